"""The warm workers' zygote: one process that has imported jaxlib (no XLA client) and forks workers on request.

A warm worker spends most of its start importing jaxlib and numpy (0.1-0.3 s; it never imports jax,
see :func:`local_xla.compile_client`); creating the XLA:CPU client takes ~0.01-0.03 s. The zygote
(``python -m neuron_args.compilers.zygote``, run under the supervisor like any compiler) pays the
import once; each worker it forks only creates its client, so a second worker is ready while the
first compiles its first graph. Forking is safe because the zygote never creates a client: after
the import its only other thread is OpenBLAS's, which handles fork itself.

The driver asks over a ``SOCK_SEQPACKET`` socketpair (the zygote's stdin): one message per worker,
``{"idle": seconds}`` with three descriptors attached (``send_fds``): the worker's request pipe,
its answer pipe and a status pipe the zygote keeps. For each request the zygote forks a *leader*,
which leads a new session (the process group a timeout or cancel kills; the zygote makes it a
group leader before it tells the pid, so a kill sent at once reaches it) and forks the worker; the
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
import sys
from collections.abc import Sequence

from neuron_args import envs
from neuron_args.compilers.lifetime import die_with_parent
from neuron_args.compilers.supervisor import EXIT_CANNOT_START, exit_as


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
    with contextlib.suppress(PermissionError):  # the zygote made it a group leader first: a group is what counts
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
    os._exit(exit_as(status))


def main(argv: Sequence[str] | None = None) -> int:
    """The zygote: import jaxlib, then fork a worker per request on stdin (a socket) until it may leave.

    ``argv``: ``[idle seconds]``: with no worker alive and no request for that long, it leaves.
    """
    argv = sys.argv[1:] if argv is None else argv
    idle = float(argv[0]) if argv else 300.0
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    envs.put_default("JAX_PLATFORMS", "cpu")  # as the worker sets it, before jax reads it
    from neuron_args import xla_cpu  # noqa: F401
    from neuron_args.compilers import local_xla, workers  # noqa: F401

    local_xla.preload()  # jaxlib and its custom-call targets: the start-up every forked worker skips

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
            with contextlib.suppress(OSError):  # it heads its group before its pid is told: a kill then reaches it
                os.setpgid(leader, leader)  # (EPERM: its own setsid came first, as good)
            os.close(req_r)
            os.close(ans_w)
            os.write(status_w, f"pid {leader}\n".encode())
            children[leader] = status_w
            _reap(children)  # a SIGCHLD that came before the leader was recorded
    return 0


if __name__ == "__main__":
    sys.exit(main())
