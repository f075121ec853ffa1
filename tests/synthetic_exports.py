"""Small synthetic exports built from a real one, for what no device capture can give us: the old
schema era (nsys up to 2023.3), other chips' metric names, and several GPUs in one file."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from nsys_ingest.names import split_unit

# Names as other nsys versions and chips spell them (Turing/Ampere/Ada name lists of nsys' metric sets).
CHIP_VARIANTS = {
    "GR Active [Throughput %]": "GR Active",
    "SMs Active [Throughput %]": "SM Active [Throughput %]",
    "Compute Warps in Flight [Throughput %]": "Compute Warps In Flight [Throughput %]",
    "Tensor Active [Throughput %]": "Tensor Active / FP16 Active [Throughput %]",
    "DRAM Read Bandwidth [Throughput %]": "DRAM Read Throughput [Throughput %]",
    "DRAM Write Bandwidth [Throughput %]": "DRAM Write Throughput [Throughput %]",
}


def rows(real: Path):
    con = sqlite3.connect(real)
    names = {(t, m): n for t, m, n in con.execute("select typeId, metricId, metricName from TARGET_INFO_GPU_METRICS")}
    data = con.execute("select timestamp, typeId, metricId, value from GPU_METRICS order by timestamp").fetchall()
    con.close()
    return names, data


def old_era(real: Path, out: Path) -> Path:
    """GENERIC_EVENTS(timestamp, typeId, data JSON) with unit-less names, as nsys 2023.3 wrote them."""
    shutil.copyfile(real, out)
    names, data = rows(real)
    con = sqlite3.connect(out)
    con.executescript("drop table GPU_METRICS; drop table TARGET_INFO_GPU_METRICS;"
                      "create table GENERIC_EVENTS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, data TEXT);")
    events: dict[tuple, dict] = {}
    for ts, type_id, metric_id, value in data:
        stem, unit = split_unit(names[(type_id, metric_id)])
        if unit not in (None, "Throughput %", "MHz"):
            continue  # old exports had one value per metric: the throughput percentage
        events.setdefault((ts, type_id), {})[stem] = value
    con.executemany("insert into GENERIC_EVENTS values (?, ?, ?, ?)",
                    [(ts, ts, t, json.dumps(d)) for (ts, t), d in events.items()])
    con.commit()
    con.close()
    return out


def renamed(real: Path, out: Path, variants=CHIP_VARIANTS) -> Path:
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    for old, new in variants.items():
        con.execute("update TARGET_INFO_GPU_METRICS set metricName=? where metricName=?", (new, old))
    con.commit()
    con.close()
    return out


def two_gpus(real: Path, out: Path) -> Path:
    """GPU 1 repeats GPU 0's samples with SM activity halved, under its own typeId and shifted
    metricIds: only a join on (typeId, metricId) reads it right."""
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    (type0,) = con.execute("select distinct typeId from TARGET_INFO_GPU_METRICS").fetchone()
    type1 = type0 + 1
    sm_ids = [m for m, n in con.execute("select metricId, metricName from TARGET_INFO_GPU_METRICS")
              if n.startswith("SMs Active")]
    con.execute("insert into TARGET_INFO_GPU_METRICS select ?, sourceId, typeName, metricId + 100, metricName "
                "from TARGET_INFO_GPU_METRICS where typeId=?", (type1, type0))
    con.execute("insert into GPU_METRICS select rawTimestamp, timestamp, ?, metricId + 100, "
                f"case when metricId in ({','.join(map(str, sm_ids))}) then value / 2 else value end "
                "from GPU_METRICS where typeId=?", (type1, type0))
    con.execute("insert into TARGET_INFO_GPU (vmId, id, name, uuid, smCount) values (0, 1, 'NVIDIA H100 80GB HBM3', "
                "'11111111-2222-3333-4444-555555555555', 132)")
    con.commit()
    con.close()
    return out


def _edited_copy(real: Path, out: Path, script: str) -> Path:
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    con.executescript(script)
    con.close()
    return out


def without_gpu_metrics(real: Path, out: Path) -> Path:
    return _edited_copy(real, out, "drop table GPU_METRICS; drop table TARGET_INFO_GPU_METRICS;")


def empty_gpu_metrics(real: Path, out: Path) -> Path:
    return _edited_copy(real, out, "delete from GPU_METRICS; vacuum;")


# -- kernel traces -----------------------------------------------------------------------------------
KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"


COPIES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


DROP_COPIES = "".join(f"drop table if exists {table};" for table in COPIES)


def without_copies(real: Path, out: Path) -> Path:
    return _edited_copy(real, out, DROP_COPIES)


def without_kernel_trace(real: Path, out: Path) -> Path:
    """No CUDA trace at all: neither kernels nor copies."""
    return _edited_copy(real, out, f"drop table {KERNELS};" + DROP_COPIES)


def one_kernel(real: Path, out: Path) -> Path:
    """One kernel and nothing else: no copies either."""
    return _edited_copy(real, out, f"delete from {KERNELS} where rowid != (select min(rowid) from {KERNELS});"
                        + DROP_COPIES)


def zero_length_kernels(real: Path, out: Path) -> Path:
    return _edited_copy(real, out, f"update {KERNELS} set end = start;")


def kernels_out_of_order(real: Path, out: Path) -> Path:
    """The same kernels and copies written newest first: the reader must not rely on nsys' order."""
    return _edited_copy(real, out, "".join(
        f"create table k as select * from {table} order by start desc; "
        f"delete from {table}; insert into {table} select * from k; drop table k;" for table in (KERNELS, *COPIES)))


