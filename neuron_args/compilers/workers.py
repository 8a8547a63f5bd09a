"""Warm local-compiler workers: long-lived processes that start XLA:CPU once and compile many graphs.

A one-shot local compile spends 0.2-0.4 s starting around a 0.05-0.25 s XLA compile. A worker runs each
request as the one-shot program would (:func:`local_xla.main`, same argv, folder and log), so the driver
keeps the one-shot contract of :func:`process.run_compiler`: same ``command.txt``, log and exit statuses;
a timeout kills the worker's group; a worker that dies mid-compile is replaced by a one-shot process.
Workers run under the supervisor, started on the lifetime thread; one per concurrent compile.
``NEURON_ARGS_WARM_WORKERS=0`` turns the pool off; an idle worker (~240 MB) leaves after
``NEURON_ARGS_WARM_WORKER_IDLE`` seconds; one started under other ``ENV_PREFIXES`` variables is retired.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from neuron_args import envs
from neuron_args.compilers.process import describe_exit, start_process
from neuron_args.compilers.lifetime import (IdleChildren, current_scope, kill_group, start_on_lifetime_thread,
                                            supervised_argv)

log = logging.getLogger("neuron_args.compilers")

MODULE = "neuron_args.compilers.workers"
WARM_WORKERS_ENV = "NEURON_ARGS_WARM_WORKERS"
IDLE_ENV = "NEURON_ARGS_WARM_WORKER_IDLE"
#: Environment variables a worker reads at start-up (jax, XLA, the interpreter): a change retires it.
ENV_PREFIXES = ("XLA_", "JAX_", "TF_", "PYTHON", "LD_")
#: How long a worker's process may take to go after its connection reported it gone.
REAP_SECONDS = 5.0
#: The longest answer read from a worker (its answers are a few dozen bytes).
MAX_MESSAGE = 1 << 16
#: How often a compile waiting for its new worker's start looks for a worker given back ready.
GIVEN_BACK_POLL = 0.05


#: ``enabled()``: False when ``$NEURON_ARGS_WARM_WORKERS`` is ``0``/``off``/``false``/``no``
enabled = functools.partial(envs.flag, WARM_WORKERS_ENV)
#: ``idle_seconds()``: how long an idle worker stays (``$NEURON_ARGS_WARM_WORKER_IDLE``, default 300 s)
idle_seconds = functools.partial(envs.seconds, IDLE_ENV,
                                 hint=f" (to turn the warm workers off set {WARM_WORKERS_ENV}=0)")


def _env_key() -> tuple[tuple[str, str], ...]:
    env = envs.snapshot(ENV_PREFIXES)
    # importing jax (here) and every worker (local_xla.preload) set it to "1" when unset: a worker started
    # before this process imported jax (prestarted, say) runs exactly as one started after
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return tuple(sorted(env.items()))


class WorkerDied(Exception):
    """The worker's connection closed before it answered (it exited, crashed or was killed)."""


