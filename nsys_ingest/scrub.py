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

from nsys_ingest.reader import IngestError, SQLITE_MAGIC

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


def scrub(source, target) -> dict:
    source, target = Path(source), Path(target)
    with open(source, "rb") as f:
        if f.read(16) != SQLITE_MAGIC:
            raise IngestError(f"{source} is not a SQLite file: scrub works on .sqlite exports")
    if source.resolve() == target.resolve():
        raise IngestError("scrub writes a copy: give an output path other than the input")
    shutil.copyfile(source, target)
    con = sqlite3.connect(target)
    try:
        return _scrub(con)
    except sqlite3.DatabaseError as exc:
        target.unlink(missing_ok=True)
        raise IngestError(f"{source} is truncated or corrupt ({exc}): export it again") from None
    finally:
        con.close()


def _scrub(con) -> dict:
    tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    secrets = _known_names(con, tables)
    counts = {}

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
        counts[table] = con.execute(f"delete from [{table}]").rowcount
    if "META_DATA_CAPTURE" in tables:
        counts["META_DATA_CAPTURE"] = _blank_meta(con, "META_DATA_CAPTURE")
    if "META_DATA_EXPORT" in tables:
        counts["META_DATA_EXPORT"] = _blank_meta(con, "META_DATA_EXPORT")
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        counts["TARGET_INFO_SYSTEM_ENV"] = con.execute(
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
                counts[f"{table}.{column}"] = changed
    con.commit()
    con.execute("vacuum")  # deleted text must not linger in free pages
    return counts


def _blank_meta(con, table: str) -> int:
    names = [n for n, in con.execute(f"select distinct name from [{table}]") if SECRET_META.search(n)]
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