def kernels_on_two_gpus(real: Path, out: Path) -> Path:
    """two_gpus(), and a second process whose CUDA device 1 is GPU 1 runs a copy of the kernels there."""
    two_gpus(real, out)
    return _edited_copy(out, out.with_name(out.stem + "_k.sqlite"),
                        f"insert into {KERNELS} (start, end, deviceId, contextId, streamId, globalPid, demangledName, "
                        "shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
                        "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
                        "select start, end, 1, contextId, streamId, globalPid + 16777216, demangledName, shortName, "
                        "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
                        f"dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId from {KERNELS};")


def _replace_rows(con, table: str, rows: list[dict]) -> None:
    """Replaces every row of `table` with `rows`, each a copy of its first row with the given columns changed."""
    cursor = con.execute(f"select * from {table} limit 1")
    columns = [d[0] for d in cursor.description]
    template = dict(zip(columns, cursor.fetchone()))
    con.execute(f"delete from {table}")
    con.executemany(f"insert into {table} ({', '.join(columns)}) values ({', '.join('?' * len(columns))})",
                    [[{**template, **row}[c] for c in columns] for row in rows])


def with_activities(real: Path, out: Path, kernels=(), copies=(), memsets=None) -> Path:
    """An export whose CUDA trace is exactly the given activities, in start order, on device 0:
    kernels (start, end, globalPid, blocks), copies (start, end, globalPid, bytes, copyKind), memsets
    (start, end, globalPid, bytes). memsets None: the export has no copy or memset tables at all."""
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    _replace_rows(con, KERNELS, [{"start": s, "end": e, "deviceId": 0, "globalPid": g, "gridX": b, "gridY": 1, "gridZ": 1}
                                 for s, e, g, b in sorted(kernels)])
    if memsets is None:
        con.executescript(DROP_COPIES)
    else:
        _replace_rows(con, COPIES[0], [{"start": s, "end": e, "deviceId": 0, "globalPid": g, "bytes": n, "copyKind": k}
                                       for s, e, g, n, k in sorted(copies)])
        _replace_rows(con, COPIES[1], [{"start": s, "end": e, "deviceId": 0, "globalPid": g, "bytes": n}
                                       for s, e, g, n in sorted(memsets)])
    con.commit()
    con.close()
    return out


