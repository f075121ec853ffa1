"""Reading files on the host that anyone may have put there (/proc under --proc-root, the Slurm job
mapping directory, watched exports): never blocks, never reads more than asked.

A FIFO opened for reading blocks in open() until a writer comes, a character device (/dev/zero)
never ends, and a 300 MB file is 300 MB: so every file is opened non-blocking, read only when
fstat says it is a regular file (procfs files are), and read up to a cap.
"""
from __future__ import annotations

import errno
import os
import stat

READ_BLOCK = 65536


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a regular file belongs. Its message says what it
    is, without the path: the caller names the file."""


class FileTooLarge(OSError):
    """More bytes than the caller's cap."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path, cap: int, follow: bool = False, truncate: bool = False) -> bytes:
    """The bytes of the regular file at `path`, at most `cap` of them. Raises NotRegularFile for
    anything else (a symbolic link too, unless `follow`), FileTooLarge past `cap` (or, with
    `truncate`, returns the first `cap` bytes), and OSError as open() does (FileNotFoundError...)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:  # O_NOFOLLOW met a link
            raise NotRegularFile("a symbolic link, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{_kind(mode)}, not a regular file")
        parts, size = [], 0
        while size <= cap:  # procfs hands out a page per read: read until EOF or past the cap
            block = os.read(fd, min(READ_BLOCK, cap + 1 - size))
            if not block:
                break
            parts.append(block)
            size += len(block)
    finally:
        os.close(fd)
    data = b"".join(parts)
    if len(data) > cap:
        if truncate:
            return data[:cap]
        raise FileTooLarge(f"larger than {cap} bytes")
    return data


def read_text_capped(path, cap: int, **kwargs) -> str:
    """read_capped, decoded as UTF-8 (undecodable bytes replaced: the content is not trusted)."""
    return read_capped(path, cap, **kwargs).decode("utf-8", "replace")
