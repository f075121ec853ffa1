"""The GPU ledger (exporter/ledger.py, docs/ledger.md): every GPU-second of every GPU in exactly one cell.
Small synthetic cases computed by hand, through the workload join where the join can build them (NVML
samples, holders, context-switch windows), else through the cells themselves (MPS with basis cupti)."""
import pytest

from exporter import ledger
from exporter.holders import REPLICAS, Held, Holdings
from exporter.ledger import GpuUse, HolderUse, cells, waste
from exporter.sampler import ProcessShare, ProcessWindow, SourceState
from exporter.snapshot import DeviceTelemetry, GpuIdentity, GpuView
from exporter.vocabulary import (BUSY_UNSPLIT, CTXSW, GPU_CELLS, HIDDEN_IDLE, SM_ACTIVE_WORK, SWITCH_OVERHEAD, TIME_IDLE,
                                 UNATTRIBUTED_BUSY_UNSPLIT, UNATTRIBUTED_HIDDEN_IDLE, UNATTRIBUTED_SM_ACTIVE_WORK,
                                 UNATTRIBUTED_TIME_IDLE, UNHELD, UNMEASURED, LOST)
from exporter.workloads import Holder, WorkloadAccountant
from tests.test_workloads import GPU0, view

A, B, C = Holder("t", "a", "c"), Holder("t", "b", "c"), Holder("t", "c", "c")


def run(views, shares, owners, seconds=10.0):
    """The accountant over `seconds` (two updates): each GPU's counted cells and each holder's."""
    acc = WorkloadAccountant()
    holdings = [Holdings(gpus={v.identity.uuid: {h: Held(s, REPLICAS) for h, s in shares.get(v.identity.uuid, shares).items()}
                               for v in views}, owners=owners)]
    acc.update(100.0, views, holdings)
    workloads = acc.update(100.0 + seconds, views, holdings)
    return {b.gpu.uuid: b for b in acc.gpu_ledgers}, {w.holder: w.counters["ledger"] for w in workloads}


def only(counts: dict) -> dict:
    """The cells that are not 0, rounded: what a reader checks by hand."""
    return {k: round(v, 6) for k, v in counts.items() if abs(v) > 1e-9}


def test_four_replicas_two_busy_pods_and_an_idle_one_count_one_gpu_second_per_second():
    """a holds 2 of 4 replicas, b and c one each; a and b keep the GPU busy 100% (NVML 0.5 each), SM active
    0.6 split by time share; c runs nothing. The old account booked 1.25 GPU-s per second (c's held-idle
    0.25 beside a and b's busy 1.0); here the GPU's second is a's and b's work and hidden idle, nothing else."""
    v = view({1: 0.5, 2: 0.5}, {1: "time_sliced", 2: "time_sliced"}, time_utilization=1.0, sm_active=0.6)
    gpus, holders = run((v,), {A: 0.5, B: 0.25, C: 0.25}, {1: A, 2: B})
    book = gpus[GPU0.uuid]
    assert book.observed == 10.0
    assert only(book.counters) == {SM_ACTIVE_WORK: 6.0, HIDDEN_IDLE: 4.0}
    assert only(holders[A]) == {SM_ACTIVE_WORK: 3.0, HIDDEN_IDLE: 2.0}
    assert only(holders[B]) == {SM_ACTIVE_WORK: 3.0, HIDDEN_IDLE: 2.0}
    assert only(holders[C]) == {}
    assert waste(book.counters) == pytest.approx(4.0)


def test_an_idle_holder_beside_a_busy_one_shares_the_time_idle_by_held_share():
    """a (half) alone runs: time 0.6, SM active 0.3 (exact); b (half) runs nothing. The 0.4 of the time no
    kernel ran is both holders', by held share: 0.2 each; nobody's busy time is b's."""
    v = view({1: 1.0}, {1: "time_sliced"}, time_utilization=0.6, sm_active=0.3)
    gpus, holders = run((v,), {A: 0.5, B: 0.5}, {1: A})
    assert only(holders[A]) == {SM_ACTIVE_WORK: 3.0, HIDDEN_IDLE: 3.0, TIME_IDLE: 2.0}
    assert only(holders[B]) == {TIME_IDLE: 2.0}
    assert only(gpus[GPU0.uuid].counters) == {SM_ACTIVE_WORK: 3.0, HIDDEN_IDLE: 3.0, TIME_IDLE: 4.0}


