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
           'row["waste_gpu_hours"] = _zero_nan(row["held_idle_gpu_hours"]) + _zero_nan(row["hidden_idle_gpu_hours"])',
           'row["waste_gpu_hours"] = _zero_nan(row["held_idle_gpu_hours"])',
           (REPORT_GUARDS + "::test_waste_is_held_idle_plus_hidden_idle",), "waste = held idle + hidden idle", True),
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
    # -- issue 36, the first hour: the traps, the README's checks, the demo profile ------------------------
    Mutant('exporterdown-any-job', 'rules/gpu-utilization.rules.yaml', '          or (up == 0 and on (job, instance) present_over_time(gpu_exporter_collector_success[1d]))\n', '',
           ('tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests',), "ExporterDown for any job that published the exporter's series"),
    Mutant('exporterdown-absent-by-job', 'rules/gpu-utilization.rules.yaml', 'or absent(up{job="gpu-spatial-exporter"} or (up and on (job, instance) present_over_time(gpu_exporter_collector_success[1d])))', 'or absent(up{job="gpu-spatial-exporter"})',
           ('tests/test_stack.py::test_promtool_checks_config_rules_and_rule_unit_tests',), 'no false ExporterDown for a job named otherwise'),
    Mutant('rollups-need-formula', 'gpu_spatial/report/account.py', 'need = max(3, math.ceil(2 * window / step) + 1)', 'need = max(3, math.ceil(2 * window / step) + 2)',
           ('tests/test_first_hour.py::test_trap2_the_evaluations_said_needed_are_what_the_planner_needs',), 'the evaluations a run needs'),
    Mutant('rollups-need-boundary', 'gpu_spatial/report/account.py', '    if len(run) < need:', '    if len(run) <= need:',
           ('tests/test_first_hour.py::test_trap2_the_evaluations_said_needed_are_what_the_planner_needs',), 'too few is fewer than needed'),
    Mutant('top-url-metrics', 'gpu_spatial/top/feeds.py', 'r"/(metrics|healthz|docs', 'r"/(healthz|docs',
           ('tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off',), 'top --url takes .../metrics'),
    Mutant('top-api-off', 'gpu_spatial/top/feeds.py', 'if answer.status == 404 and b"--no-api" in answer.body[:4096]:', 'if False:',
           ('tests/test_first_hour.py::test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off',), 'top says the API is off'),
    Mutant('report-exporter-probe', 'gpu_spatial/report/promapi.py', 'return isinstance(health, dict) and health.get("status") in ("ok", "no_gpu", "stale") and "gpus" in health', 'return True',
           ('tests/test_first_hour.py::test_trap4_a_json_404_of_another_server_is_not_called_an_exporter',), "only the exporter's /healthz makes a URL the exporter"),
    Mutant('report-exporter-said', 'gpu_spatial/report/promapi.py', 'if status == 404 and self._is_our_exporter():', 'if False:',
           ('tests/test_first_hour.py::test_trap4_report_pointed_at_the_exporter_says_it_is_one',), 'the report says a URL is the exporter'),
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
    Mutant('top-inprocess-workloads', 'gpu_spatial/top/feeds.py', 'data = {**snapshot_json(snapshot), "workloads": [workload_json(w) for w in snapshot.workloads]}', 'data = snapshot_json(snapshot)',
           ('tests/test_first_hour.py::test_trap8_top_shows_the_users_the_exporter_assigned',), 'in-process top has the workloads'),
    Mutant('top-narrow-model', 'gpu_spatial/top/render.py', '([mark], f" hid{pct(gpu.hidden_idle)}"),\n', '',
           ('tests/test_first_hour.py::test_trap8_top_keeps_the_sm_bar_at_30_columns',), 'narrow top drops the model first'),
    Mutant('top-narrow-bars', 'gpu_spatial/top/render.py', '                       ([mark], "")):', '                       ([mark, model], "")):',
           ('tests/test_first_hour.py::test_trap8_top_keeps_the_sm_bar_at_30_columns',), 'narrowest top keeps both bars'),
    Mutant('nsys-reason-token-file', 'exporter/sources.py', '--nsys-live or --nsys-upload-token-file"', '--nsys-live or --nsys-upload-token"',
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