class Worker:
    """One worker process (its supervisor heading its group, the worker inside) and its connection."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, idle: float) -> None:
        self.proc, self.conn = proc, conn
        self.pid = proc.pid  # its supervisor's: the process group a timeout kills
        self.env = _env_key()
        self.ready = False  # it said it has started its XLA client
        self.worker_pid: int = proc.pid  # the worker's own pid once it said so (proc is its supervisor)
        self.idle = idle  # how long it is kept unused

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.conn.send_bytes(json.dumps(message).encode())
        except (OSError, ValueError) as exc:  # it died while idle (or was given up)
            raise WorkerDied() from exc

    def receive_status(self, deadline: float | None) -> int | None:
        """The exit status of the request in flight; None when ``deadline`` passed first."""
        message = self._receive("status", deadline)
        return None if message is None else int(message["status"])

    def wait_ready(self, deadline: float | None) -> bool:
        """True once it has started its XLA client (before any request); False when ``deadline`` passed first."""
        return self.ready or self._receive("ready", deadline) is not None

    def _receive(self, field: str, deadline: float | None) -> dict[str, Any] | None:
        """The next message holding ``field`` (a ``ready`` one noted on the way), each at most :data:`MAX_MESSAGE`
        bytes; None when ``deadline`` passed first (past: look once)."""
        while True:
            try:
                if not self.conn.poll(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    return None
                message = json.loads(self.conn.recv_bytes(MAX_MESSAGE))
            except (EOFError, OSError) as exc:  # closed, or a message past the bound
                raise WorkerDied() from exc
            if "ready" in message:
                self.ready, self.worker_pid = True, int(message["ready"])
            if field in message:
                return message

    def reap(self) -> int:
        """Wait for the process (its connection is closed); SIGKILL the group if it lingers."""
        try:
            return self.proc.wait(timeout=REAP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        kill_group(self.proc, reap=False)

    def close(self) -> None:
        """Ask an idle worker to leave (end of its input), without waiting for it."""
        with contextlib.suppress(OSError):
            self.conn.close()


class WorkerPool:
    """Idle warm workers of one worker program; a compile takes one or starts one, then gives it back."""

    def __init__(self, program: Sequence[str] | None = None) -> None:
        self.program = list(program) if program else [sys.executable, "-m", MODULE]
        self.broken = False  # a worker died before it was ready: one process per graph from then on
        self._idle: IdleChildren[Worker] = IdleChildren(Worker.close)

    def take(self, ready_only: bool = False) -> Worker | None:
        """An idle worker to use, one that is ready first (``ready_only``: only such one), or None."""
        env = _env_key()

        def usable(worker: Worker) -> bool:
            try:  # it may have said it is ready meanwhile (never waits)
                started = worker.wait_ready(time.monotonic())
            except WorkerDied:
                return False
            return worker.proc.poll() is None and worker.env == env and (started or not ready_only)

        taken = self._idle.take(1, usable, rank=lambda worker: not worker.ready)
        return taken[0] if taken else None

    def _spawn(self) -> Worker:
        idle = idle_seconds()  # a bad value fails before any process starts
        return start_on_lifetime_thread(lambda: self._start(idle), Worker.kill)

    def _start(self, idle: float) -> Worker:
        """One new worker under the supervisor, in a process group of its own (on the start thread), its
        connection on the worker's standard input."""
        ours, theirs = socket.socketpair()
        with theirs:
            try:
                proc = subprocess.Popen(supervised_argv(self.program), stdin=theirs, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
            except BaseException:
                ours.close()
                raise
        return Worker(proc, Connection(ours.detach()), idle)

    def prestart(self, n: int, timeout: float = 300.0, wait: bool = True) -> int:
        """Start workers until ``n`` are idle and ready; returns how many are. One not ready within ``timeout``
        is dropped; ``wait=False`` returns at once (the new workers wait idle while they start)."""
        new = [self._spawn() for _ in range(max(0, n - self._usable()))]
        deadline = time.monotonic() + timeout
        for worker in new:
            try:
                ready = not wait or worker.wait_ready(deadline)
            except WorkerDied:
                ready = False
            if ready:
                self.release(worker)
            else:
                worker.kill()
                worker.reap()
        return self._usable()

    def _usable(self) -> int:
        env = _env_key()
        with self._idle.lock:
            return sum(w.proc.poll() is None and w.env == env for w in self._idle.children)

    def release(self, worker: Worker) -> None:
        """Give a worker back (it waits for the next compile)."""
        self._idle.put(worker, worker.idle)

    def idle_pids(self) -> list[int]:
        """The supervisor pids of the idle workers (each leads its worker's process group)."""
        return self._idle.pids()

    def inherited_fds(self) -> list[int]:
        """The descriptors a forked child of this process got from this pool: the idle workers' connections
        (read without the lock: a fork leaves it as whichever thread held it)."""
        return [worker.conn.fileno() for worker in list(self._idle.children) if not worker.conn.closed]

    def close(self) -> None:
        """Let every idle worker go (busy ones leave when their compile ends and they are not given back)."""
        self._idle.close()

    def start(self, program_args: Sequence[str], argv: Sequence[str], *, cwd: Path, stdout: IO[bytes]) -> Any:
        """Start one compile on a warm worker (``program_args``: ``argv`` without the program part); a one-shot
        ``Popen`` when this pool is broken."""
        if self.broken:
            return start_process(argv, cwd=cwd, stdout=stdout)
        worker = self.take()  # an idle one, one that is ready first, else a new one
        return PooledCompile(self, worker or self._spawn(), program_args, argv, cwd=cwd, stdout=stdout)


class PooledCompile:
    """One compile on a warm worker, shaped like the ``Popen`` :func:`process.run_compiler` waits on; a worker
    still starting races a ready one given back (two workers are never slower than one)."""

    def __init__(self, pool: WorkerPool, worker: Worker, program_args: Sequence[str], argv: Sequence[str], *,
                 cwd: Path, stdout: IO[bytes]) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        self._pool, self._worker, self._cwd, self._stdout = pool, worker, cwd, stdout
        self._request = {"argv": list(program_args), "cwd": str(cwd), "capture": str(Path(stdout.name).absolute())}
        self._sent = False
        self._fallback: subprocess.Popen | None = None
        self._stopping = False  # timed out or interrupted: the death that follows is ours

    def kill_group(self) -> None:
        """SIGKILL the group running this compile now (the worker's, or its one-shot replacement's)."""
        self._stopping = True
        kill_group(self._fallback or self._worker.proc, reap=False)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._fallback is None:
            try:
                code = self._status(deadline)
            except WorkerDied:
                code = self._worker.reap()
                if not (self._stopping or current_scope().cancelled):  # it died on its own
                    self._replace(code)
            except BaseException:  # KeyboardInterrupt: the caller kills the group next
                self._stopping = True
                raise
            else:
                if code is None:
                    self._stopping = True
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                self._pool.release(self._worker)
        if self._fallback is not None:  # TimeoutExpired: the caller kills its group
            code = self._fallback.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.returncode = code
        return code

    def _status(self, deadline: float | None) -> int | None:
        """The compile's exit status from the worker (sending the request once one is ready); None: timed out."""
        if not self._sent:
            if self._stopping:  # killed before it took the request: wait for it to go
                raise WorkerDied()
            if not self._await_worker(deadline):
                return None
            if current_scope().cancelled:  # cancelled while it waited: wait() gives the unused worker back
                return -signal.SIGKILL
            self._worker.send(self._request)
            self._sent = True
        return self._worker.receive_status(deadline)

    def _await_worker(self, deadline: float | None) -> bool:
        """Until the held worker is ready or another one is given back ready (looked for every
        :data:`GIVEN_BACK_POLL` s: a start takes longer), whichever first; False: timed out."""
        while not self._worker.wait_ready(min(time.monotonic() + GIVEN_BACK_POLL, deadline or math.inf)):
            other = self._pool.take(ready_only=True)
            if other is not None:
                self._pool.release(self._worker)  # still starting: the next compile takes it
                self._worker = other
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def _replace(self, code: int) -> None:
        """The worker died on its own: run this graph in a process of its own (the one-shot way)."""
        worker = self._worker
        if not worker.ready:
            self._pool.broken = True
        how, name = describe_exit(code), worker.worker_pid
        log.warning("warm local-compiler worker %s %s mid-compile; compiling %s in a process of its own%s", name,
                    how, self._cwd, "" if worker.ready else " (it never started: the pool is off from now on)")
        self._stdout.seek(0, os.SEEK_END)
        self._stdout.write(f"neuron-args: warm compile worker (pid {name}) {how} mid-compile; this graph "
                           "was compiled again in a process of its own\n".encode())
        self._stdout.flush()
        self._fallback = start_process(self.args, cwd=self._cwd, stdout=self._stdout)
        if current_scope().cancelled:  # cancelled while it started
            kill_group(self._fallback, reap=False)


# ----------------------------------------------------------------------------- one pool per process

_pool: WorkerPool | None = None
_pool_lock = threading.Lock()
_forgotten: list[WorkerPool] = []  # the parent's connections and Popen objects: never used, never collected


def shared_pool() -> WorkerPool:
    """This process's pool of the local compiler program (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = WorkerPool()
        return _pool


def _forget_after_fork() -> None:
    """A forked child starts its own workers, and points the parent's connections at ``/dev/null`` so a worker the
    parent closes sees its end of input then, not when a kept child leaves (the fd numbers stay taken)."""
    global _pool, _pool_lock
    if _pool is not None:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in _pool.inherited_fds():
            os.dup2(devnull, fd, inheritable=False)
        os.close(devnull)
        _forgotten.append(_pool)
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _run_request(request: dict[str, Any], devnull: int, n: int) -> int:
    """One compile, as ``python -m neuron_args.compilers.local_xla <argv>`` run in ``cwd`` would do it."""
    from neuron_args.compilers import local_xla

    try:
        os.chdir(request["cwd"])
        # the driver created it: a link swapped in since (the entry's folder may be others') is not followed
        out = os.open(request["capture"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        return local_xla.main(request["argv"], worker=f"warm worker, compile {n}")
    except SystemExit as exc:  # argparse and friends, as the interpreter would map them
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)


def serve() -> int:
    """The worker: start its XLA client, say so, then answer each request with ``{"status": N}`` until its
    connection (standard input) closes: the pool closes it when the worker was idle too long."""
    conn = Connection(os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    envs.environ().setdefault("JAX_PLATFORMS", "cpu")  # skip probing for accelerator plugins (if jax is imported)
    start = time.perf_counter()
    from neuron_args.compilers import local_xla

    local_xla.compile_client()
    conn.send_bytes(json.dumps({"ready": os.getpid(), "seconds": round(time.perf_counter() - start, 3)}).encode())
    n = 0
    while True:  # one request at a time: none waits in the buffer
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return 0
        n += 1
        conn.send_bytes(json.dumps({"status": _run_request(request, devnull, n)}).encode())


if __name__ == "__main__":
    sys.exit(serve())
