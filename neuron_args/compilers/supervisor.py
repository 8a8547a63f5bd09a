"""Runs one compiler so that it never outlives the Python process that asked for it (Linux).

    python -I -S supervisor.py [--reap] <parent pid> <program> [args...]

A process-group leader that SIGKILLs its whole group when its parent dies (``PR_SET_PDEATHSIG``, ``kill -9``
included) or on SIGTERM/SIGINT/SIGHUP; ``--reap`` also kills what the compiler left running. The exit status
passes on unchanged. Standard library only, run with ``-I -S`` (a few milliseconds per compile).
"""
import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_CANNOT_START = 127
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _kill_group(signum, frame=None):
    try:
        os.killpg(0, signal.SIGKILL)  # the compiler, its helpers and this process (their group's leader)
    finally:
        os._exit(128 + signum)


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; else nothing): the supervisor,
    and a trace child first thing, with the parent's pid taken before the fork (one already gone: ``sig`` now)."""
    if not sys.platform.startswith("linux"):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        print(f"neuron-args: prctl failed (errno {ctypes.get_errno()}); process {os.getpid()} may outlive a "
              "killed parent", file=sys.stderr)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)


def _kill_leftovers() -> None:
    """SIGKILL and reap what the compiler left running, until none is left (each kill hands us its children)."""
    path = f"/proc/self/task/{os.getpid()}/children"
    for _ in range(1000):
        try:
            with open(path) as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):  # no such file (a kernel without it): nothing to go on
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):  # already reaped
                os.waitpid(pid, 0)


def main(argv):
    reap = argv[0] == "--reap"
    argv = argv[1:] if reap else argv
    parent, program = int(argv[0]), argv[1:]
    if os.getpgrp() != os.getpid():  # run by hand inside another group (the driver starts it as a leader)
        os.setsid()
    for sig in _FORWARDED:
        signal.signal(sig, _kill_group)
    die_with_parent(parent, signal.SIGTERM)  # the handler above kills the group
    if reap:
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the compiler come here, not to init
    pid = os.fork()
    if pid == 0:
        try:
            for sig in _FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(program[0], program)
        except OSError as exc:
            print(f"neuron-args supervisor: cannot start {program[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_CANNOT_START)
    _, status = os.waitpid(pid, 0)
    if reap:
        _kill_leftovers()
    return exit_as(status)


def exit_as(status: int) -> int:
    """The exit code to return for a child's wait ``status``; a signal death is re-raised on this process instead."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be (and need not be) reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not kill (should not happen): say which one
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
