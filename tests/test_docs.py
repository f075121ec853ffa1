"""The README and docs/ hold together (issue 36): every relative link and anchor resolves, and every
command the README names still parses (its `--help` lists each flag the README passes it). bench/README.md
indexes every script in bench/ (issue 44)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# Our commands, and how to run each from this tree with the interpreter the tests run under.
COMMANDS = {
    "gpu-spatial-exporter": [sys.executable, "-m", "exporter"],
    "gpu-spatial": [sys.executable, "-m", "gpu_spatial"],
    "nsys-ingest": [sys.executable, "-m", "nsys_ingest"],
}

def _nsys_commands() -> set[str]:
    from nsys_ingest.__main__ import build_parser

    return set(re.search(r"\{([\w,-]+)\}", build_parser().format_usage()).group(1).split(","))  # {summary,plot,...}


def _gpu_spatial_commands() -> set[str]:
    from gpu_spatial.cli import SUBCOMMANDS as GPU_SPATIAL

    return set(GPU_SPATIAL)


SUBCOMMANDS = {"gpu-spatial": _gpu_spatial_commands(), "nsys-ingest": _nsys_commands()}


def outside_code(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(outside_code(page.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading with anchor #{anchor} in {where.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    assert broken_links(page) == []


def test_the_link_check_catches_a_broken_file_and_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## The DaemonSet's privileges\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#the-daemonsets-privileges) [b](other.md#twice-1) [c](other.md#gone) "
                    "[d](missing.md) [e](#here) `[f](inline.md)`\n\n## Here\n\n```\n[g](fenced.md)\n```\n")
    assert broken_links(page) == ["other.md#gone: no heading with anchor #gone in other.md", "missing.md: no such file"]


def bench_index() -> dict[str, str]:
    """bench/README.md's tables: script -> its row's RESULTS cell."""
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([^|]*) \|$", (ROOT / "bench" / "README.md").read_text(), flags=re.M)
    return dict(rows)


def test_the_bench_index_names_every_script_and_the_results_section_it_feeds():
    """Issue 44: every script in bench/ has its row, linking the RESULTS.md sections it feeds (the anchors are
    checked with the other links), and no row names a script that is gone."""
    index = bench_index()
    scripts = sorted(p.name for p in (ROOT / "bench").iterdir() if p.is_file() and p.suffix in (".py", ".sh")
                     and p.name != "__init__.py")
    assert sorted(index) == scripts
    assert [name for name, cell in index.items() if "(RESULTS.md#" not in cell] == []


def readme_commands() -> list[list[str]]:
    """Every command line of the README's sh blocks that runs one of our commands, as words."""
    readme = (ROOT / "README.md").read_text()
    found = []
    for block in re.findall(r"^```sh\n(.*?)^```", readme, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token in ("&&", "||", "|", ";", "&"):
                    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
                        words = words[1:]
                    if words and words[0] in COMMANDS:
                        found.append(words)
                    words = []
                else:
                    words.append(token)
    return found


def flags_of(words: list[str]) -> tuple[list[str], list[str]]:
    """The subcommand words before the first flag, and the long flags passed."""
    head = []
    for word in words[1:]:
        if word.startswith("-"):
            break
        head.append(word)
    command_words = head[:1] if words[0] in SUBCOMMANDS else []
    if words[0] == "gpu-spatial" and head[:1] == ["nsys"] and len(head) > 1:
        command_words = head[:2]
    return command_words, [w.split("=", 1)[0] for w in words[1:] if w.startswith("--")]


def test_the_readme_names_our_commands():
    named = {words[0] for words in readme_commands()}
    assert named == set(COMMANDS)


@pytest.mark.parametrize("words", readme_commands(), ids=lambda w: " ".join(w)[:60])
def test_every_readme_command_parses(words):
    """`--help` of the command answers 0 and lists every flag the README gives it."""
    command_words, flags = flags_of(words)
    if command_words:
        assert command_words[-1] in SUBCOMMANDS.get(words[0], set()) | SUBCOMMANDS["nsys-ingest"]
    done = subprocess.run([*COMMANDS[words[0]], *command_words, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    missing = [flag for flag in flags if not re.search(re.escape(flag) + r"(?![\w-])", done.stdout)]
    assert missing == [], f"{' '.join(words)}: {missing} not in --help"