def test_a_gpu_without_holders_is_unheld_where_idle_and_unattributed_where_busy():
    """A process of nobody's keeps the GPU 30% busy, SM active 0.1: its work and hidden idle are nobody's."""
    v = view({9: 1.0}, {9: "time_sliced"}, time_utilization=0.3, sm_active=0.1)
    gpus, holders = run((v,), {}, {})
    assert holders == {}
    assert only(gpus[GPU0.uuid].counters) == {UNATTRIBUTED_SM_ACTIVE_WORK: 1.0, UNATTRIBUTED_HIDDEN_IDLE: 2.0,
                                              UNHELD: 7.0}
    assert sum(gpus[GPU0.uuid].counters.values()) == pytest.approx(10.0, abs=1e-9)


def test_nvml_shares_summing_to_1_3_are_scaled_to_the_gpus_time():
    """NVML's per-process samples say 0.8 and 0.5 (1.3) of a GPU busy 0.9, SM active 0.45: each is scaled
    by 0.9 / 1.3, SM split by time share; 0.1 idle, half each."""
    v = view({1: 0.8, 2: 0.5}, {1: "time_sliced", 2: "time_sliced"}, time_utilization=0.9, sm_active=0.45)
    gpus, holders = run((v,), {A: 0.5, B: 0.5}, {1: A, 2: B}, seconds=1.0)
    assert only(holders[A]) == {SM_ACTIVE_WORK: round(0.45 * 0.8 / 1.3, 6), HIDDEN_IDLE: round(0.45 * 0.8 / 1.3, 6),
                                TIME_IDLE: 0.05}
    assert only(holders[B]) == {SM_ACTIVE_WORK: round(0.45 * 0.5 / 1.3, 6), HIDDEN_IDLE: round(0.45 * 0.5 / 1.3, 6),
                                TIME_IDLE: 0.05}
    assert sum(gpus[GPU0.uuid].counters.values()) == pytest.approx(1.0, abs=1e-9)
    # the same raw shares without a GPU total to scale to (NVML read no time utilization): 1.3 is cut to 1
    mine, gpu = cells(GpuUse(busy=None), {A: HolderUse(0.5, 0.8), B: HolderUse(0.5, 0.5)})
    assert only(mine[A]) == {BUSY_UNSPLIT: round(0.8 / 1.3, 6)} and only(gpu) == {BUSY_UNSPLIT: 1.0}


class WindowSource:
    """A workload source (exporter.sampler.WorkloadSource) whose fresh window is given: the join reads it."""

    name, basis = "ctxsw", CTXSW

    def __init__(self, window):
        self.window = window

    def fresh(self, uuid, now):
        return self.window

    def state(self, uuid, now):
        return SourceState("active", "test", self.window.window_start, self.window.window_end)


def test_a_ctxsw_window_with_20_percent_switch_gaps():
    """The window: resident time a 0.4 (SM of its slices 0.3), b 0.2 (SM 0.1), gaps between slices 0.2; no
    spatial source for the GPU itself (its SM active is the window's). 0.2 is left idle, 0.1 each; NVML's
    0.99 busy of the same GPU does not enter (the window's own figures sum to it)."""
    window = ProcessWindow(CTXSW, 90.0, 100.0, frozenset({1, 2}),
                           {1: ProcessShare(0.4, 0.3), 2: ProcessShare(0.2, 0.1)}, switch_overhead=0.2)
    v = view({1: 0.5, 2: 0.5}, {1: "time_sliced", 2: "time_sliced"}, time_utilization=0.99, sm_active=None)
    acc = WorkloadAccountant(sources=[WindowSource(window)])
    holdings = [Holdings(gpus={GPU0.uuid: {A: Held(0.5, REPLICAS), B: Held(0.5, REPLICAS)}}, owners={1: A, 2: B})]
    acc.update(100.0, (v,), holdings)
    holders = {w.holder: w.counters["ledger"] for w in acc.update(110.0, (v,), holdings)}
    assert only(holders[A]) == {SM_ACTIVE_WORK: 3.0, HIDDEN_IDLE: 1.0, TIME_IDLE: 1.0}
    assert only(holders[B]) == {SM_ACTIVE_WORK: 1.0, HIDDEN_IDLE: 1.0, TIME_IDLE: 1.0}
    (book,) = acc.gpu_ledgers
    assert only(book.counters) == {SM_ACTIVE_WORK: 4.0, HIDDEN_IDLE: 2.0, TIME_IDLE: 2.0, SWITCH_OVERHEAD: 2.0}
    assert waste(book.counters) == pytest.approx(6.0) and book.observed == 10.0


