"""The mutation engine of bench/mutations.py: where a mutant applies, and the mutants of a function made from its
operators, so that a mutation table survives refactors.

A hand mutant names a change (`old` -> `new`) and, optionally, the function it lives in. `old` is matched as
written, else by its syntax tree (a whole expression, statements, or a block's header such as `if x > 1:`: the
parentheses, line breaks, comments and quotes a formatter changes do not count), else by its tokens (for a
fragment: whitespace, comments, quotes and trailing commas do not count), so a file reformatted or rewrapped
keeps its mutants. With `function` (a qualified name: `gpu_shares`,
`WorkloadView.gpu_shares`), only that function is searched, wherever it now stands in the file, and in the other
modules of its package when it moved out of the file. A change that no longer matches exactly once is refused,
never counted as survived.

Generated mutants need no table at all: for a named function, each comparison flipped (`<` to `<=`, `==` to `!=`,
`in` to `not in`, ...), each integer constant off by one, each float constant doubled, each `min`/`max` clamp
dropped, each `not` dropped and each `and`/`or` swapped (`operator_mutants`). A test names the tests that must
catch every one of them.

Test references survive moves too: `tests/test_x.py::test_name` whose test now lives in another file is
followed there (`resolve_tests`).
"""
from __future__ import annotations

import ast
import copy
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str  # the rule the mutant breaks
    listed: bool = False  # one of the surviving mutants (issue 27, "Tests that guard")
    function: str | None = None  # the qualified name of the function (or class) `old` lives in
    at: int | None = None  # generated mutants: where `old` starts, counted from the start of `function`


class NotApplicable(Exception):
    """The mutant's change is not found exactly once where it is looked for."""


# -- tokens -------------------------------------------------------------------------------------------------
def _offsets(text: str) -> list[int]:
    starts, at = [0], 0
    for line in text.splitlines(keepends=True):
        at += len(line)
        starts.append(at)
    return starts


def _key(kind: int, string: str) -> str:
    if kind == tokenize.STRING:  # 'a' and "a" are one string; an f-string keeps its text
        try:
            return repr(ast.literal_eval(string))
        except (ValueError, SyntaxError):
            return string
    return string


def tokens(text: str) -> list[tuple[str, int, int]]:
    """The significant tokens of `text` as (key, start offset, end offset), without a trailing comma before a
    closing bracket; a fragment that does not end a statement (`if x > 1:`, an open bracket) keeps the tokens
    read before the end."""
    line_starts = _offsets(text)
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in SKIPPED or (tok.type == tokenize.ERRORTOKEN and tok.string.isspace()):
                continue
            start = line_starts[tok.start[0] - 1] + tok.start[1]
            end = line_starts[tok.end[0] - 1] + tok.end[1]
            found.append((_key(tok.type, tok.string), start, end))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    # a trailing comma before a closing bracket is a formatter's choice (black's "magic trailing comma")
    return [t for t, after in zip(found, found[1:] + [("", 0, 0)]) if not (t[0] == "," and after[0] in (")", "]", "}"))]


# -- where a function is ------------------------------------------------------------------------------------
def definitions(tree: ast.AST, prefix: str = "") -> dict[str, ast.AST]:
    """Qualified name -> node of every function and class (methods as `Class.method`, nested as `f.g`)."""
    found = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            found[name] = node
            found.update(definitions(node, name + "."))
        else:
            found.update(definitions(node, prefix))
    return found


def _span(text: str, node: ast.AST) -> tuple[int, int]:
    line_starts = _offsets(text)
    return (line_starts[node.lineno - 1] + node.col_offset, line_starts[node.end_lineno - 1] + node.end_col_offset)


def locate_function(path: str, function: str) -> tuple[str, tuple[int, int]]:
    """(the file the function is in now, its span there): `path` first, else the one other module of its
    package that defines it."""
    candidates = [ROOT / path]
    package = Path(path).parts[0]
    candidates += sorted(p for p in (ROOT / package).rglob("*.py") if p != ROOT / path) if package != path else []
    found = []
    for candidate in candidates:
        if not candidate.is_file():
            continue
        text = candidate.read_text()
        node = definitions(ast.parse(text)).get(function)
        if node is not None:
            if candidate == ROOT / path:
                return path, _span(text, node)
            found.append((str(candidate.relative_to(ROOT)), _span(text, node)))
    if len(found) != 1:
        raise NotApplicable(f"function {function} found in {len(found)} modules")
    return found[0]


