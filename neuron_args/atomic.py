"""Atomic file writes: a temp file in the same folder, then ``os.replace``.

Readers (another rank, a later run, the manifest reader) see the old file or the new one, never
half of one: the compile cache's metadata and marker, the manifest and the plugin's baselines.
A writer killed between the two (``kill -9``, out of memory) leaves its ``.<name>.XXXX.tmp``
behind: :func:`remove_temporaries` drops such files, at once where a lock says no writer is alive
(a cache entry under its key lock), else once they are ``STALE_AFTER`` seconds old (each write
sweeps its own name's). :func:`directory_problem` says up front why a folder cannot hold them.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path


TMP_SUFFIX = ".tmp"
#: Seconds after which a temporary file of :func:`write_atomic` is taken for a dead writer's when no
#: lock tells (a live write takes milliseconds; an hour leaves room for a stalled network file system).
STALE_AFTER = 3600.0


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (mode 0644); ``durable`` also fsyncs before the rename.

    Then removes the temporary files of earlier writes of ``path`` killed mid-write (older than ``STALE_AFTER``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
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
