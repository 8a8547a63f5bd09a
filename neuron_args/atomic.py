"""Atomic file writes: a temp file in the same folder, then ``os.replace``; links are never followed.

Readers (another rank, a later run) see the old file or the new one, never half of one. A writer
killed mid-write leaves its ``.<name>.XXXX.tmp``: :func:`remove_temporaries` drops such files, at once
under a lock that says no writer is alive, else once ``STALE_AFTER`` seconds old. The folders written
may be writable by others: temporaries are created ``O_EXCL | O_NOFOLLOW``, and
:func:`open_for_writing` is the one way to write a file in place (a log, a ledger).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path


TMP_SUFFIX = ".tmp"
#: Seconds after which a temporary file of :func:`write_atomic` is taken for a dead writer's when no
#: lock tells (a live write takes milliseconds; an hour leaves room for a stalled network file system).
STALE_AFTER = 3600.0
#: New files get 0666 less the umask, as any program's files (the umask of a shared cache's users decides).
_MODE = 0o666
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_for_writing(path: str | os.PathLike[str], *, append: bool = False) -> int:
    """A descriptor writing ``path`` in place (truncated, or appended to), never through a link at ``path``:
    a link planted there (``command.txt`` pointing at a file of the user's) is replaced by a fresh file."""
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    try:
        return os.open(path, flags, _MODE)
    except OSError:
        if not os.path.islink(path):
            raise
    os.unlink(path)
    return os.open(path, flags | os.O_EXCL, _MODE)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (mode 0666 less the umask); ``durable`` also fsyncs before the rename.

    Then removes the temporary files of earlier writes of ``path`` killed mid-write (older than ``STALE_AFTER``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    tmp = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(6)}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, _MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    remove_temporaries(path.parent, name=path.name, older_than=STALE_AFTER)


def remove_temporaries(folder: str | os.PathLike[str], *, name: str | None = None,
                       older_than: float | None = None) -> list[str]:
    """Remove the temporary files :func:`write_atomic` left in ``folder`` (of ``name`` only, when given).

    ``older_than`` (seconds) spares younger ones, which a live writer may still own; None removes
    all of them: only for a caller that knows no writer is alive (it holds the folder's lock).
    Returns the names removed; a missing folder or a file removed meanwhile is not an error.
    """
    prefix = "." if name is None else f".{name}."
    cutoff = None if older_than is None else time.time() - older_than
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as items:
        for item in items:
            if not (item.name.startswith(prefix) and item.name.endswith(TMP_SUFFIX)):
                continue
            with contextlib.suppress(OSError):
                if not item.is_file(follow_symlinks=False):
                    continue
                if cutoff is not None and item.stat(follow_symlinks=False).st_mtime > cutoff:
                    continue
                os.unlink(item.path)
                removed.append(item.name)
    return removed


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(inode, mtime ns)`` of ``path`` (None: absent): tells a file replaced since it was seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def directory_problem(path: str | os.PathLike[str], *, writable: bool = False) -> str | None:
    """Why ``path`` cannot be used as a directory (created if missing), or None.

    ``writable`` also asks for write access (a read-only file system says so even to root); a
    read-only compile cache is fine for serving its complete entries, a manifest folder is not.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "exists and is not a directory"
    except NotADirectoryError:
        return "has a parent that is a regular file"
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    if writable and not os.access(path, os.W_OK | os.X_OK):
        try:
            read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):  # no statvfs (Windows)
            read_only = False
        return "is on a read-only file system" if read_only else "is not writable"
    return None