def enclosing(path: str, old: str) -> str | None:
    """The qualified name of the innermost function or class around the one place of `old` in `path` (None at
    module level, outside Python or when `old` is not found exactly once): what a hand mutant's `function`
    should say."""
    text = (ROOT / path).read_text()
    if not path.endswith(".py") or text.count(old) != 1:
        return None
    start = text.index(old)
    end = start + len(old)
    around = [(name, _span(text, node)) for name, node in definitions(ast.parse(text)).items()]
    inside = [(span[1] - span[0], name) for name, span in around if span[0] <= start and end <= span[1]]
    return min(inside)[1] if inside else None


# -- matched by its syntax tree: parentheses, wrapping, quotes and comments do not count ---------------------
def _as_source(fragment: str) -> tuple[str, int]:
    """The fragment as parseable source: its later lines dedented to sit under its first (a block under a
    header ending in ":" one level in); the dedent applied."""
    first, *rest = fragment.strip("\n").split("\n")
    rest = [line for line in rest]
    indents = [len(line) - len(line.lstrip()) for line in rest if line.strip()]
    header = re.sub(r"#.*", "", first).rstrip().endswith(":")
    cut = max(min(indents) - (4 if header else 0), 0) if indents else 0
    return "\n".join([first.strip()] + [line[cut:] for line in rest]), cut


def _dump(node) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _header_dump(node) -> str:
    twin = copy.copy(node)
    for field in ("body", "orelse", "finalbody", "handlers"):
        if hasattr(twin, field):
            setattr(twin, field, [])
    return _dump(twin)


def _in(node, low: int, high: int, text: str) -> bool:
    start, end = _span(text, node)
    return low <= start and end <= high


def _ast_locate(old: str, text: str, low: int, high: int) -> tuple[int, int, int] | None:
    """(start, end, column of the match) of the one place `old` is, compared as syntax trees; None when `old`
    is no whole expression, statements or a block's header, or is not found exactly once."""
    source, _cut = _as_source(old)
    header = False
    try:
        parsed = ast.parse(source)
    except SyntaxError:
        line = source.rstrip()
        if "\n" in line or not line.endswith(":"):
            return None
        line = line[2:] if line.startswith("elif ") else line
        try:
            parsed = ast.parse(line + "\n    pass")
        except SyntaxError:
            return None
        header = True
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    stmts = parsed.body
    hits = []
    if header and len(stmts) == 1:
        want = _header_dump(stmts[0])
        for node in ast.walk(tree):
            if type(node) is type(stmts[0]) and _in(node, low, high, text) and _header_dump(node) == want:
                body = node.body[0]
                head = text[_span(text, node)[0]:_span(text, body)[0]]
                colons = [t for t in tokens(head) if t[0] == ":"]
                hits.append((_span(text, node)[0], _span(text, node)[0] + colons[-1][2], node.col_offset))
    elif len(stmts) == 1 and isinstance(stmts[0], ast.Expr):
        want = _dump(stmts[0].value)
        hits = [(*_span(text, n), n.col_offset) for n in ast.walk(tree)
                if isinstance(n, ast.expr) and _in(n, low, high, text) and _dump(n) == want]
    elif stmts:
        want = [_dump(n) for n in stmts]
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for i in range(len(block) - len(want) + 1):
                    run = block[i:i + len(want)]
                    if [_dump(n) for n in run] == want and _in(run[0], low, high, text) and _in(run[-1], low, high, text):
                        hits.append((_span(text, run[0])[0], _span(text, run[-1])[1], run[0].col_offset))
    return hits[0] if len(hits) == 1 else None


def _placed(new: str, old: str, column: int) -> str:
    """`new` with its later lines dedented as `old`'s were and indented to where the match stands."""
    if "\n" not in new:
        return new
    _source, cut = _as_source(old)
    if "\n" not in old.strip("\n"):  # one line: its own indentation says where it stood
        lead = old[:len(old) - len(old.lstrip(" "))]
        if not lead:
            return new
        cut = len(lead)
    first, *rest = new.split("\n")
    return "\n".join([first] + [(" " * column + line[cut:]) if line.strip() else line for line in rest])


