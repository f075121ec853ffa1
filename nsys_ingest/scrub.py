"""A copy of an export without the profiled processes' environment, safe to share.

Exports carry what users don't know is there: environment variables, command lines, working
directories, host and user names, paths under home directories, and the processes' own stdout and
stderr. The GPU metrics, the GPU and session descriptions and the timeline stay.
"""
from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

from nsys_ingest.reader import SQLITE_MAGIC, IngestError, check_tables, connect_untrusted, export_rep, schema_objects

ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ABSOLUTE_PATH = re.compile(r"(?<![\w.])(/[^\s/'\"]+)+/?")
# Whole tables that hold only process I/O or environment.
DROP_ROWS = ("ANALYSIS_FILE", "ProcessStreams", "TARGET_INFO_ENVIRONMENT")
# Metadata names whose values describe the profiled processes or the host.
SECRET_META = re.compile(r"ENVIRONMENT|COMMAND|ARGUMENT|WORKING_DIR|USER|HOST|DISPLAY_NAME|PATH|FILE", re.I)
SECRET_SYSTEM_ENV = re.compile(r"env|host|user|name|dir", re.I)
# Tables whose text is metric names, enums and schema: left alone.
KEEP_TEXT = re.compile(r"^(ENUM_|TARGET_INFO_GPU|GPU_METRICS|META_DATA_EXPORT$|sqlite_)")


