"""When a compiler must stop: parent death, cancellation, and the one thread long-lived children start on.

Each compiler runs under :mod:`neuron_args.compilers.supervisor` (Linux), which kills its process group when
this process dies. Long-lived children start on :func:`start_on_lifetime_thread`'s one thread, because
``PR_SET_PDEATHSIG`` fires when the *thread* that started a process ends.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C")

SUPERVISOR = Path(__file__).with_name("supervisor.py")
SUPERVISED = sys.platform.startswith("linux")


def supervised_argv(argv: list[str], *, reap: bool = False) -> list[str]:
    """``argv`` wrapped in the supervisor (Linux), so the compiler dies with this process (``reap``: a
    one-shot program, what it leaves running when it exits is killed too)."""
    if not SUPERVISED:
        return argv
    return [sys.executable, "-I", "-S", str(SUPERVISOR), *(["--reap"] if reap else []), str(os.getpid()), *argv]


_starter: cf.ThreadPoolExecutor | None = None  # its one thread lives as long as the process
_starter_lock = threading.Lock()


def start_on_lifetime_thread(start: Callable[[], T], abandon: Callable[[T], None]) -> T:
    """``start()`` run on this process's start thread (see the module docstring); its result. A caller
    interrupted while it waits leaves nothing untracked: ``abandon(child)`` kills what ``start()`` returned."""
    global _starter
    with _starter_lock:
        if _starter is None:
            _starter = cf.ThreadPoolExecutor(1, thread_name_prefix="neuron-args-start")
        future = _starter.submit(start)
    try:
        return future.result()
    except BaseException:
        future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else abandon(f.result()))
        raise


def _forget_starter() -> None:
    """A forked child has none of its parent's threads: its first long-lived child starts a thread of its own."""
    global _starter, _starter_lock
    _starter, _starter_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_starter)


def kill_group(proc: Any, *, reap: bool = True) -> None:
    """SIGKILL the process group ``proc`` leads (every compiler starts in a session of its own): its own
    ``kill_group()`` when it has one (a warm worker's compile, whose group changes hands), else ``os.killpg`` of
    its pid; then reap ``proc`` unless ``reap=False`` (never waits)."""
    killer = getattr(proc, "kill_group", None)
    if killer is not None:
        killer()
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if reap:
        proc.wait()


class IdleChildren(Generic[C]):
    """Long-lived children (warm compile workers, trace children) waiting for their next use, oldest first. Each is
    stopped ``idle`` seconds after it was put back, by a timer of this process: one taken (under the lock) is never
    stopped under its user."""

    def __init__(self, stop: Callable[[C], None]) -> None:
        self.lock = threading.Lock()
        self.children: list[C] = []
        self.timer: threading.Timer | None = None
        self._stop = stop
        self._until: dict[int, float] = {}  # id(child): when it is stopped

    def put(self, child: C, idle: float, cap: int | None = None) -> None:
        """Keep ``child`` for ``idle`` seconds (0: stop it now); the oldest kept beyond ``cap`` are stopped."""
        if idle <= 0:
            self._stop(child)
            return
        with self.lock:
            self.children.append(child)
            self._until[id(child)] = time.monotonic() + idle
            extra = self._remove(self.children[:-cap] if cap else [])
        for old in extra:
            self._stop(old)

    def take(self, n: int, usable: Callable[[C], bool], rank: Callable[[C], Any] = lambda c: 0) -> list[C]:
        """Up to ``n`` kept children ``usable`` accepts (called under the lock), the lowest ``rank`` first, then the
        newest; the ones it refuses are stopped."""
        with self.lock:
            fit = [c for c in reversed(self.children) if usable(c)]
            taken = sorted(fit, key=rank)[:n]
            refused = [c for c in self.children if c not in fit]
            self._remove(refused + taken)
        for child in refused:
            self._stop(child)
        return taken

    def pids(self) -> list[int]:
        with self.lock:
            return [c.pid for c in self.children]  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop every kept child now."""
        with self.lock:
            children = self._remove(self.children)
        for child in children:
            self._stop(child)

    def _expire(self) -> None:
        with self.lock:
            expired = self._remove([c for c in self.children if self._until[id(c)] <= time.monotonic()])
        for child in expired:
            self._stop(child)

    def _remove(self, children: list[C]) -> list[C]:
        """Forget ``children`` and arm the timer for the next expiry (under the lock); returns them."""
        self.children = [c for c in self.children if c not in children]
        for child in children:
            del self._until[id(child)]
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._until:
            self.timer = threading.Timer(max(0.0, min(self._until.values()) - time.monotonic()), self._expire)
            self.timer.daemon = True
            self.timer.start()
        return children


class CompileCancelled(Exception):
    """Raised inside a worker whose :class:`CancelScope` was cancelled (never reaches users)."""


class CancelScope:
    """The compilers started under one scope; :meth:`cancel` kills them and refuses new ones."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # cancel() also runs in a signal handler, maybe inside cancel()
        self._running: set[subprocess.Popen] = set()
        self._event = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise CompileCancelled()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            procs = list(self._running)
        for proc in procs:
            kill_group(proc, reap=False)

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.add(proc)
            cancelled = self._event.is_set()
        if cancelled:
            kill_group(proc, reap=False)

    def discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.discard(proc)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when cancelled meanwhile (an interruptible poll)."""
        return self._event.wait(seconds)


_scope: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar("neuron_args_cancel_scope", default=None)


def current_scope() -> CancelScope:
    """The scope compiles started now run under; outside any, a fresh one nobody cancels."""
    return _scope.get() or CancelScope()


@contextlib.contextmanager
def within(scope: CancelScope) -> Iterator[CancelScope]:
    """Run compiles started in this block (this thread) under ``scope``."""
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)
