"""tests/mutants.py, bench/mutations.py's engine (issue 44): a mutant written against one layout of the code
still applies after the code is reformatted, rewrapped, moved into a class or into another module of its
package, and one that no longer matches is refused; a function's operator mutants; tests followed to the file
they moved to."""
import ast

import pytest

import tests.mutants as engine
from tests.mutants import Mutant, NotApplicable, locate, operator_mutants, resolve_tests

BEFORE = '''IDLE = 0.01


def shares(view, limit):
    """Each holder's share."""
    out = {}
    for holder, own in view.items():
        if own < IDLE:  # idle below 1 %
            continue
        out[holder] = round(min(own * view.scale, 1.0), 6)
    return out


def other(own):
    if own < IDLE:
        return 0
    return own
'''
AFTER = '''from dataclasses import dataclass

IDLE = 0.01


@dataclass
class View:
    scale: float

    def shares(self, view, limit):
        """Each holder's share, now a method."""
        out = {}
        for holder, own in view.items():
            if (
                own < IDLE  # a comment that was not there
            ):
                continue
            out[holder] = round(
                min(own * view.scale, 1.0),
                6,
            )
        return out


def other(own):
    if own < IDLE:
        return 0
    return own
'''


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(BEFORE)
    monkeypatch.setattr(engine, "ROOT", tmp_path)
    return tmp_path


def mutated(mutant: Mutant) -> str:
    path, start, end, new = locate(mutant)
    text = (engine.ROOT / path).read_text()
    out = text[:start] + new + text[end:]
    ast.parse(out)  # still Python
    return out


def test_a_mutant_applies_as_written_and_after_the_code_is_rewrapped_parenthesized_and_moved_into_a_class(tree):
    clamp = Mutant("clamp", "pkg/mod.py", "round(min(own * view.scale, 1.0), 6)", "round(own * view.scale, 6)", (), "")
    boundary = Mutant("boundary", "pkg/mod.py", "if own < IDLE:", "if own <= IDLE:", (), "", function="shares")
    assert "round(own * view.scale, 6)" in mutated(clamp)
    assert "if own <= IDLE:  # idle below 1 %" in mutated(boundary)
    (tree / "pkg" / "mod.py").write_text(AFTER)
    assert "out[holder] = round(own * view.scale, 6)\n" in mutated(clamp)
    with pytest.raises(NotApplicable, match="found in 0 modules"):  # a method now: its name says so
        locate(boundary)
    moved = Mutant("boundary", "pkg/mod.py", "if own < IDLE:", "if own <= IDLE:", (), "", function="View.shares")
    text = mutated(moved)
    assert "if own <= IDLE:\n                continue" in text and "def other(own):\n    if own < IDLE:" in text


def test_a_change_found_twice_or_not_at_all_is_refused_and_a_function_tells_twins_apart(tree):
    twice = Mutant("twice", "pkg/mod.py", "if own < IDLE:", "if own <= IDLE:", (), "")
    with pytest.raises(NotApplicable, match="text found 2 times"):
        locate(twice)
    with pytest.raises(NotApplicable, match="text found 0 times, tokens 0 times"):
        locate(Mutant("gone", "pkg/mod.py", "own > IDLE", "own >= IDLE", (), ""))
    assert mutated(Mutant("twin", "pkg/mod.py", "if own < IDLE:", "if own <= IDLE:", (), "", function="other")) \
        .endswith("def other(own):\n    if own <= IDLE:\n        return 0\n    return own\n")


def test_a_function_moved_to_another_module_of_its_package_is_followed_there(tree):
    (tree / "pkg" / "mod.py").write_text("from pkg.moved import shares\n")
    (tree / "pkg" / "moved.py").write_text(BEFORE.replace("# idle below 1 %", "# moved here"))
    path, start, _end, new = locate(Mutant("m", "pkg/mod.py", "own < IDLE", "own <= IDLE", (), "", function="shares"))
    assert path == "pkg/moved.py" and new == "own <= IDLE"
    assert (tree / "pkg" / "moved.py").read_text()[start:].startswith("own < IDLE:  # moved here")


def test_a_deleted_line_goes_with_its_indentation_after_a_reformat(tree):
    drop = Mutant("drop", "pkg/mod.py", "    out = {}\n", "", (), "", function="shares")
    (tree / "pkg" / "mod.py").write_text(BEFORE.replace("    out = {}\n", "    out = {}  # start empty\n"))
    assert '"""Each holder\'s share."""\n    for holder' in mutated(drop)


def test_a_multi_line_change_is_indented_where_the_function_now_is(tree):
    skip = Mutant("skip", "pkg/mod.py", "if own < IDLE:  # idle below 1 %\n            continue",
                  "if own < IDLE:\n            pass", (), "", function="View.shares")
    (tree / "pkg" / "mod.py").write_text(AFTER)
    assert "            if own < IDLE:\n                pass\n" in mutated(skip)


def test_a_functions_operator_mutants_flip_offset_and_drop_each_operator_and_apply_at_their_place(tree):
    found = operator_mutants("pkg/mod.py", "shares", ("tests/test_x.py",))
    assert [(m.id, m.old, m.new) for m in found] == [
        ("shares:flip-1", "own < IDLE", "(own <= IDLE)"),
        ("shares:clamp-1", "min(own * view.scale, 1.0)", "(own * view.scale)"),
        ("shares:float-1", "1.0", "2.0"),
    ]  # the docstring, the comment and round()'s digits are no operators
    assert all(m.tests == ("tests/test_x.py",) and m.function == "shares" for m in found)
    for mutant in found:
        mutated(mutant)
    assert "(own <= IDLE)" in mutated(found[0]) and "def other(own):\n    if own < IDLE:" in mutated(found[0])
    (tree / "pkg" / "mod.py").write_text(BEFORE.replace("    out = {}\n", "    out = {}  # edited\n"))
    with pytest.raises(NotApplicable, match="changed since its mutants were made"):
        locate(found[0])
    assert [m.id for m in operator_mutants("pkg/mod.py", "other", ())] == ["other:flip-1", "other:int-1"]


def test_a_test_named_in_a_file_it_left_is_followed_to_the_file_that_holds_it_now(tree):
    (tree / "tests").mkdir()
    (tree / "tests" / "test_unit.py").write_text("def test_moved():\n    pass\n\n\ndef test_here():\n    pass\n")
    assert resolve_tests(("tests/test_guards.py::test_moved[case]", "tests/test_unit.py::test_here", "-k", "x",
                          "tests/test_unit.py", "tests/test_guards.py::test_nowhere")) == \
        ["tests/test_unit.py::test_moved[case]", "tests/test_unit.py::test_here", "-k", "x", "tests/test_unit.py",
         "tests/test_guards.py::test_nowhere"]