def _redact_paths(text: str) -> str:
    """/home/alice/proj/train.py -> <path>/train.py: keeps the file name, drops where it lives."""
    return ABSOLUTE_PATH.sub(lambda m: "<path>/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def scrub(source, target, nsys: str = "nsys") -> dict:
    """Writes a scrubbed copy of `source` (a .sqlite export, or a .nsys-rep when nsys is installed:
    exported first) to `target`. Returns what it did: {"removed": rows per table, "blanked": values
    per metadata table, "redacted": values per table.column}."""
    source, target = Path(source), Path(target)
    if not source.exists():
        raise IngestError(f"{source}: no such file")
    exported = export_rep(source, nsys) if source.suffix == ".nsys-rep" else None
    try:
        return _scrub_file(exported or source, source, target)
    finally:
        if exported is not None:
            shutil.rmtree(exported.parent, ignore_errors=True)


def _scrub_file(sqlite_file: Path, source: Path, target: Path) -> dict:
    with open(sqlite_file, "rb") as f:
        if f.read(16) != SQLITE_MAGIC:
            raise IngestError(f"{source} is not a SQLite file: scrub takes an Nsight Systems export (.sqlite), or a "
                              ".nsys-rep where nsys is installed")
    if target.exists() and source.resolve() == target.resolve():
        raise IngestError("scrub writes a copy: give an output path other than the input")
    shutil.copyfile(sqlite_file, target)
    con = connect_untrusted(target, readonly=False)  # the private copy, under the same limits as any reader
    try:
        return _scrub(con)
    except (sqlite3.DatabaseError, IngestError) as exc:
        con.close()
        target.unlink(missing_ok=True)
        if isinstance(exc, IngestError):
            raise
        raise IngestError(f"{source} is truncated or corrupt ({exc}): export it again") from None
    finally:
        con.close()


def describe(target, counts: dict) -> str:
    """The one line the CLI prints: what was removed, blanked and redacted."""
    parts = []
    for key, verb in (("removed", "removed {} rows of process output and environment"),
                      ("blanked", "blanked {} metadata values"),
                      ("redacted", "redacted paths and host/user names in {} text values")):
        if counts[key]:
            detail = ", ".join(f"{name} {n}" for name, n in sorted(counts[key].items()))
            parts.append(f"{verb.format(sum(counts[key].values()))} ({detail})")
    done = "; ".join(parts) or "found nothing to scrub"
    kept = counts.get("kept", KEPT)
    missing = [name for name in KEPT if name not in kept]
    tail = f" (the export has no {_and(missing)})" if missing else ""
    return f"wrote a scrubbed copy to {target}: {done}; {_and([*kept, 'timeline'])} kept{tail}"


# What a scrub keeps where the export has it: the line says only what was there to keep.
KEPT = ("GPU metrics", "kernels")
KEPT_TABLES = {"GPU metrics": ("GPU_METRICS", "GENERIC_EVENTS"), "kernels": ("CUPTI_ACTIVITY_KIND_KERNEL",)}


def _and(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _scrub(con) -> dict:
    objects = schema_objects(con)
    # Triggers and views are the file's own SQL: nsys writes none, and our updates must run none.
    for name, kind in con.execute("select name, type from sqlite_master where type in ('trigger', 'view')").fetchall():
        con.execute(f"drop {kind} [{name}]")
    tables = {name for name, kind in objects.items() if kind == "table"}
    check_tables(con, objects, {t: () for t in tables})  # no generated column anywhere: updates would compute them
    secrets = _known_names(con, tables)
    counts = {"removed": {}, "blanked": {}, "redacted": {}}

    def clean(value):
        if not isinstance(value, str) or not value:
            return value
        if ENV_ASSIGNMENT.match(value):
            return ""
        text = _redact_paths(value)
        for secret in secrets:
            text = text.replace(secret, "<redacted>")
        return text

    con.create_function("scrub_text", 1, clean, deterministic=True)
    for table in sorted(tables & set(DROP_ROWS)):
        counts["removed"][table] = con.execute(f"delete from [{table}]").rowcount
    for table in ("META_DATA_CAPTURE", "META_DATA_EXPORT"):
        if table in tables:
            counts["blanked"][table] = _blank_meta(con, table)
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        counts["removed"]["TARGET_INFO_SYSTEM_ENV"] = con.execute(
            "delete from TARGET_INFO_SYSTEM_ENV where value like '%=%' or name like '%Env%' or name like '%Host%' "
            "or name like '%User%' or name like '%Dir%'").rowcount
    for table in sorted(tables - set(DROP_ROWS)):
        if KEEP_TEXT.match(table):
            continue
        text_columns = [r[1] for r in con.execute(f"pragma table_info([{table}])") if (r[2] or "").upper() == "TEXT"]
        for column in text_columns:
            changed = con.execute(f"update [{table}] set [{column}] = scrub_text([{column}]) "
                                  f"where [{column}] is not null and [{column}] != scrub_text([{column}])").rowcount
            if changed:
                counts["redacted"][f"{table}.{column}"] = changed
    con.commit()
    con.execute("vacuum")  # deleted text must not linger in free pages
    found = {key: {k: n for k, n in found.items() if n} for key, found in counts.items()}
    found["kept"] = [name for name in KEPT if any(_has_rows(con, t) for t in KEPT_TABLES[name] if t in tables)]
    return found


def _has_rows(con, table: str) -> bool:
    return con.execute(f"select 1 from [{table}] limit 1").fetchone() is not None


def _blank_meta(con, table: str) -> int:
    names = [n for n, in con.execute(f"select distinct name from [{table}]") if isinstance(n, str) and SECRET_META.search(n)]
    return sum(con.execute(f"update [{table}] set value='' where name=? and value != ''", (n,)).rowcount for n in names)


def _known_names(con, tables) -> list[str]:
    """Host and user names the export itself records, to redact wherever else they appear."""
    names = set()
    queries = []
    if "META_DATA_CAPTURE" in tables:
        queries.append("select value from META_DATA_CAPTURE where name in ('DEVICE_DISPLAY_NAME') "
                       "or name like '%USER_NAME%'")
    if "META_DATA_EXPORT" in tables:
        queries.append("select value from META_DATA_EXPORT where name in ('EXPORT_HOST', 'EXPORT_USER')")
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        queries.append("select value from TARGET_INFO_SYSTEM_ENV where name like '%Host%' or name like '%User%'")
    for query in queries:
        names.update(v for v, in con.execute(query) if isinstance(v, str) and len(v) >= 3)
    return sorted(names, key=len, reverse=True)