# -- where a hand mutant applies ----------------------------------------------------------------------------
def _matches(haystack: list[tuple[str, int, int]], needle: list[str]) -> list[int]:
    n = len(needle)
    return [i for i in range(len(haystack) - n + 1) if [t[0] for t in haystack[i:i + n]] == needle]


def _reindent(new: str, old: str, text: str, old_tokens, file_tokens, first: int) -> str:
    """`new` with its continuation lines shifted by what the file's indentation adds to the one `old` was
    written at (a function moved into a class)."""
    if "\n" not in new:
        return new
    for i, (_key_, start, _end) in enumerate(old_tokens):
        if "\n" in old[:start]:
            old_column = start - old.rfind("\n", 0, start) - 1
            at = file_tokens[first + i][1]
            shift = (at - text.rfind("\n", 0, at) - 1) - old_column
            break
    else:
        return new
    lines = new.split("\n")
    if shift > 0:
        return "\n".join(lines[:1] + [" " * shift + line if line else line for line in lines[1:]])
    return "\n".join(lines[:1] + [line[min(-shift, len(line) - len(line.lstrip(" "))):] for line in lines[1:]])


def _whole(fragment: str, found: list[tuple[str, int, int]]) -> bool:
    """The tokens cover the fragment: nothing but whitespace, comments or line continuations around and between them."""
    cuts = [0] + [x for _k, start, end in found for x in (start, end)] + [len(fragment)]
    return all(not re.sub(r"#[^\n]*", "", fragment[a:b]).replace("\\\n", "").strip() for a, b in zip(cuts[::2], cuts[1::2]))


def locate(mutant: Mutant) -> tuple[str, int, int, str]:
    """(file, start, end, replacement): where the mutant's change goes now. Raises NotApplicable."""
    path = mutant.path
    if mutant.function:
        path, (low, high) = locate_function(path, mutant.function)
    text = (ROOT / path).read_text()
    if not mutant.function:
        low, high = 0, len(text)
    elif mutant.at is not None:  # a node of the function as it was read when the mutant was made
        start = low + mutant.at
        if text[start:start + len(mutant.old)] != mutant.old:
            raise NotApplicable(f"{mutant.function} changed since its mutants were made")
        return path, start, start + len(mutant.old), mutant.new
    if text.count(mutant.old, low, high) == 1:  # as written: exactly as written
        start = text.index(mutant.old, low, high)
        return path, start, start + len(mutant.old), mutant.new
    found = _ast_locate(mutant.old, text, low, high) if path.endswith(".py") else None
    if found is not None:
        start, end, column = found
        lead, trail = mutant.old[:len(mutant.old) - len(mutant.old.lstrip())], mutant.old[len(mutant.old.rstrip()):]
        new = mutant.new[len(lead):] if lead and mutant.new.startswith(lead) else mutant.new
        new = new[:len(new) - len(trail)] if trail and new.endswith(trail) else new
        if trail.endswith("\n") and not new.endswith("\n") and not new.strip():  # a line deleted: its end too
            end = text.find("\n", end) + 1 if "\n" in text[end:high] else high
            start = text.rfind("\n", 0, start) + 1
        return path, start, end, _placed(new, mutant.old, column)
    old_tokens = tokens(mutant.old) if path.endswith(".py") else []
    hits: list[int] = []
    if old_tokens and _whole(mutant.old, old_tokens):
        file_tokens = [t for t in tokens(text) if low <= t[1] and t[2] <= high]
        hits = _matches(file_tokens, [k for k, _s, _e in old_tokens])
    if len(hits) != 1:
        where = f" in {mutant.function}" if mutant.function else ""
        raise NotApplicable(f"text found {text.count(mutant.old, low, high)} times, tokens {len(hits)} times{where}")
    first = hits[0]
    start, end = file_tokens[first][1], file_tokens[first + len(old_tokens) - 1][2]
    replacement = mutant.new
    lead, trail = mutant.old[:old_tokens[0][1]], mutant.old[old_tokens[-1][2]:]
    if lead and replacement.startswith(lead):  # the file has its own indentation before the first token
        replacement = replacement[len(lead):]
    elif lead:  # the whitespace before goes with the text
        while start > low and text[start - 1] in " \t":
            start -= 1
    if trail and replacement.endswith(trail):
        replacement = replacement[:len(replacement) - len(trail)]
    elif trail:  # and the whitespace (and a comment) after it, up to the end of its line when it had one
        while end < high and text[end] in " \t":
            end += 1
        if text[end:end + 1] == "#" and ("#" in trail or trail.endswith("\n")):  # old ran to its line's end
            end = text.find("\n", end) if "\n" in text[end:high] else high
        if trail.endswith("\n") and text[end:end + 1] == "\n":
            end += 1
    return path, start, end, _reindent(replacement, mutant.old, text, old_tokens, file_tokens, first)


