"""Live per-process time and SM shares of time-sliced GPUs, from the GPU's own context switches.

Opt-in (`--workload-ctxsw`): every `--ctxsw-period` (180 s) it runs, in its own thread and never on the
scrape path,

    nsys profile --gpuctxsw=true --trace=none --gpu-metrics-devices=I,J --gpu-metrics-frequency=500 \\
        --sample=none --cpuctxsw=none -o DIR/ctxsw -f true sleep WINDOW
    nsys export --type sqlite -o DIR/ctxsw.sqlite -f true DIR/ctxsw.nsys-rep

system-wide (as root): one capture for every GPU it serves. It attributes the export with
nsys_ingest.ctxsw.attribute (the same function as `gpu-spatial nsys workloads`) in a child process
(`python -m exporter.samplers.ctxsw EXPORT`), so that the memory the attribution needs (numpy, the export's
rows: 55-110 MB) goes back to the system when the child ends and the exporter stays at its own size; removes
its files, and keeps per GPU: each pid's time share and SM active (as a share of the
GPU) over the window, the window's wall time, and the pids NVML listed on the GPU during it.
exporter/workloads.py joins them with the holders (basis "ctxsw").

Where it cannot run it says why per GPU (state unsupported: no nsys, not root, MPS, MIG, DCGM
profiling the GPU, a GPU or driver that records no switches; error: a capture that failed) and the
workload view keeps the NVML basis. A window older than `max_age` (2 periods and a window) is dropped.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from exporter import heap
from exporter.config import duration
from exporter.nsys_exports import CaptureError, NsysRunner, last_line, read_export
from exporter.sampler import LatestWindows, ProcessShare, ProcessWindow, SourceState
from exporter.sources import profiled_by
from exporter.snapshot import CollectorHealth, LogOnce
from exporter.vocabulary import ACTIVE, CTXSW, ERROR, MPS_CLIENT, MPS_SERVER, STANDBY, UNSUPPORTED

if TYPE_CHECKING:  # loaded where a window is attributed: every exporter imports this module for its flags
    from nsys_ingest.attribution import Attribution

log = logging.getLogger(__name__)
STARTUP_GRACE_S = 120.0  # nsys' own start and finish around the window (its daemon, the report)
EXPORT_TIMEOUT_S = 120.0  # `nsys export` of a 10 s window at 500 Hz takes about a second
READ_BUDGET_S = 60.0
CHILD_START_S = 30.0  # the attribution's child: Python and its imports, on a loaded node
MAX_ANSWER_BYTES = 4 << 20  # the child's output read back (its answer is the last line): far above a window's processes
NVML_WAIT_S = 15.0  # at start the first capture waits this long at most for NVML's first look at the GPUs
MPS = "MPS: all clients share one context, so the trace has no per-client slices"
MIG = "MIG: every instance is its own GPU; the GPU has no time slices to split"
PROFILED = "{name} profiles this GPU and nsys cannot sample its metrics at the same time (pause {name} profiling: {pause})"
DCGM = PROFILED.format(name="DCGM", pause="dcgmi profile --pause")  # what it says where DCGM profiles the GPU
NOT_ROOT = "needs root: nsys traces GPU context switches system-wide only as root"
NO_SWITCHES = ("no context switches recorded while {n} processes ran on it: this GPU or its driver does not "
               "trace them")
ALONE = "fewer than two processes ran in the window: nothing to split (a process alone is exact without it)"
# The default duty: one capture of WINDOW_S every PERIOD_S (bench/cost_per_gpu.py models the cost per GPU from these).
WINDOW_S = 10.0
PERIOD_S = 180.0


def add_arguments(parser) -> None:
    g = parser.add_argument_group("ctxsw")
    g.add_argument("--workload-ctxsw", action="store_true",
                   help="time shares and SM activity per holder from the GPUs' own context switches: runs `nsys "
                        "profile --gpuctxsw=true` system-wide (as root; --nsys-binary) for --ctxsw-window every "
                        "--ctxsw-period (basis ctxsw; where it cannot run the NVML basis stays)")
    g.add_argument("--ctxsw-window", type=duration, default=WINDOW_S, help="length of one context-switch capture")
    # 180 s at 500 Hz: a window costs ~2.4 s of CPU (mostly nsys' own agent, which a lower frequency hardly
    # changes), so the exporter with pods as holders measured 2.6 % of a core over 10 minutes on the H200
    # (bench/RESULTS.md, issue 26); at 120 s and 1 kHz it was 3.9 %.
    g.add_argument("--ctxsw-period", type=duration, default=PERIOD_S,
                   help="one capture starts every this long (the duty is window / period)")
    # 500 Hz: 2 ms samples over ~2 ms slices; the fit's error of SM active against the 10 kHz truth is 0.009
    # of the GPU at 500 Hz, 0.006 at 1 kHz, for a third less CPU per window
    g.add_argument("--ctxsw-frequency", type=int, default=500, help="GPU metrics sampling frequency of the captures, Hz")
    g.add_argument("--ctxsw-estimator", choices=("fit", "overlap", "at", "within"), default="fit",
                   help="how GPU metrics samples are given to the time slices (nsys-ingest workloads --estimator)")


def check_arguments(args) -> str | None:
    """Why the flags cannot work together (one line), or None."""
    if not args.workload_ctxsw:
        return None
    if not 1.0 <= args.ctxsw_window < args.ctxsw_period:
        return (f"--ctxsw-window {args.ctxsw_window:g}s must be at least 1 s and shorter than --ctxsw-period "
                f"{args.ctxsw_period:g}s")
    if args.nsys_live:
        return ("--workload-ctxsw and --nsys-live would both sample the GPUs' metrics with nsys, which one "
                "session at a time can do: choose one")
    if not 10 <= args.ctxsw_frequency <= 10000:
        return (f"--ctxsw-frequency {args.ctxsw_frequency}: give 10 to 10000 Hz (500 resolves ~2 ms slices; "
                "10 kHz already makes ~180 MB a second of raw stream)")
    return None


def build(args, nvml, spatial):
    """The sampler the flags ask for (--workload-ctxsw), or None."""
    if not args.workload_ctxsw:
        return None
    return CtxswSampler(nvml, args.nsys_binary, args.ctxsw_window, args.ctxsw_period, args.ctxsw_frequency,
                        args.ctxsw_estimator, other_sources=spatial)


def profile_command(binary: str, devices: str, frequency: int, out: Path, seconds: float) -> list[str]:
    """The capture: context switches and GPU metrics of `devices` ("0,1"), system-wide, for `seconds`;
    nothing else traced (no CUDA API, no CPU sampling), so the cost to the workloads stays small."""
    return [binary, "profile", "--gpuctxsw=true", "--trace=none", f"--gpu-metrics-devices={devices}",
            f"--gpu-metrics-frequency={frequency}", "--sample=none", "--cpuctxsw=none", "-o", str(out), "-f", "true",
            "sleep", f"{seconds:g}"]


class CtxswSampler(LatestWindows):
    """An exporter.sampler.WorkloadSource of basis ctxsw."""

    name = "ctxsw"
    basis = CTXSW
    description = "GPU context-switch source of workload time shares (--workload-ctxsw)"
    not_yet = "the first window has not been captured yet"
    child = ("-m", "exporter.samplers.ctxsw")  # the attribution's process: Python's arguments before the export
    stalled = " (captures stalled)"

    def __init__(self, nvml, binary: str = "nsys", window_s: float = WINDOW_S, period_s: float = PERIOD_S,
                 frequency: int = 500, estimator: str | None = None, other_sources=None):
        self._nvml = nvml  # NvmlSampler: the GPUs, their process lists and modes
        self.binary = binary
        self.window_s = window_s
        self.interval = period_s
        self.frequency = frequency
        self.estimator = estimator  # None: the attribution's default (nsys_ingest.ctxsw, which loads numpy: not here)
        self.max_age = 2 * period_s + window_s
        self._others = other_sources or {}  # name -> spatial source (dcgm: its profiling excludes ours)
        self.readings: dict[str, ProcessWindow] = {}  # GPU UUID -> the last window
        self.states: dict[str, SourceState] = {}
        self.health = CollectorHealth(True, 0.0, "")
        self._log = LogOnce(log)
        self._stopping = threading.Event()
        self._runner = NsysRunner(self._stopping)
        self._work: Path | None = None  # the capture's directory while one runs
        self.attribution: dict = {}  # the last attribution's child: its CPU seconds (of them start-up) and peak bytes

    # -- one tick: one window -----------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        try:
            self._tick()
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.clear("ctxsw")
        except (CaptureError, OSError, subprocess.SubprocessError) as exc:
            self._log.problem("ctxsw", str(exc))
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
        finally:
            heap.give_back()  # what the window freed (its steps' output, the answer) leaves the exporter's RSS

    def _set(self, uuid: str, state: SourceState, quiet: bool = False) -> None:
        """`quiet`: the problem is the whole source's, logged once under "ctxsw", not per GPU."""
        self.states[uuid] = state
        if state.state != ACTIVE:
            self.readings.pop(uuid, None)  # a window that cannot be refreshed is not kept
        if state.state in (UNSUPPORTED, ERROR) and not quiet:
            self._log.problem(f"ctxsw GPU {uuid}", f"{state.state}: {state.reason}")
        else:
            self._log.clear(f"ctxsw GPU {uuid}")

    def _nvml_ready(self) -> list:
        """The GPUs with NVML's telemetry of them (their processes and modes decide what is captured). At
        start every sampler ticks at once: the first capture waits for NVML's first tick, not a period."""
        deadline = time.monotonic() + NVML_WAIT_S
        while True:
            gpus = list(getattr(self._nvml, "gpus", ()))
            telemetry = getattr(self._nvml, "telemetry", {})
            if (gpus and all(g.uuid in telemetry for g in gpus)) or time.monotonic() > deadline:
                return gpus
            if self._stopping.wait(0.2):
                return []

    def _tick(self) -> None:
        gpus = self._nvml_ready()
        for uuid in set(self.states) - {g.uuid for g in gpus}:  # GPUs that left
            self.states.pop(uuid, None)
            self.readings.pop(uuid, None)
        binary = shutil.which(self.binary)
        refusal = (f"nsys not found ({self.binary}): install Nsight Systems or give --nsys-binary" if binary is None
                   else NOT_ROOT if os.geteuid() != 0 else None)
        if refusal and gpus:
            for gpu in gpus:
                self._set(gpu.uuid, SourceState(UNSUPPORTED, refusal), quiet=True)
            raise CaptureError(refusal)
        targets = []
        for gpu in gpus:
            why = self._refused(gpu.uuid)
            if why:
                self._set(gpu.uuid, SourceState(UNSUPPORTED, why))
            else:
                targets.append(gpu)
        if not targets:
            return
        before = self._listed(targets)
        try:
            result, ended = self._capture(binary, targets)
        except CaptureError as exc:
            for gpu in targets:
                self._set(gpu.uuid, SourceState(ERROR, str(exc)), quiet=True)
            raise
        if result is None:  # stopping
            return
        after = self._listed(targets)
        found = {g.uuid: g for g in result.gpus if g.uuid}
        by_index = {g.gpu: g for g in result.gpus}
        start, end = ended - (result.window_s[1] - result.window_s[0]), ended
        for gpu in targets:
            entry = found.get(gpu.uuid) or (by_index.get(gpu.index) if not found else None)
            listed = frozenset(before[gpu.uuid] | after[gpu.uuid])
            if entry is None:
                many = len(listed)
                self._set(gpu.uuid, SourceState(STANDBY, ALONE) if many < 2 else
                          SourceState(UNSUPPORTED, NO_SWITCHES.format(n=many)))
                continue
            shares = {p.pid: ProcessShare(time=p.time_share, sm=p.of_gpu.get("sm_active"))
                      for p in entry.processes if p.pid is not None}
            self.readings[gpu.uuid] = ProcessWindow(basis=CTXSW, window_start=start, window_end=end, listed=listed,
                                                    shares=shares, switch_overhead=entry.switch_between_share)
            stopped = entry.fit_unconverged
            self._set(gpu.uuid, SourceState(
                ACTIVE, f"{entry.slices} slices of {len(shares)} processes in {end - start:.1f} s, switch gaps "
                        f"{entry.switch_gap_share:.1%}, estimator {result.estimator}"
                        + (f" (stopped at its cap before converging: {', '.join(stopped)})" if stopped else "")
                        + self._attribution_cost(),
                start, end))

    def _attribution_cost(self) -> str:
        cpu, peak = self.attribution.get("cpu_s"), self.attribution.get("peak_rss_bytes")
        if cpu is None or peak is None:
            return ""
        startup = self.attribution.get("startup_cpu_s")
        return (f"; attributed in a child process: {cpu:.2f} s CPU"
                + (f" ({startup:.2f} s of it start-up)" if startup is not None else "") + f", peak {peak / 2**20:.0f} MiB")

    def _refused(self, uuid: str) -> str | None:
        tel = getattr(self._nvml, "telemetry", {}).get(uuid)
        if tel is not None and tel.mig_enabled:
            return MIG
        if tel is not None and any(p.kind in (MPS_CLIENT, MPS_SERVER) for p in tel.compute_processes or ()):
            return MPS
        profiler = profiled_by(self._others, uuid)
        if profiler is not None:
            return PROFILED.format(name=profiler[0].upper(), pause=profiler[1])
        return None

    def _listed(self, targets) -> dict[str, set[int]]:
        telemetry = getattr(self._nvml, "telemetry", {})
        out = {}
        for gpu in targets:
            tel = telemetry.get(gpu.uuid)
            out[gpu.uuid] = {p.pid for p in (tel.compute_processes or ())} if tel is not None else set()
        return out

    def _capture(self, binary: str, targets) -> tuple[Attribution | None, float]:
        """(attribution of one window, wall time it ended); (None, _) when the exporter is stopping."""
        work = self._work = Path(tempfile.mkdtemp(prefix="gpu-exporter-ctxsw-"))
        try:
            devices = ",".join(str(g.index) for g in targets)
            self._runner.run(profile_command(binary, devices, self.frequency, work / "ctxsw", self.window_s),
                             self.window_s + STARTUP_GRACE_S, "nsys profile")
            # the window's wall time is ours: a replayed or clock-skewed export's own start time is not
            ended = time.time()
            if self._stopping.is_set():
                return None, ended
            rep = work / "ctxsw.nsys-rep"
            if not rep.is_file():
                raise CaptureError("nsys profile wrote no report (ctxsw.nsys-rep)")
            self._runner.run([binary, "export", "--type", "sqlite", "-o", str(work / "ctxsw.sqlite"), "-f", "true",
                              str(rep)], EXPORT_TIMEOUT_S, "nsys export")
            if self._stopping.is_set():
                return None, ended
            out = self._runner.run([sys.executable, *self.child, str(work / "ctxsw.sqlite"),
                                    *(["--estimator", self.estimator] if self.estimator else []), "--nsys", binary,
                                    "--window", f"{self.window_s:g}", "--budget", f"{READ_BUDGET_S:g}"],
                                   READ_BUDGET_S + CHILD_START_S, "the attribution", keep=MAX_ANSWER_BYTES)
            if self._stopping.is_set():
                return None, ended
            answer = child_answer(out)
            self.attribution = {k: answer[k] for k in CHILD_COST_KEYS if k in answer}
            if "error" in answer:
                raise CaptureError(f"the capture's export is unreadable: {answer['error']}")
            from nsys_ingest.attribution import Attribution

            try:
                return Attribution.from_json(answer["result"]), ended
            except (KeyError, TypeError, ValueError) as exc:
                raise CaptureError(f"the attribution answered no result: {type(exc).__name__}: {exc}"[:300]) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
            self._work = None

    def close(self) -> None:
        """Stops a capture in progress (its files go with the tick's clean-up)."""
        self._runner.stop()
        work = self._work
        if work is not None:  # the exporter may exit before the capture's thread cleans up
            shutil.rmtree(work, ignore_errors=True)


BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the child's numpy: one thread
CHILD_COST_KEYS = ("cpu_s", "startup_cpu_s", "peak_rss_bytes")  # what the child says of its own cost


def child_answer(out: str) -> dict:
    """The child's last output line, its JSON answer: {"result"} or {"error"}, with its CPU and peak memory."""
    line = last_line(out)
    try:
        answer = json.loads(line) if line else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not ("result" in answer or "error" in answer):
        raise CaptureError(f"the attribution answered no result: {(line or 'no output')[:300]}")
    return answer


def attribute_export(path: str, estimator: str, binary: str = "nsys", window_s: float = 10.0,
                     budget_s: float = READ_BUDGET_S) -> Attribution:
    """nsys_ingest.ctxsw.attribute of one capture's export, read as untrusted input within budget_s: a window
    without any context switch (nothing to split, or a GPU that records none) attributes to no GPU."""
    from nsys_ingest.attribution import Attribution
    from nsys_ingest.ctxsw import EVENTS, NoSwitches, attribute
    from nsys_ingest.reader import Budget

    nothing = Attribution(file="", estimator=estimator, sampling_hz=None, window_s=(0.0, window_s), window_utc_s=None,
                          quantities=(), gpus=())
    try:
        return read_export(path, lambda export: attribute(export, estimator=estimator) if EVENTS in export.tables
                           else nothing, binary, require_metrics=False, budget=Budget(budget_s))
    except NoSwitches:
        return nothing


