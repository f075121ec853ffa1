"""Users sampler: on a host without a scheduler (a lab server people log into, a workstation), the
holders of a GPU are the Unix users with a CUDA context on it.

A user holds a GPU while one of their processes has a context on it (NVML's compute and MPS-client
lists; the MPS server is infrastructure). Held share: the GPU split evenly among the users holding
it (1/number of users with contexts): nobody allocated it, so presence is what is held. A user who
keeps a context open and runs nothing holds the GPU idle.

The uid is the real uid of /proc/PID/status (under --proc-root); the name comes from the host's user
database where it is readable (--passwd FILE, else <proc-root>/1/root/etc/passwd: the host's, seen
through its init process, which only root may read; where --proc-root is this host's own /proc, an
ordinary user's exporter reads /etc/passwd instead: the same file), the uid otherwise. One log line
names the file the names came from. Every read is capped and non-blocking.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from exporter.holders import EVEN_SPLIT, Held, Holder, HolderSampler, Holdings
from hostio.files import FileTooLarge, read_capped
from exporter.samplers.cgroups import ProcFileOwners
from exporter.snapshot import CollectorHealth, LogOnce
from exporter.vocabulary import MPS_SERVER

log = logging.getLogger(__name__)
MAX_STATUS_BYTES = 16384  # /proc/PID/status is ~1.5 KB
MAX_PASSWD_BYTES = 4 * 1024 * 1024
MAX_USERS = 100_000
MAX_UID = 2**32 - 2  # uid_t is 32 bits and (uid_t)-1 means "no uid": anything larger is no uid
PASSWD_EVERY_S = 60.0  # the user database is read again at most once a minute


def uid_number(text: str) -> int | None:
    """The uid a field spells in ASCII digits, or None: no number, or one no uid can be (a 5,000-digit
    field made int() raise and stopped the users source for everyone)."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_UID)):
        return None
    uid = int(text)
    return uid if uid <= MAX_UID else None


