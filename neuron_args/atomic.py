"""Atomic writes (a temp file, then ``os.replace``: old or new, never half), never following links (``O_EXCL |
O_NOFOLLOW``): the folders written may be writable by others."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import time
from pathlib import Path


TMP_SUFFIX = ".tmp"
#: Seconds after which a temporary file is a dead writer's when no lock tells (room for a stalled network FS).
STALE_AFTER = 3600.0
_MODE = 0o666
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_for_writing(path: str | os.PathLike[str], *, append: bool = False) -> int:
    """A descriptor writing ``path`` in place; a link or FIFO planted there is replaced by a fresh file, never
    followed or written to (opened non-blocking: a FIFO nobody reads would block the writer)."""
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, _MODE)
    except OSError:  # ELOOP: a link; ENXIO: a FIFO with no reader
        if not _planted(path):
            raise
    else:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
    os.unlink(path)
    return os.open(path, flags | os.O_EXCL, _MODE)


def _planted(path: str | os.PathLike[str]) -> bool:
    """A link or a FIFO at ``path``: something put there to be written through."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISLNK(mode) or stat.S_ISFIFO(mode)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (``durable``: fsync before the rename), then drop stale temporaries."""
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
    """Remove (and return the names of) killed writes' temporaries in ``folder``; ``older_than=None`` only under a
    lock that says no writer is alive."""
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


def remove_path(path: Path) -> None:
    """Remove whatever is at ``path``: a file, a link (never followed) or a folder tree; nothing when absent."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(inode, mtime ns)`` of ``path`` (None: absent): tells a file replaced since it was seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def directory_problem(path: str | os.PathLike[str], *, writable: bool = False) -> str | None:
    """Why ``path`` cannot be used as a directory (created if missing), or None; ``writable`` also asks write access
    (a read-only file system says so even to root)."""
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
