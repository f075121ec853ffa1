"""Hand mutations, reproducible: each mutant is one text substitution in one file and the tests that
should catch it. The file is changed, the tests run, the file restored (always, also on Ctrl-C); a
mutant is caught when the tests fail. Results: bench/RESULTS.md, "Mutation review".

    python3 bench/mutations.py [--only ID ...] [--out results.json] [--list]

Run from the repository root, on a clean tree (it refuses a mutant whose text is not found exactly
once, so a mutant that no longer applies says so instead of passing as "survived").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str  # the rule the mutant breaks
    listed: bool = False  # one of the surviving mutants (issue 27, "Tests that guard")


GUARDS = "tests/test_guards.py"
REPORT_GUARDS = "tests/test_report_guards.py"
PHASES = "tests/test_diagnose_phases.py"
LEDGER = "tests/test_ledger.py"

MUTANTS = (
    # -- the survivors listed in issue 27 ----------------------------------------------------------------
    Mutant("idle-threshold-value", "exporter/workloads.py", "IDLE_TIME_SHARE = 0.01", "IDLE_TIME_SHARE = 0.1",
           (GUARDS + "::test_idle_below_one_percent_of_the_time_not_at_it",), "idle under 1 % of the time", True),
    Mutant("idle-threshold-boundary", "exporter/workloads.py", "time_share < IDLE_TIME_SHARE",
           "time_share <= IDLE_TIME_SHARE", (GUARDS + "::test_idle_below_one_percent_of_the_time_not_at_it",),
           "exactly 1 % is not idle", True),
    Mutant("time-share-clamp", "exporter/workloads.py",
           'entry["time_share"] = round(min(own * (scale if scale is not None else 1.0), 1.0), 6)',
           'entry["time_share"] = round(own * (scale if scale is not None else 1.0), 6)',
           (GUARDS + "::test_a_holders_time_share_never_exceeds_the_whole_gpu",), "a time share is at most 1", True),
    Mutant("slurm-byte-cap-boundary", "exporter/samplers/slurm.py", "if len(data) > MAX_FILE_BYTES:",
           "if len(data) >= MAX_FILE_BYTES:", (GUARDS + "::test_a_mapping_file_of_exactly_the_cap_is_read_one_byte_more_is_not",),
           "a 4096-byte mapping file is read", True),
    Mutant("slurm-file-count-listing", "exporter/samplers/slurm.py", "zip(entries, range(MAX_FILES + 1))",
           "zip(entries, range(MAX_FILES))", (GUARDS + "::test_more_than_1024_files_is_said_exactly_then",),
           "more than 1024 files is noticed", True),
    Mutant("slurm-file-count-boundary", "exporter/samplers/slurm.py", "if len(names) > MAX_FILES:",
           "if len(names) >= MAX_FILES:", (GUARDS + "::test_more_than_1024_files_is_said_exactly_then",),
           "exactly 1024 files is fine", True),
    Mutant("cgroup-cache-never-forgets", "exporter/samplers/cgroups.py",
           "self._known = {pid: owner for pid, owner in self._known.items() if pid in pids}",
           "self._known = dict(self._known)",
           (GUARDS + "::test_a_pid_that_left_the_gpu_is_forgotten_so_a_reused_pid_gets_its_new_owner",),
           "a reused pid gets its new owner", True),
    Mutant("mig-replicas-held-whole", "exporter/samplers/kubelet.py",
           "if base in devices.mig_share and replicas_of(device_id, offered) == 1:",
           "if base in devices.mig_share:", (GUARDS + "::test_a_mig_device_offered_as_replicas_is_not_held_whole",),
           "a MIG replica's instance SMs are not its holder's alone", True),
    Mutant("mig-replica-share-whole", "exporter/samplers/kubelet.py", "total += share / replicas",
           "total += share if replica_base(device_id) in devices.mig_share else share / replicas",
           (GUARDS + "::test_a_mig_device_offered_as_replicas_is_not_held_whole",),
           "a MIG replica holds its device's share over the replicas", True),
    Mutant("report-rollups-fixed-60s", "gpu_spatial/report/account.py",
           'return f"sum by ({by}) (sum_over_time({rollup(label, quantity)}{self.selector}[{window}])) * {interval:g}"',
           'return f"sum by ({by}) (sum_over_time({rollup(label, quantity)}{self.selector}[{window}])) * 60"',
           (REPORT_GUARDS + "::test_rollups_evaluated_every_30_s_give_the_scenarios_gpu_hours",),
           "rollups integrate over the rule group's interval", True),
    Mutant("report-waste-without-hidden-idle", "gpu_spatial/report/summary.py",
           'row["waste_gpu_hours"] = row[f"ledger_{HIDDEN_IDLE}_gpu_hours"] + row[f"ledger_{TIME_IDLE}_gpu_hours"]',
           'row["waste_gpu_hours"] = row[f"ledger_{TIME_IDLE}_gpu_hours"]',
           (REPORT_GUARDS + "::test_waste_is_the_ledgers_hidden_idle_plus_time_idle_never_the_allocation_views",),
           "waste = hidden idle + time idle (the ledger's, issue 35)", True),
    Mutant("report-basic-auth-not-sent", "gpu_spatial/report/promapi.py",
           'return "Basic " + base64.b64encode(basic.encode()).decode()', "return None",
           (REPORT_GUARDS + "::test_credentials_against_prometheus_with_basic_auth",),
           "basic auth reaches the server (guard runs without VictoriaMetrics)", True),
    Mutant("server-idle-deadline-header-timeout", "exporter/server.py",
           "return max(self.idle_since, self.since) + limits.idle_timeout",
           "return max(self.idle_since, self.since) + limits.header_timeout",
           (GUARDS + "::test_a_silent_connection_closes_at_the_idle_timeout_not_the_header_timeout",),
           "a silent connection closes at --http-idle-timeout", True),
    Mutant("server-keepalive-not-from-idle-timeout", "exporter/server.py",
           "timeout_keep_alive=limits.idle_timeout, ", "",
           (GUARDS + "::test_a_kept_alive_connection_lives_for_the_idle_timeout_not_uvicorns_default",),
           "keep-alive lasts --http-idle-timeout", True),
    Mutant("rule-hidden-idle-time-boundary", "rules/gpu-utilization.rules.yaml",
           "(gpu_time_utilization_ratio >= 0.8)", "(gpu_time_utilization_ratio > 0.8)",
           (GUARDS + "::test_alert_thresholds_hold_at_their_boundaries",), "HiddenIdleSMs fires at time 0.8", True),
    # -- this round's code ------------------------------------------------------------------------------
    Mutant("phases-min-length", "nsys_ingest/phases.py", "MIN_PHASE_S = 2.0", "MIN_PHASE_S = 1.5", (PHASES,),
           "a phase lasts 2 s or more"),
    Mutant("phases-min-length-boundary", "nsys_ingest/phases.py", "if runs[i][2] >= min_buckets and",
           "if runs[i][2] > min_buckets and", (PHASES,), "a run of exactly 2 s is a phase"),
    Mutant("phases-window-end-overlaps", "nsys_ingest/phases.py", '"end_ns": edges[i + 1] - 1}', '"end_ns": edges[i + 1]}',
           (PHASES,), "a phase ends before the next one's first sample"),
    Mutant("phases-short-run-joins-shorter-neighbour", "nsys_ingest/phases.py",
           "into = max(neighbours, key=lambda j: runs[j][2])", "into = min(neighbours, key=lambda j: runs[j][2])",
           (PHASES,), "a blip joins its longer neighbour"),
    Mutant("coverage-also-for-a-window", "nsys_ingest/diagnose.py",
           '_coverage(export, window) if traced and start_ns is None and end_ns is None else None',
           '_coverage(export, window) if traced else None', (PHASES,), "coverage only for whole-capture runs"),
    Mutant("engine-holders-start-with-nvml", "exporter/engine.py",
           "target = self._run_after_nvml if all(s.after_nvml for s in members) else self._run", "target = self._run",
           ("tests/test_engine_order.py",), "holder samplers start after NVML listed the GPUs"),
    Mutant("engine-export-gpu-keeps-index-0", "exporter/engine.py", "if ident.index in taken:", "if False:",
           ("tests/test_replay_uploads.py::test_replayed_gpu_is_numbered_after_nvmls_and_uploads_are_refused",),
           "an export-only GPU gets a free index"),
    Mutant("upload-stored-under-replay", "exporter/uploads.py", "if self.refuse_uploads:", "if False:",
           ("tests/test_replay_uploads.py::test_replayed_gpu_is_numbered_after_nvmls_and_uploads_are_refused",),
           "uploads to a --replay exporter are refused"),
    Mutant("upload-gpu-that-stopped-early-dropped", "exporter/nsys_exports.py",
           "for gpu, gpu_last in _last_sample_per_gpu(export, {i for", "for gpu, gpu_last in _last_sample_per_gpu(export, set() and {i for",
           ("tests/test_replay_uploads.py::test_every_gpu_of_an_upload_is_listed_and_published_even_one_that_stopped_early",),
           "every GPU of an export is published"),
    Mutant("old-era-names-from-first-event", "nsys_ingest/reader.py", "CATALOGUE_EVENTS = 32 ", "CATALOGUE_EVENTS = 1 ",
           ("tests/test_replay_uploads.py::test_an_old_era_gpu_whose_first_event_holds_a_clock_only_is_listed",),
           "an old-era GPU whose first event is partial keeps its metrics"),
    Mutant("scrub-claims-gpu-metrics", "nsys_ingest/scrub.py", "missing = [name for name in KEPT if name not in kept]",
           "missing = []", ("tests/test_output_details.py::test_scrub_says_what_it_kept",), "scrub says what it kept"),
    # -- the ledger (issue 35): every GPU-second in exactly one cell ---------------------------------------
    *(Mutant(f"ledger-{name}", path, old, new, tests, why) for name, path, old, new, tests, why in (
        ("switch-not-taken-out", "exporter/ledger.py", "room = 1.0 - switch", "room = 1.0", (LEDGER,),
         "switch overhead is its own cell, not idle time"),
        ("shares-past-the-gpu-not-scaled", "exporter/ledger.py",
         "scale = cap / attributed if attributed > cap + EPSILON else 1.0", "scale = 1.0", (LEDGER,),
         "time shares past the GPU's time are scaled down"),
        ("work-above-time", "exporter/ledger.py", "work = min(u.sm * scale, time)", "work = u.sm * scale", (LEDGER,),
         "a holder's work is at most its time"),
        ("idle-not-by-held-share", "exporter/ledger.py", "mine[h][TIME_IDLE] = idle * share / whole",
         "mine[h][TIME_IDLE] = idle / len(held)", (LEDGER,), "time idle is split by held share"),
        ("held-past-the-gpu", "exporter/ledger.py", "whole = max(known, 1.0)", "whole = 1.0", (LEDGER,),
         "held shares past 1 split the idle time, never count it twice"),
        ("unknown-held-called-unheld", "exporter/ledger.py",
         "gpu_cells[UNATTRIBUTED_TIME_IDLE if None in held.values() else UNHELD] = free", "gpu_cells[UNHELD] = free",
         (LEDGER,), "idle time beyond unknown shares is not known to be unheld"),
        ("cupti-hidden-split-without-every-client", "exporter/ledger.py",
         "if concurrent and gpu.complete and gpu.sm is not None", "if concurrent and gpu.sm is not None", (LEDGER,),
         "MPS hidden idle is split only where every client traces"),
        ("cupti-hidden-split-by-held", "exporter/ledger.py", "hidden * u.time / total if total > 0 else 0.0",
         "hidden * u.held if total > 0 else 0.0", (LEDGER,), "MPS hidden idle goes by kernel-busy shares"),
        ("unattributed-work-past-busy", "exporter/ledger.py",
         "unattributed_work = min(max(gpu.sm - work, 0.0), rest)", "unattributed_work = max(gpu.sm - work, 0.0)",
         (LEDGER,), "unattributed work is at most the busy time nobody's share covers"),
        ("unmeasured-called-idle", "exporter/ledger.py",
         "gpu_cells[UNMEASURED] = max(room - known_busy, 0.0)  # busy or idle: nobody can tell\n        idle = 0.0",
         "gpu_cells[UNMEASURED] = 0.0\n        idle = max(room - known_busy, 0.0)", (LEDGER,),
         "without the GPU's busy time the rest is unmeasured, not idle"),
        ("lost-gpu-kept", "exporter/ledger.py", "                del self._gpus[uuid]", "                pass",
         (LEDGER,), "a GPU that is gone leaves the ledger: its series end"),
        ("observed-not-counted", "exporter/ledger.py", "book.observed += dt", "book.observed += 0.0", (LEDGER,),
         "observed seconds are the wall clock"),
        ("window-switch-ignored", "exporter/workloads.py", "sm, window.switch_overhead or 0.0, complete)",
         "sm, 0.0, complete)", (LEDGER,), "a ctxsw window's gaps are switch overhead"),
        ("window-busy-from-nvml", "exporter/workloads.py", "return ledger.GpuUse(sum(s.time for s in shares), sm,",
         "return ledger.GpuUse(view.time_utilization, sm,", (LEDGER,), "under ctxsw the window's own busy time"),
        ("ctxsw-gap-across-chunks-lost", "nsys_ingest/ctxsw.py", "            self.last_end = int(max(reached[-1], ends[-1]))\n",
         "", ("tests/test_ctxsw.py::test_switch_overhead_is_the_gaps_between_slices_not_the_windows_idle_edges",),
         "a gap between slices read in two chunks counts once"),
        ("ctxsw-edges-as-switches", "nsys_ingest/ctxsw.py",
         '"switch_between_share": round(min(gpu.between, gap_s) / length, 6)',
         '"switch_between_share": round(gap_s / length, 6)',
         ("tests/test_ctxsw.py::test_switch_overhead_is_the_gaps_between_slices_not_the_windows_idle_edges",),
         "the window's idle edges are not switch overhead"),
        ("report-lower-bound-ignores-unsplit", "gpu_spatial/report/summary.py",
         'row["waste_is_lower_bound"] = bool(row[f"ledger_{BUSY_UNSPLIT}_gpu_hours"] > 1e-9 or',
         'row["waste_is_lower_bound"] = bool(False or', (REPORT_GUARDS,), "unsplit busy time makes waste a lower bound"),
        ("report-gpu-ledger-observed-twice", "gpu_spatial/report/account.py", "                    out.observed += value",
         "                    out.observed += 2 * value", ("tests/test_account_history.py",),
         "the GPU-hours that existed are the observed counters"),
    )),
    # -- older rules --------------------------------------------------------------------------------------
    Mutant("verdict-idle-boundary", "nsys_ingest/verdicts.py", "if e.time_utilization < IDLE_BELOW:",
           "if e.time_utilization <= IDLE_BELOW:", ("tests/test_verdicts.py",), "idle under 5 %"),
    Mutant("verdict-saturated-boundary", "nsys_ingest/verdicts.py",
           "if e.sm_active is not None and e.sm_active >= SATURATED_SM:",
           "if e.sm_active is not None and e.sm_active > SATURATED_SM:", ("tests/test_verdicts.py",),
           "saturated at SM active 80 %"),
    Mutant("verdict-memory-bound-boundary", "nsys_ingest/verdicts.py", "e.dram_active < MEMORY_BOUND_DRAM:",
           "e.dram_active <= MEMORY_BOUND_DRAM:", ("tests/test_verdicts.py",), "memory-bound at DRAM 60 %"),
    Mutant("verdict-rule-order", "nsys_ingest/verdicts.py",
           '("mps_server_paging", _mps_server_paging), ("idle", _idle), ("memory_bound", _memory_bound),\n         ("saturated", _saturated),',
           '("mps_server_paging", _mps_server_paging), ("idle", _idle), ("saturated", _saturated),\n         ("memory_bound", _memory_bound),',
           ("tests/test_verdicts.py",), "memory-bound before saturated"),
    Mutant("trace-mps-overlap-boundary", "nsys_ingest/diagnose.py",
           'return "mps" if summary["short_kernel_overlap"] >= CONCURRENT_KERNELS else "time_sliced"',
           'return "mps" if summary["short_kernel_overlap"] > CONCURRENT_KERNELS else "time_sliced"',
           ("tests/test_verdicts.py", "tests/test_diagnose.py"), "short kernels overlapping 1.2x read MPS"),
    Mutant("summary-busy-idle-boundary", "nsys_ingest/analysis.py",
           "((gr[both] >= BUSY_GR) & (sm[both] <= IDLE_SM))", "((gr[both] > BUSY_GR) & (sm[both] <= IDLE_SM))",
           ("tests/test_nsys_ingest.py", GUARDS + "::test_busy_but_idle_counts_gr_active_of_exactly_80_percent"),
           "busy-but-idle counts GR active exactly 0.8"),
    Mutant("live-hidden-idle-negative", "exporter/chain.py", "hidden = round(max(0.0, busy - spatial.sm_active), 6)",
           "hidden = round(busy - spatial.sm_active, 6)", ("tests/test_source_guards.py", "tests/test_sampling.py"),
           "hidden idle is never negative"),
    Mutant("workload-hidden-idle-negative", "exporter/workloads.py", '"hidden_idle": (basis, max(0.0, time_share - sm))',
           '"hidden_idle": (basis, time_share - sm)',
           ("tests/test_workloads.py", GUARDS + "::test_a_holders_hidden_idle_is_never_negative"),
           "a holder's hidden idle is never negative"),
    Mutant("workload-stalled-gap-integrated", "exporter/workloads.py",
           "min(max(now - self._last, 0.0), MAX_STEP_S)", "max(now - self._last, 0.0)", ("tests/test_workloads.py",),
           "a stalled engine's gap is not integrated"),
    Mutant("slurm-jobs-share-evenly", "exporter/workloads.py", "out[Holder(hpc_job=job)] = round(1.0 / len(jobs), 9)",
           "out[Holder(hpc_job=job)] = 1.0", ("tests/test_workloads.py",), "jobs of one GPU share it evenly"),
    Mutant("dcgm-frozen-boundary", "exporter/samplers/dcgm.py", "now - seen[1] >= self.frozen_after_s",
           "now - seen[1] > self.frozen_after_s",
           ("tests/test_dcgm_chain.py", "tests/test_source_guards.py",
            GUARDS + "::test_dcgm_values_are_frozen_after_exactly_the_frozen_time"),
           "frozen after exactly --dcgm-frozen-after"),
    Mutant("log-once-per-problem", "exporter/snapshot.py", "if self._current.get(key) == (kind or message):\n                return",
           "if False:\n                return", ("tests/test_source_guards.py", "tests/test_faults.py"),
           "one log line per problem, not per tick"),
    Mutant("spool-keeps-newest", "exporter/spool.py", "keep.add(uploads[-1][2].resolve())", "pass",
           ("tests/test_spool.py",), "the newest upload is never removed"),
    Mutant("rule-stuck-age-boundary", "rules/gpu-utilization.rules.yaml",
           "(max by (instance, uuid) (time() - gpu_spatial_sample_timestamp_seconds) > 60)",
           "(max by (instance, uuid) (time() - gpu_spatial_sample_timestamp_seconds) > 600)",
           ("tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests",), "SpatialSourceStuck after 60 s of age"),
    Mutant("rule-hidden-idle-sm-boundary", "rules/gpu-utilization.rules.yaml",
           "(max by (instance, uuid) (gpu_sm_active_ratio) <= 0.5)", "(max by (instance, uuid) (gpu_sm_active_ratio) < 0.5)",
           (GUARDS + "::test_alert_thresholds_hold_at_their_boundaries", "tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests"),
           "HiddenIdleSMs fires at SM active 0.5"),
)


def run_mutant(mutant: Mutant) -> dict:
    path = ROOT / mutant.path
    original = path.read_text()
    found = original.count(mutant.old)
    if found != 1:
        return {**asdict(mutant), "result": "not applicable", "detail": f"text found {found} times"}
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutant.old, mutant.new))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutant.tests],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            result = "survived" if done.returncode == 0 else ("caught" if done.returncode == 1 else
                                                               f"error (pytest exit {done.returncode})")
            tail = (done.stdout.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            result, tail = "caught (timeout)", f"tests ran past {TIMEOUT_S} s"
    finally:
        path.write_text(original)
    return {**asdict(mutant), "result": result, "detail": tail, "seconds": round(time.monotonic() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id:42} {m.path:36} {m.why}")
        return 0
    results = []
    for mutant in chosen:
        result = run_mutant(mutant)
        results.append(result)
        print(f"{result['result']:18} {mutant.id:42} {result.get('seconds', '')!s:>6} s  {result['detail']}", flush=True)
    caught = sum(r["result"].startswith("caught") for r in results)
    print(f"{len(results)} mutants, {caught} caught, "
          f"{sum(r['result'] == 'survived' for r in results)} survived, "
          f"{sum(r['result'] not in ('survived',) and not r['result'].startswith('caught') for r in results)} other")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