def test_mps_without_per_client_numbers_leaves_the_busy_time_unattributed():
    """Two MPS clients (half each), NVML charges the server: no client time. The GPU's 0.8 busy (0.3 SM
    active) is unattributed work and hidden idle; the 0.2 no kernel ran is the clients', by held share."""
    v = view({588: 1.0}, {1: "mps", 2: "mps", 588: "mps_server"}, time_utilization=0.8, sm_active=0.3, mode="mps")
    gpus, holders = run((v,), {A: 0.5, B: 0.5}, {1: A, 2: B})
    assert only(holders[A]) == only(holders[B]) == {TIME_IDLE: 1.0}
    assert only(gpus[GPU0.uuid].counters) == {UNATTRIBUTED_SM_ACTIVE_WORK: 3.0, UNATTRIBUTED_HIDDEN_IDLE: 5.0,
                                              TIME_IDLE: 2.0}


def test_mps_with_cupti_clients_lays_sm_shares_side_by_side_and_splits_hidden_idle_by_kernel_time():
    """Clients' kernel-busy 0.7 and 0.4 overlap (1.1 > the GPU's 0.8); their SM shares, scaled to the GPU's
    0.3, are work; the GPU's hidden idle 0.5 goes 7:4 where every client traces, else stays unattributed."""
    gpu_use = GpuUse(busy=0.8, sm=0.3, complete=True)
    mine, gpu = cells(gpu_use, {A: HolderUse(0.5, 0.7, 0.2, True), B: HolderUse(0.5, 0.4, 0.1, True)})
    assert only(mine[A]) == {SM_ACTIVE_WORK: 0.2, HIDDEN_IDLE: round(0.5 * 7 / 11, 6), TIME_IDLE: 0.1}
    assert only(mine[B]) == {SM_ACTIVE_WORK: 0.1, HIDDEN_IDLE: round(0.5 * 4 / 11, 6), TIME_IDLE: 0.1}
    assert sum(gpu.values()) == pytest.approx(1.0, abs=1e-12)
    # a third client that does not trace: whose hidden idle it is cannot be known
    mine, gpu = cells(GpuUse(busy=0.8, sm=0.3, complete=False),
                      {A: HolderUse(0.4, 0.7, 0.2, True), B: HolderUse(0.4, 0.4, 0.1, True), C: HolderUse(0.2)})
    assert only(mine[A]) == {SM_ACTIVE_WORK: 0.2, TIME_IDLE: 0.08}
    assert only(mine[C]) == {TIME_IDLE: 0.04}
    assert only(gpu) == {SM_ACTIVE_WORK: 0.3, UNATTRIBUTED_HIDDEN_IDLE: 0.5, TIME_IDLE: 0.2}


def test_mig_instances_without_per_process_numbers():
    """A MIG holder of 60/132 of the SMs whose instance read SM 0.2: its work is known; the GPU's time
    utilization is not (NVML has none on MIG): the rest of the second is unmeasured, not idle."""
    mine, gpu = cells(GpuUse(busy=None), {A: HolderUse(60 / 132, None, 0.2), B: HolderUse(72 / 132)})
    assert only(mine[A]) == {SM_ACTIVE_WORK: 0.2} and only(mine[B]) == {}
    assert only(gpu) == {SM_ACTIVE_WORK: 0.2, UNMEASURED: 0.8}


