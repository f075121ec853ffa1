"""Mutations, reproducible: each hand mutant is one substitution in one file and the tests that should catch
it; generated mutants are every operator of a named function. The file is changed, the tests run, the file
restored (always, also on Ctrl-C); a mutant is caught when the tests fail. Results: bench/RESULTS.md,
"Mutation review".

    python3 bench/mutations.py [--only ID ...] [--module PATH ...] [--out results.json] [--list] [--check]
    python3 bench/mutations.py --module exporter/holders.py --without tests/test_edge_guards.py  # "before"
    python3 bench/mutations.py --rerun results.json   # only the mutants that survived that run
    python3 bench/mutations.py --function exporter/workloads.py:gpu_shares --tests tests/test_workloads.py

Run from the repository root, on a clean tree. A hand mutant survives refactors (tests/mutants.py): its
`old` is matched as written, else by its tokens (whitespace, line breaks, comments, quotes and trailing commas
do not count), inside its `function` when it names one, wherever that function now stands in the file or in
its package; a test named in a file it left is followed to the file that holds it. A mutant that does not
match exactly once is refused ("not applicable"), never counted as survived. `--function PATH:NAME` needs no
table: each comparison of the function flipped, each constant off by one, each min/max clamp, `not` dropped
and each and/or swapped, all to be caught by `--tests`. The tests of a mutant are pytest arguments (files,
node ids, `-k` expressions): targeted, never the whole suite. `--without FILE` drops a test file from every
mutant (the survival rate before the tests it holds); the summary gives the rate per module.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.mutants import Mutant, NotApplicable, apply, locate, operator_mutants, resolve_tests

TIMEOUT_S = 600


GUARDS = "tests/test_guards.py"
REPORT_GUARDS = "tests/test_report_guards.py"
PHASES = "tests/test_diagnose_phases.py"
LEDGER = "tests/test_ledger.py"
DRA, HTTP = "tests/test_dra.py", "tests/test_bounded_http.py"
KUBELET = ("tests/test_kubelet.py::test_a_list_answer_is_read_up_to_its_bounds_and_the_rest_counted_in_one_problem",
           "tests/test_kubelet.py::test_a_list_answer_is_parsed_a_pod_at_a_time_up_to_the_bound",
           "tests/test_kubelet.py::test_a_kubelet_listing_more_pods_than_are_read_or_garbled_ones_is_the_ticks_problem")
CLAIMS = DRA + "::test_a_kubelet_listing_too_many_containers_or_devices_costs_a_bounded_pass"

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
    Mutant("slurm-byte-cap-boundary", "exporter/samplers/slurm.py", "data = read_capped(folder / name, MAX_FILE_BYTES)",
           "data = read_capped(folder / name, MAX_FILE_BYTES - 1)", (GUARDS + "::test_a_mapping_file_of_exactly_the_cap_is_read_one_byte_more_is_not",),
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
           "for q, unknown, expr in plan.rule_queries(window, span.step * span.weight))",
           "for q, unknown, expr in plan.rule_queries(window, 60.0 * span.weight))",
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
        ("join-cupti-not-concurrent", "exporter/workloads.py", "concurrent=entry.time_share_basis == CUPTI)",
         "concurrent=False)", (LEDGER,), "MPS clients' overlapping time shares are not laid side by side"),
        ("join-untraced-client-ignored", "exporter/workloads.py", "complete = compute is not None and compute <= timed",
         "complete = compute is not None", (LEDGER,), "a client that does not trace leaves the hidden idle unattributed"),
        ("ctxsw-gap-across-chunks-lost", "nsys_ingest/ctxsw.py", "            self.last_end = int(max(reached[-1], ends[-1]))\n",
         "", ("tests/test_ctxsw.py::test_switch_overhead_is_the_gaps_between_slices_not_the_windows_idle_edges",),
         "a gap between slices read in two chunks counts once"),
        ("ctxsw-edges-as-switches", "nsys_ingest/ctxsw.py",
         'switch_between_share=round(min(gpu.between, gap_s) / length, 6)',
         'switch_between_share=round(gap_s / length, 6)',
         ("tests/test_ctxsw.py::test_switch_overhead_is_the_gaps_between_slices_not_the_windows_idle_edges",),
         "the window's idle edges are not switch overhead"),
        ("report-lower-bound-ignores-unsplit", "gpu_spatial/report/summary.py",
         'row["waste_is_lower_bound"] = bool(row[f"ledger_{BUSY_UNSPLIT}_gpu_hours"] > 1e-9 or',
         'row["waste_is_lower_bound"] = bool(False or', (REPORT_GUARDS,), "unsplit busy time makes waste a lower bound"),
        ("report-ledger-rollups-lose-the-cell", "gpu_spatial/report/account.py",
         'queries.append((LEDGER, False, summed(rollup(label, LEDGER), f"{label}, cell")))',
         'queries.append((LEDGER, False, summed(rollup(label, LEDGER), label)))',
         ("tests/test_account_history.py::test_rollups_equal_the_counters_in_every_column",),
         "the rollups keep each ledger cell apart"),
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
           '("memory_bound", _memory_bound),\n         ("saturated", _saturated),',
           '("saturated", _saturated),\n         ("memory_bound", _memory_bound),',
           ("tests/test_verdicts.py",), "memory-bound before saturated"),
    Mutant("trace-mps-overlap-boundary", "nsys_ingest/diagnose.py",
           'return MPS if summary["short_kernel_overlap"] >= CONCURRENT_KERNELS else TIME_SLICED',
           'return MPS if summary["short_kernel_overlap"] > CONCURRENT_KERNELS else TIME_SLICED',
           ("tests/test_verdicts.py", "tests/test_diagnose.py"), "short kernels overlapping 1.2x read MPS"),
    Mutant("summary-busy-idle-boundary", "nsys_ingest/analysis.py",
           "((gr[both] >= BUSY_GR) & (sm[both] <= IDLE_SM))", "((gr[both] > BUSY_GR) & (sm[both] <= IDLE_SM))",
           ("tests/test_nsys_ingest.py", GUARDS + "::test_busy_but_idle_counts_gr_active_of_exactly_80_percent"),
           "busy-but-idle counts GR active exactly 0.8"),
    Mutant("live-hidden-idle-negative", "exporter/chain.py", "hidden = round(max(0.0, busy - spatial.sm_active), 6)",
           "hidden = round(busy - spatial.sm_active, 6)", ("tests/test_source_guards.py", "tests/test_sampling.py"),
           "hidden idle is never negative"),
    Mutant("workload-hidden-idle-negative", "exporter/workloads.py", 'HIDDEN_IDLE: {basis: max(0.0, time_share - sm)}',
           'HIDDEN_IDLE: {basis: time_share - sm}',
           ("tests/test_workloads.py", GUARDS + "::test_a_holders_hidden_idle_is_never_negative"),
           "a holder's hidden idle is never negative"),
    Mutant("workload-stalled-gap-integrated", "exporter/workloads.py",
           "min(max(now - self._last, 0.0), MAX_STEP_S)", "max(now - self._last, 0.0)", ("tests/test_workloads.py",),
           "a stalled engine's gap is not integrated"),
    Mutant("slurm-jobs-share-evenly", "exporter/samplers/slurm.py",
           "Held(round(1.0 / len(ids), 9), EVEN_SPLIT) for job in ids}", "Held(1.0, EVEN_SPLIT) for job in ids}", ("tests/test_workloads.py",), "jobs of one GPU share it evenly"),
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
    # -- issue 39, attacks 4-7: answers of the API server and the kubelet -------------------------------
    Mutant("http-read-deadline-per-call", "hostio/answers.py",
           "    while True:\n        sock.settimeout(left(deadline))\n        chunk = sock.recv(READ_BYTES)",
           "    while True:\n        chunk = sock.recv(READ_BYTES)",
           (DRA + "::test_a_request_ends_by_its_own_deadline_and_by_the_ticks",),
           "every read gets what is left of one deadline, not a timeout of its own"),
    Mutant("http-body-cap-boundary", "hostio/answers.py", "if len(raw) - head_end > max_bytes:",
           "if len(raw) - head_end >= max_bytes:", (HTTP,), "an answer of exactly the cap is read"),
    Mutant("http-length-cap-boundary", "hostio/answers.py", "if int(text) > max_bytes:",
           "if int(text) >= max_bytes:", (HTTP,), "a Content-Length of exactly the cap is read"),
    Mutant("http-chunked-ignored", "hostio/answers.py",
           '    if "chunked" in fields.get("transfer-encoding", "").lower():\n        return',
           '    if False:\n        return', (HTTP,), "chunk framing is no part of the body"),
    Mutant("http-head-cap-dropped", "hostio/answers.py", "if len(raw) > MAX_HEAD_BYTES:", "if False:",
           (HTTP,), "headers are capped"),
    Mutant("json-count-commas", "hostio/answers.py", 'body.count(b",") + ', "", (HTTP,),
           "every value after a comma is counted"),
    Mutant("json-count-colons", "hostio/answers.py", 'body.count(b":") + ', "", (HTTP,),
           "every value after a colon is counted"),
    Mutant("json-count-brackets", "hostio/answers.py", 'body.count(b"[") + ', "", (HTTP,),
           "an array's first value is counted"),
    Mutant("json-count-braces", "hostio/answers.py", 'body.count(b"{") + ', "", (HTTP,),
           "an object's first key is counted"),
    Mutant("json-value-cap-boundary", "hostio/answers.py", "if values_at_most(body) > max_values:",
           "if values_at_most(body) >= max_values:", (HTTP,), "exactly the cap of values is parsed"),
    Mutant("json-recursion-uncaught", "hostio/answers.py", "    except RecursionError:\n", "    except ZeroDivisionError:\n",
           (HTTP,), "nested JSON is the answer's error"),
    Mutant("json-value-cap-value", "exporter/kubernetes_api.py", "MAX_ANSWER_VALUES = 200_000",
           "MAX_ANSWER_VALUES = 2_000_000", (DRA + "::test_a_hostile_api_server_is_one_line_a_back_off_and_an_even_split",),
           "200,000 values per answer"),
    Mutant("api-request-deadline-ignored", "exporter/kubernetes_api.py",
           "min(deadline, time.monotonic() + self.timeout)", "deadline",
           (DRA + "::test_a_request_ends_by_its_own_deadline_and_by_the_ticks",), "2 s per request"),
    Mutant("api-tick-budget-ignored", "exporter/kubernetes_api.py",
           "min(deadline, time.monotonic() + self.timeout)", "time.monotonic() + self.timeout",
           (DRA + "::test_a_request_ends_by_its_own_deadline_and_by_the_ticks",), "3 s per tick"),
    Mutant("api-catches-its-own-errors-only", "exporter/kubernetes_api.py", "            except Exception as exc:  # noqa: BLE001",
           "            except ApiError as exc:  # noqa: BLE001", (DRA + "::test_any_exception_reading_an_answer_is_the_readers_error",),
           "any exception reading an answer is the reader's error"),
    Mutant("quantity-exa-as-exponent", "exporter/kubernetes_api.py", "(UNITS[suffix] if suffix in UNITS else",
           '(UNITS[suffix] if suffix[0] not in "eE" else', (DRA + "::test_quantities",), "1Ei and 2E are quantities"),
    Mutant("engine-raising-tick-kept", "exporter/engine.py",
           "            self._crashed[name] = CollectorHealth(False, 0.0, f\"tick failed: {exc!r}\")\n            self._withdrawn.add(name)",
           "            self._crashed[name] = CollectorHealth(False, 0.0, f\"tick failed: {exc!r}\")",
           ("tests/test_host_files.py::test_a_stuck_or_raising_sampler_has_its_values_withdrawn_and_comes_back",),
           "a raising tick withdraws its sampler's values"),
    Mutant("engine-raising-tick-restored", "exporter/engine.py",
           "            if name not in self._crashed:  # a tick that raised leaves the values withdrawn\n                self._withdrawn",
           "            if True:\n                self._withdrawn",
           ("tests/test_host_files.py::test_a_stuck_or_raising_sampler_has_its_values_withdrawn_and_comes_back",),
           "withdrawn until a tick succeeds"),
    Mutant("kubelet-containers-read", "exporter/samplers/dra.py", "for c in pod.containers), MAX_CONTAINERS)",
           "for c in pod.containers), MAX_CONTAINERS + 1)", (*KUBELET, CLAIMS), "1,024 containers read"),
    Mutant("kubelet-containers-boundary", "exporter/samplers/kubelet.py", "if listed > MAX_CONTAINERS:",
           "if listed >= MAX_CONTAINERS:", KUBELET, "exactly 1,024 containers is no problem"),
    Mutant("kubelet-devices-read", "exporter/samplers/dra.py", "max(0, MAX_DEVICES - read)",
           "max(0, MAX_DEVICES - read + 1)", (*KUBELET, CLAIMS), "4,096 devices read"),
    Mutant("kubelet-ids-boundary", "exporter/samplers/kubelet.py", "    if seen > MAX_DEVICES:", "    if seen >= MAX_DEVICES:",
           KUBELET, "exactly 4,096 device IDs is no problem"),
    Mutant("claims-devices-boundary", "exporter/samplers/dra.py", "    if seen > MAX_DEVICES:", "    if seen >= MAX_DEVICES:",
           (CLAIMS,), "exactly 4,096 DRA devices is no problem"),
    Mutant("problems-named-boundary", "exporter/samplers/dra.py", "if len(problems) > MAX_PROBLEMS:",
           "if len(problems) >= MAX_PROBLEMS:", KUBELET, "ten problems are each named"),
    Mutant("kubelet-doubled-unbounded", "exporter/samplers/kubelet.py",
           '    named_at_most(doubts, "device IDs listed for several pods")\n', "", KUBELET,
           "pods listing one ID: ten named"),
    Mutant("kubelet-pods-parsed", "exporter/samplers/kubelet.py", "if len(pods) == limit:", "if len(pods) > limit:",
           KUBELET, "the first 1,024 pods parsed"),
    Mutant("kubelet-pods-beyond-silent", "exporter/samplers/kubelet.py", "        if more == Unread.PODS:\n", "        if False:\n",
           KUBELET, "pods beyond the bound are one problem"),
    Mutant("kubelet-varint-field-unskipped", "exporter/samplers/kubelet.py", "        if tag & 7 == 0:\n",
           "        if False:\n", KUBELET, "an unknown varint field is skipped"),
    Mutant("workloads-kept-counters-dropped", "exporter/workloads.py",
           "            kept[i] = dataclasses.replace(w, counters=account.published_counters(), created=account.created)\n",
           "", ("tests/test_workloads.py",), "the published holders carry their counters"),
    Mutant("workloads-unfolded-created-kept", "exporter/workloads.py",
           "counters=account.published_counters(), created=account.created)",
           "counters=account.published_counters(), created=w.created)", ("tests/test_workloads.py",),
           "a holder back out of pod=\"other\" starts its series again"),
    Mutant("kubelet-garbled-uncaught", "exporter/samplers/kubelet.py", "except (ValueError, IndexError) as exc:  # UnicodeDecodeError",
           "except (IndexError,) as exc:  # UnicodeDecodeError", KUBELET, "a garbled List answer is the kubelet's error"),
    # -- issue 36, the first hour: the traps, the README's checks, the demo profile ------------------------
    Mutant('exporterdown-any-job', 'rules/gpu-utilization.rules.yaml', '          or (up == 0 and on (job, instance) present_over_time(gpu_exporter_collector_success[1d]))\n', '',
           ('tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests',), "ExporterDown for any job that published the exporter's series"),
    Mutant('exporterdown-absent-by-job', 'rules/gpu-utilization.rules.yaml', 'or absent(up{job="gpu-spatial-exporter"} or (up and on (job, instance) present_over_time(gpu_exporter_collector_success[1d])))', 'or absent(up{job="gpu-spatial-exporter"})',
           ('tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests',), 'no false ExporterDown for a job named otherwise'),
    Mutant('rollups-need-formula', 'gpu_spatial/report/account.py', 'need = max(3, math.ceil(2 * window / step) + 1)', 'need = max(3, math.ceil(2 * window / step) + 2)',
           ('tests/test_first_hour.py::test_trap2_the_evaluations_said_needed_are_what_the_planner_needs',), 'the evaluations a run needs'),
    Mutant('rollups-need-boundary', 'gpu_spatial/report/account.py', '    if len(run) < need:', '    if len(run) <= need:',
           ('tests/test_first_hour.py::test_trap2_the_evaluations_said_needed_are_what_the_planner_needs',), 'too few is fewer than needed'),
    Mutant('top-url-metrics', 'gpu_spatial/endpoints.py', 'r"/(metrics|healthz|docs', 'r"/(healthz|docs',
           ('tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off',), 'top --url takes .../metrics'),
    Mutant('top-api-off', 'gpu_spatial/top/feeds.py', 'if answer.status == 404 and b"--no-api" in answer.body[:4096]:', 'if False:',
           ('tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off',), 'top says the API is off'),
    Mutant('report-exporter-probe', 'gpu_spatial/endpoints.py', 'return isinstance(health, dict) and health.get("status") in ("ok", "no_gpu", "stale") and "gpus" in health', 'return True',
           ('tests/test_first_hour.py::test_trap4_a_json_404_of_another_server_is_not_called_an_exporter_or_a_prometheus',), "only the exporter's /healthz makes a URL the exporter"),
    Mutant('report-exporter-said', 'gpu_spatial/report/promapi.py', 'if status == 404 and serves_exporter(exporter_base(self.url), self.timeout):', 'if False:',
           ('tests/test_first_hour.py::test_trap4_report_pointed_at_the_exporter_says_it_is_one',), 'the report says a URL is the exporter'),
    Mutant('report-exporter-metrics-url', 'gpu_spatial/report/promapi.py', 'serves_exporter(exporter_base(self.url), self.timeout)', 'serves_exporter(self.url, self.timeout)',
           ('tests/test_first_hour.py::test_trap4_report_pointed_at_the_exporter_says_it_is_one',), "the exporter's /metrics URL is the exporter too"),
    Mutant('top-prometheus-probe', 'gpu_spatial/endpoints.py', 'return status == 200 and isinstance(data, dict) and data.get("status") == "success"', 'return True',
           ('tests/test_first_hour.py::test_trap4_a_json_404_of_another_server_is_not_called_an_exporter_or_a_prometheus',), 'only a query answered makes a URL a Prometheus'),
    Mutant('top-prometheus-said', 'gpu_spatial/top/feeds.py', 'if answer.status == 404 and serves_prometheus_api(self.url, self.timeout):', 'if False:',
           ('tests/test_first_hour.py::test_top_pointed_at_a_prometheus_says_it_is_one',), 'top says a URL is a Prometheus'),
    Mutant('top-refused-stderr', 'gpu_spatial/top/__init__.py', '    if state.refused:\n        print(', '    if False:\n        print(',
           ('tests/test_first_hour.py::test_top_pointed_at_a_prometheus_says_it_is_one', 'tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off'), 'a URL no retry helps: one line on stderr, exit 2'),
    Mutant('top-url-scheme', 'gpu_spatial/top/__init__.py', 'url = with_scheme(args.url)', 'url = args.url',
           ('tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off',), 'top --url takes host:port'),
    Mutant('top-once-piped-uncut', 'gpu_spatial/top/__init__.py', 'cut=args.size is not None or sys.stdout.isatty()', 'cut=True',
           ('tests/test_first_hour.py::test_top_once_piped_cuts_no_line',), 'top --once piped cuts no line'),
    Mutant('top-once-sized-cut', 'gpu_spatial/top/__init__.py', 'cut=args.size is not None or sys.stdout.isatty()', 'cut=False',
           ('tests/test_first_hour.py::test_top_once_piped_cuts_no_line',), 'top --once --size cuts at its width'),
    Mutant('report-scraped-once', 'gpu_spatial/report/empty.py', '        if scraped_once(api, plan, start, end):', '        if False:',
           ('tests/test_first_hour.py::test_report_on_one_scrape_says_wait_for_the_next',), 'one scrape said as one scrape'),
    Mutant('report-scraped-once-only', 'gpu_spatial/report/empty.py', 'return bool(found) and isinstance(found[0], dict) and _value(found[0]) == 1', 'return True',
           ('tests/test_first_hour.py::test_report_on_one_scrape_says_wait_for_the_next',), 'a range without data is not called one scrape'),
    Mutant('report-never-scraped', 'gpu_spatial/report/empty.py', '    if waiting:', '    if False:',
           ('tests/test_first_hour.py::test_report_before_the_first_scrape_says_so',), 'a target not scraped yet is said'),
    Mutant('report-never-scraped-health', 'gpu_spatial/report/empty.py', 't.get("health") == NEVER_SCRAPED', 'True',
           ('tests/test_first_hour.py::test_the_targets_named_are_few_and_printable',), 'only targets never scraped are named'),
    Mutant('report-targets-printable', 'gpu_spatial/report/empty.py', 'c if c.isprintable() else "?" for c in str(value)[:limit]', 'c for c in str(value)[:limit]',
           ('tests/test_first_hour.py::test_the_targets_named_are_few_and_printable',), "a server's target URL reaches no terminal raw"),
    Mutant('nvml-recording-what', 'exporter/nvml_replay.py', '(not JSON: {exc}): {WHAT_A_RECORDING_IS}")', '(not JSON: {exc})")',
           ('tests/test_first_hour.py::test_an_nvml_replay_that_is_no_recording_says_what_one_is',), 'a file that is no recording: what one is'),
    Mutant('nvml-recording-capped', 'exporter/nvml_replay.py', 'text = read_text_capped(path, MAX_RECORDING_BYTES, follow=True)', 'text = Path(path).read_text()',
           ('tests/test_first_hour.py::test_an_nvml_replay_that_is_no_recording_says_what_one_is',), 'a FIFO as a recording never blocks'),
    Mutant('exporter-inputs-first', 'exporter/__main__.py', '            engine, upload = build_engine(args)\n            sock = bind(args.listen_address, args.port)\n', '            sock = bind(args.listen_address, args.port)\n            engine, upload = build_engine(args)\n',
           ('tests/test_first_hour.py::test_the_inputs_are_checked_before_the_port',), 'the inputs are checked before the port'),
    Mutant('exporter-port-one-line', 'exporter/__main__.py', '    root.handlers[:] = [held]\n', '',
           ('tests/test_first_hour.py::test_the_inputs_are_checked_before_the_port',), 'a port in use is the one line said'),
    Mutant('users-passwd-calm', 'exporter/samplers/users.py', '        if len(failed) == 1 and len(self.passwd_files) > 1:', '        if False:',
           ('tests/test_first_hour.py::test_trap6_users_named_from_etc_passwd_when_init_is_not_readable',), "this host's /etc/passwd said calmly"),
    Mutant('trace-help-needs', 'gpu_trace/__main__.py', 'epilog=NEEDS,', 'epilog=None,',
           ('tests/test_first_hour.py::test_trace_help_says_what_tracing_needs',), 'trace --help says what tracing needs'),
    Mutant('plot-format', 'nsys_ingest/plot.py', '    if suffix not in formats:', '    if False:',
           ('tests/test_first_hour.py::test_trap5_plot_to_an_unknown_format_names_the_formats',), 'plot refuses an unknown format'),
    Mutant('plot-format-first', 'nsys_ingest/__main__.py', '        check_output(args.output)\n', '',
           ('tests/test_first_hour.py::test_trap5_plot_to_an_unknown_format_names_the_formats',), 'the format is checked before the export is read'),
    Mutant('users-passwd-own-proc', 'exporter/samplers/users.py', 'own_proc = not passwd and os.path.realpath(self.proc_root) == "/proc"', 'own_proc = not passwd',
           ('tests/test_first_hour.py::test_trap6_users_named_from_etc_passwd_when_init_is_not_readable', 'tests/test_first_hour.py::test_trap6_a_foreign_proc_root_never_falls_back_to_this_hosts_users'), "/etc/passwd only for this host's /proc"),
    Mutant('users-passwd-fallback', 'exporter/samplers/users.py', 'self.passwd_files = [self.passwd, *([Path("/etc/passwd")] if own_proc else [])]', 'self.passwd_files = [self.passwd]',
           ('tests/test_first_hour.py::test_trap6_users_named_from_etc_passwd_when_init_is_not_readable', 'tests/test_first_hour.py::test_trap6_a_foreign_proc_root_never_falls_back_to_this_hosts_users'), '/etc/passwd is tried'),
    Mutant('advice-host-bound', 'nsys_ingest/verdicts.py', '"--trace=cuda, then nsys-ingest diagnose (or gpu-spatial nsys diagnose)")', '"--trace=cuda, then nsys_ingest diagnose")',
           ('tests/test_first_hour.py::test_trap7_verdict_advice_names_installed_commands', 'tests/test_first_hour.py::test_trap7_no_advice_names_a_command_that_is_not_installed'), 'advice names installed commands (host-bound)'),
    Mutant('advice-small-kernels', 'nsys_ingest/verdicts.py', 'run nsys-ingest diagnose (or gpu-spatial nsys diagnose) to tell', 'run nsys_ingest diagnose to tell',
           ('tests/test_first_hour.py::test_trap7_verdict_advice_names_installed_commands', 'tests/test_first_hour.py::test_trap7_no_advice_names_a_command_that_is_not_installed'), 'advice names installed commands (small kernels)'),
    Mutant('root-page', 'exporter/app.py', 'elif scope["type"] == "http" and scope["path"] == "/" and', 'elif False and',
           ('tests/test_first_hour.py::test_trap8_the_root_page_links_what_the_exporter_serves',), 'GET / is a page'),
    Mutant('root-page-no-api', 'exporter/app.py', 'INDEX.format(api=INDEX_API if self._api_on else INDEX_NO_API)', 'INDEX.format(api=INDEX_API)',
           ('tests/test_first_hour.py::test_trap8_the_root_page_links_what_the_exporter_serves',), 'GET / without the API links no /docs'),
    Mutant('report-equal-dates', 'gpu_spatial/report/__init__.py', '    if start == end:', '    if False:',
           ('tests/test_first_hour.py::test_trap8_equal_dates_are_a_day_not_swapped_timestamps',), 'equal dates said as a day'),
    Mutant('bare-gpu-spatial', 'gpu_spatial/cli.py', '        return 2\n    if argv[0] == "--version"', '        return 0\n    if argv[0] == "--version"',
           ('tests/test_first_hour.py::test_trap8_bare_gpu_spatial_is_a_usage_error',), 'bare gpu-spatial exits 2'),
    Mutant('nsys-subcommand-usage', 'nsys_ingest/__main__.py', '    if unknown:', '    if False:',
           ('tests/test_first_hour.py::test_trap8_nsys_help_and_errors_name_the_command_as_typed',), "a subcommand's bad flag: its own usage"),
    Mutant('nsys-help-prog', 'nsys_ingest/__main__.py', 'GPUs per process from their context switches (workloads). Installed as nsys-ingest and gpu-spatial nsys.', 'GPUs per process (python -m nsys_ingest).',
           ('tests/test_first_hour.py::test_trap8_nsys_help_and_errors_name_the_command_as_typed',), 'nsys --help names no python -m'),
    Mutant('top-user-from-holders', 'gpu_spatial/top/state.py', '        proc.user = users.get(proc.pid)  #', '        proc.user = None  #',
           ('tests/test_first_hour.py::test_trap8_top_shows_the_users_the_exporter_assigned',), "top's USER from the exporter's holders"),
    Mutant('top-inprocess-workloads', 'gpu_spatial/top/feeds.py', '"workloads": [workload_json(w) for w in snapshot.workloads],', '"workloads": [],',
           ('tests/test_first_hour.py::test_trap8_top_shows_the_users_the_exporter_assigned',), 'in-process top has the workloads'),
    Mutant('top-narrow-model', 'gpu_spatial/top/render.py', '([mark], f" hid{pct(gpu.hidden_idle)}"),\n', '',
           ('tests/test_first_hour.py::test_trap8_top_keeps_the_sm_bar_at_30_columns',), 'narrow top drops the model first'),
    Mutant('top-narrow-bars', 'gpu_spatial/top/render.py', '                       ([mark], "")):', '                       ([mark, model], "")):',
           ('tests/test_first_hour.py::test_trap8_top_keeps_the_sm_bar_at_30_columns',), 'narrowest top keeps both bars'),
    Mutant('nsys-reason-token-file', 'exporter/samplers/nsys.py', '--nsys-live or --nsys-upload-token-file"', '--nsys-live or --nsys-upload-token"',
           ('tests/test_first_hour.py::test_trap8_the_nsys_source_suggests_the_token_file_not_the_flag',), 'the nsys reason names the token file'),
    Mutant('upload-off-token-file', 'exporter/app.py', 'UPLOADS_OFF = "uploads are off: start the exporter with --nsys-upload-token-file"', 'UPLOADS_OFF = "uploads are off: start the exporter with --nsys-upload-token"',
           ('tests/test_first_hour.py::test_trap8_the_nsys_source_suggests_the_token_file_not_the_flag',), 'the upload refusal names the token file'),
    Mutant('report-only-none', 'gpu_spatial/report/__init__.py', '        collected.notes.append(account.other_groupings(api, plan, start, end))', '        pass',
           ('tests/test_first_hour.py::test_a_report_of_only_none_says_which_by_has_data',), 'a report of only (none) names the --by with data'),
    Mutant('report-html-extra', 'gpu_spatial/report/__init__.py', '    missing = args.format == "html" and missing_extra', '    missing = False and missing_extra',
           ('tests/test_first_hour.py::test_install_without_the_plots_extra_says_which_extra', 'tests/test_first_hour.py::test_an_extra_is_named_only_when_its_own_package_is_missing'), 'report --format html names the extra'),
    Mutant('extra-own-package', 'nsys_ingest/commandline.py', '        if (missing.name or "").split(".")[0] != package:\n            raise', '        if False:\n            raise',
           ('tests/test_first_hour.py::test_install_without_the_plots_extra_says_which_extra', 'tests/test_first_hour.py::test_an_extra_is_named_only_when_its_own_package_is_missing'), "only the extra's own package is called left out"),
    Mutant('docs-slug', 'tests/test_docs.py', '    text = re.sub(r"[^\\w\\- ]", "", text)', '    pass',
           ('tests/test_docs.py',), "anchors are GitHub's"),
    Mutant('docs-anchor', 'tests/test_docs.py', '        elif anchor and where.suffix == ".md" and anchor not in anchors(where):', '        elif False:',
           ('tests/test_docs.py',), 'a broken anchor fails'),
    Mutant('readme-flag', 'README.md', '--held-idle-after 1m', '--held-idle-afterwards 1m',
           ('tests/test_docs.py',), 'a README flag --help lacks fails'),
    Mutant('readme-link', 'README.md', '(docs/exporter.md#without-a-gpu)', '(docs/exporter.md#without-gpu)',
           ('tests/test_docs.py',), 'a broken README link fails'),
    Mutant('readme-subcommand', 'README.md', 'nsys-ingest diagnose tests/fixtures/h100_diag_time_sliced.sqlite', 'nsys-ingest diagnosis tests/fixtures/h100_diag_time_sliced.sqlite',
           ('tests/test_docs.py',), 'a README subcommand that does not exist fails'),
    Mutant('demo-alias', 'docker-compose.yaml', '      default:\n        aliases: [gpu-spatial-exporter]\n', '      default:\n        aliases: [gpu-spatial-exporter-x]\n',
           ('tests/test_stack.py::test_compose_profiles_gpu_and_demo_start_what_they_need',), 'the demo exporter is reached as gpu-spatial-exporter'),
    Mutant('demo-profile', 'docker-compose.yaml', '  gpu-spatial-exporter-demo:\n    profiles: [demo]\n', '  gpu-spatial-exporter-demo:\n    profiles: [demo, gpu]\n',
           ('tests/test_stack.py::test_compose_profiles_gpu_and_demo_start_what_they_need',), 'the demo exporter is in the demo profile only'),
)


# -- issue 39, "Rules no test guards": the modules the last round and this one touched ------------------
EDGE = "tests/test_edge_guards.py"
NOT_SLOW = ("-k", "not ten_million")  # the 10 M-row switch table: 26 s, and chunking has its own test
CTXSW_INGEST = (EDGE, "tests/test_ctxsw.py", *NOT_SLOW)
CTXSW_LIVE = (EDGE, "tests/test_ctxsw_live.py")
WORKLOADS = (EDGE, GUARDS, "tests/test_workloads.py", "tests/test_ctxsw_live.py")
HOLDERS = (EDGE, GUARDS, "tests/test_users.py", "tests/test_workloads.py", "tests/test_dra.py")
DRA = (EDGE, "tests/test_dra.py")
KUBE_API = (EDGE, "tests/test_dra.py")
VERDICTS = (EDGE, "tests/test_verdicts.py")
USERS = (EDGE, "tests/test_users.py")
KUBELET = (EDGE, GUARDS, "tests/test_kubelet.py", "tests/test_workloads.py", "tests/test_dra.py")
ACCOUNT = (EDGE, REPORT_GUARDS, "tests/test_account_history.py")


def _m(id, path, old, new, tests, why, listed=False, function=None):
    return Mutant(id, path, old, new, tuple(tests), why, listed, function)


ROUND_39 = (
    # -- nsys_ingest/ctxsw.py ------------------------------------------------------------------------------
    _m("ctxsw-at-sample-at-slice-end", "nsys_ingest/ctxsw.py", "(ends[np.maximum(j, 0)] > lo)",
       "(ends[np.maximum(j, 0)] >= lo)", CTXSW_INGEST, "a sample stamped at a slice's end is not the slice's", True),
    _m("ctxsw-at-sample-at-slice-start", "nsys_ingest/ctxsw.py", 'j = np.searchsorted(starts, lo, side="right") - 1',
       'j = np.searchsorted(starts, lo, side="left") - 1', CTXSW_INGEST, "a sample stamped at a slice's start is the slice's"),
    _m("ctxsw-restore-without-pid", "nsys_ingest/ctxsw.py",
       "owners.append(np.where(gpid[opens] >= 0, gpid[opens], gpid[opens + 1]))", "owners.append(gpid[opens])",
       CTXSW_INGEST, "a RESTORE_START without a pid takes its SAVE_END's", True),
    _m("ctxsw-window-ends-at-last-stamp", "nsys_ingest/ctxsw.py", "highs.append(last + _period_ns(export))",
       "highs.append(last)", CTXSW_INGEST, "the default window ends one period after the last sample", True),
    _m("ctxsw-pair-any-context", "nsys_ingest/ctxsw.py",
       "pair = (kind[:-1] == 1) & (kind[1:] == 2) & (ctx[:-1] == ctx[1:])", "pair = (kind[:-1] == 1) & (kind[1:] == 2)",
       CTXSW_INGEST, "a slice is a RESTORE_START and SAVE_END of one context"),
    _m("ctxsw-first-save-end-dropped", "nsys_ingest/ctxsw.py", "if self._first and len(ts) and kind[0] == 2:",
       "if False:", CTXSW_INGEST, "a SAVE_END first in the window: resident since the window opened"),
    _m("ctxsw-last-restore-dropped", "nsys_ingest/ctxsw.py",
       "return self._clip(np.array([ts]), np.array([self.window[1]]), np.array([gpid]))", "return None",
       CTXSW_INGEST, "a RESTORE_START last in the window: resident until it closes"),
    _m("ctxsw-within-boundary", "nsys_ingest/ctxsw.py", "whole = weight >= length[sample]",
       "whole = weight > length[sample]", CTXSW_INGEST, "within: a sample wholly inside one slice counts"),
    _m("ctxsw-last-sample-dropped", "nsys_ingest/ctxsw.py",
       "if gpu.held is not None:  # the very last sample: one period", "if False:", CTXSW_INGEST,
       "the last sample covers one period"),
    _m("ctxsw-merge-one-context-only", "nsys_ingest/ctxsw.py", "share = sum(p.time_share for p in group)",
       "share = group[0].time_share", CTXSW_INGEST, "a pid with several contexts is one process"),
    _m("ctxsw-fit-not-clamped-above", "nsys_ingest/ctxsw.py",
       "new = min(max(d[i] + (moment[i] - gram[i] @ d) / diagonal[i], 0.0), 1.0)",
       "new = max(d[i] + (moment[i] - gram[i] @ d) / diagonal[i], 0.0)", CTXSW_INGEST, "a fitted ratio is at most 1"),
    _m("ctxsw-process-cap-boundary", "nsys_ingest/ctxsw.py",
       "if sum(len(v) for v in seen.values()) >= MAX_PROCESSES:", "if sum(len(v) for v in seen.values()) > MAX_PROCESSES:",
       CTXSW_INGEST, "at most MAX_PROCESSES processes"),
    # -- exporter/samplers/ctxsw.py ------------------------------------------------------------------------
    _m("live-ctxsw-max-age", "exporter/samplers/ctxsw.py", "self.max_age = 2 * period_s + window_s",
       "self.max_age = period_s + window_s", CTXSW_LIVE, "a window lasts two periods and a window", True),
    _m("live-ctxsw-fresh-boundary", "exporter/sampler.py", "now - window.window_end <= self.max_age",
       "now - window.window_end < self.max_age", CTXSW_LIVE, "a window exactly max_age old is fresh"),
    _m("live-ctxsw-state-never-stale", "exporter/sampler.py",
       "if state.state == ACTIVE and self.fresh(uuid, now) is None:", "if False:", CTXSW_LIVE,
       "a stalled source says standby, not active", True),
    _m("live-ctxsw-failed-keeps-window", "exporter/samplers/ctxsw.py",
       "self.readings.pop(uuid, None)  # a window that cannot be refreshed is not kept", "pass", CTXSW_LIVE,
       "a GPU that cannot be captured loses its window"),
    _m("live-ctxsw-gpu-left-kept", "exporter/samplers/ctxsw.py", "for uuid in set(self.states) - {g.uuid for g in gpus}:",
       "for uuid in set():", CTXSW_LIVE, "a GPU that left loses its state and window"),
    _m("live-ctxsw-alone-boundary", "exporter/samplers/ctxsw.py", "SourceState(STANDBY, ALONE) if many < 2 else",
       "SourceState(STANDBY, ALONE) if many <= 2 else", CTXSW_LIVE, "two processes without switches: unsupported"),
    _m("live-ctxsw-mps-client-not-refused", "exporter/samplers/ctxsw.py",
       'any(p.kind in (MPS_CLIENT, MPS_SERVER) for p in tel.compute_processes or ())',
       'any(p.kind in (MPS_SERVER,) for p in tel.compute_processes or ())', CTXSW_LIVE, "MPS clients: no capture"),
    _m("live-ctxsw-mig-not-refused", "exporter/samplers/ctxsw.py", "if tel is not None and tel.mig_enabled:",
       "if False:", CTXSW_LIVE, "MIG: no capture"),
    _m("live-ctxsw-listed-after-only", "exporter/samplers/ctxsw.py",
       "listed = frozenset(before[gpu.uuid] | after[gpu.uuid])", "listed = frozenset(after[gpu.uuid])", CTXSW_LIVE,
       "pids listed at the window's start or end"),
    _m("live-ctxsw-window-from-flag", "exporter/samplers/ctxsw.py",
       "start, end = ended - (result.window_s[1] - result.window_s[0]), ended",
       "start, end = ended - self.window_s, ended", CTXSW_LIVE, "the window's length is the export's"),
    # -- exporter/workloads.py -----------------------------------------------------------------------------
    _m("workloads-ctxsw-sm-any", "exporter/workloads.py", "if all(share.sm is not None or share.time == 0 for share in own):",
       "if any(share.sm is not None or share.time == 0 for share in own):", WORKLOADS, "ctxsw SM only where every resident pid's was sampled", True),
    _m("workloads-ctxsw-covers-listed-only", "exporter/sampler.py",
       "return set(pids) <= self.listed | self.shares.keys()", "return set(pids) <= self.shares.keys()",
       WORKLOADS, "a pid listed in the window but never resident is covered"),
    _m("workloads-ctxsw-time-not-clamped", "exporter/workloads.py",
       'entry["time_share"] = round(min(sum(share.time for share in own), 1.0), 6)\n                entry["time_share_basis"], entry["window"] = CTXSW',
       'entry["time_share"] = round(sum(share.time for share in own), 6)\n                entry["time_share_basis"], entry["window"] = CTXSW', WORKLOADS, "a ctxsw time share is at most 1"),
    _m("workloads-mps-server-counted", "exporter/workloads.py",
       '[p for p in tel.compute_processes if p.kind != MPS_SERVER]', "list(tel.compute_processes)", WORKLOADS,
       "the MPS server is no workload process"),
    _m("workloads-exact-despite-strangers", "exporter/workloads.py", "elif len(running) == 1 and not strangers:",
       "elif len(running) == 1:", WORKLOADS, "exact SM only when nobody else runs on the GPU"),
    _m("workloads-fold-least-busy-kept", "exporter/workloads.py", "return (-(view.time_share or 0.0), -(view.held_share",
       "return ((view.time_share or 0.0), -(view.held_share", WORKLOADS, "the busiest holders stay published"),
    _m("workloads-held-idle-boundary", "exporter/workloads.py", "idle_seconds >= self.held_idle_after",
       "idle_seconds > self.held_idle_after", WORKLOADS, "held idle at exactly --held-idle-after"),
    _m("workloads-fold-loses-last-step", "exporter/workloads.py", "other.add(account.step)", "pass", WORKLOADS,
       "a folded holder's last step goes to OTHER"),
    _m("workloads-weakest-time-basis", "exporter/workloads.py", "return None if not found else next(iter(found)) if len(found) == 1 else NVML",
       "return None if not found else next(iter(found))", WORKLOADS, "OTHER's time basis is ctxsw only if every part's is"),
    _m("workloads-lost-gpu-kept", "exporter/workloads.py", "if tel is None or tel.lost:", "if tel is None:", WORKLOADS,
       "a GPU NVML lost has no holders"),
    _m("workloads-left-holders-kept", "exporter/workloads.py", "del self._accounts[key]", "pass", WORKLOADS,
       "holders that left take their series with them"),
    _m("workloads-mig-sm-not-weighted", "exporter/workloads.py",
       "total += reading.sm_active * device.sm_count / tel.mig_sm_count", "total += reading.sm_active", WORKLOADS,
       "a MIG instance's SM activity weighted by its share of the SMs"),
    # -- exporter/holders.py -------------------------------------------------------------------------------
    _m("holders-later-kind-wins", "exporter/holders.py", "owners.setdefault(pid, holder)", "owners[pid] = holder",
       HOLDERS, "the first kind keeps a pid two kinds claim", True),
    _m("holders-failed-owners-count", "exporter/holders.py",
       "if not h.error:\n            for pid, holder in h.owners.items():", "if True:\n            for pid, holder in h.owners.items():",
       HOLDERS, "a failed sampler owns no pid"),
    _m("holders-failed-gpus-count", "exporter/holders.py", "if not h.error:\n            out.update",
       "if True:\n            out.update", HOLDERS, "a failed sampler holds no GPU"),
    _m("holders-strongest-basis", "exporter/holders.py", "max(bases, key=HELD_SHARE_BASES.index, default=WHOLE)",
       "min(bases, key=HELD_SHARE_BASES.index, default=WHOLE)", HOLDERS, "the weakest basis is said"),
    _m("holders-claim-owner-keeps-claim", "exporter/holders.py",
       'self if not through & self._map.keys() else', 'self if True else', HOLDERS,
       "a claim's processes are its container's"),
    # issue 44: the registries and the vocabulary refuse at construction
    _m("holders-unknown-label-accepted", "exporter/holders.py", "        if unknown:\n", "        if False:\n",
       ("tests/test_holder_registry.py",), "a label no kind declares is refused"),
    _m("holders-positional-overflow", "exporter/holders.py", "if len(values) > len(order):",
       "if len(values) > len(order) + 1:", ("tests/test_holder_registry.py",), "more values by position than labels"),
    _m("holders-label-meaning-last-wins", "exporter/holders.py", "                meaning.setdefault(label, what)\n",
       "                meaning[label] = what\n", ("tests/test_holder_registry.py",), "the first kind's meaning of a shared label"),
    _m("owner-labels-keep-held-through", "exporter/holders.py",
       "return tuple(label for label in labels() if label not in through)", "return labels()",
       ("tests/test_holder_registry.py", "tests/test_exporter_e2e.py"), "the process series' owners: a claim is not one"),
    _m("sources-profiler-ignored", "exporter/sources.py", 'if getattr(module := _module(name), "HOLDS_PROFILER", False)}',
       'if getattr(module := _module(name), "HOLDS_PROFILER", True)}', ("tests/test_source_registry.py",),
       "only a source that holds the profiler excludes captures"),
    _m("vocabulary-check-optional-always", "exporter/vocabulary.py",
       "if word not in allowed and not (optional and word is None):", "if word not in allowed and word is not None:",
       ("tests/test_vocabulary.py",), "None is a word only where the field is optional"),
    _m("holders-kinds-order", "exporter/holders.py",
       'KINDS = {"kubelet": "exporter.samplers.kubelet", "slurm": "exporter.samplers.slurm",',
       'KINDS = {"slurm": "exporter.samplers.slurm", "kubelet": "exporter.samplers.kubelet",', HOLDERS,
       "kubelet before Slurm before users"),
    _m("holders-auto-users-beside-scheduler", "exporter/holders.py", "if auto and not module.SCHEDULER and samplers:",
       "if auto and not module.SCHEDULER and False:", HOLDERS, "--holders auto: no users where a scheduler is"),
    _m("holders-none-builds", "exporter/holders.py", 'if wanted == ("none",):\n        return []', "if False:\n        pass",
       HOLDERS, "--holders none builds none"),
    _m("holders-basis-order", "exporter/vocabulary.py", "HELD_SHARE_BASES = (WHOLE, MIG, REPLICAS, CAPACITY, EVEN_SPLIT)",
       "HELD_SHARE_BASES = (WHOLE, MIG, REPLICAS, EVEN_SPLIT, CAPACITY)", HOLDERS, "even split is the weakest basis"),
    _m("holders-explicit-inverted", "exporter/holders.py", "build(args, nvml, explicit=not auto)",
       "build(args, nvml, explicit=auto)", HOLDERS, "a kind named on the command line is explicit"),
    # -- exporter/samplers/dra.py --------------------------------------------------------------------------
    _m("dra-capacity-not-clamped", "exporter/samplers/dra.py", "return min(consumed[name] / capacity[name], 1.0)",
       "return consumed[name] / capacity[name]", DRA, "consumed capacity is at most the device", True),
    _m("dra-memory-before-shares", "exporter/samplers/dra.py", 'CAPACITY_NAMES = ("shares", "memory")',
       'CAPACITY_NAMES = ("memory", "shares")', DRA, "shares decide before memory", True),
    _m("dra-merge-claim-part-only", "exporter/samplers/dra.py",
       "share = None if share is None or before.share is None else round(min(share + before.share, 1.0), 9)",
       "share = share", DRA, "a container holding a GPU both ways holds both parts", True),
    _m("dra-merge-claim-basis-only", "exporter/samplers/dra.py",
       "basis, mig = weakest_basis((basis, before.basis)), tuple(sorted({*mig, *before.mig}))", "basis, mig = basis, mig",
       DRA, "both parts' basis and MIG devices"),
    _m("dra-single-ignores-share-id", "exporter/samplers/dra.py",
       "single = len(allocations) == 1 and not next(iter(allocations))[2]", "single = len(allocations) == 1", DRA,
       "one allocation with a share id is a shared device's"),
    _m("dra-capacity-any", "exporter/samplers/dra.py", "by_capacity = bool(ratios) and all(r is not None for r in ratios.values())",
       "by_capacity = bool(ratios) and any(r is not None for r in ratios.values())", DRA,
       "capacity basis only where every allocation's is known"),
    _m("dra-one-container-split", "exporter/samplers/dra.py", "if len(alloc.containers) > 1:  # one pod's",
       "if len(alloc.containers) >= 1:  # one pod's", DRA, "one container: no even split"),
    _m("dra-shared-mig-held-whole", "exporter/samplers/dra.py",
       "alone = single and len(alloc.containers) == 1 and mig is not None", "alone = mig is not None", DRA,
       "a shared MIG device's SMs are not one holder's"),
    _m("dra-claim-cap-boundary", "exporter/samplers/dra.py", "return list(items[:max(0, MAX_DEVICES - read)])",
       "return list(items[:max(0, MAX_DEVICES - 1 - read)])", DRA, "exactly MAX_CLAIM_DEVICES are read"),
    _m("dra-mig-size-ignored", "exporter/samplers/dra.py",
       "if found is None or (size is not None and found[1] not in (None, size)):", "if found is None:", DRA,
       "a MIG name's placement size must match"),
    _m("dra-uuid-attribute-ignored", "exporter/samplers/dra.py", "if uuid is not None:  # the driver's own word",
       "if False:", DRA, "the ResourceSlice's uuid attribute wins over the name"),
    _m("dra-holder-not-clamped", "exporter/samplers/dra.py", "round(min(e[0], 1.0), 9)", "round(e[0], 9)", DRA,
       "a container holds at most one GPU"),
    # -- exporter/kubernetes_api.py ------------------------------------------------------------------------
    _m("kube-api-never-forgets", "exporter/kubernetes_api.py", "if started - self._slices_at > FORGET_AFTER_S:",
       "if False:", KUBE_API, "devices not confirmed for FORGET_AFTER_S are forgotten", True),
    _m("kube-api-forget-boundary", "exporter/kubernetes_api.py", "if started - self._slices_at > FORGET_AFTER_S:",
       "if started - self._slices_at >= FORGET_AFTER_S:", KUBE_API, "kept at exactly FORGET_AFTER_S"),
    _m("kube-api-no-backoff", "exporter/kubernetes_api.py",
       "if started - self._failed_at >= BACKOFF_S and (devices or shared):", "if (devices or shared):", KUBE_API,
       "a failure backs off BACKOFF_S"),
    _m("kube-api-gone-claims-kept", "exporter/kubernetes_api.py",
       "self._claims = {k: v for k, v in self._claims.items() if k in wanted}", "self._claims = dict(self._claims)",
       KUBE_API, "claims that left are forgotten"),
    _m("kube-api-deleted-claim-fails", "exporter/kubernetes_api.py", 'if exc.kind == "404":', "if False:", KUBE_API,
       "a claim deleted meanwhile is no failure"),
    _m("kube-api-kibi-decimal", "exporter/kubernetes_api.py", '"Ki": 2**10,', '"Ki": 1e3,', KUBE_API,
       "Ki is 1024"),
    _m("kube-api-rbac-hint-403", "exporter/kubernetes_api.py", "if answer.status in (401, 403) else", "if answer.status in (401,) else",
       KUBE_API, "403 says RBAC"),
    _m("kube-api-other-driver-slices", "exporter/kubernetes_api.py",
       'if spec.get("driver") != NVIDIA_DRIVER:\n                    continue', "pass", KUBE_API,
       "only NVIDIA's ResourceSlices are read"),
    _m("kube-api-other-driver-claims", "exporter/kubernetes_api.py",
       'if result.get("driver") != NVIDIA_DRIVER:\n                continue', "pass", KUBE_API,
       "only NVIDIA's claim results are read"),
    _m("kube-api-claims-reread-at-once", "exporter/kubernetes_api.py",
       "(not wanted[k] <= self._claims[k][1].keys() and started - self._claims[k][0] >= BACKOFF_S)",
       "(not wanted[k] <= self._claims[k][1].keys())", KUBE_API, "a claim is read again at most every BACKOFF_S"),
    _m("kube-api-unknown-device-waits", "exporter/kubernetes_api.py",
       "if due or (unknown and started - self._slices_tried >= SLICES_EVERY_S / 6):", "if due:", KUBE_API,
       "an unknown device lists the slices again early"),
    _m("kube-api-zero-capacity-kept", "exporter/kubernetes_api.py",
       "return {name: amount for name, amount in amounts.items() if amount}", "return amounts", KUBE_API,
       "an unreadable capacity is no capacity"),
    # -- nsys_ingest/verdicts.py ---------------------------------------------------------------------------
    _m("verdict-hw-slowdown-no-cooling", "nsys_ingest/verdicts.py",
       'if any(r in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown") for r in held):',
       'if any(r in ("sw_thermal_slowdown", "hw_thermal_slowdown") for r in held):', VERDICTS,
       "a hardware slowdown asks for cooling", True),
    _m("verdict-hw-slowdown-no-power", "nsys_ingest/verdicts.py",
       'if any(r in ("sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown") for r in held):',
       'if any(r in ("sw_power_cap", "hw_power_brake_slowdown") for r in held):', VERDICTS,
       "a hardware slowdown asks for power"),
    _m("verdict-throttled-clock-boundary", "nsys_ingest/verdicts.py", "if ratio >= THROTTLED_CLOCK:",
       "if ratio > THROTTLED_CLOCK:", VERDICTS, "a clock at exactly 90 % is not throttled"),
    _m("verdict-mps-paging-boundary", "nsys_ingest/verdicts.py",
       "e.mps_server_faults_per_s >= MPS_STALL_FAULTS_PER_S:", "e.mps_server_faults_per_s > MPS_STALL_FAULTS_PER_S:",
       VERDICTS, "paging at exactly 1 fault/s"),
    _m("verdict-copies-boundary", "nsys_ingest/verdicts.py",
       "if e.copy_busy_share and e.copy_busy_share >= (e.kernel_busy_share or 0.0):",
       "if e.copy_busy_share and e.copy_busy_share > (e.kernel_busy_share or 0.0):", VERDICTS,
       "copies as long as kernels are the work"),
    _m("verdict-one-context-time-sliced", "nsys_ingest/verdicts.py", "if contexts > 1:\n        return TIME_SLICED",
       "if contexts >= 1:\n        return TIME_SLICED", VERDICTS, "one context is exclusive"),
    _m("verdict-mps-clients-are-contexts", "nsys_ingest/verdicts.py",
       "contexts = time_sliced + (1 if mps_clients else 0)", "contexts = time_sliced + mps_clients", VERDICTS,
       "MPS clients share one context"),
    # -- exporter/samplers/users.py ------------------------------------------------------------------------
    _m("users-mps-server-holds", "exporter/samplers/users.py",
       'return {uuid: {p.pid for p in tel.compute_processes or () if p.kind != MPS_SERVER}',
       "return {uuid: {p.pid for p in tel.compute_processes or ()}", USERS, "the MPS server holds nothing"),
    _m("users-lost-gpu-held", "exporter/samplers/users.py", "for uuid, tel in telemetry.items() if not tel.lost}",
       "for uuid, tel in telemetry.items()}", USERS, "a lost GPU has no holders"),
    _m("users-no-even-split", "exporter/samplers/users.py", "Held(round(1.0 / len(users), 9), EVEN_SPLIT)",
       "Held(1.0, EVEN_SPLIT)", USERS, "users split their GPU evenly"),
    _m("users-last-passwd-line-wins", "exporter/samplers/users.py", "names.setdefault(int(fields[2]), fields[0][:64])",
       "names[int(fields[2])] = fields[0][:64]", USERS, "the first passwd line of a uid wins"),
    _m("users-passwd-comments-read", "exporter/samplers/users.py", 'and not line.startswith(("#", "+", "-")):', ":",
       USERS, "comment and NIS lines are no users"),
    _m("users-effective-uid", "exporter/samplers/users.py", "return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None",
       "return int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None", USERS, "the real uid"),
    _m("users-unreadable-passwd-keeps-names", "exporter/samplers/users.py",
       "self._names, self.names_from = {}, None", "self.names_from = None", USERS,
       "an unreadable user database forgets its names"),
    _m("users-uid-unknown-held", "exporter/samplers/users.py",
       "for pid, uid in sorted(self._uids.lookup(everyone).items())\n                  if uid is not None}",
       "for pid, uid in sorted(self._uids.lookup(everyone).items())}", USERS, "a process without a uid holds nothing"),
    _m("users-replay-against-this-host", "exporter/samplers/users.py",
       'if not explicit and args.nvml_replay and os.path.realpath(args.proc_root) == "/proc":', "if False:", USERS,
       "a replay is not attributed to this host's users"),
    _m("users-interval-floor", "exporter/samplers/users.py", "interval=max(args.interval, 1.0)", "interval=args.interval",
       USERS, "users are read at most once a second"),
    # -- exporter/samplers/kubelet.py ----------------------------------------------------------------------
    _m("kubelet-held-not-clamped", "exporter/samplers/kubelet.py",
       "out.setdefault(uuid, {})[holder] = None if total is None else round(min(total, 1.0), 9)",
       "out.setdefault(uuid, {})[holder] = None if total is None else round(total, 9)", KUBELET,
       "a container holds at most one GPU"),
    _m("kubelet-doubled-ids-credited", "exporter/samplers/kubelet.py",
       "doubled = {d for d, pods in holders.items() if len(pods) > 1}", "doubled = set()", KUBELET,
       "an ID two pods list is credited to neither"),
    _m("kubelet-replicas-basis-whole", "exporter/samplers/kubelet.py",
       "if replicas_of(device_id, offered) != 1:\n        return REPLICAS", "if False:\n        return REPLICAS", KUBELET,
       "a replica's basis is replicas"),
    _m("kubelet-replica-unknown-n", "exporter/samplers/kubelet.py", "return 1 if base == device_id else None", "return 1",
       KUBELET, "a replica without the offered count has no share"),
    _m("kubelet-index-mig-whole", "exporter/samplers/kubelet.py",
       'if base_id in self.by_uuid or (INDEX.match(base_id) and ":" not in base_id):',
       "if base_id in self.by_uuid or INDEX.match(base_id):", KUBELET, "index:mig has no known share"),
    _m("kubelet-other-resources-read", "exporter/samplers/kubelet.py",
       "if not dev.resource_name.startswith(RESOURCE_PREFIX):\n                continue", "pass", KUBELET,
       "only nvidia.com/ resources"),
    _m("kubelet-unlisted-container-owns", "exporter/samplers/kubelet.py",
       "if ref is not None and (ref.namespace, ref.pod, ref.container) in listed:", "if ref is not None:", KUBELET,
       "a process belongs only to a container listed as holding a GPU"),
    _m("kubelet-api-pods-off-by-one", "exporter/samplers/kubelet.py", "for ref in refs[:API_PODS_PER_GPU]]",
       "for ref in refs[:API_PODS_PER_GPU + 1]]", KUBELET, "the JSON API lists 256 holders per GPU"),
    _m("kubelet-failure-keeps-holdings", "exporter/samplers/kubelet.py", "self.holdings = Holdings(error=str(exc))",
       "pass", KUBELET, "a failed List withdraws the holders"),
    _m("kubelet-api-view-not-reapplied", "exporter/samplers/kubelet.py", "if view != self._api_view:", "if False:",
       KUBELET, "news from the API server resolves the claims again"),
    _m("kubelet-offered-ids-repeated", "exporter/samplers/kubelet.py", "for i in set(device_ids))",
       "for i in device_ids)", KUBELET, "an ID offered twice is one replica"),
    _m("kubelet-first-container-id", "exporter/samplers/kubelet.py", "return found[-1] if found else None",
       "return found[0] if found else None", KUBELET, "the innermost container ID of a cgroup path"),
    # -- gpu_spatial/report/account.py ---------------------------------------------------------------------
    _m("account-even-boundary", "gpu_spatial/report/account.py", "abs(gap - step) <= EVEN * step",
       "abs(gap - step) < EVEN * step", ACCOUNT, "a spacing 25 % off is still even"),
    _m("account-gap-equal-window", "gpu_spatial/report/account.py", "if window == last_w and gap <= window and",
       "if window == last_w and gap < window and", ACCOUNT, "a spacing of exactly W still covers"),
    _m("account-two-evaluations-a-run", "gpu_spatial/report/account.py", "if len(run) < 3:", "if len(run) < 2:",
       ACCOUNT, "a run needs three evaluations"),
    _m("account-no-lag", "gpu_spatial/report/account.py", "lag = (window - step) / 2", "lag = 0.0", ACCOUNT,
       "a moving sum lags (W - D) / 2"),
    _m("account-unlabelled-busy-unknown", "gpu_spatial/report/account.py",
       'basis = _label(metric, "basis") or UNLABELLED_BASIS.get(plan_quantity, "unknown")',
       'basis = _label(metric, "basis") or "unknown"', ACCOUNT, "busy without a basis label is nvml"),
    _m("account-unknown-held-in-span", "gpu_spatial/report/account.py", 'if plan_quantity == HELD and not unknown:',
       'if plan_quantity == HELD:', ACCOUNT, "a span's held total excludes the unknown"),
    _m("account-jitter-is-gap", "gpu_spatial/report/account.py", "if span.start > t + 1.0:", "if span.start > t:",
       ACCOUNT, "a second of jitter is no gap"),
    _m("account-heartbeat-edge", "gpu_spatial/report/account.py", "if chunk_start < t <= chunk_end and",
       "if chunk_start <= t <= chunk_end and", ACCOUNT, "an evaluation on a day's edge counts once"),
    _m("account-two-evaluators", "gpu_spatial/report/account.py", "if len(evaluators) > 1:  # two evaluators",
       "if len(evaluators) > 2:  # two evaluators", ACCOUNT, "two evaluators: counters"),
    _m("account-other-matchers-ignored", "gpu_spatial/report/account.py",
       "other = sorted({label for label, _op, _value in self.matchers} - {rule_label(self.by)})", "other = []",
       ACCOUNT, "a matcher the rollups do not keep: counters"),
    _m("account-last-day-overlong", "gpu_spatial/report/account.py", "out.append((t, min(t + size, end)))",
       "out.append((t, t + size))", ACCOUNT, "the last day ends at the range's end"),
    _m("account-non-finite-kept", "gpu_spatial/report/account.py", "return value if math.isfinite(value) else 0.0",
       "return value", ACCOUNT, "NaN and Inf read as 0"),
)

# -- this round's new modules (the sampler contract, the engine as one loop over samplers) ---------------
ENGINE = ("tests/test_engine_order.py", "tests/test_sampler_contract.py", EDGE, "tests/test_host_files.py::"
          "test_a_stuck_or_raising_sampler_has_its_values_withdrawn_and_comes_back", "tests/test_sampling.py", "tests/test_health.py")
SAMPLER = ("tests/test_sampler_contract.py", EDGE, "tests/test_ctxsw_live.py", "tests/test_nsys_source.py")
ROUND_39_NEW = (
    _m("engine-duplicate-names", "exporter/engine.py", "if len(set(names)) != len(names):", "if False:", ENGINE,
       "two samplers never share a collector name"),
    _m("engine-gpm-after-nvml", "exporter/engine.py",
       "self._loops = {nvml.name: (*(s for s in samplers if s.in_nvml_loop), nvml)}",
       "self._loops = {nvml.name: (nvml, *(s for s in samplers if s.in_nvml_loop))}", ENGINE,
       "in_nvml_loop samplers tick right before NVML"),
    _m("engine-any-loop-means-nvml-ticked", "exporter/engine.py",
       "if self.nvml in members:\n                self._nvml_ticked.set()", "if True:\n                self._nvml_ticked.set()",
       ENGINE, "after_nvml loops wait for NVML's own tick"),
    _m("engine-stop-leaves-work", "exporter/engine.py", "            sampler.close()\n", "            pass\n", ENGINE,
       "stop() ends work in flight"),
    _m("engine-deadline-ignores-sampler", "exporter/engine.py",
       "deadline = max(self.tick_deadline, 2 * interval, *(s.max_tick_seconds for s in members))",
       "deadline = self.tick_deadline", ENGINE, "a sampler's own max_tick_seconds and 2 intervals"),
    _m("engine-stuck-never-returns", "exporter/engine.py", "self._withdrawn.discard(name)", "pass", ENGINE,
       "a stuck loop's values come back when it returns"),
    _m("engine-stuck-values-published", "exporter/engine.py",
       "return self._loop_of[sampler.name] not in self._withdrawn", "return True", ENGINE,
       "a stuck loop's values are withdrawn"),
    _m("engine-crash-health-hidden", "exporter/engine.py", "health[sampler.name] = crashed", "pass", ENGINE,
       "a raising or stuck tick is its samplers' health"),
    _m("engine-stuck-nvml-telemetry-kept", "exporter/engine.py",
       "telemetry = self.nvml.telemetry if self.nvml in current else {}", "telemetry = self.nvml.telemetry", ENGINE,
       "a stuck NVML loop publishes no telemetry"),
    _m("engine-crash-never-cleared", "exporter/engine.py", "self._crashed.pop(name, None)", "pass", ENGINE,
       "a good tick clears the crash"),
    _m("engine-burst-after-falling-behind", "exporter/engine.py", "if delay < 0:  # fell behind", "if False:  # fell behind",
       ENGINE, "a loop that fell behind skips ticks instead of bursting"),
    _m("sampler-serves-any-state", "exporter/sampler.py", "return result is not None and result.state == OK",
       "return result is not None", SAMPLER, "a source serves a GPU only while its state is ok"),
    _m("sampler-defaults-after-nvml", "exporter/sampler.py", "    after_nvml = False\n", "    after_nvml = True\n",
       SAMPLER, "samplers start at once unless they map things to GPUs"),
    _m("sampler-state-window-always", "exporter/sampler.py",
       '"window": None if self.window_end is None else [self.window_start, self.window_end]}',
       '"window": [self.window_start, self.window_end]}', SAMPLER, "a state without a window says none"),
)
CUPTI = (EDGE, "tests/test_cupti.py")
ROUND_39_CUPTI = (
    _m("cupti-pid-spoofed", "exporter/samplers/cupti.py", 'if data.get("pid") != peer_pid:', "if False:", CUPTI,
       "a client speaks only for its own pid"),
    _m("cupti-other-window", "exporter/samplers/cupti.py", 'if data.get("window") != window:', "if False:", CUPTI,
       "an answer to another window is refused"),
    _m("cupti-start-slack", "exporter/samplers/cupti.py", "asked_at - START_SLACK_S, asked_at + START_SLACK_S)",
       "asked_at - START_SLACK_S, asked_at + 10 * START_SLACK_S)", CUPTI, "a window starts when asked"),
    _m("cupti-empty-window", "exporter/samplers/cupti.py", "if length <= 0:", "if length < 0:", CUPTI,
       "an empty window is refused"),
    _m("cupti-foreign-gpu", "exporter/samplers/cupti.py", 'if entry["uuid"] not in gpus:', "if False:", CUPTI,
       "a GPU of another host is refused"),
    _m("cupti-busy-over-window", "exporter/samplers/cupti.py",
       'Field("kernel_busy_s", lambda length, got: length * SLACK)',
       'Field("kernel_busy_s", lambda length, got: length * 2)', CUPTI, "kernel-busy time within the window"),
    _m("cupti-sm-over-busy", "exporter/samplers/cupti.py", 'got["kernel_busy_s"] * SLACK + 1e-9)', "length * SLACK)",
       CUPTI, "SM-seconds within the kernel-busy time"),
    _m("cupti-time-not-clamped", "exporter/samplers/cupti.py",
       "ProcessShare(time=round(min(device.kernel_busy_s / length, 1.0), 6),",
       "ProcessShare(time=round(device.kernel_busy_s / length, 6),", CUPTI, "a client's time share is at most 1"),
    _m("cupti-max-clients-boundary", "exporter/samplers/cupti.py", "if len(self._clients) >= self.max_clients:",
       "if len(self._clients) > self.max_clients:", CUPTI, "at most --cupti-max-clients connections"),
    _m("cupti-max-age", "exporter/samplers/cupti.py", "self.max_age = 2 * period_s + window_s",
       "self.max_age = period_s + window_s", CUPTI, "a window lasts two periods and a window"),
    _m("cupti-oversized-line", "exporter/samplers/cupti.py", "if end < 0 or end > protocol.MAX_REPORT_BYTES:",
       "if end < 0:", CUPTI, "a report line over 16 KiB is refused"),
    _m("cupti-no-clients-keeps-windows", "exporter/samplers/cupti.py",
       "self.readings.clear()\n            self.states = {uuid: SourceState(V.STANDBY, NO_CLIENTS)",
       "self.states = {uuid: SourceState(V.STANDBY, NO_CLIENTS)", CUPTI, "no client: no window"),
    _m("cupti-late-client-kept", "exporter/samplers/cupti.py", "                self._drop(key.data)\n",
       "                pass\n", CUPTI, "a client silent past the grace is disconnected"),
)
CUPTI_ONLY = ("tests/test_cupti.py", "-k", "not end_to_end")
ISSUE_42_CUPTI = (  # the tracing socket's hostile numbers, slots and reused pids; the guards tested where they refuse
    _m("cupti-overflow-raised", "exporter/samplers/cupti.py", "    except OverflowError:\n", "    except ZeroDivisionError:\n",
       CUPTI_ONLY, "a number too large for a float is a refused report"),
    _m("cupti-inf-accepted", "exporter/samplers/cupti.py", "    if not math.isfinite(number):", "    if False:",
       CUPTI_ONLY, "1e400 (infinity) is refused"),
    _m("cupti-below-zero", "exporter/samplers/cupti.py", "if not lo <= number <= hi:", "if not number <= hi:",
       CUPTI_ONLY, "no negative seconds"),
    _m("cupti-bool-number", "exporter/samplers/cupti.py", "if isinstance(value, bool) or not", "if not", CUPTI_ONLY,
       "true is not a number"),
    _m("cupti-fraction-count", "exporter/samplers/cupti.py", "if whole and not number.is_integer():", "if False:",
       CUPTI_ONLY, "a count is whole"),
    _m("cupti-copy-over-window", "exporter/samplers/cupti.py", 'Field("copy_busy_s", lambda length, got: length * SLACK)',
       'Field("copy_busy_s", lambda length, got: length * 2)', CUPTI_ONLY, "copy-busy time within the window"),
    _m("cupti-kernels-bound", "exporter/samplers/cupti.py", "MAX_KERNELS = 1e12", "MAX_KERNELS = 1e13", CUPTI_ONLY,
       "at most 1e12 kernels"),
    _m("cupti-end-before-start", "exporter/samplers/cupti.py", '_number(data.get("end"), "end", start,',
       '_number(data.get("end"), "end", start - 1,', CUPTI_ONLY, "a window ends after it starts"),
    _m("cupti-end-past-asked", "exporter/samplers/cupti.py", "min(now + 1.0, start + asked_s + START_SLACK_S)",
       "now + 1.0", CUPTI_ONLY, "a window is no longer than asked"),
    _m("cupti-devices-boundary", "exporter/samplers/cupti.py", "len(devices) > protocol.MAX_DEVICES",
       "len(devices) >= protocol.MAX_DEVICES", CUPTI_ONLY, "16 GPUs are read"),
    _m("cupti-device-twice", "exporter/samplers/cupti.py", 'if entry["uuid"] in out:', "if False:", CUPTI_ONLY,
       "a GPU reported twice is refused"),
    _m("cupti-sm-not-clamped", "exporter/samplers/cupti.py", "sm=round(min(device.sm_seconds / length, 1.0), 6)",
       "sm=round(device.sm_seconds / length, 6)", CUPTI_ONLY, "a client's SM share is at most 1 (issue 42)"),
    _m("cupti-error-keeps-shares", "exporter/samplers/cupti.py",
       "                self.states[uuid] = SourceState(V.ERROR, str(exc))\n            self.readings.clear()",
       "                self.states[uuid] = SourceState(V.ERROR, str(exc))", CUPTI_ONLY,
       "after a socket error no share is served (issue 42)"),
    _m("cupti-parser-exception-kills-tick", "exporter/samplers/cupti.py", "except Exception as exc:  # whatever",
       "except BadReport as exc:  # whatever", CUPTI_ONLY, "an unforeseen parser error is that client's refusal"),
    _m("cupti-pid-reuse-unchecked", "exporter/samplers/cupti.py",
       "if process_start(self.proc_root, client.pid) != client.start:", "if False:", CUPTI_ONLY,
       "a report after the connecting process exited is refused"),
    _m("cupti-zombie-alive", "exporter/samplers/cupti.py", 'stat["state"] in ("Z", "X")', 'stat["state"] in ("X",)',
       CUPTI_ONLY, "a zombie's socket kept by its parent speaks for no one"),
    _m("cupti-unbound-accepted", "exporter/samplers/cupti.py", "        if client.start is None:\n", "        if False:\n",
       CUPTI_ONLY, "a connection without a process to bind to is closed"),
    _m("cupti-per-process-unlimited", "exporter/samplers/cupti.py", "        if older is not None:\n",
       "        if False:\n", CUPTI_ONLY, "one connection per process"),
    _m("cupti-per-user-boundary", "exporter/samplers/cupti.py", "if self._per_user[client.uid] >= self.max_per_user:",
       "if self._per_user[client.uid] > self.max_per_user:", CUPTI_ONLY, "at most --cupti-max-clients-per-user"),
    _m("cupti-per-user-never-freed", "exporter/samplers/cupti.py", "            self._per_user[client.uid] -= 1\n", "",
       CUPTI_ONLY, "a user's connection that goes frees its slot"),
    _m("cupti-per-user-zero-kept", "exporter/samplers/cupti.py", "            if not self._per_user[client.uid]:\n"
       "                del self._per_user[client.uid]\n", "", CUPTI_ONLY, "no tally kept for users who have gone"),
    _m("cupti-by-process-kept", "exporter/samplers/cupti.py", "            del self._by_process[client.process]\n", "",
       CUPTI_ONLY, "a dropped connection is forgotten"),
    _m("cupti-refusal-per-kind-only", "exporter/samplers/cupti.py", "said = (kind, client.who)", "said = (kind, '')",
       CUPTI_ONLY, "one line per client and kind, not per kind"),
    _m("cupti-refusal-every-time", "exporter/samplers/cupti.py", "        if said in self._said:\n", "        if False:\n",
       CUPTI_ONLY, "one line per client and kind, not per report"),
    _m("cupti-refusals-unbounded", "exporter/samplers/cupti.py", "            self._said.popitem(last=False)\n",
       "            pass\n", CUPTI_ONLY, "the remembered refusals are bounded"),
    _m("cupti-refusals-lru", "exporter/samplers/cupti.py", "            self._said.move_to_end(said)\n", "", CUPTI_ONLY,
       "the refusal said last is kept longest"),
)
LEDGER = (EDGE, "tests/test_ledger.py")
ROUND_39_LEDGER = (
    _m("ledger-no-scale", "exporter/ledger.py", "scale = cap / attributed if attributed > cap + EPSILON else 1.0",
       "scale = 1.0", LEDGER, "shares summing past the GPU's time are scaled to it"),
    _m("ledger-cap-ignores-attributed", "exporter/ledger.py",
       "cap = room if busy is None else min(max(busy, attributed), room)", "cap = room if busy is None else min(busy, room)",
       LEDGER, "the holders' own time counts when the GPU's reads lower"),
    _m("ledger-work-over-time", "exporter/ledger.py", "work = min(u.sm * scale, time)", "work = u.sm * scale", LEDGER,
       "a holder's SM work is at most its time"),
    _m("ledger-unmeasured-whole-room", "exporter/ledger.py", "gpu_cells[UNMEASURED] = max(room - known_busy, 0.0)",
       "gpu_cells[UNMEASURED] = room", LEDGER, "unmeasured is what the holders' known busy time leaves"),
    _m("ledger-mps-hidden-without-every-client", "exporter/ledger.py",
       "if concurrent and gpu.complete and gpu.sm is not None and rest > EPSILON:",
       "if concurrent and gpu.sm is not None and rest > EPSILON:", LEDGER,
       "MPS hidden idle split only where every client traces"),
    _m("ledger-mps-hidden-below-work", "exporter/ledger.py", "hidden = max(busy - max(gpu.sm, known_busy), 0.0)",
       "hidden = max(busy - gpu.sm, 0.0)", LEDGER, "hidden idle is what the work leaves of the busy time"),
    _m("ledger-unattributed-work-over-rest", "exporter/ledger.py",
       "unattributed_work = min(max(gpu.sm - work, 0.0), rest)", "unattributed_work = max(gpu.sm - work, 0.0)",
       LEDGER, "unattributed work within the unattributed busy time"),
    _m("ledger-held-over-one-not-split", "exporter/ledger.py", "whole = max(known, 1.0)", "whole = 1.0", LEDGER,
       "held shares past the GPU split the idle time among them"),
    _m("ledger-unknown-share-unheld", "exporter/ledger.py",
       "gpu_cells[UNATTRIBUTED_TIME_IDLE if None in held.values() else UNHELD] = free", "gpu_cells[UNHELD] = free",
       LEDGER, "with a share unknown, the rest of the idle time is not known to be unheld"),
    _m("ledger-switch-not-clipped", "exporter/ledger.py", "switch = _clip(gpu.switch_overhead or 0.0)",
       "switch = gpu.switch_overhead or 0.0", LEDGER, "switch overhead within 0..1"),
    _m("ledger-idle-ignores-switch", "exporter/ledger.py", "idle = max(room - busy, 0.0)", "idle = max(1.0 - busy, 0.0)",
       LEDGER, "time idle is what kernels and switches leave"),
    _m("ledger-gone-gpu-kept", "exporter/ledger.py", "                del self._gpus[uuid]\n", "                pass\n",
       LEDGER, "a GPU that left leaves the ledger"),
    _m("ledger-observed-before-rates", "exporter/ledger.py", "if not book.rates:\n                    continue",
       "if False:\n                    continue", LEDGER, "time before a GPU's first rates is not observed"),
)
# -- issue 37, cost2: what a default exporter imports, and the NVML cadences --------------------------------
DEFAULT_IMPORTS = ("tests/test_cost.py::test_an_exporter_with_the_default_flags_loads_nothing_only_other_flags_use",)
VERSIONS = ("tests/test_http.py::test_every_command_tells_its_version_under_the_name_typed",)
STEP_TAIL = ("tests/test_ctxsw_live.py::test_a_step_is_read_up_to_its_last_bytes_and_its_last_line_says_why_it_failed",)
HEAP_CADENCE = ("tests/test_cost.py::test_the_engine_gives_the_heap_back_after_nvmls_first_tick_and_then_every_minute",)
SCRAPE_ERROR = ("tests/test_cost.py::test_the_8x64_bench_writes_why_it_failed_into_its_result",)
WINDOW_MEMORY = ("tests/test_ctxsw_live.py", "-k", "failing_capture or answer_is_read_whole or last_bytes")
ROUND_37_COST = (
    _m("import-metadata-at-start", "nsys_ingest/commandline.py", "import argparse\n",
       "import argparse\nfrom importlib import metadata  # noqa: F401\n", DEFAULT_IMPORTS,
       "--version reads the package metadata only when given"),
    _m("version-without-prog", "nsys_ingest/commandline.py", 'sys.stdout.write(f"{parser.prog} {version()}\\n")',
       'sys.stdout.write(f"{version()}\\n")', VERSIONS, "--version names the command typed"),
    _m("sqlite-at-import", "exporter/nsys_exports.py", "import os\nimport selectors\n",
       "import os\nimport selectors\nimport sqlite3  # noqa: F401\n", DEFAULT_IMPORTS,
       "SQLite is loaded where an export is read"),
    _m("uploads-always", "exporter/samplers/nsys.py", '    watch_dir, upload = args.nsys_watch_dir, None\n',
       '    from exporter.uploads import UploadSpool  # noqa: F401\n    watch_dir, upload = args.nsys_watch_dir, None\n',
       DEFAULT_IMPORTS, "the upload spool is loaded with its flag"),
    _m("nsys-reader-always", "exporter/samplers/nsys.py", "from exporter.sources import profiled_by\n",
       "from exporter.sources import profiled_by\nfrom nsys_ingest.reader import Export  # noqa: F401\n", DEFAULT_IMPORTS,
       "the nsys source's module (its flags) loads no export reader"),
    _m("serves-from-nsys", "exporter/samplers/nvml.py", "        from exporter.samplers.gpm import engine_busy\n",
       "        from exporter.samplers.gpm import engine_busy\n        from exporter.samplers.nsys import serves\n",
       DEFAULT_IMPORTS, "the NVML sampler does not load the nsys source"),
    _m("attribution-at-import", "exporter/samplers/ctxsw.py",
       "from exporter.vocabulary import ACTIVE, CTXSW, ERROR, MPS_CLIENT, MPS_SERVER, STANDBY, UNSUPPORTED\n",
       "from exporter.vocabulary import ACTIVE, CTXSW, ERROR, MPS_CLIENT, MPS_SERVER, STANDBY, UNSUPPORTED\n"
       "from nsys_ingest.attribution import Attribution  # noqa: F811\n", DEFAULT_IMPORTS,
       "the attribution's classes are loaded by a capture"),
    _m("bind-str-host", "exporter/server.py", 'host = address.encode("ascii") if address.isascii() else address',
       "host = address", DEFAULT_IMPORTS, "an ASCII listen address does not load the IDNA codec"),
    _m("step-tail-uncut", "exporter/nsys_exports.py", "                del tail[:-keep]\n", "                pass\n",
       STEP_TAIL, "a step's output costs its last `keep` bytes while read"),
    _m("step-tail-whole", "exporter/nsys_exports.py", "return bytes(tail[-keep:])", "return bytes(tail)", STEP_TAIL,
       "exactly the last `keep` bytes come back"),
    _m("last-line-first", "exporter/nsys_exports.py", 'return out.rstrip().rpartition("\\n")[2].strip()',
       'return out.strip().partition("\\n")[0].strip()', STEP_TAIL, "a step's last line says why it failed"),
    _m("answer-cut-at-step-tail", "exporter/samplers/ctxsw.py", '"the attribution", keep=MAX_ANSWER_BYTES)',
       '"the attribution")', WINDOW_MEMORY, "the child's answer is read whole up to 4 MiB"),
    _m("give-back-only-on-failure", "exporter/samplers/ctxsw.py", "        finally:\n            heap.give_back()",
       "        else:\n            heap.give_back()", WINDOW_MEMORY, "the heap is given back after every window"),
    _m("give-back-without-trim", "exporter/heap.py", "    libc.malloc_trim(0)\n", "",
       ("tests/test_cost.py::test_the_heap_gives_its_free_pages_back",), "free pages go back to the system"),
    _m("health-every-10-s", "exporter/samplers/nvml.py", "HEALTH_EVERY_S = 30.0", "HEALTH_EVERY_S = 10.0",
       ("tests/test_cost.py",), "the health reads every 30 s (dcgm-exporter's default collection interval)"),
    _m("health-every-29-s", "exporter/samplers/nvml.py", "HEALTH_EVERY_S = 30.0", "HEALTH_EVERY_S = 29.0",
       ("tests/test_cost.py",), "exactly every 30 s"),
    _m("heap-give-back-other-loops", "exporter/engine.py", "            if name == self.nvml.name:\n                self._give_back_heap()",
       "            if name != self.nvml.name:\n                self._give_back_heap()", HEAP_CADENCE,
       "NVML's loop gives the heap back"),
    _m("heap-give-back-boundary", "exporter/engine.py", "if now - self._heap_given_back >= HEAP_GIVE_BACK_S:",
       "if now - self._heap_given_back > HEAP_GIVE_BACK_S:", HEAP_CADENCE, "exactly every 60 s"),
    _m("heap-give-back-every-tick", "exporter/engine.py", "            self._heap_given_back = now\n", "", HEAP_CADENCE,
       "no sooner than 60 s after the last"),
    _m("scrape-8x64-error-uncaught", "bench/scrape_8x64.py", "    except Exception as exc:  # noqa: BLE001 - unattended",
       "    except KeyboardInterrupt as exc:  # noqa: BLE001 - unattended", SCRAPE_ERROR,
       "a failing device run says why in its result"),
    _m("scrape-8x64-exit-0", "bench/scrape_8x64.py", 'return 1 if "error" in result else 0', "return 0", SCRAPE_ERROR,
       "a failing run exits 1"),
)
# -- issue 39, attacks 6-7 left over: GetAllocatableResources walked, the API reader's tallies capped ------
WALKS = ("tests/test_kubelet.py", "-k", "allocatable or parsed_a_pod or list_answer or garbled")
API_TALLIES = (EDGE, "-k", "slices_keep or capacities_a_share or other_drivers or forgotten")
ROUND_39_KUBECAPS = (
    _m("alloc-ids-boundary", "exporter/samplers/kubelet.py", "if device_id not in ids and len(ids) == limit:",
       "if device_id not in ids and len(ids) > limit:", WALKS, "the first `limit` distinct IDs, no more"),
    _m("alloc-ids-repeated-counted", "exporter/samplers/kubelet.py", "if device_id not in ids and len(ids) == limit:",
       "if len(ids) == limit:", WALKS, "an ID listed twice (two NUMA nodes) counts once against the bound"),
    _m("alloc-walk-unbounded", "exporter/samplers/kubelet.py", "reader = WireWalk(answer, ALLOCATABLE_FIELDS_PER_DEVICE * limit)",
       "reader = WireWalk(answer, 10**9)", WALKS, "the walk stops after 8 fields per device"),
    _m("alloc-walk-boundary", "exporter/samplers/kubelet.py", "if self.fields < 0:\n                raise _WalkSpent",
       "if self.fields <= 0:\n                raise _WalkSpent", WALKS, "exactly the fields budget is walked"),
    _m("alloc-walk-inner-uncounted", "exporter/samplers/kubelet.py",
       "for inner, field in reader.walk(span):", "for inner, field in wire_fields(reader.answer, *span):", WALKS,
       "the fields inside an entry count too"),
    _m("alloc-other-resources-read", "exporter/samplers/kubelet.py",
       "            if not resource.startswith(RESOURCE_PREFIX):\n                continue\n            for field in listed:",
       "            for field in listed:", WALKS, "only nvidia.com/ IDs are read"),
    _m("alloc-first-name-counts", "exporter/samplers/kubelet.py", "resource = reader.text(field)",
       "resource = resource or reader.text(field)", WALKS, "a field sent twice: the last counts"),
    _m("alloc-garbled-uncaught", "exporter/samplers/kubelet.py",
       "except Exception as exc:  # noqa: BLE001 - whatever a garbled answer", "except KeyError as exc:  # whatever a garbled answer",
       WALKS, "a garbled Allocatable answer is the tick's problem, not an exception"),
    _m("alloc-cut-silent", "exporter/samplers/kubelet.py", "        if more:  # a GPU's replicas", "        if False:  # a GPU's replicas",
       WALKS, "a cut Allocatable answer is one problem line"),
    _m("alloc-cut-counted", "exporter/samplers/kubelet.py", "(so is a replica's share)\")\n            return None\n",
       "(so is a replica's share)\")\n", WALKS, "a cut answer tells no replica count (shares unknown, never overstated)"),
    _m("list-others-boundary", "exporter/samplers/kubelet.py", "if others > limit:", "if others >= limit:", WALKS,
       "`limit` fields that are no pod are skipped"),
    _m("list-others-unbounded", "exporter/samplers/kubelet.py",
       'raise ValueError(f"more than {limit} fields that are no pod")', "pass", WALKS,
       "more fields that are no pod is no List answer"),
    _m("wire-field-past-end-yielded", "exporter/samplers/kubelet.py", "            if at + size > end:\n",
       "            if False:\n", WALKS, "a field running past the end is refused before it is read"),
    _m("api-slice-devices-uncapped", "exporter/kubernetes_api.py",
       "if (pool, name) not in kept and len(kept) == MAX_SLICE_DEVICES:", "if False:", API_TALLIES,
       "at most MAX_SLICE_DEVICES devices kept"),
    _m("api-slice-devices-boundary", "exporter/kubernetes_api.py", "and len(kept) == MAX_SLICE_DEVICES:",
       "and len(kept) > MAX_SLICE_DEVICES:", API_TALLIES, "exactly MAX_SLICE_DEVICES kept"),
    _m("api-slice-device-twice-counted", "exporter/kubernetes_api.py",
       "if (pool, name) not in kept and len(kept) == MAX_SLICE_DEVICES:", "if len(kept) == MAX_SLICE_DEVICES:",
       API_TALLIES, "a device named twice is one"),
    _m("api-slice-devices-silent", "exporter/kubernetes_api.py", "        if left_out:\n", "        if False:\n",
       API_TALLIES, "devices left out are one line"),
    _m("api-claim-allocations-unfiltered", "exporter/kubernetes_api.py", "if allocation in listed:", "if True:",
       API_TALLIES, "only the allocations the kubelet lists are kept"),
    _m("api-capacity-names-unfiltered", "exporter/kubernetes_api.py",
       "amounts = {name: quantity(value_of(named.get(name))) for name in CAPACITY_NAMES}",
       "amounts = {name: quantity(value_of(v)) for name, v in list(named.items())[:64]}", API_TALLIES,
       "only the capacities a share is split by are kept"),
    _m("kubelet-log-links-unfiltered", "exporter/samplers/kubelet.py", "if entry.name[-68:-4] in ids else None",
       "if True else None", ("tests/test_kubelet.py", "-k", "log_links or over_http"),
       "only the log links of GPU processes' containers are kept"),
    _m("kubelet-pods-held-through-allocatable", "exporter/samplers/kubelet.py", "        del pod_resources\n", "",
       ("tests/test_kubelet.py", "-k", "let_go"), "the parsed pods go before the Allocatable answer comes"),
    _m("alloc-over-cap-called-old-kubelet", "exporter/samplers/kubelet.py", 'if code == "RESOURCE_EXHAUSTED" else',
       "if False else", WALKS, "an Allocatable answer over the cap is said to be one"),
)
# The List answer walked on the wire (kubelet.ListReader): its bounds, its budget, what a cut keeps.
LIST_WALK = ("tests/test_kubelet.py", "-k", "on_the_wire or fields_budget or hostile_list or parsed_a_pod or garbled")
KUBELIST = (
    _m("list-walk-unbounded", "exporter/samplers/kubelet.py", "reader = ListReader(answer, fields)",
       "reader = ListReader(answer, 10**9)", LIST_WALK, "at most LIST_FIELDS fields walked"),
    _m("list-walk-boundary", "exporter/samplers/kubelet.py", "if self.fields < 0:\n                raise _WalkSpent",
       "if self.fields <= 0:\n                raise _WalkSpent", LIST_WALK, "exactly LIST_FIELDS fields are walked"),
    _m("list-walk-ids-uncounted", "exporter/samplers/kubelet.py",
       "            for number, inner in self.walk(span):\n                if inner is NO_SPAN:",
       "            for number, inner in wire_fields(self.answer, *span):\n                if inner is NO_SPAN:", LIST_WALK,
       "the fields inside a device entry count against the budget"),
    _m("list-ids-kept-unbounded", "exporter/samplers/kubelet.py", "if len(kept) < room:", "if True:", LIST_WALK,
       "at most MAX_DEVICES IDs kept (a span per ID listed was the memory)"),
    _m("list-ids-kept-boundary", "exporter/samplers/kubelet.py", "room = max(0, MAX_DEVICES - self.device_ids)",
       "room = max(0, MAX_DEVICES + 1 - self.device_ids)", LIST_WALK, "exactly MAX_DEVICES IDs kept"),
    _m("list-other-resource-counted", "exporter/samplers/kubelet.py",
       "            if devices.resource_name.startswith(RESOURCE_PREFIX):\n                self.device_ids",
       "            if True:\n                self.device_ids", LIST_WALK, "only nvidia.com/ IDs are kept and counted"),
    _m("list-first-name-counts", "exporter/samplers/kubelet.py", "devices.resource_name = self.text(inner)",
       "devices.resource_name = devices.resource_name or self.text(inner)", LIST_WALK, "a field sent twice: the last counts"),
    _m("list-cut-entry-dropped", "exporter/samplers/kubelet.py", "        finally:\n            if devices.resource_name",
       "        except _WalkSpent:\n            raise\n        else:\n            if devices.resource_name", LIST_WALK,
       "a walk cut inside an entry keeps the IDs it read"),
    _m("list-containers-kept-unbounded", "exporter/samplers/kubelet.py", "if self.containers <= MAX_CONTAINERS:",
       "if True:", LIST_WALK, "containers past MAX_CONTAINERS are counted, never walked"),
    _m("list-containers-kept-boundary", "exporter/samplers/kubelet.py", "if self.containers <= MAX_CONTAINERS:",
       "if self.containers < MAX_CONTAINERS:", LIST_WALK, "exactly MAX_CONTAINERS containers read"),
    _m("list-claim-devices-boundary", "exporter/samplers/kubelet.py", "if self.claim_devices <= MAX_DEVICES:",
       "if self.claim_devices < MAX_DEVICES:", LIST_WALK, "exactly MAX_DEVICES claim devices read"),
    _m("list-claim-fields-swapped", "exporter/samplers/kubelet.py", '3: "pool_name", 4: "device_name"',
       '3: "device_name", 4: "pool_name"', LIST_WALK, "a claim device's fields by their numbers"),
    _m("list-cut-silent", "exporter/samplers/kubelet.py", "        elif more == Unread.FIELDS:", "        elif False:",
       LIST_WALK, "a cut List answer is said, first"),
    _m("list-cut-said-last", "exporter/samplers/kubelet.py", "problems.insert(0, f\"the kubelet's List answer",
       "problems.insert(len(problems), f\"the kubelet's List answer", LIST_WALK,
       "the cut comes before the counts it qualifies"),
)
# Issue 42 item 1: a lost GPU is that GPU's problem (tests/test_nvml_lost.py; the alert's boundaries: promtool).
LOST = ("tests/test_nvml_lost.py",)
LOST_GPU = (
    _m("lost-at-listing-fails-all", "exporter/samplers/nvml.py", "            except NvmlError as exc:\n"
       "                unreachable[index] = exc\n", "            except KeyError as exc:\n"
       "                unreachable[index] = exc\n", LOST, "one GPU that cannot be asked leaves the others listed"),
    _m("lost-address-guessed", "exporter/nvml.py", "        if len(unclaimed) == len(silent):",
       "        if len(unclaimed) >= len(silent):", LOST, "no address is guessed where the lists do not add up"),
    _m("lost-address-not-pci-order", "exporter/nvml.py", "unclaimed = sorted(set(", "unclaimed = sorted(reverse=True, "
       "iterable=set(", LOST, "the silent GPUs take the unclaimed addresses in PCI order"),
    _m("lost-retry-boundary", "exporter/samplers/nvml.py", "self._lost[gpu.index] < LOST_RETRY_S:",
       "self._lost[gpu.index] <= LOST_RETRY_S:", LOST, "asked again exactly LOST_RETRY_S after"),
    _m("lost-another-uuid-back", "exporter/samplers/nvml.py", "        elif answer[\"uuid\"] != gpu.uuid:\n            return True\n",
       "", LOST, "another GPU answering at a lost one's index is not that GPU back"),
    _m("lost-placeholder-read-under-its-name", "exporter/samplers/nvml.py", "        return is_unnamed(gpu)\n",
       "        return False\n", LOST, "the tick that names a placeholder does not read it under the placeholder"),
    _m("lost-placeholder-telemetry-kept", "exporter/samplers/nvml.py", "        telemetry = {}\n        for gpu in self.gpus:",
       "        telemetry = dict(self.telemetry)\n        for gpu in self.gpus:", LOST, "a renamed GPU's placeholder goes"),
    _m("lost-gauge-inverted", "exporter/collectors/gpu.py", "1.0 if tel.lost else 0.0", "0.0 if tel.lost else 1.0", LOST,
       "gpu_lost is 1 while lost"),
    _m("lost-healthz-silent", "exporter/app.py", "    if lost:\n        # 200", "    if False:\n        # 200", LOST,
       "/healthz names the lost GPU"),
)
MUTANTS = (MUTANTS + ROUND_39 + ROUND_39_NEW + ROUND_39_CUPTI + ISSUE_42_CUPTI + ROUND_39_LEDGER + ROUND_39_KUBECAPS + ROUND_37_COST + KUBELIST
           + LOST_GPU)


def _is_test_path(arg: str) -> bool:
    return arg.startswith("tests/")


def tests_without(tests: tuple[str, ...], without: set[str]) -> list[str]:
    """The mutant's pytest arguments less the test files in `without` (with their node ids); no test path
    left: none at all (a bare `-k` would run the whole suite)."""
    kept = [t for t in tests if not (_is_test_path(t) and t.split("::")[0] in without)]
    return kept if any(_is_test_path(t) for t in kept) else []


def applies(mutant: Mutant) -> str | None:
    """None when the mutant applies exactly once, else why not."""
    try:
        locate(mutant)
    except NotApplicable as exc:
        return str(exc)
    return None


def run_mutant(mutant: Mutant, without: set[str] = frozenset()) -> dict:
    try:
        where = locate(mutant)[0]
    except NotApplicable as exc:
        return {**asdict(mutant), "result": "not applicable", "detail": str(exc)}
    tests = resolve_tests(tuple(tests_without(mutant.tests, without)))
    if not tests:
        return {**asdict(mutant), "result": "survived", "detail": "no test left to run", "seconds": 0.0}
    started = time.monotonic()
    target, original = apply(mutant)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            result = "survived" if done.returncode == 0 else ("caught" if done.returncode == 1 else
                                                               f"error (pytest exit {done.returncode})")
            tail = (done.stdout.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            result, tail = "caught (timeout)", f"tests ran past {TIMEOUT_S} s"
    finally:
        target.write_text(original)
    moved = {"applied_in": where} if where != mutant.path else {}
    return {**asdict(mutant), **moved, "result": result, "detail": tail, "seconds": round(time.monotonic() - started, 1)}


def per_module(results: list[dict]) -> dict[str, dict]:
    """path -> counts of caught, survived and other, and the survival rate over the mutants that applied."""
    out: dict[str, dict] = {}
    for r in results:
        row = out.setdefault(r["path"], {"mutants": 0, "caught": 0, "survived": 0, "other": 0})
        row["mutants"] += 1
        kind = "caught" if r["result"].startswith("caught") else "survived" if r["result"] == "survived" else "other"
        row[kind] += 1
    for row in out.values():
        ran = row["caught"] + row["survived"]
        row["survival"] = round(row["survived"] / ran, 3) if ran else None
    return out


def _interrupted(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--module", nargs="+", metavar="PATH", help="run the mutants of these files only")
    parser.add_argument("--without", nargs="+", default=[], metavar="TESTFILE",
                        help="leave these test files out of every mutant's tests (the rate before them)")
    parser.add_argument("--rerun", metavar="RESULTS", help="run only the mutants that survived in this results file")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="say which mutants no longer apply, and exit")
    parser.add_argument("--function", nargs="+", metavar="PATH:NAME",
                        help="instead of the table: every operator mutant of these functions (tests/mutants.py: "
                             "comparisons flipped, constants off by one, clamps and `not` dropped, and/or swapped)")
    parser.add_argument("--tests", nargs="+", default=[], metavar="ARG",
                        help="with --function: the pytest arguments that must catch them (one -k expression as "
                             "'-k=EXPR')")
    args = parser.parse_args(argv)
    table = MUTANTS
    if args.function:
        if not any(t.startswith("tests/") for t in args.tests):
            parser.error("--function needs --tests naming test files (never the whole suite)")
        tests = tuple(x for t in args.tests for x in (("-k", t[3:]) if t.startswith("-k=") else (t,)))
        try:
            table = tuple(m for spec in args.function for m in operator_mutants(*spec.split(":", 1), tests))
        except (NotApplicable, TypeError) as exc:
            parser.error(f"--function: {exc}")
    chosen = [m for m in table if (not args.only or m.id in args.only) and (not args.module or m.path in args.module)]
    if args.rerun:
        survived = {r["id"] for r in json.loads(Path(args.rerun).read_text()) if r["result"] == "survived"}
        chosen = [m for m in chosen if m.id in survived]
    if len({m.id for m in table}) != len(table):
        raise SystemExit("two mutants share an id")
    if args.list:
        for m in chosen:
            print(f"{m.id:42} {m.path:36} {m.why}")
        return 0
    if args.check:
        stale = [(m, why) for m in chosen if (why := applies(m)) is not None]
        for m, why in stale:
            print(f"not applicable: {m.id} ({m.path}: {why})")
        print(f"{len(chosen) - len(stale)} of {len(chosen)} mutants apply")
        return 1 if stale else 0
    # SIGTERM (and SIGINT, which a shell without job control ignores in background jobs) end the run
    # through the mutant's `finally`: its file is restored and its pytest killed.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    results = []
    for mutant in chosen:
        result = run_mutant(mutant, set(args.without))
        results.append(result)
        print(f"{result['result']:18} {mutant.id:42} {result.get('seconds', '')!s:>6} s  {result['detail']}", flush=True)
        if args.out:  # as it goes: a run cut short keeps what it found
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    caught = sum(r["result"].startswith("caught") for r in results)
    print(f"{len(results)} mutants, {caught} caught, "
          f"{sum(r['result'] == 'survived' for r in results)} survived, "
          f"{sum(r['result'] not in ('survived',) and not r['result'].startswith('caught') for r in results)} other")
    for path, row in sorted(per_module(results).items()):
        rate = "-" if row["survival"] is None else f"{row['survival']:.0%}"
        print(f"  {path:36} {row['mutants']:3} mutants {row['caught']:3} caught {row['survived']:3} survived "
              f"{row['other']:2} other  survival {rate}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
