"""Bounded reads, JSON and sha256 of files others may write, which may be a FIFO, a link to ``/dev/zero`` or JSON
nested a million deep: each is an :class:`UntrustedFileError` (a ``ValueError``) naming the file."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

from neuron_args.errors import NeuronArgsError

#: Size caps (bytes) per kind of file: far above what this library writes, far below a memory exhaustion.
METADATA_LIMIT = 16 << 20
RECORD_LIMIT = 64 << 20  # the trace record, the trace memo
MANIFEST_LIMIT = 512 << 20  # manifests and reports: one line per graph
LEDGER_LIMIT = 512 << 20  # one process's ledger file
HLO_LIMIT = 4 << 30  # a serialized HLO module (a large model's is hundreds of MB)

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class UntrustedFileError(NeuronArgsError, ValueError):
    """A file that is not what it should be: not a regular file, larger than its cap, or not parseable."""


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path``, opened without blocking and checked on the descriptor;
    ``follow_links=False`` refuses a link at ``path`` (what is read is then what the name held when opened)."""
    try:
        fd = os.open(path, _READ_FLAGS | (0 if follow_links else _NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise UntrustedFileError(f"{os.fsdecode(path)} is a link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UntrustedFileError(f"{os.fsdecode(path)} is not a regular file ({_kind(st.st_mode)})")
    return fd, st


def read_bounded(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``; opened as :func:`open_regular` says."""
    fd, st = open_regular(path, follow_links=follow_links)
    try:
        return b"".join(read_chunks(fd, st, limit, path))
    finally:
        os.close(fd)


def read_chunks(fd: int, st: os.stat_result, limit: int, path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The bytes of ``path`` opened by :func:`open_regular` (``fd``, ``st``), at most ``limit``, a MiB at a time, so
    a multi-GB file can be hashed without holding it."""
    if st.st_size > limit:
        raise UntrustedFileError(f"{os.fsdecode(path)} has {st.st_size} bytes, more than the {limit} allowed")
    left = limit + 1
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        yield chunk
        left -= len(chunk)
    if left <= 0:  # grew while read
        raise UntrustedFileError(f"{os.fsdecode(path)} has more than the {limit} bytes allowed")


def read_tail(path: str | os.PathLike[str], size: int) -> tuple[bytes, bool]:
    """The last ``size`` bytes of the regular file ``path`` (a log), and whether bytes before them were left out."""
    fd, st = open_regular(path)
    try:
        start = max(0, st.st_size - size)
        return os.pread(fd, size, start), start > 0
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def load_json(data: bytes | str, what: object = "JSON") -> Any:
    """``json.loads`` for untrusted text: every failure is an :class:`UntrustedFileError` naming ``what``."""
    try:
        return json.loads(data)
    except RecursionError:
        raise UntrustedFileError(f"{what} is not JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        raise UntrustedFileError(f"{what} is not JSON ({exc})") from None


def is_sha256(value: object) -> bool:
    """Whether ``value`` has a sha256 hex digest's form (64 lowercase hex digits): checked where a record enters."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")


def read_json(path: str | os.PathLike[str], limit: int) -> Any:
    return load_json(read_bounded(path, limit), os.fsdecode(path))


def stream_sha256(f: BinaryIO) -> str:
    """The sha256 of what is left to read in ``f`` (an open file: the remote cache hashes what it uploads)."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()