def apply(mutant: Mutant) -> tuple[Path, str]:
    """Writes the mutant into its file; returns the file and its original text (to restore)."""
    path, start, end, new = locate(mutant)
    target = ROOT / path
    original = target.read_text()
    target.write_text(original[:start] + new + original[end:])
    return target, original


# -- mutants made from a function's operators ---------------------------------------------------------------
FLIPPED = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _changed(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(what, the node changed) for each operator mutation of this one node."""
    out = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            twin = copy.deepcopy(node)
            twin.ops[i] = FLIPPED[type(op)]()
            out.append(("flip", twin))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        twin = ast.Constant(node.value + 1 if type(node.value) is int else (node.value * 2 or 1.0))
        out.append(("int" if type(node.value) is int else "float", twin))
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
          and len(node.args) >= 2 and not node.keywords):
        kept = next((a for a in node.args if not isinstance(a, ast.Constant)), node.args[0])
        out.append(("clamp", copy.deepcopy(kept)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", copy.deepcopy(node.operand)))
    elif isinstance(node, ast.BoolOp):
        twin = copy.deepcopy(node)
        twin.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("boolop", twin))
    return out


def _docstrings(function: ast.AST) -> set[int]:
    """Expression statements that are constants (docstrings): not operators."""
    return {id(n.value) for n in ast.walk(function) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def operator_mutants(path: str, function: str, tests: tuple[str, ...], why: str = "") -> list[Mutant]:
    """Every operator mutant of `function` in `path` (followed into its package if it moved), each an exact
    change at its place now: ids name the function, the kind and the rank of the node in it."""
    where, (low, high) = locate_function(path, function)
    text = (ROOT / where).read_text()
    node = next(n for n in definitions(ast.parse(text)).values() if _span(text, n) == (low, high))
    skip = _docstrings(node) | {id(n) for s in ast.walk(node) if isinstance(s, ast.JoinedStr) for n in ast.walk(s)}
    skip |= {id(c.args[1]) for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
             and c.func.id == "round" and len(c.args) == 2}  # round(x, 6): its digits are not a rule
    seen: dict[str, int] = {}
    out = []
    in_order = sorted((n for n in ast.walk(node) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))
    for child in in_order:
        if id(child) in skip or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for kind, twin in _changed(child):
            start, end = _span(text, child)
            old = text[start:end]
            new = ast.unparse(twin)
            if not isinstance(twin, (ast.Constant, ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                new = f"({new})"  # in the place of the node, whatever binds around it
            rank = seen[kind] = seen.get(kind, 0) + 1
            out.append(Mutant(f"{function}:{kind}-{rank}", where, old, new, tests,
                              why or f"{kind} at line {child.lineno}: {old!r} -> {new!r}", function=function,
                              at=start - low))
    return out


# -- the tests of a mutant ----------------------------------------------------------------------------------
def test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def resolve_tests(tests: tuple[str, ...]) -> list[str]:
    """The mutant's pytest arguments with each `FILE::test_name` whose test moved pointed at the file that
    defines it now (the first part of the name: parametrized ids and classes keep their tail)."""
    out = []
    index: dict[str, list[str]] | None = None
    for arg in tests:
        file, sep, node = arg.partition("::")
        if not sep or not file.startswith("tests/"):
            out.append(arg)
            continue
        name = node.split("::")[0].split("[")[0]
        if (ROOT / file).is_file() and name in test_names(ROOT / file):
            out.append(arg)
            continue
        if index is None:
            index = {}
            for candidate in sorted((ROOT / "tests").rglob("test_*.py")):
                for found in test_names(candidate):
                    index.setdefault(found, []).append(str(candidate.relative_to(ROOT)))
        homes = index.get(name, [])
        out.append(f"{homes[0]}::{node}" if len(homes) == 1 else arg)
    return out
