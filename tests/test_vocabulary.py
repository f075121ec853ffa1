"""The vocabulary is spelled once (exporter/vocabulary.py, issue 44) and a record refuses a word outside it where
it is built, as client_python's Metric refuses a type outside METRIC_TYPES: a misspelling fails there, not as a
new label value in /metrics, the API and the report."""
from __future__ import annotations

import pytest

from exporter import vocabulary
from exporter.holders import Held
from exporter.snapshot import ComputeProcess, GpuIdentity, SourceResult, SourceStatus
from exporter.workloads import Holder, WorkloadView


def workload(**bases) -> WorkloadView:
    return WorkloadView(holder=Holder(user="u"), gpu=GpuIdentity(0, "GPU-a", "H100"), held_share=1.0, processes=0,
                        pids=(), time_share=None, time_share_reason="", sm_active=None, idle_seconds=0.0,
                        held_idle=False, counters={}, created=0.0, **{"sm_active_basis": None, **bases})


@pytest.mark.parametrize("build, word", [
    (lambda: ComputeProcess(7, "python3", "mps_client"), "process kind 'mps_client'"),
    (lambda: Held(1.0, "replica"), "held-share basis 'replica'"),
    (lambda: SourceResult("active", "an active source is the chain's word"), "source state 'active'"),
    (lambda: SourceStatus("gpm", "ok", "a source's word, not a published state"), "published source state 'ok'"),
    (lambda: workload(held_share_basis="replica"), "held-share basis 'replica'"),
    (lambda: workload(time_share_basis="nvml_scaled"), "time-share basis 'nvml_scaled'"),
    (lambda: workload(sm_active_basis="timeshare"), "SM-active basis 'timeshare'"),
    (lambda: Held(1.0, None), "held-share basis None"),  # None is a word only where the field is optional
    (lambda: ComputeProcess(7, "python3", None), "process kind None"),
])
def test_a_word_outside_the_vocabulary_is_refused_where_the_record_is_built(build, word):
    with pytest.raises(ValueError, match=word):
        build()


def test_every_word_of_the_vocabulary_builds():
    for kind in vocabulary.PROCESS_KINDS:
        assert ComputeProcess(7, "python3", kind).kind == kind
    for basis in vocabulary.HELD_SHARE_BASES:
        assert workload(held_share_basis=basis).held_share_basis == Held(1.0, basis).basis
    for time_basis in (None, *vocabulary.TIME_SHARE_BASES):
        assert workload(time_share_basis=time_basis).time_share_basis == time_basis
    for sm_basis in (None, *vocabulary.SM_ACTIVE_BASES):
        assert workload(sm_active_basis=sm_basis).sm_active_basis == sm_basis
    for state in vocabulary.SOURCE_STATES:
        assert SourceResult(state, "").state == state
    for state in vocabulary.PUBLISHED_STATES:
        assert SourceStatus("gpm", state, "").state == state


def test_the_report_and_nsys_ingest_speak_the_exporters_words():
    from gpu_spatial.report import account
    from nsys_ingest import verdicts

    assert vocabulary.SHARING_MODES is verdicts.SHARING_MODES
    assert set(account.BASES[vocabulary.BUSY]) == set(vocabulary.TIME_SHARE_BASES)
    assert set(account.BASES[vocabulary.SM_ACTIVE]) == set(vocabulary.SM_ACTIVE_BASES)
    assert account.QUANTITIES == vocabulary.QUANTITIES and set(account.WITH_BASIS) <= set(vocabulary.QUANTITIES)