def peak_memory_bytes() -> int | None:
    """This process's peak resident memory (VmHWM), where /proc says it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv=None) -> int:
    """The attribution's child: python -m exporter.samplers.ctxsw EXPORT [--estimator E] [--nsys BIN]. Its
    answer is one JSON line on stdout; its memory goes back to the system when it ends."""
    import argparse

    from nsys_ingest.ctxsw import DEFAULT_ESTIMATOR
    from nsys_ingest.reader import IngestError

    startup_cpu_s = time.process_time()  # Python and its imports: what every window pays before reading a row
    p = argparse.ArgumentParser(prog="python -m exporter.samplers.ctxsw", description=main.__doc__.split(":")[0])
    p.add_argument("export")
    p.add_argument("--estimator", default=DEFAULT_ESTIMATOR)
    p.add_argument("--nsys", default="nsys")
    p.add_argument("--window", type=float, default=10.0, help="the capture's length, seconds")
    p.add_argument("--budget", type=float, default=READ_BUDGET_S, help="the most the read may take, seconds")
    args = p.parse_args(argv)
    try:
        answer = {"result": attribute_export(args.export, args.estimator, args.nsys, args.window, args.budget).to_json()}
    except IngestError as exc:
        answer = {"error": str(exc)}
    answer.update(cpu_s=round(time.process_time(), 3), startup_cpu_s=round(startup_cpu_s, 3),
                  peak_rss_bytes=peak_memory_bytes())
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    # The child's numpy with one BLAS thread, set before it loads: the fit's matrices are at most 257 x 257, and
    # OpenBLAS starts a thread per core at import (one more thread cost 0.04 s of every start-up here; an H200 host
    # has 32 cores)
    os.environ.update(dict.fromkeys(BLAS_THREADS, "1"))
    sys.exit(main())
