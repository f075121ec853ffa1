"""Files generated from code and committed: written, or compared with --check (CI) so that the
committed copy never drifts from its source."""
from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], check: bool, command: str) -> int:
    """Writes each path's text, or with `check` returns 1 (naming `command`) when any differs."""
    stale = []
    for path, text in files.items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}: run {command}", file=sys.stderr)
        return 1
    return 0
