"""Hand mutants of the native tracer (gpu_trace/native/gputrace.c), each built and run against
tests/test_native_tracer.py: a mutant that no test fails is a guard tested only where it accepts.

    python3 bench/native_mutations.py [--only NAME]

Each mutant names the C function it lives in and one exact edit inside that function's body, so a change
elsewhere in the file cannot move it onto other code; a mutant whose text is no longer there is reported
as stale, never as caught. bench/mutations.py does the same for the Python modules.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "gpu_trace" / "native" / "gputrace.c"

# (name, function, text, replacement)
MUTANTS = [
    ("warps rounded down", "gt_blocks_per_sm", "(threads + 31) / 32", "threads / 32"),
    ("no per-SM block limit", "gt_blocks_per_sm", "if (fit > max_blocks) fit = max_blocks;", ""),
    ("registers not rounded to their unit", "gt_blocks_per_sm", "+ REGISTER_UNIT - 1) / REGISTER_UNIT * REGISTER_UNIT",
     ")"),
    ("no reserved shared memory", "gt_blocks_per_sm", "+ RESERVED_SHARED_PER_BLOCK", ""),
    ("a last wave counts whole", "gt_sms_occupied", "(double)(last < sms ? last : sms)", "(double)sms"),
    ("limited by the usable SMs, shared by the usable", "kernel_share", "/ (double)d->gpu_sm_count", "/ (double)d->sm_count"),
    ("an unknown device counted", "device_of", "id < (uint32_t)W.device_count", "id < MAX_DEVICES"),
    ("the store one past its cap", "keep", "W.count >= W.max_records", "W.count > W.max_records"),
    ("an inverted record kept", "take", "if (start > 0 && end > 0 && end < start) { W.incomplete++; return; }", ""),
    ("an unfinished kernel kept", "take", "if (start <= 0 || end <= 0) { W.incomplete++; return; }",
     "if (start <= 0) { W.incomplete++; return; }"),
    ("an inverted copy kept", "take", "if (start <= 0 || end < start)", "if (start <= 0)"),
    ("memsets on the copy engines", "take", "kind == KIND_MEMSET || ", ""),
    ("device copies on the copy engines", "take", "FIELD(uint8_t, r, C_COPY_KIND) == COPY_DTOD", "0"),
    ("queued before the window followed", "note_stream", "if (queued < W.lo) return;", ""),
    ("a later launch replaces the first", "note_stream", "if (queued < s->queued)", "if (queued > s->queued)"),
    ("the backlog at the launch wait", "add_backlog", "until - s->queued > QUEUE_WAIT_NS", "until - s->queued >= QUEUE_WAIT_NS"),
    ("an unstarted kernel waited nothing", "add_backlog", "s->start > 0 ? s->start : hi", "s->start"),
    ("a gap queued after the first ended", "add_queue_gaps", "b->queued <= a->end", "b->queued <= a->end + QUEUE_GAP_MAX_NS"),
    ("the longest gap refused", "add_queue_gaps", "gap <= QUEUE_GAP_MAX_NS", "gap < QUEUE_GAP_MAX_NS"),
    ("any gap counted", "add_queue_gaps", "&& gap <= QUEUE_GAP_MAX_NS", ""),
    ("the longest turn refused", "add_queue_gaps", ": gap <= TURN_NS", ": gap < TURN_NS"),
    ("any turn counted", "add_queue_gaps", ": gap <= TURN_NS", ": 1"),
    ("no turns without timestamps", "add_queue_gaps", ": gap <= TURN_NS", ": 0"),
    ("timestamps ignored for turns", "add_queue_gaps",
     "b->queued > 0 ? b->queued <= a->end && gap <= QUEUE_GAP_MAX_NS : gap <= TURN_NS", "gap <= TURN_NS"),
    ("gaps across streams", "add_queue_gaps", "|| a->stream != b->stream ", ""),
    ("a gap holds SMs", "add_queue_gaps", "a->end, b->start, 0, 0.0f,", "a->end, b->start, 0, 1.0f,"),
    ("intervals not clipped to the window", "sweep", "int64_t s = r->start < lo ? lo : r->start, e = r->end > hi ? hi : r->end;",
     "int64_t s = r->start, e = r->end;"),
    ("the SM load not capped", "sweep", "load > 1.0 ? 1.0 : load", "load"),
    ("kernels counted outside the window", "summarise", "&& r->end > lo && r->start < hi", ""),
    ("backlog in the kernels' union", "summarise", "sweep(edges, d, BIT(REC_KERNEL), lo, hi, &kernel_busy, &kernel_sm);",
     "sweep(edges, d, BIT(REC_KERNEL) | BIT(REC_BACKLOG), lo, hi, &kernel_busy, &kernel_sm);"),
    ("host copies in the busy time", "summarise", "BIT(REC_KERNEL) | BIT(REC_SM_COPY) | BIT(REC_BACKLOG) | BIT(REC_QUEUE_GAP), lo",
     "BIT(REC_KERNEL) | BIT(REC_SM_COPY) | BIT(REC_BACKLOG) | BIT(REC_QUEUE_GAP) | BIT(REC_COPY), lo"),
    ("a cut record read", "gt_test_feed", "at + record_size <= valid", "at < valid"),
    ("a command one byte longer", "read_line", "while (n + 1 < cap)", "while (n + 1 <= cap)"),
    ("a bad command answered", "serve", "if (seconds < 0 || window < 0 || window > 9e15) return;", ""),
    ("a second client per process", "gt_claim", "__sync_bool_compare_and_swap(&claimed, 0, 1)", "1"),
]


def body(source: str, function: str) -> tuple[int, int]:
    """The span of `function`'s body in the C source (from its signature's opening brace to its match)."""
    m = re.search(rf"^[^\n;]*\b{re.escape(function)}\([^;{{]*\)\s*{{", source, re.M)
    if not m:
        raise LookupError(function)
    depth, i = 0, m.end() - 1
    while i < len(source):
        c = source[i]
        if c in "\"'":  # a string or character literal: its braces are text
            i += 1
            while source[i] != c:
                i += 2 if source[i] == "\\" else 1
        elif source.startswith("/*", i):
            i = source.index("*/", i) + 1
        else:
            depth += {"{": 1, "}": -1}.get(c, 0)
            if depth == 0:
                return m.start(), i + 1
        i += 1
    raise LookupError(function)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None)
    args = p.parse_args(argv)
    original = SOURCE.read_text()
    caught = survived = stale = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, function, text, replacement in MUTANTS:
            if args.only and args.only != name:
                continue
            try:
                lo, hi = body(original, function)
            except LookupError:
                print(f"STALE     {name}: no function {function}")
                stale += 1
                continue
            if original[lo:hi].count(text) != 1:
                print(f"STALE     {name}: the text is not once in {function}")
                stale += 1
                continue
            mutant = Path(tmp) / "gputrace.c"
            mutant.write_text(original[:lo] + original[lo:hi].replace(text, replacement) + original[hi:])
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                  "tests/test_native_tracer.py"], cwd=ROOT, capture_output=True, text=True,
                                 env={**os.environ, "GPU_TRACE_NATIVE_SOURCE": str(mutant)}, timeout=600)
            if run.returncode == 0:
                survived += 1
                print(f"SURVIVED  {name} ({function})")
            else:
                caught += 1
                print(f"caught    {name}")
    print(f"{caught} caught, {survived} survived, {stale} stale of {len(MUTANTS)}")
    return 1 if survived or stale else 0


if __name__ == "__main__":
    sys.exit(main())
