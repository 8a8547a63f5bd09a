"""Who writes into a manifest folder: ``flock`` on the folder itself, taken by the pytest plugin and NeuronRunner jobs.

An emit reads an engine's ledger and then removes it, so a second writer of the engine at once would lose its lines
(its manifest would miss graphs and still read as valid). A pytest session holds ``<root>`` exclusively; a job
holds ``<root>`` shared and ``<root>/<engine-id>/`` exclusively until its emit (:func:`hold_engine`). The locks
leave no file and die with their holder; one this process holds is never waited for.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EngineHold", "folder_lock_holder", "held_here", "hold_engine", "lock_folder", "unlock_folder"]

logger = logging.getLogger("neuron_args.manifest")

#: seconds between tries while another process holds a folder, and between "still waiting" lines
POLL_SECONDS = 0.2
REPEAT_NOTICE_SECONDS = 600.0

_HELD: dict[int, tuple[int, int]] = {}  # a descriptor this process locked a folder by -> the folder's (st_dev, st_ino)


def held_here(root: Path) -> bool:
    """Whether this process holds a lock on ``root`` (taken through this module)."""
    try:
        st = os.stat(root)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _HELD.values()


def lock_folder(root: Path, *, shared: bool = False) -> int | None:
    """A ``flock`` on the folder itself, without waiting: the descriptor to pass to :func:`unlock_folder`, or None
    where folders cannot be locked. Raises BlockingIOError when another holder's lock conflicts."""
    try:
        import fcntl
    except ImportError:  # Windows: no guard
        return None
    try:
        fd = os.open(root, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:  # a file system without flock: no guard
        os.close(fd)
        return None
    with contextlib.suppress(OSError):  # not remembered: this process may then wait for its own hold
        st = os.fstat(fd)
        _HELD[fd] = (st.st_dev, st.st_ino)
    return fd


def unlock_folder(fd: int | None) -> None:
    """Release a lock :func:`lock_folder` took (closing its descriptor releases the ``flock``)."""
    if fd is None:
        return
    _HELD.pop(fd, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def folder_lock_holder(root: Path) -> int | None:
    """The pid holding a ``flock`` on ``root`` (Linux's /proc/locks: ``N: FLOCK ADVISORY WRITE pid MAJ:MIN:INODE``)."""
    try:
        st = os.stat(root)
        with open("/proc/locks") as handle:
            text = handle.read()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == where and parts[4].isdigit():
            return int(parts[4])
    return None


def _ancestors() -> set[int]:
    """The pids of this process's parents (Linux's /proc; empty elsewhere)."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _wait_for(folder: Path, *, shared: bool, why: str) -> int | None:
    """:func:`lock_folder`, waiting (saying who holds it and why, every ten minutes) while another process holds a
    conflicting lock; None when the holder is a parent (an xdist worker or rank process in its session's folder)."""
    start = last_notice = None
    while True:
        try:
            return lock_folder(folder, shared=shared)
        except BlockingIOError:
            now = time.monotonic()
            if last_notice is None or now - last_notice >= REPEAT_NOTICE_SECONDS:
                holder = folder_lock_holder(folder)
                if last_notice is None and holder is not None and holder in _ancestors():
                    return None
                start = now if start is None else start
                logger.warning("manifest folder %s is held by pid %s: %s; waiting for it%s", folder,
                               holder or "unknown", why,
                               f" (waited {now - start:.0f} s)" if now > start else "")
                last_notice = now
            time.sleep(POLL_SECONDS)


@dataclass
class EngineHold:
    """What :func:`hold_engine` took: release it once the engine's manifest is written."""

    fds: list[int | None] = field(default_factory=list)

    def release(self) -> None:
        while self.fds:
            unlock_folder(self.fds.pop())


def hold_engine(root: Path, engine_id: str) -> EngineHold:
    """Hold ``root`` shared and ``root/engine_id`` exclusively (creating both), waiting for other processes';
    either is skipped where this process holds it already (a second runner of the engine, a pytest session)."""
    engine = root / engine_id
    hold = EngineHold()
    try:
        engine.mkdir(parents=True, exist_ok=True)
    except OSError:  # an unwritable folder: nothing to guard, the manifest's write says what is wrong
        return hold
    if held_here(engine):
        return hold
    if not held_here(root):
        hold.fds.append(_wait_for(
            root, shared=True,
            why="a pytest session writes this folder's manifests until it ends (one writer at a time: give this job "
                "another manifest folder to run it alongside)"))
    try:
        hold.fds.append(_wait_for(
            engine, shared=False,
            why=f"another job warms up engine {engine_id} into this folder until it writes its manifest (two jobs "
                "at once would lose each other's ledger lines; give each job its own manifest folder, e.g. its own "
                "--out, to run them side by side)"))
    except BaseException:
        hold.release()
        raise
    return hold
