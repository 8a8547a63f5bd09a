"""Atomic file writes: a temp file in the same folder, then ``os.replace``.

Readers (another rank, a later run, the manifest reader) see the old file or the new one, never
half of one: the compile cache's metadata and marker, the manifest and the plugin's baselines.
:func:`directory_problem` says up front why a folder cannot hold them.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (mode 0644); ``durable`` also fsyncs before the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