def preempted(real: Path, out: Path) -> Path:
    """Time slicing as the trace may show it at worst: the kernel each context has in flight when its
    slice ends keeps running in the timestamps until its context gets the GPU back (its end moves to
    just before that process's next kernel), spanning the other contexts' slices."""
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    rows = con.execute(f"select rowid, start, end, globalPid from {KERNELS} order by start").fetchall()
    next_start: dict[int, int] = {}
    moved = []
    for i in range(len(rows) - 1, -1, -1):  # newest first: each process's next kernel is known when reached
        rowid, start, end, gpid = rows[i]
        switch = i + 1 < len(rows) and rows[i + 1][3] != gpid
        if switch and gpid in next_start and next_start[gpid] - 1 > end:
            moved.append((next_start[gpid] - 1, rowid))
        next_start[gpid] = start
    con.executemany(f"update {KERNELS} set end = ? where rowid = ?", moved)
    con.commit()
    con.close()
    return out


def metric_phases(real: Path, out: Path, phases, step_ns: int = 100_000_000) -> Path:
    """GPU 0's GPU metrics replaced by phases (start_s, end_s, {metric name stem: percent}): one sample
    every step_ns in [start, end), every other metric dropped; the kernel trace is left as it is."""
    shutil.copyfile(real, out)
    con = sqlite3.connect(out)
    ids = {split_unit(name)[0]: (type_id, metric_id) for type_id, metric_id, name in
           con.execute("select typeId, metricId, metricName from TARGET_INFO_GPU_METRICS")}
    con.execute("delete from GPU_METRICS")
    rows = []
    for start_s, end_s, values in phases:
        for ts in range(int(start_s * 1e9), int(end_s * 1e9), step_ns):
            rows += [(ts, ts, *ids[stem], percent) for stem, percent in values.items()]
    con.executemany("insert into GPU_METRICS (rawTimestamp, timestamp, typeId, metricId, value) values (?, ?, ?, ?, ?)",
                    rows)
    con.commit()
    con.close()
    return out


# -- GPU context switches (nsys profile --gpuctxsw=true) ----------------------------------------------
MS = 1_000_000  # ns
CTXSW_METRICS = {"gr_active": "GR Active [Throughput %]", "sm_active": "SMs Active [Throughput %]",
                 "sm_occupancy": "Compute Warps in Flight [Throughput %]", "tensor_active": "Tensor Active [Throughput %]",
                 "dram_read": "DRAM Read Bandwidth [Throughput %]"}
# tags as the H200's nsys 2025.3 numbered the two that matter (8, 7); the others' numbers are made up here
DEVICE_ENUM = {8: "RESTORE_START", 7: "SAVE_END", 5: "SAVE_START", 6: "RESTORE_END"}
HOST_BITS = 0x1000000000000  # what nsys' globalPid holds above the pid (pid = (globalPid >> 24) & 0xFFFFFF)


def global_pid(pid: int) -> int:
    return HOST_BITS | (pid << 24)


def type_id(gpu: int) -> int:
    return 0x1000100000000 + gpu  # the H100 fixture's typeId for GPU 0; the GPU is typeId & 0xFF


