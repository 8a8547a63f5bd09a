"""The driver's handles on the warm workers' zygote (:mod:`neuron_args.compilers.zygote`) and on the workers it forks.

:class:`Zygote` starts the zygote under the supervisor and asks it for workers without waiting for
the fork (the first request waits in its socket while it imports jax); :class:`ForkedProcess` holds
one forked worker the way a ``Popen`` holds a worker started as a process of its own: its leader's
pid (the process group to kill, known once forked), its pipes, its exit status. See the zygote's
module for the protocol.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO

from neuron_args.compilers.lifetime import supervised_argv
from neuron_args.compilers.supervisor import EXIT_CANNOT_START  # the leader's status when the worker could not run

ZYGOTE_MODULE = "neuron_args.compilers.zygote"


class ZygoteGone(Exception):
    """The zygote no longer takes requests (it left or died)."""


class Zygote:
    """A running zygote: its supervisor's ``Popen``, the socket to ask it, the environment it started under."""

    def __init__(self, program: Sequence[str], idle: float, env: tuple[tuple[str, str], ...]) -> None:
        """Start it; call from the thread that starts every worker (``PR_SET_PDEATHSIG`` follows that thread)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(supervised_argv([*program, f"{idle:g}"]), stdin=theirs.fileno(),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours
        self.env = env
        self.idle = idle
        self.last_used = time.monotonic()

    def usable(self, env: tuple[tuple[str, str], ...]) -> bool:
        """Alive, same environment, and not about to leave on its idle time."""
        fresh = time.monotonic() - self.last_used < self.idle * 0.9
        return fresh and self.proc.poll() is None and self.env == env and self.control.fileno() >= 0

    def fork(self, idle: float) -> ForkedProcess:
        """Ask for one worker (it leaves after ``idle`` seconds without a request); does not wait for the fork."""
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(self.control, [json.dumps({"idle": idle}).encode()], [req_r, ans_w, status_w])
        except OSError as exc:
            for fd in (req_w, ans_r, status_r):
                os.close(fd)
            raise ZygoteGone(str(exc)) from exc
        finally:
            for fd in (req_r, ans_w, status_w):
                os.close(fd)
        self.last_used = time.monotonic()
        return ForkedProcess(self, os.fdopen(req_w, "wb", buffering=0), os.fdopen(ans_r, "rb", buffering=0), status_r)

    def retire(self) -> None:
        """Take no more requests: it leaves once its workers have."""
        with contextlib.suppress(OSError):
            self.control.close()

    def ended(self, timeout: float) -> int | None:
        """Its exit status once it ended (waiting up to ``timeout`` s), else None."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class ForkedProcess:
    """A worker the zygote forked, shaped like the ``Popen`` a warm worker is held by.

    ``pid`` is its leader's (the process group to kill), known once the zygote forked; ``stdin`` and
    ``stdout`` are the worker's request and answer pipes; ``poll``/``wait`` read the leader's exit
    status from the zygote. ``zygote_gone``: the status pipe ended without one (the zygote left or died;
    a worker it forked died with it).
    """

    def __init__(self, zygote: Zygote, stdin: IO[bytes], stdout: IO[bytes], status_fd: int) -> None:
        self.zygote, self.stdin, self.stdout = zygote, stdin, stdout
        self.args = ["zygote fork"]
        self.returncode: int | None = None
        self.zygote_gone = False
        self._known_pid: int | None = None
        self._status: int | None = status_fd
        os.set_blocking(status_fd, False)
        self._buffer = b""
        self._lock = threading.Lock()

    @property
    def known_pid(self) -> int | None:
        """The leader's pid if the zygote said it already (never waits)."""
        self._read(block=False)
        return self._known_pid

    @property
    def pid(self) -> int | None:
        """The leader's pid, waiting for the fork; None if it never happened (the zygote left first)."""
        while self._known_pid is None and self._status is not None:
            self._read(block=True)
        return self._known_pid

    def poll(self) -> int | None:
        self._read(block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(block=True, timeout=remaining)
        return self.returncode

    def kill_group(self) -> None:
        """SIGKILL the leader's group; a worker not forked yet is given up (the zygote drops the request)."""
        pid = self._known_pid if self.returncode is not None else self.known_pid
        if pid is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        else:
            with contextlib.suppress(OSError):
                self.stdin.close()

    def _read(self, block: bool, timeout: float | None = None) -> None:
        """Take what the zygote wrote on the status pipe (``pid N``, ``exit S``); non-blocking unless ``block``."""
        if not self._lock.acquire(blocking=block):  # another thread (or a signal handler) is reading it
            return
        try:
            fd = self._status
            if fd is None:
                return
            if block and not select.select([fd], [], [], timeout)[0]:
                return
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                word, value = line.split()
                if word == b"pid":
                    self._known_pid = int(value)
                else:
                    self.returncode = int(value)
            if not chunk:  # the zygote closed it: after the exit line, or it is gone
                os.close(fd)
                self._status = None
                if self.returncode is None:
                    self.zygote_gone = True
                    # a forked worker died with its zygote (PR_SET_PDEATHSIG); an unforked one never ran
                    self.returncode = -signal.SIGKILL if self._known_pid is not None else EXIT_CANNOT_START
        finally:
            self._lock.release()