def test_held_shares_past_the_whole_gpu_split_the_idle_time_never_count_it_twice():
    """Estimated shares (even splits) of 1.0 and 0.5 on one GPU busy 0.4: the 0.6 no kernel ran goes 2:1,
    0.4 and 0.2, not 0.6 and 0.3; nothing is unheld."""
    mine, gpu = cells(GpuUse(busy=0.4, sm=0.2), {A: HolderUse(1.0, 0.4, 0.2), B: HolderUse(0.5, 0.0, 0.0)})
    assert only(mine[A]) == {SM_ACTIVE_WORK: 0.2, HIDDEN_IDLE: 0.2, TIME_IDLE: 0.4}
    assert only(mine[B]) == {TIME_IDLE: 0.2}
    assert only(gpu) == {SM_ACTIVE_WORK: 0.2, HIDDEN_IDLE: 0.2, TIME_IDLE: 0.6}


def test_unknown_held_shares_and_spatial_readings_are_named_not_guessed():
    """b's share is unknown (replicas without GetAllocatableResources): the idle time beyond a's share is
    not known to be unheld. No spatial reading: a's busy time and the stranger's stay unsplit."""
    mine, gpu = cells(GpuUse(busy=0.5), {A: HolderUse(0.25, 0.3), B: HolderUse(None, 0.0)})
    assert only(mine[A]) == {BUSY_UNSPLIT: 0.3, TIME_IDLE: 0.125}
    assert only(gpu) == {BUSY_UNSPLIT: 0.3, UNATTRIBUTED_BUSY_UNSPLIT: 0.2, TIME_IDLE: 0.125,
                         UNATTRIBUTED_TIME_IDLE: 0.375}


def test_a_lost_gpu_stays_in_the_ledger_as_lost_and_a_gone_one_ends_where_it_was_last_seen():
    """Two GPUs; GPU 1 (held whole by a) answers GPU_IS_LOST at 110: its second is `lost` (it still exists)
    and a keeps holding it (held counts on, its ledger cells stop); at 120 it is gone (no view): its
    ledger and a's series end (nothing frozen); back at 130 it counts from 0; GPU 0 counts on."""
    gpu1 = GpuIdentity(1, "GPU-bbbb", "H100")
    v0 = view({}, {}, time_utilization=0.0, sm_active=0.0)
    v1 = GpuView(gpu1, DeviceTelemetry(gpu1, 0.0, processes=(), compute_processes=()), 0.0, None, None, None, None,
                 (), "time_sliced")
    lost = GpuView(gpu1, DeviceTelemetry(gpu1, 0.0, lost=True), None, None, None, None, None, (), "time_sliced")
    holding = [Holdings(gpus={gpu1.uuid: {A: Held(1.0, REPLICAS)}}, owners={})]
    acc = WorkloadAccountant()
    for t, views in ((100.0, (v0, v1)), (105.0, (v0, v1)), (110.0, (v0, lost)), (115.0, (v0, lost)),
                     (120.0, (v0,)), (130.0, (v0, v1)), (133.0, (v0, v1))):
        held = acc.update(t, views, holding)
        if t == 105.0:
            assert {b.gpu.index: b.observed for b in acc.gpu_ledgers} == {0: 5.0, 1: 5.0}
        if t == 115.0:
            assert [(w.holder, w.held_share, w.time_share, w.sm_active) for w in held] == [(A, 1.0, None, None)]
            assert held[0].counters["held"] == 15.0 and only(held[0].counters["ledger"]) == {TIME_IDLE: 10.0}
            assert only(acc.gpu_ledgers[1].counters) == {TIME_IDLE: 10.0, LOST: 5.0}
        if t == 120.0:
            assert [b.gpu.index for b in acc.gpu_ledgers] == [0] and held == ()
    books = {b.gpu.index: b for b in acc.gpu_ledgers}
    assert books[0].observed == 33.0 and only(books[0].counters) == {UNHELD: 33.0}
    assert books[1].observed == 3.0 and books[1].created == 130.0 and only(books[1].counters) == {TIME_IDLE: 3.0}


@pytest.mark.parametrize("gpu_use", [GpuUse(busy=1.0, sm=0.9), GpuUse(busy=0.2, sm=0.5), GpuUse(busy=None, sm=0.3),
                                     GpuUse(busy=0.7, sm=None, switch_overhead=0.4), GpuUse(busy=0.0, sm=0.0)])