def ctxsw_export(out: Path, slices=(), samples=(), events=(), processes=None, hz: float | None = 1000,
                 enum=DEVICE_ENUM, reverse: bool = False, start_utc_ns: int = 1_800_000_000 * 10**9,
                 metrics=CTXSW_METRICS) -> Path:
    """An export as `nsys profile --gpuctxsw=true --gpu-metrics-devices=all` writes it, from scratch.

    slices: (gpu, start ms, end ms, pid, contextId) -> a RESTORE_START and a SAVE_END; events: extra
    (gpu, ms, tag (name or number), contextId, pid or None); samples: (gpu, ms, {quantity: ratio}) as
    GPU_METRICS percentages, each describing [ms, next sample); processes: pid -> command (PROCESSES). `reverse` writes the events newest
    first (seqNo still in time order). enum None: no ENUM_GPU_CTX_SWITCH table. metrics: quantity -> the name nsys
    gives it, each GPU's catalogue."""
    by_name = {name: code for code, name in (enum or DEVICE_ENUM).items()}
    rows = []
    for gpu, start, end, pid, ctx in slices:
        rows.append((start, len(rows), by_name["RESTORE_START"], ctx, pid, gpu))
        rows.append((end, len(rows), by_name["SAVE_END"], ctx, pid, gpu))
    for gpu, ms, tag, ctx, pid in events:
        rows.append((ms, len(rows), by_name.get(tag, tag), ctx, pid, gpu))
    rows.sort(key=lambda r: (r[0], r[1]))
    table = [(tag, 0, seq, ctx, round(ms * MS), None if pid is None else global_pid(pid), gpu)
             for seq, (ms, _, tag, ctx, pid, gpu) in enumerate(rows)]
    if reverse:
        table.reverse()
    out.unlink(missing_ok=True)
    con = sqlite3.connect(out)
    con.executescript("""
        create table StringIds (id integer primary key, value text);
        create table TARGET_INFO_SESSION_START_TIME (utcEpochNs integer, utcTime text, localTime text);
        create table META_DATA_CAPTURE (name text not null, value text);
        create table TARGET_INFO_GPU (vmId integer not null, id integer not null, name text, uuid text, smCount integer);
        create table TARGET_INFO_GPU_METRICS (typeId integer not null, sourceId integer not null, typeName text not null,
                                              metricId integer not null, metricName text not null);
        create table GPU_METRICS (rawTimestamp integer not null, timestamp integer not null, typeId integer not null,
                                  metricId integer not null, value integer not null);
        create table GPU_CONTEXT_SWITCH_EVENTS (tag integer not null, vmId integer not null, seqNo integer not null,
                                                contextId integer not null, timestamp integer not null, globalPid integer,
                                                gpuId integer);
        create table PROCESSES (globalPid integer, pid integer, name text);
    """)
    con.execute("insert into TARGET_INFO_SESSION_START_TIME values (?, '', '')", (start_utc_ns,))
    if hz:
        con.execute("insert into META_DATA_CAPTURE values ('GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY', ?)", (str(hz),))
    gpus = sorted({r[6] for r in table if r[6] is not None} | {s[0] for s in samples})
    for gpu in gpus:
        con.execute("insert into TARGET_INFO_GPU values (0, ?, 'NVIDIA H200', ?, 132)",
                    (gpu, f"{gpu:08x}-0000-4000-8000-000000000000"))
        con.executemany("insert into TARGET_INFO_GPU_METRICS values (?, ?, 'GPU metrics', ?, ?)",
                        [(type_id(gpu), type_id(gpu), i, name) for i, name in enumerate(metrics.values())])
    metric_ids = {q: i for i, q in enumerate(metrics)}
    con.executemany("insert into GPU_METRICS values (?, ?, ?, ?, ?)",
                    [(round(ms * MS), round(ms * MS), type_id(gpu), metric_ids[q], value * 100)
                     for gpu, ms, values in samples for q, value in values.items()])
    if not samples:  # profiled without --gpu-metrics-devices
        con.executescript("drop table GPU_METRICS; drop table TARGET_INFO_GPU_METRICS;")
    if enum is not None:
        con.execute("create table ENUM_GPU_CTX_SWITCH (id integer not null primary key, name text, label text)")
        con.executemany("insert into ENUM_GPU_CTX_SWITCH values (?, ?, ?)",
                        [(code, name, name.replace("_", " ").title()) for code, name in enum.items()])
    con.executemany("insert into GPU_CONTEXT_SWITCH_EVENTS values (?, ?, ?, ?, ?, ?, ?)", table)
    con.executemany("insert into PROCESSES values (?, ?, ?)",
                    [(global_pid(pid), pid, name) for pid, name in (processes or {}).items()])
    con.commit()
    con.close()
    return out


