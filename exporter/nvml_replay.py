"""Record the live NVML wrapper's answers on a GPU host; replay them where there is no GPU.

The recording is the only fake in the project: it sits exactly at the `Nvml` interface and returns
what a real GPU returned, call for call. Each (method, device) keeps its own list of answers, played
in order and then looped; since the sampler calls every method once per tick, answers recorded in
one tick are replayed together. Errors are recorded too and replayed as the same `NvmlError`.
XID events are kept apart (`xid_events`: when, which GPU, which XID) and replayed once each at the
same offset from the replay's first wait; a fixture may declare them by hand.

    python -m exporter.nvml_replay record OUT.json --seconds 10 --interval 0.5
    python -m exporter.nvml_replay cut IN.json OUT.json --frame 12
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from pathlib import Path

from exporter import nvml_answers
from exporter.nvml import NvmlError, PartialAnswer
from exporter.nvml_answers import XidEvent
from hostio.files import read_text_capped

# Methods answered once (identity does not change); the others are per-tick streams.
STATIC_METHODS = ("device_count", "identity", "gpm_support", "mig_devices", "driver_version", "max_clocks",
                  "xid_open", "pci_bus_ids")
STREAM_METHODS = (
    "utilization_samples",
    "utilization_rates",
    "memory",
    "power_watts",
    "sm_clock_hz",
    "temperature_celsius",
    "process_utilization",
    "compute_processes",
    "gpm_metrics",
    "gpm_mig_metrics",
    "memory_clock_hz",
    "clock_event_reasons",
    "health_counters",
    "nvml_throughput",
    "memory_errors",
)
# Stream methods the sampler calls only on some ticks even while recording (see aligned_calls): per-process
# utilization while processes run, MIG instances, the instant rate before NVML has its first samples.
CONDITIONAL_METHODS = ("process_utilization", "gpm_mig_metrics", "utilization_rates")
# Methods answering an exporter.nvml.PartialAnswer: recorded in its to_json() form.
PARTIAL_METHODS = ("max_clocks", "health_counters", "nvml_throughput", "memory_errors")
FORMAT = "gpu-exporter-nvml-recording/1"
WHAT_A_RECORDING_IS = ("a recording is the JSON that `python3 -m exporter.nvml_replay record OUT.json` writes on a GPU "
                       "host (tests/fixtures/nvml_h100_time_sliced.json is one)")
MAX_RECORDING_BYTES = 256 << 20  # ten minutes of 8 GPUs at 0.5 s is ~50 MB


def _key(method: str, args: tuple) -> str:
    # The device index identifies a call (a MIG GPU instance too): window lengths vary from tick to tick.
    if method == "gpm_mig_metrics":
        return f"{method}/{args[0]}/{args[1]}"
    return f"{method}/{args[0]}" if args else method


class RecordingNvml:
    """Wraps a live `Nvml` and keeps every answer (or error) it gives."""

    def __init__(self, live):
        self._live = live
        self._lock = threading.Lock()
        self.calls: dict[str, list] = {}
        self.xid_events: list[dict] = []
        self._started = time.monotonic()

    def xid_wait(self, timeout_ms: int):
        event = self._live.xid_wait(timeout_ms)
        if event is not None:
            with self._lock:
                self.xid_events.append({"after_s": round(time.monotonic() - self._started, 3), **event._asdict()})
        return event

    def __getattr__(self, method):
        if method not in STATIC_METHODS + STREAM_METHODS:
            return getattr(self._live, method)

        def call(*args):
            try:
                value = getattr(self._live, method)(*args)
                answer = {"value": value.to_json() if method in PARTIAL_METHODS else nvml_answers.to_json(value)}
            except NvmlError as exc:
                answer = exc.to_json()
            # gpm_metrics answers None on its first call only (no previous sample): nothing to replay.
            if not (method in ("gpm_metrics", "gpm_mig_metrics") and answer.get("value", 0) is None):
                with self._lock:
                    self.calls.setdefault(_key(method, args), []).append(answer)
            if "error" in answer:
                raise NvmlError.from_json(answer)
            return value

        return call

    def aligned_calls(self) -> dict[str, list]:
        """Streams trimmed at their start to one length per device: GPM answers from its second tick on,
        so without this a replay would pair GPM windows with utilization samples two ticks older. Calls
        the sampler makes only on some ticks (per-process utilization: only while processes run) do
        not set the length."""
        lengths: dict[str, int] = {}
        for key, answers in self.calls.items():
            method, _, device = key.partition("/")
            if method in STREAM_METHODS and method not in CONDITIONAL_METHODS:
                lengths[device] = min(lengths.get(device, len(answers)), len(answers))
        out = {}
        for key, answers in self.calls.items():
            method, _, device = key.partition("/")
            keep = lengths.get(device, len(answers))
            out[key] = answers[max(0, len(answers) - keep):] if method in STREAM_METHODS else answers
        return out

    def save(self, path: Path, note: str = "") -> None:
        data = {"format": FORMAT, "note": note, "calls": self.aligned_calls(), "xid_events": self.xid_events}
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


class ReplayNvml:
    """Answers the `Nvml` interface from a recording, looping each stream."""

    def __init__(self, path: str | Path):
        path = Path(path)
        data = read_recording(path)
        self.path = path
        self._lock = threading.Lock()
        self._streams = {key: itertools.cycle(answers) for key, answers in data["calls"].items() if answers}
        self._static = {key: answers[0] for key, answers in data["calls"].items() if answers}
        self._xid_events = sorted(self._checked_events(path, data.get("xid_events", [])), key=lambda e: e["after_s"])
        self._xid_next = 0
        self._xid_started = None
        self._xid_closed = threading.Event()

    @staticmethod
    def _checked_events(path: Path, events) -> list[dict]:
        """xid_events as {"after_s": seconds >= 0, "index": GPU index, "xid": XID}, or one line saying which is wrong."""
        def number(value, kind):
            return isinstance(value, kind) and not isinstance(value, bool) and value >= 0

        if not isinstance(events, list):
            raise NvmlError("replay", f"{path}: xid_events must be a list of events")
        for n, event in enumerate(events):
            if not (isinstance(event, dict) and number(event.get("after_s"), (int, float))
                    and number(event.get("index"), int) and number(event.get("xid"), int)):
                raise NvmlError("replay", f"{path}: xid_events[{n}] must be {{\"after_s\": seconds, \"index\": GPU "
                                          f"index, \"xid\": XID}} with numbers >= 0, not {event!r:.80}")
        return list(events)

    def xid_wait(self, timeout_ms: int):
        """The next recorded XID event once its offset from the first wait has passed; None meanwhile."""
        with self._lock:
            if self._xid_started is None:
                self._xid_started = time.monotonic()
            event = self._xid_events[self._xid_next] if self._xid_next < len(self._xid_events) else None
            due = None if event is None else self._xid_started + float(event["after_s"])
        wait = timeout_ms / 1000 if due is None else min(timeout_ms / 1000, due - time.monotonic())
        if wait > 0 and self._xid_closed.wait(wait):
            return None
        with self._lock:
            if due is None or time.monotonic() < due or self._xid_closed.is_set():
                return None
            self._xid_next += 1
        return XidEvent(int(event["index"]), int(event["xid"]))

    def xid_close(self) -> None:
        self._xid_closed.set()

    def xid_register(self, index: int) -> str | None:
        """A GPU that came back is registered again: nothing to do on a recording."""
        return None

    def __getattr__(self, method):
        if method not in STATIC_METHODS + STREAM_METHODS:
            raise AttributeError(method)

        def call(*args):
            key = _key(method, args)
            with self._lock:
                if method in STATIC_METHODS:
                    answer = self._static.get(key)
                else:
                    stream = self._streams.get(key)
                    answer = next(stream) if stream else None
            if answer is None:
                raise NvmlError(method, "not in this recording", unsupported=True)
            if "error" in answer:
                raise NvmlError.from_json(answer)
            if method in PARTIAL_METHODS:
                return PartialAnswer.from_json(answer["value"], method)
            return nvml_answers.from_json(method, answer["value"])

        return call

    def shutdown(self) -> None:
        self.xid_close()


def read_recording(path: Path) -> dict:
    """The recording at `path`, checked for what a replay reads of it; NvmlError with one line that says
    what a recording is, for the file that is not one (--nvml-replay README.md)."""
    try:
        text = read_text_capped(path, MAX_RECORDING_BYTES, follow=True)
    except OSError as exc:
        raise NvmlError("replay", f"cannot read NVML recording {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise NvmlError("replay", f"{path} is not an NVML recording (not JSON: {exc}): {WHAT_A_RECORDING_IS}") from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != FORMAT:
        raise NvmlError("replay", f"{path} is not an NVML recording (format {found!r}, want {FORMAT}): "
                                  f"{WHAT_A_RECORDING_IS}")
    calls = data.get("calls")
    if not isinstance(calls, dict) or not all(isinstance(answers, list) for answers in calls.values()):
        raise NvmlError("replay", f"{path}: \"calls\" must map each call to its list of answers: {WHAT_A_RECORDING_IS}")
    return data


def cut(source: Path, target: Path, frame: int) -> None:
    """Keep one tick of every stream: a recording whose every tick looks the same (golden tests)."""
    data = read_recording(Path(source))
    for key, answers in data["calls"].items():
        method = key.split("/", 1)[0]
        if method in STREAM_METHODS and answers:
            data["calls"][key] = [answers[min(frame, len(answers) - 1)]]
    data["note"] = f"{data.get('note', '')} (frame {frame} of {source.name})".strip()
    Path(target).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporter.nvml_replay", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the NVML and GPM samplers on this host and record every answer")
    rec.add_argument("output", type=Path)
    rec.add_argument("--seconds", type=float, default=10.0)
    rec.add_argument("--interval", type=float, default=0.5)
    rec.add_argument("--note", default="")
    cutp = sub.add_parser("cut", help="keep one tick of a recording")
    cutp.add_argument("source", type=Path)
    cutp.add_argument("target", type=Path)
    cutp.add_argument("--frame", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "cut":
        cut(args.source, args.target, args.frame)
        return 0
    from exporter.engine import Engine
    from exporter.nvml import Nvml
    from exporter.samplers.gpm import GpmSource
    from exporter.samplers.nvml import NvmlSampler

    try:
        recorder = RecordingNvml(Nvml())
    except NvmlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # The exporter's own device tick, so the recording holds exactly the calls a replay will get; the
    # values read every few seconds or every minute are read every tick here, so that every stream has
    # one answer per tick (and XID events are recorded as they come, by the sampler's own watcher).
    sampler = NvmlSampler(recorder, interval=args.interval)
    sampler.slow_every_s = sampler.health_every_s = sampler.errors_every_s = 0.0
    engine = Engine(sampler, [GpmSource(sampler)], interval=args.interval)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        engine.tick_devices()
        time.sleep(args.interval)
    sampler.close()
    recorder.save(args.output, args.note)
    print(f"recorded {sum(len(v) for v in recorder.calls.values())} answers to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