def test_cells_sum_to_the_wall_clock_whatever_the_inputs(gpu_use):
    """Shares past their whole (2.0 held, time 1.2, SM above time): every second still sums to 1 and no
    cell is negative."""
    holders = {A: HolderUse(1.0, 0.9, 1.0), B: HolderUse(1.0, 0.3, None), C: HolderUse(None, None, 0.4, True)}
    mine, gpu = cells(gpu_use, holders)
    assert set(gpu) <= set(GPU_CELLS) and min(gpu.values()) >= 0
    assert sum(gpu.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(min(c.values(), default=0) >= 0 for c in mine.values())
    assert waste(gpu) <= 1.0


def test_the_ledger_is_one_module_holding_its_gpus():
    book = ledger.Ledger()
    book.set(GPU0, {UNHELD: 1.0}, 0.0)
    book.integrate(2.5)
    assert book.books()[0].to_json() == {"gpu": 0, "uuid": GPU0.uuid, "model": GPU0.model, "cells": {UNHELD: 1.0},
                                         "gpu_seconds": {UNHELD: 2.5}, "observed_seconds": 2.5}


def test_mps_clients_tracing_with_cupti_through_the_join():
    """The cupti engineer's MPS GPU (tests/test_cupti.py): the trainer's clients 501, 502 (kernel-busy 1.0
    together, SM estimates scaled to 0.4), the notebook's 503 (0.8, 0.2); the GPU busy 0.99 with SM active 0.6.
    Work is the scaled SM shares (0.4 + 0.2 = the GPU's 0.6); the GPU's hidden idle 0.39 goes 1.0 : 0.8 because
    every client traces; the 0.01 idle half each. Over 10 s, exact."""
    from tests.test_cupti import MPS, MPS_OWNERS, NOTEBOOK, TRAINER, StubSource, clients

    win = clients({501: (1.0, 0.5), 502: (0.4, 0.3), 503: (0.8, 0.4)}, start=0.0, end=1.0)
    accountant = WorkloadAccountant(sources=[StubSource(win)])
    holdings = [Holdings({GPU0.uuid: {TRAINER: Held(0.5), NOTEBOOK: Held(0.5)}}, MPS_OWNERS)]
    accountant.update(1.0, [view(**MPS, sm_active=0.6)], holdings)
    holders = {w.holder: w.counters["ledger"] for w in accountant.update(11.0, [view(**MPS, sm_active=0.6)], holdings)}
    assert only(holders[TRAINER]) == {SM_ACTIVE_WORK: 4.0, HIDDEN_IDLE: round(3.9 / 1.8, 6), TIME_IDLE: 0.05}
    assert only(holders[NOTEBOOK]) == {SM_ACTIVE_WORK: 2.0, HIDDEN_IDLE: round(3.9 * 0.8 / 1.8, 6), TIME_IDLE: 0.05}
    (book,) = accountant.gpu_ledgers
    assert only(book.counters) == {SM_ACTIVE_WORK: 6.0, HIDDEN_IDLE: 3.9, TIME_IDLE: 0.1}
    # a fourth client that does not trace: the GPU's hidden idle is nobody's it can name
    untraced = dict(MPS, compute={**MPS["compute"], 504: "mps"})
    accountant = WorkloadAccountant(sources=[StubSource(win)])
    accountant.update(1.0, [view(**untraced, sm_active=0.6)], holdings)
    accountant.update(11.0, [view(**untraced, sm_active=0.6)], holdings)
    (book,) = accountant.gpu_ledgers
    assert only(book.counters) == {SM_ACTIVE_WORK: 6.0, UNATTRIBUTED_HIDDEN_IDLE: 3.9, TIME_IDLE: 0.1}


def test_a_holder_kind_the_exporter_never_heard_of_is_in_the_account(tmp_path, capsys):
    """tests/dummy_holder.py (LSF jobs, registered by its own module) on the recorded frame (pids 417 + 418 at
    30 + 10 %, 419 at 40 %, 420 of nobody at 20 %): a real Prometheus scrapes it and `gpu-spatial report --by
    hpc_job` shows both jobs in both views. Constant rates, so the ratios are exact whatever the scrape
    times: job 77's busy cells are twice the unattributed host process's, equal to job 88's; its time
    idle equals job 88's (even split); the GPU's cells sum to the seconds that existed."""
    import json

    from exporter.nvml_replay import cut
    from tests.helpers import FIXTURES, Exporter, Prometheus, wait_for
    from tests.test_report import run_report

    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)
    (tmp_path / "jobs").write_text("417 77\n418 77\n419 88\n")
    with Exporter("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2", "--holders", "lsf",
                  "--lsf-job-file", str(tmp_path / "jobs"), module="tests.dummy_holder") as running:
        prom = Prometheus(tmp_path, {"gpu": [running.url.removeprefix("http://")]})
        try:
            def scraped():
                found = prom.query("min(count_over_time(gpu_workload_ledger_gpu_seconds_total[1h]))")
                return found and float(found[0]["value"][1]) >= 8
            wait_for(scraped, 40, 0.5, "eight scrapes of the LSF jobs' ledger")
            code, out, err = run_report(capsys, "--prometheus", prom.url, "--last", "1h", "--by", "hpc_job",
                                        "--source", "counters", "--format", "json")
        finally:
            prom.stop()
    assert code == 0, err
    document = json.loads(out)
    jobs = {g["name"]: g for g in document["groups"]}
    assert set(jobs) == {"lsf-77", "lsf-88"}
    cells = {name: job["ledger"]["cells"] for name, job in jobs.items()}
    ledger = document["gpu_ledger"]
    busy = {name: c["sm_active_work"] + c["hidden_idle"] for name, c in cells.items()}
    nobody = ledger["cells"]["unattributed_sm_active_work"] + ledger["cells"]["unattributed_hidden_idle"]
    rounding = 3e-6  # the JSON's GPU-hours have 6 digits: a few seconds of scrapes are ~1e-3 GPU-h
    assert busy["lsf-77"] == pytest.approx(busy["lsf-88"], abs=rounding) == pytest.approx(2 * nobody, abs=rounding)
    assert busy["lsf-77"] > 100 * rounding
    assert cells["lsf-77"]["time_idle"] == pytest.approx(cells["lsf-88"]["time_idle"], abs=rounding)
    assert ledger["cells_sum_gpu_hours"] == pytest.approx(ledger["observed_gpu_hours"], abs=rounding)
    assert jobs["lsf-77"]["allocation"]["held_gpu_hours"] == pytest.approx(ledger["observed_gpu_hours"] / 2, abs=rounding)