def time_sliced(out: Path, densities: dict[int, float], duration_ms: float = 500.0, hz: float = 10000, seed: int = 1,
                ramp_ms: float = 0.0, turn_ms=(1.5, 2.9), gap_ms=(0.02, 0.08), gpus: int = 1) -> tuple[Path, dict[int, float]]:
    """Processes taking ~2.2 ms turns (`turn_ms`: 1.5-2.9 ms, mostly round robin, `gap_ms`: 20-80 us gaps), each with its
    own SM active while resident, except the first `ramp_ms` of each slice (0: the context is still being
    restored); samples at `hz` hold the exact mean of their interval as integer percentages, as nsys
    stores them, stamped at its start; the same processes on each of `gpus` GPUs (their own turns). Returns the
    export and each process's true mean SM active while resident."""
    import bisect
    import random

    rng = random.Random(seed)
    pids = sorted(densities)
    step = 1000.0 / hz
    reach = int(step / turn_ms[0]) + 5  # the slices a sample can overlap, from the one before its start
    slices, samples = [], []
    for gpu in range(gpus):
        mine, t, k = [], 0.0, 0
        while t < duration_ms:
            pid = pids[k % len(pids)] if rng.random() > 0.1 else pids[(k + 1) % len(pids)]
            end = min(t + rng.uniform(*turn_ms), duration_ms)
            mine.append((gpu, t, end, pid, pid))
            t = end + rng.uniform(*gap_ms)
            k += 1
        starts = [s[1] for s in mine]
        for i in range(1, int(round(duration_ms / step)) + 1):
            hi = i * step
            lo = hi - step
            first = max(bisect.bisect_left(starts, lo) - 2, 0)
            busy = sum(max(min(e, hi) - max(s + ramp_ms, lo), 0.0) * densities[pid]
                       for _, s, e, pid, _ in mine[first:first + reach])
            samples.append((gpu, round(lo, 6), {"sm_active": round(busy / step * 100) / 100, "gr_active": 1.0}))
        slices += mine
    resident = {pid: sum(e - s for _, s, e, p, _ in slices if p == pid) for pid in pids}
    active = {pid: sum(max(e - s - ramp_ms, 0.0) * densities[pid] for _, s, e, p, _ in slices if p == pid) for pid in pids}
    ctxsw_export(out, slices=slices, samples=samples, hz=hz, processes={pid: f"job-{pid}" for pid in pids})
    return out, {pid: active[pid] / resident[pid] for pid in pids}


# -- hostile context-switch exports (issue 39; bench/ctxsw_attacks.py runs them at full size) ---------------
def _insert_switches(path: Path, rows: int, select: str) -> Path:
    """`rows` more GPU_CONTEXT_SWITCH_EVENTS from `select` over k = 0..rows-1 (SQLite's own loop: seconds, not
    Python rows)."""
    con = sqlite3.connect(path)
    con.execute("pragma journal_mode=off")
    con.execute(f"insert into GPU_CONTEXT_SWITCH_EVENTS with recursive i(k) as "
                f"(select 0 union all select k + 1 from i where k < {rows} - 1) {select} from i")
    con.commit()
    con.close()
    return path


def switches_in_one_sample(out: Path, slices: int = 5000, slice_ns: int = 1, samples_ms: int = 1) -> Path:
    """`slices` slices of `slice_ns`, two processes taking turns, packed into the first of `samples_ms`
    1 ms samples (at 1 ns each, 5,000 fit in one): the fit's pairs per sample grow with the slices."""
    path = ctxsw_export(out, slices=[(0, samples_ms - 0.5, samples_ms - 0.4, 100, 1)],
                        samples=[(0, ms, {"sm_active": 0.5}) for ms in range(samples_ms + 1)])
    step = max(slice_ns * 2, 2)
    return _insert_switches(path, 2 * slices, f"""
        select case when k % 2 = 0 then 8 else 7 end, 0, k + 10, (k / 2) % 2 + 10,
               1000 + (k / 2) * {step} + (k % 2) * {slice_ns}, {global_pid(300)} + ((k / 2) % 2) * 16777216, 0""")


