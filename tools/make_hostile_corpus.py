"""Writes tests/fixtures/hostile/: small files, each named for what it attacks in a reader of Nsight
Systems exports (issue 17). tests/test_hostile.py runs every one through the upload endpoint, the
watched directory, --replay and every nsys_ingest command.

    python3 tools/make_hostile_corpus.py [OUT_DIR]
    python3 tools/make_hostile_corpus.py --generated OUT_DIR   # GENERATED: 4 MB and 300 MB more

The files are built from scratch (a minimal export of the 2023.4+ schema: one H100, 10 s of GPU
metrics at 10 Hz), so the corpus is deterministic and a few KB per case; CASES says, per file, the
words of the one-line refusal, or None where a correct answer is expected.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hostile"
START_NS = 1_763_794_570_000_000_000  # 2025-11-22T06:56:10Z
UUID = "GPU-0bd3b3fe-7d8e-5c3f-9e2f-4a5b6c7d8e9f"
METRICS = {  # metricId -> name, as nsys 2024 writes them for an H100
    0: "GR Active [Throughput %]", 1: "SMs Active [Throughput %]", 2: "Compute Warps in Flight [Throughput %]",
    3: "Tensor Active [Throughput %]", 4: "DRAM Read Bandwidth [Throughput %]", 5: "DRAM Write Bandwidth [Throughput %]",
}
TYPE_ID = 0x10000  # GPU 0
SAMPLES = 100  # 10 s at 10 Hz

SCHEMA = """
create table StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
create table TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
create table META_DATA_CAPTURE (name TEXT, value TEXT);
create table TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT, uuid TEXT, smCount INTEGER);
create table TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, metricId INTEGER, metricName TEXT);
create table GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);
"""


def _value(metric_id: int, i: int) -> int:
    """GR active 90 %, SM active 40 % then 80 %: busy in time, idle in space for the first half."""
    return {0: 90, 1: 40 if i < SAMPLES // 2 else 80, 2: 30, 3: 10, 4: 20, 5: 5}[metric_id]


def normal(con: sqlite3.Connection, metrics=METRICS) -> None:
    con.executescript(SCHEMA)
    con.execute("insert into StringIds values (1, 'python3')")
    con.execute("insert into TARGET_INFO_SESSION_START_TIME values (?, '2025-11-22T06:56:10Z', '')", (START_NS,))
    con.execute("insert into META_DATA_CAPTURE values ('GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY', '10')")
    con.execute("insert into TARGET_INFO_GPU values (0, 0, 'NVIDIA H100 80GB HBM3', ?, 132)", (UUID[4:],))
    con.executemany("insert into TARGET_INFO_GPU_METRICS values (?, 0, 'GPU 0', ?, ?)",
                    [(TYPE_ID, m, n) for m, n in metrics.items()])
    con.executemany("insert into GPU_METRICS values (?, ?, ?, ?, ?)",
                    [(ts, ts, TYPE_ID, m, _value(m, i)) for i in range(SAMPLES) for ts in [100_000_000 * (i + 1)]
                     for m in metrics])


# -- the attacks: each edits a normal export ---------------------------------------------------------
BOMB = "TEXT GENERATED ALWAYS AS (printf('%.*c', 200000000, 'x')) VIRTUAL"  # 200 MB per row read


def generated_column_bomb(con):
    normal(con)
    con.execute(f"alter table GPU_METRICS add column pad {BOMB}")  # virtual: nothing stored, nothing computed now


def generated_column_elsewhere(con):
    """A bomb in a table no reader needs: scrub (which rewrites every table) must refuse it."""
    normal(con)
    con.execute("create table Junk (x TEXT)")
    con.execute("insert into Junk (x) values ('a')")
    con.execute(f"alter table Junk add column y {BOMB}")


def views_instead_of_tables(con):
    normal(con)
    con.executescript("alter table GPU_METRICS rename to raw_metrics;"
                      "create view GPU_METRICS as with recursive n(i) as (select 1 union all select i + 1 from n) "
                      "select r.* from raw_metrics r, n;")


def virtual_table(con):
    normal(con)
    con.executescript("alter table TARGET_INFO_GPU_METRICS rename to names;"
                      "create virtual table TARGET_INFO_GPU_METRICS using fts5(typeId, sourceId, typeName, metricId, "
                      "metricName); insert into TARGET_INFO_GPU_METRICS select * from names;")


def gpus_256_with_10kb_names(con):
    normal(con)
    con.execute("delete from TARGET_INFO_GPU")
    for gpu in range(256):
        con.execute("insert into TARGET_INFO_GPU values (0, ?, ?, ?, 132)", (gpu, "N" * 10240, f"{gpu:032x}"))
        con.executemany("insert into TARGET_INFO_GPU_METRICS values (?, 0, 'GPU', ?, ?)",
                        [(TYPE_ID + gpu, m, n) for m, n in METRICS.items()])
        con.executemany("insert into GPU_METRICS values (100000000, 100000000, ?, ?, 50)",
                        [(TYPE_ID + gpu, m) for m in METRICS])


def gpu_with_10kb_name(con):
    normal(con)
    con.execute("update TARGET_INFO_GPU set name = ?, uuid = ?", ("N" * 10240, "U" * 10240))


def huge_strings(con):
    """A 1 MB metric name: the catalogue is read into memory, so its strings are bounded."""
    normal(con)
    con.execute("update TARGET_INFO_GPU_METRICS set metricName = ? || metricName where metricId = 3", ("x" * (1 << 20),))


def typeids_200k(con):
    """The old schema era, 200,000 distinct event types: a per-type catalogue query each was ~9 minutes."""
    normal(con)
    con.executescript("drop table GPU_METRICS; drop table TARGET_INFO_GPU_METRICS;"
                      "create table GENERIC_EVENTS (timestamp INTEGER, typeId INTEGER, data TEXT);")
    con.executemany("insert into GENERIC_EVENTS values (?, ?, NULL)", ((i, i) for i in range(200_000)))


def metrics_5000(con):
    normal(con)
    con.executemany("insert into TARGET_INFO_GPU_METRICS values (?, 0, 'GPU 0', ?, ?)",
                    [(TYPE_ID, 100 + i, f"Metric {i} [Throughput %]") for i in range(5000)])


def dram_read_without_write(con):
    normal(con, {m: n for m, n in METRICS.items() if not n.startswith("DRAM Write")})


def dram_write_without_read(con):
    normal(con, {m: n for m, n in METRICS.items() if not n.startswith("DRAM Read")})


def text_in_values(con):
    normal(con)
    con.execute("update GPU_METRICS set value = 'abc' where metricId = 1 and timestamp = 10000000000")  # the last sample


def null_timestamps(con):
    normal(con)
    con.execute("update GPU_METRICS set timestamp = NULL where timestamp = 500000000")


def null_metric_name(con):
    normal(con)
    con.execute("update TARGET_INFO_GPU_METRICS set metricName = NULL where metricId = 2")


def bad_gpu_id(con):
    normal(con)
    con.execute("update TARGET_INFO_GPU set id = 'abc'")


def gpu_id_out_of_range(con):
    normal(con)
    con.execute("update TARGET_INFO_GPU set id = 100000")


def text_sm_count(con):
    normal(con)
    con.execute("update TARGET_INFO_GPU set smCount = 'many'")


def non_integer_utc_epoch(con):
    normal(con)
    con.execute("update TARGET_INFO_SESSION_START_TIME set utcEpochNs = 'yesterday'")


def missing_column(con):
    normal(con)
    con.execute("alter table GPU_METRICS drop column value")


def missing_tables(con):
    normal(con)
    con.executescript("drop table GPU_METRICS; drop table TARGET_INFO_GPU_METRICS; drop table TARGET_INFO_GPU;")


def expression_depth_bomb(con):
    """A view (read by nobody) whose expression is 900 deep (SQLite's own limit is 1,000; ours 100): parsing the schema must fail fast."""
    normal(con)
    con.execute(f"create view deep as select 1{' + 1' * 900} as x")


def trigger_on_update(con):
    """A trigger that would fire on scrub's updates of the copy, running the file's own SQL."""
    normal(con)
    con.execute("insert into StringIds values (2, '/home/alice/train.py')")
    con.execute("create table log (x TEXT)")
    con.execute("create trigger t after update on StringIds begin "
                "insert into log select printf('%.*c', 100000000, 'x'); end")


def kernel_trace_with_text(con):
    """diagnose's kernel reader: text where kernel start times belong."""
    normal(con)
    con.executescript("create table CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
                      "globalPid INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER);"
                      "insert into CUPTI_ACTIVITY_KIND_KERNEL values ('soon', 200, 0, 16777216, 132, 1, 1);")


def wal_mode(con):
    normal(con)
    con.commit()
    con.execute("pragma journal_mode=wal")


# -- exports that expand far beyond their size (issue 25, items 4-7) ----------------------------------
KERNEL_SCHEMA = """
create table CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, globalPid INTEGER,
                                         gridX INTEGER, gridY INTEGER, gridZ INTEGER);
create table CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, globalPid INTEGER,
                                         bytes INTEGER, copyKind INTEGER);
create table ENUM_CUDA_MEMCPY_OPER (id INTEGER, name TEXT, label TEXT);
"""
GLOBAL_PID = 1234 << 24  # nsys' GlobalId: the pid in bits 24-47


def kernel_trace(con, kernels=100, pid_of=lambda i: GLOBAL_PID, device_of=lambda i: 0):
    """A CUDA trace beside the GPU metrics: `kernels` kernels of 50 us every 100 us, one copy."""
    normal(con)
    con.executescript(KERNEL_SCHEMA)
    con.executemany("insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, ?, ?, 132, 1, 1)",
                    [(100_000_000 + i * 100_000, 100_050_000 + i * 100_000, device_of(i), pid_of(i))
                     for i in range(kernels)])
    con.execute("insert into CUPTI_ACTIVITY_KIND_MEMCPY values (100000000, 100010000, 0, ?, 4096, 1)", (GLOBAL_PID,))
    con.execute("insert into ENUM_CUDA_MEMCPY_OPER values (1, 'CUDA_MEMCPY_KIND_HTOD', 'Host-to-Device')")


def generated_column_in_memcpy(con):
    """A table the reader once left unchecked: every table read goes through the same check."""
    kernel_trace(con)
    con.execute(f"alter table CUPTI_ACTIVITY_KIND_MEMCPY add column pad {BOMB}")


def generated_column_in_memcpy_enum(con):
    kernel_trace(con)
    con.execute(f"alter table ENUM_CUDA_MEMCPY_OPER add column pad {BOMB}")


def generated_label_in_memcpy_enum(con):
    """The generated column is the one read (label), in a table whose other columns are plain."""
    normal(con)
    con.executescript(KERNEL_SCHEMA.replace(", label TEXT", ""))
    con.execute("insert into CUPTI_ACTIVITY_KIND_KERNEL values (100000000, 100050000, 0, ?, 132, 1, 1)", (GLOBAL_PID,))
    con.execute("insert into CUPTI_ACTIVITY_KIND_MEMCPY values (100000000, 100010000, 0, ?, 4096, 1)", (GLOBAL_PID,))
    con.execute("insert into ENUM_CUDA_MEMCPY_OPER (id, name) values (1, 'CUDA_MEMCPY_KIND_HTOD')")
    con.execute(f"alter table ENUM_CUDA_MEMCPY_OPER add column label {BOMB}")  # after the insert: nothing computed


def kernels_of_20000_processes(con):
    """20,000 kernels, each from another process: per-process state for each would be 600 MB."""
    kernel_trace(con, 20_000, pid_of=lambda i: (1000 + i) << 24)


def kernels_on_20000_devices(con):
    kernel_trace(con, 20_000, device_of=lambda i: i)


def enum_of_10000_kinds(con):
    """A copy-kind table of 10,000 rows (nsys writes about ten), one of them a 1 MB label."""
    kernel_trace(con)
    con.executemany("insert into ENUM_CUDA_MEMCPY_OPER values (?, 'K', ?)", ((i, f"kind {i}") for i in range(2, 10_000)))
    con.execute("update ENUM_CUDA_MEMCPY_OPER set label = ? where id = 7", ("L" * (1 << 20),))


def process_names_of_1mb(con):
    """PROCESSES with 1 MB names: a name is read capped, whatever its size."""
    kernel_trace(con)
    con.executescript("create table PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);")
    con.execute("insert into PROCESSES values (?, 1234, ?)", (GLOBAL_PID, "p" * (1 << 20)))


SELF_LINKED_ROWS = 400
STORED_BLOB = 9000  # stored bytes of each value: its size fits a 3-byte varint...
CLAIMED_BLOB = STORED_BLOB + 242 * 4092  # ...and so does the claim (~1 MB), which keeps the local part the same


def values_on_a_self_linked_overflow_page(path: Path) -> None:
    """400 GPU_METRICS values that each claim a 1 MB blob through one overflow page that links to itself:
    400 MB if the values are fetched, from a 4 MB file. Patched into the file's b-tree after it is written."""
    con = sqlite3.connect(path)
    normal(con)
    con.executemany("insert into GPU_METRICS values (?, ?, ?, 1, ?)",
                    [(ts, ts, TYPE_ID, b"\x01" * STORED_BLOB) for i in range(SELF_LINKED_ROWS)
                     for ts in [100_000_000 * (SAMPLES - i % 40)]])
    (root,) = con.execute("select rootpage from sqlite_master where name = 'GPU_METRICS'").fetchone()
    con.commit()
    con.close()
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big")
    usable = size - data[20]
    local_min = (usable - 12) * 32 // 255 - 23
    loop_page = None
    for page in _leaf_pages(data, root, size):
        base = page * size - size
        head = base + (100 if page == 1 else 0)
        for n in range(int.from_bytes(data[head + 3:head + 5], "big")):
            cell = base + int.from_bytes(data[head + 8 + 2 * n:head + 10 + 2 * n], "big")
            payload, at = _varint(data, cell)
            if payload <= STORED_BLOB:
                continue
            _, at = _varint(data, at)  # rowid
            local = local_min + (payload - local_min) % (usable - 4)
            local = local if local <= usable - 35 else local_min
            overflow = at + local
            loop_page = loop_page or int.from_bytes(data[overflow:overflow + 4], "big")
            data[cell:cell + 3] = _varint3(payload + CLAIMED_BLOB - STORED_BLOB)
            # the record header: its size, then serial types; the value's (a blob: 2n + 12) is the last
            types = at + 1
            for _ in range(4):
                _, types = _varint(data, types)
            data[types:types + 3] = _varint3(2 * CLAIMED_BLOB + 12)
            data[overflow:overflow + 4] = loop_page.to_bytes(4, "big")
    data[(loop_page - 1) * size:(loop_page - 1) * size + 4] = loop_page.to_bytes(4, "big")  # its next page: itself
    path.write_bytes(bytes(data))


def _leaf_pages(data, page, size):
    base = (page - 1) * size
    head = base + (100 if page == 1 else 0)
    if data[head] == 0x0D:
        yield page
        return
    for n in range(int.from_bytes(data[head + 3:head + 5], "big")):
        cell = base + int.from_bytes(data[head + 12 + 2 * n:head + 14 + 2 * n], "big")
        yield from _leaf_pages(data, int.from_bytes(data[cell:cell + 4], "big"), size)
    yield from _leaf_pages(data, int.from_bytes(data[head + 8:head + 12], "big"), size)


def _varint(data, at) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise AssertionError


def _varint3(value: int) -> bytes:
    assert 1 << 14 <= value < 1 << 21
    return bytes((0x80 | (value >> 14), 0x80 | ((value >> 7) & 0x7F), value & 0x7F))


def rows_at_one_timestamp(path: Path, rows: int = 10_000_000) -> None:
    """`rows` GPU_METRICS rows all at one timestamp (206 MB at 10 M): one sample per GPU that never ends."""
    con = sqlite3.connect(path)
    normal(con)
    con.execute("pragma journal_mode=off")
    con.execute("insert into GPU_METRICS select 10100000000, 10100000000, ?, n.i % 6, 50 from "
                "(with recursive n(i) as (select 1 union all select i + 1 from n where i < ?) select i from n) n",
                (TYPE_ID, rows))
    con.commit()
    con.close()


# Built on demand into a temporary directory (too large, or too many rows, to keep in the repository):
# name -> (builder of a path, words of the refusal or None). bench/hostile_cases.py runs them at full size.
GENERATED = {
    "values_on_a_self_linked_overflow_page": (values_on_a_self_linked_overflow_page,
                                              "GPU_METRICS.value holds 'blob of 999264 bytes'"),
    "rows_at_one_timestamp": (rows_at_one_timestamp, None),
}


def build_generated(out: Path, rows_at_one_timestamp_rows: int = 10_000_000) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (builder, _) in GENERATED.items():
        path = out / f"{name}.sqlite"
        path.unlink(missing_ok=True)
        builder(path, rows_at_one_timestamp_rows) if builder is rows_at_one_timestamp else builder(path)
        paths.append(path)
    return paths

# name -> (builder, words of the refusal, or None: a correct answer is expected)
CASES = {
    "generated_column_bomb": (generated_column_bomb, "generated column"),
    "generated_column_elsewhere": (generated_column_elsewhere, None),
    "views_instead_of_tables": (views_instead_of_tables, "is a view, not a table"),
    "virtual_table": (virtual_table, "virtual table"),
    "gpus_256_with_10kb_names": (gpus_256_with_10kb_names, "more than 64 GPUs"),
    "gpu_with_10kb_name": (gpu_with_10kb_name, "10240 characters"),
    "huge_strings": (huge_strings, "characters"),
    "typeids_200k": (typeids_200k, "more than 4096 event types"),
    "metrics_5000": (metrics_5000, "more than 4096 metrics"),
    "dram_read_without_write": (dram_read_without_write, None),
    "dram_write_without_read": (dram_write_without_read, None),
    "text_in_values": (text_in_values, "GPU_METRICS.value holds 'abc'"),
    "null_timestamps": (null_timestamps, "GPU_METRICS.timestamp holds NULL"),
    "null_metric_name": (null_metric_name, "metricName is NULL"),
    "bad_gpu_id": (bad_gpu_id, "TARGET_INFO_GPU.id holds 'abc'"),
    "gpu_id_out_of_range": (gpu_id_out_of_range, "not a GPU index"),
    "text_sm_count": (text_sm_count, "TARGET_INFO_GPU.smCount holds 'many'"),
    "non_integer_utc_epoch": (non_integer_utc_epoch, "utcEpochNs holds 'yesterday'"),
    "missing_column": (missing_column, "GPU_METRICS has no column value"),
    "missing_tables": (missing_tables, "no GPU metric"),
    "expression_depth_bomb": (expression_depth_bomb, "malformed database schema"),
    "trigger_on_update": (trigger_on_update, None),
    "kernel_trace_with_text": (kernel_trace_with_text, None),
    "wal_mode": (wal_mode, None),
    # the CUDA trace: only diagnose reads it (DIAGNOSE_REFUSES)
    "generated_column_in_memcpy": (generated_column_in_memcpy, None),
    "generated_column_in_memcpy_enum": (generated_column_in_memcpy_enum, None),
    "generated_label_in_memcpy_enum": (generated_label_in_memcpy_enum, None),
    "kernels_of_20000_processes": (kernels_of_20000_processes, None),
    "kernels_on_20000_devices": (kernels_on_20000_devices, None),
    "enum_of_10000_kinds": (enum_of_10000_kinds, None),
    "process_names_of_1mb": (process_names_of_1mb, None),
    # not databases at all (written below, not built)
    "truncated": (None, "truncated or corrupt"),
    "zero_bytes": (None, "not a SQLite file"),
    "not_sqlite": (None, "not a SQLite file"),
}


# Cases only diagnose (the CLI's and POST /api/v1/diagnose) refuses: it alone reads the CUDA trace.
DIAGNOSE_REFUSES = {
    "kernel_trace_with_text": "CUPTI_ACTIVITY_KIND_KERNEL holds a start",
    "generated_column_in_memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY.pad is a generated column",
    "generated_column_in_memcpy_enum": "ENUM_CUDA_MEMCPY_OPER.pad is a generated column",
    "generated_label_in_memcpy_enum": "ENUM_CUDA_MEMCPY_OPER.label is a generated column",
    "kernels_of_20000_processes": "kernels of more than 1024 processes in one export",
    "kernels_on_20000_devices": "deviceId holds 256, not a GPU index",
    "enum_of_10000_kinds": "ENUM_CUDA_MEMCPY_OPER lists more than 256 copy kinds",
}


def build(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (builder, _) in CASES.items():
        path = out / f"{name}.sqlite"
        path.unlink(missing_ok=True)
        if builder is not None:
            con = sqlite3.connect(path)
            builder(con)
            con.commit()
            con.close()
        written.append(path)
    for suffix in ("-wal", "-shm"):
        (out / f"wal_mode.sqlite{suffix}").unlink(missing_ok=True)
    whole = sqlite3.connect(":memory:")
    normal(whole)
    data = whole.serialize()
    (out / "truncated.sqlite").write_bytes(data[: len(data) // 2])
    (out / "zero_bytes.sqlite").write_bytes(b"")
    (out / "not_sqlite.sqlite").write_bytes(json.dumps({"this": "is not an export"}).encode())
    return written


if __name__ == "__main__":
    if sys.argv[1:2] == ["--generated"]:
        target = Path(sys.argv[2])
        paths = build_generated(target)
    else:
        target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
        paths = build(target)
    print(f"wrote {len(paths)} files to {target} ({sum(p.stat().st_size for p in paths) / 1e6:.1f} MB)")