# -- exporter/ledger.py --------------------------------------------------------------------------------
def test_ledger_cells_at_their_edges():
    """Mutants: the holders' own busy time ignored where the GPU's reads lower (a's 0.8 squeezed into 0.5);
    MPS hidden idle taken from the GPU's SM active where the clients' work is larger (cells past 1); switch
    overhead not clipped to the whole GPU."""
    from exporter.ledger import GpuUse, HolderUse, cells
    from exporter.vocabulary import BUSY_UNSPLIT, HIDDEN_IDLE, SM_ACTIVE_WORK, SWITCH_OVERHEAD, TIME_IDLE

    a, b = Holder("t", "a", "c"), Holder("t", "b", "c")
    mine, gpu = cells(GpuUse(busy=0.5), {a: HolderUse(held=1.0, time=0.8)})
    assert mine[a] == {BUSY_UNSPLIT: 0.8, TIME_IDLE: pytest.approx(0.2)}
    assert sum(gpu.values()) == pytest.approx(1.0)
    clients = {a: HolderUse(held=0.5, time=0.6, sm=0.5, concurrent=True), b: HolderUse(held=0.5, time=0.2, sm=0.3,
                                                                                          concurrent=True)}
    mine, gpu = cells(GpuUse(busy=1.0, sm=0.6, complete=True), clients)
    assert mine[a][HIDDEN_IDLE] == pytest.approx(0.15) and mine[b][HIDDEN_IDLE] == pytest.approx(0.05)
    assert (mine[a][SM_ACTIVE_WORK], mine[b][SM_ACTIVE_WORK]) == (0.5, 0.3) and sum(gpu.values()) == pytest.approx(1.0)
    mine, gpu = cells(GpuUse(busy=0.5, switch_overhead=1.2), {a: HolderUse(held=1.0, time=0.5)})
    assert gpu[SWITCH_OVERHEAD] == 1.0 and sum(gpu.values()) == pytest.approx(1.0)