def status_uid(text: str) -> int | None:
    """The real uid of a /proc/PID/status text."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return uid_number(fields[1]) if len(fields) > 1 else None
    return None


def parse_passwd(text: str) -> dict[int, str]:
    """uid -> name from passwd lines (name:password:uid:...); the first line of a uid wins."""
    names: dict[int, str] = {}
    for line in text.splitlines()[:MAX_USERS]:
        fields = line.split(":")
        uid = uid_number(fields[2]) if len(fields) >= 3 and fields[0] and not line.startswith(("#", "+", "-")) else None
        if uid is not None:
            names.setdefault(uid, fields[0][:64])
    return names


def context_pids(telemetry) -> dict[str, set[int]]:
    """GPU UUID -> pids with a context on it (compute processes and MPS clients, not the MPS server)."""
    return {uuid: {p.pid for p in tel.compute_processes or () if p.kind != MPS_SERVER}
            for uuid, tel in telemetry.items() if not tel.lost}


class UsersSampler(HolderSampler):
    name = "users"

    def __init__(self, nvml, proc_root="/proc", passwd: str | None = None, interval: float = 5.0):
        self.nvml = nvml
        self.proc_root = Path(proc_root)
        self.passwd = Path(passwd) if passwd else self.proc_root / "1" / "root" / "etc" / "passwd"
        # This host's own /proc: its init's root is this file system's, so /etc/passwd is the same database.
        own_proc = not passwd and os.path.realpath(self.proc_root) == "/proc"
        self.passwd_files = [self.passwd, *([Path("/etc/passwd")] if own_proc else [])]
        self.names_from: Path | None = None
        self.interval = interval
        self.holdings = Holdings()
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._uids = ProcFileOwners(self.proc_root, status_uid, "status", MAX_STATUS_BYTES)  # kept while on a GPU
        self._names: dict[int, str] = {}
        self._names_read = -PASSWD_EVERY_S
        self._log = LogOnce(log)

    def _why_not_first(self, failed: list[str]) -> str:
        """Said beside the file the names came from. This host's /etc/passwd after its init's copy is the same
        database: the init's is closed without CAP_SYS_PTRACE (a container's root too), which is no fault."""
        if not failed:
            return ""
        if len(failed) == 1 and len(self.passwd_files) > 1:
            return (f", the same database as {self.passwd_files[0]} (this host's, seen through its init, which "
                    f"this process may not open: that needs CAP_SYS_PTRACE)")
        return f" ({'; '.join(failed)})"

    def _user_names(self) -> dict[int, str]:
        if time.monotonic() - self._names_read >= PASSWD_EVERY_S:
            self._names_read = time.monotonic()
            failed = []
            for path in self.passwd_files:
                try:
                    try:
                        data = read_capped(path, MAX_PASSWD_BYTES, follow=True)  # a mounted secret is a link
                    except FileTooLarge:
                        raise OSError(f"larger than {MAX_PASSWD_BYTES} bytes, not a user database") from None
                except OSError as exc:
                    failed.append(f"cannot read {path} ({exc.strerror or exc})")
                    continue
                self._names = parse_passwd(data.decode("utf-8", "replace"))
                if path != self.names_from:  # one line, also where a failure ends
                    self.names_from = path
                    self._log.problem("users passwd", f"user names from {path}" + self._why_not_first(failed),
                                      logging.INFO)
                return self._names
            self._names, self.names_from = {}, None
            self._log.problem("users passwd", f"{'; '.join(failed)}: users are labelled by uid (pass --passwd FILE, "
                              "or mount the host's / at <proc-root>/1/root)", logging.INFO)
        return self._names

    def tick(self) -> None:
        started = time.perf_counter()
        contexts = context_pids(self.nvml.telemetry)
        everyone = set().union(*contexts.values()) if contexts else set()
        names = self._user_names()
        owners = {pid: Holder(user=names.get(uid, str(uid))) for pid, uid in sorted(self._uids.lookup(everyone).items())
                  if uid is not None}
        gpus = {}
        for uuid, pids in contexts.items():
            users = {owners[pid] for pid in pids if pid in owners}
            if users:
                gpus[uuid] = {user: Held(round(1.0 / len(users), 9), EVEN_SPLIT) for user in users}
        unknown = len(everyone) - len(owners)
        if unknown:  # processes of another PID namespace, already gone, or whose status names no uid
            self._log.problem("users", f"{unknown} GPU process(es) not found under {self.proc_root}, or without a "
                              "uid there: they hold nothing (pass the host's /proc as --proc-root)", logging.INFO,
                              kind="unknown")
        else:
            self._log.clear("users")
        self.holdings = Holdings(gpus=gpus, owners=owners)
        self.health = CollectorHealth(True, time.perf_counter() - started, "")


SCHEDULER = False  # exporter/holders.py KINDS: users hold GPUs only where no scheduler is configured
LABELS = {"user": "the Unix user (name, or uid where no name resolves) of a user holder"}  # label -> meaning


def add_arguments(parser) -> None:
    g = parser.add_argument_group("users")
    g.add_argument("--passwd", metavar="FILE", default=None,
                   help="the host's user database, naming user holders (default: <proc-root>/1/root/etc/passwd; "
                        "where unreadable, users are labelled by uid)")


def build(args, nvml, explicit: bool = False):
    """The users sampler. Under --holders auto it runs only where no scheduler is configured (see
    exporter/holders.py), and not on a replay read against this host's /proc: a recording's pids are
    another host's processes."""
    if args.no_nvml:
        return None
    if not explicit and args.nvml_replay and os.path.realpath(args.proc_root) == "/proc":
        log.info("users as holders: off for an NVML replay against this host's /proc (pass --proc-root with the "
                 "recording's processes, or --holders users)")
        return None
    return UsersSampler(nvml, proc_root=args.proc_root, passwd=args.passwd, interval=max(args.interval, 1.0))