def unknown_tags(out: Path, rows: int = 1_000_000, kinds: int | None = None) -> Path:
    """`rows` switch events with tags the enum does not name, over 10 ms of samples: each its own, or `kinds`
    of them in turn (1000, 1001, ...)."""
    path = ctxsw_export(out, slices=[(0, 0.0, 1.0, 100, 1)], samples=[(0, ms, {"sm_active": 0.5}) for ms in range(11)])
    return _insert_switches(path, rows, f"select 1000 + k % {kinds or rows}, 0, k + 10, 1, 2000000 + k, "
                                        f"{global_pid(300)}, 0")


def ill_conditioned(out: Path, pairs: int = 128, samples: int = 2048, seed: int = 7) -> Path:
    """`pairs` pairs of processes, one pair per 1 ms sample in turn; in each the two alternate in nearly the
    same proportion (half of the sample each, +- 0.1 %), one at 0.9 and one at 0.1 of every quantity: their
    columns of X are nearly the same, X'X nearly singular, and projected coordinate descent creeps (issue 39,
    attack 3: 20,000 sweeps of every quantity)."""
    import random

    rng = random.Random(seed)
    slices, values = [], []
    for ms in range(samples):
        p = ms % pairs
        split = 0.5 + rng.uniform(-1e-3, 1e-3)
        slices += [(0, ms, ms + split, 1000 + 2 * p, 2 * p + 1), (0, ms + split, ms + 0.999, 1001 + 2 * p, 2 * p + 2)]
        value = round(split * 0.9 + (0.999 - split) * 0.1, 2)
        values.append((0, ms, {q: value for q in CTXSW_METRICS}))
    values.append((0, samples, {q: 0.0 for q in CTXSW_METRICS}))
    return ctxsw_export(out, slices=slices, samples=values)


# -- big exports (nsys_ingest at 50 million rows: bench/ingest_bench.py) ----------------------------------------
FIXTURES = Path(__file__).resolve().parent / "fixtures"
METRICS_SOURCE = FIXTURES / "h100_phases_100hz.sqlite"
KERNEL_SOURCE = FIXTURES / "h100_diag_time_sliced.sqlite"
KERNEL_COLUMNS = ("start, end, deviceId, contextId, streamId, globalPid, demangledName, shortName, registersPerThread, "
                  "gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
                  "localMemoryPerThread, localMemoryTotal, gridId")


def grown(target: Path, rows: int, kernels: bool = False) -> None:
    """A big export of `rows` rows (bench/ingest_bench.py, tests/test_hostile.py): a fixture whose rows are doubled
    (kernels: and the GPU metrics beside them) with timestamps shifted past the previous copies, so the rows stay in
    time order as nsys writes them."""
    shutil.copyfile(KERNEL_SOURCE if kernels else METRICS_SOURCE, target)
    con = sqlite3.connect(target)
    con.execute("pragma journal_mode=off")
    con.execute("pragma synchronous=off")
    table = "CUPTI_ACTIVITY_KIND_KERNEL" if kernels else "GPU_METRICS"
    (have,) = con.execute(f"select count(*) from {table}").fetchone()
    span = con.execute("select max(timestamp) - min(timestamp) + 10000000 from GPU_METRICS").fetchone()[0]
    if kernels:  # copies must start after the previous ones end, whichever table spans longer
        span = max(span, con.execute(f"select max(end) - min(start) + 10000000 from {table}").fetchone()[0])
    metrics_have = con.execute("select count(*) from GPU_METRICS").fetchone()[0]
    shift = span
    while have < rows:
        take = min(have, rows - have)
        if kernels:
            con.execute(f"insert into {table} ({KERNEL_COLUMNS}) select {KERNEL_COLUMNS.replace('start, end', 'start + ?, end + ?', 1)} "
                        f"from {table} where rowid <= ?", (shift, shift, take))
        if not kernels or take == have:
            limit = metrics_have if kernels else take
            con.execute("insert into GPU_METRICS (rawTimestamp, timestamp, typeId, metricId, value) "
                        "select rawTimestamp + ?, timestamp + ?, typeId, metricId, value from GPU_METRICS "
                        "where rowid <= ?", (shift, shift, limit))
            metrics_have += limit
        con.commit()
        shift *= 2
        have += take
    con.close()
