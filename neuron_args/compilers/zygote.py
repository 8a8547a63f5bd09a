"""The warm workers' zygote: one process that has imported jax (no XLA client) and forks workers on request.

A warm worker spends nearly all of its start in ``import jax`` (0.25-1.4 s); creating the XLA:CPU
client takes ~0.01-0.03 s. The zygote (``python -m neuron_args.compilers.zygote``, run under the
supervisor like any compiler) pays the import once; each worker it forks only creates its client,
so a second worker is ready while the first compiles its first graph. Forking is safe because the
zygote never creates a client: after ``import jax`` its only other thread is OpenBLAS's, which
handles fork itself.

The driver asks over a ``SOCK_SEQPACKET`` socketpair (the zygote's stdin): one message per worker,
``{"idle": seconds}`` with three descriptors attached (``send_fds``): the worker's request pipe,
its answer pipe and a status pipe the zygote keeps. For each request the zygote forks a *leader*,
which leads a new session (the process group a timeout or cancel kills) and forks the worker; the
leader waits for the worker and exits as it did, as the supervisor does. The zygote writes
``pid <leader>`` on the status pipe at once and ``exit <status>`` when it reaps the leader.

Lifetime: the zygote dies with the driver (its supervisor was started from the driver's spawner
thread); each leader dies with the zygote and each worker with its leader (``PR_SET_PDEATHSIG``),
so ``kill -9`` of the driver leaves nothing. The zygote leaves when the driver closes its end and its
workers are gone, or after its idle time with no worker alive. A request whose request pipe the
driver closed before the fork (a timeout or cancel of a worker not forked yet) is dropped.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from neuron_args.compilers.lifetime import die_with_parent, supervised_argv

MODULE = "neuron_args.compilers.zygote"
#: The leader's status when the worker could not run at all (as the supervisor's).
EXIT_CANNOT_START = 127


# ----------------------------------------------------------------------------- the driver's side


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


# ----------------------------------------------------------------------------- the zygote process


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                os.write(fd, f"exit {code}\n".encode())
            os.close(fd)


def _dropped(req_r: int) -> bool:
    """The driver closed the worker's request pipe before it was forked (a timeout or cancel)."""
    poller = select.poll()
    poller.register(req_r, select.POLLIN)
    return any(event & (select.POLLHUP | select.POLLERR) for _, event in poller.poll(0))


def _lead(req_r: int, ans_w: int, idle: float, zygote: int, inherited: list[int]) -> None:
    """The leader (in the forked child): a session of its own, the worker as its child; exits as the worker did."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    os.setsid()
    die_with_parent(zygote, signal.SIGKILL)
    leader = os.getpid()
    worker = os.fork()
    if worker == 0:
        code = EXIT_CANNOT_START
        try:
            die_with_parent(leader, signal.SIGKILL)
            os.dup2(req_r, 0)
            os.dup2(ans_w, 1)
            os.close(req_r)
            os.close(ans_w)
            from neuron_args.compilers import workers

            code = workers.serve([f"{idle:g}"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(req_r)
    os.close(ans_w)
    _, status = os.waitpid(worker, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(leader, sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


def main(argv: Sequence[str] | None = None) -> int:
    """The zygote: import jax, then fork a worker per request on stdin (a socket) until it may leave.

    ``argv``: ``[idle seconds]``: with no worker alive and no request for that long, it leaves.
    """
    argv = sys.argv[1:] if argv is None else argv
    idle = float(argv[0]) if argv else 300.0
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # as the worker sets it, before jax reads it
    import jax  # noqa: F401  (the start-up every forked worker skips)

    from neuron_args import xla_cpu  # noqa: F401
    from neuron_args.compilers import local_xla, workers  # noqa: F401

    zygote = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through wake_r
    children: dict[int, int] = {}  # leader pid -> its status pipe
    listening = True
    while listening or children:
        ready = select.select([control, wake_r] if listening else [wake_r], [], [], None if children else idle)[0]
        if not ready:
            break  # idle: no worker alive, no request
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            _reap(children)
        if control in ready:
            try:
                data, fds, _, _ = socket.recv_fds(control, 4096, 3)
            except OSError:
                data, fds = b"", []
            if not data:
                listening = False  # the driver closed its end (retired) or is gone
                continue
            req_r, ans_w, status_w = fds
            if _dropped(req_r):
                with contextlib.suppress(OSError):
                    os.write(status_w, f"exit {-signal.SIGKILL}\n".encode())  # as if killed: it was given up
                for fd in fds:
                    os.close(fd)
                continue
            leader = os.fork()
            if leader == 0:
                try:
                    _lead(req_r, ans_w, float(json.loads(data)["idle"]), zygote,
                          [control.fileno(), wake_r, wake_w, status_w, *children.values()])
                finally:
                    os._exit(EXIT_CANNOT_START)
            os.close(req_r)
            os.close(ans_w)
            os.write(status_w, f"pid {leader}\n".encode())
            children[leader] = status_w
            _reap(children)  # a SIGCHLD that came before the leader was recorded
    return 0


if __name__ == "__main__":
    sys.exit(main())
