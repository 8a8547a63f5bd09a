"""Capture every graph in long-lived child processes (the design's ``parallel_trace.py``).

Each child traces job after job under the job's scope and autograd mode (the keys the caller's serve
resolves), resetting Dynamo between jobs: it pays its start-up once. Children fork while that is safe
(jax's client does not survive a fork), else start from a fork server or spawn; with ``keep_children``
they stay idle for this process's next call (``benchmarks/bench_trace_children.py`` measures both).
Each job fails alone; on a warm cache the jobs the trace record lists complete are traced here instead.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.cache import cache_root
from neuron_args.cache_key import current_autograd_mode
from neuron_args.compilers.lifetime import IdleChildren, start_on_lifetime_thread
from neuron_args.compilers.process import describe_exit
from neuron_args.compilers.supervisor import die_with_parent
from neuron_args.deferred.jobs import TraceJob, normalize_job, workers_from_env
from neuron_args.deferred.trace_record import TraceRecord, fingerprint
from neuron_args.errors import CacheMissError, NeuronArgsError, TraceError
from neuron_args.settings import CompileSettings
from neuron_args.text import clip

log = logging.getLogger("neuron_args.deferred")

WORKERS_ENV = "NEURON_ARGS_TRACE_WORKERS"
DEFAULT_TIMEOUT = 600.0
#: seconds a kept trace child waits idle for this process's next ``parallel_trace`` before it leaves
IDLE_ENV = "NEURON_ARGS_TRACE_IDLE_SECONDS"


@dataclass
class TraceResult:
    graph_type: str | None
    compiler_args: list[str] | None
    status: str  # "captured" (in a child) | "loaded" (complete: traced in this process) | "failed"
    seconds: float
    keys: list[str] = field(default_factory=list)
    error: str | None = None
    pid: int | None = None  # the process that traced it (a trace child, or this one for "loaded")


#: ``default_workers(n)``: the trace children for ``n`` jobs (``$NEURON_ARGS_TRACE_WORKERS``, else the CPUs)
default_workers = functools.partial(workers_from_env, WORKERS_ENV)


def fork_is_safe() -> bool:
    """False once this process created a jax/XLA client (forked children would hang on first use)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    if xb is not None and getattr(xb, "_backends", None):
        return False
    xla_cpu = sys.modules.get("neuron_args.xla_cpu")
    return not (xla_cpu is not None and xla_cpu.clients_created())


def neuron_compiled(obj: Any) -> Any | None:
    """``obj`` when it is already ``torch.compile``-d with a neuron seam, else None (walks Dynamo's
    wrappers and closures, not one torch version's exact nesting)."""
    if not hasattr(obj, "_torchdynamo_orig_callable") and not hasattr(obj, "dynamo_ctx"):
        return None
    from neuron_args.seams.backends import NeuronBackend

    todo, seen = [obj], set()
    while todo and len(seen) < 64:
        item = todo.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        if isinstance(item, NeuronBackend):
            return obj
        for name in ("dynamo_ctx", "callback", "_torchdynamo_orig_backend", "compiler_fn", "__wrapped__",
                     "_inner_convert"):
            todo.append(getattr(item, name, None))
        for cell in getattr(item, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    return None


def _run_job(job: TraceJob, settings: CompileSettings) -> tuple[str, Any]:
    """Capture one job under its own scope: ``("ok", keys)`` or ``("error", traceback)``; a model already
    compiled with a neuron seam keeps its own options. Dynamo is reset after, so the next job keys afresh."""
    import torch

    from neuron_args.cache_key import autograd_mode
    from neuron_args.scope import scoped_compiler_args
    from neuron_args.seams import records

    try:
        model, kwargs, compiler_args = job
        records.clear()
        compiled = neuron_compiled(model)
        if compiled is None:
            model = getattr(model, "_orig_mod", model)
            compiled = torch.compile(model, backend="neuron_libtorch_graph_capture", options=settings.as_options(),
                                     dynamic=False)
        # the caller's mode: its serve finds the keys only if the graph was traced as it serves
        with autograd_mode(job.autograd or "inference_mode"), \
                scoped_compiler_args(compiler_args, graph_type=job.graph_type):
            compiled(**kwargs)
        return "ok", [r.key for r in records.records()]
    except BaseException:
        return "error", _raised(job)
    finally:
        torch._dynamo.reset()
        records.clear()


def _raised(job: TraceJob) -> str:
    """The exception a job raised as its reader needs it first: what, on which inputs, the fix; then the traceback."""
    exc = sys.exc_info()[1]
    first = str(exc).splitlines()[0] if str(exc) else ""
    head = f"{type(exc).__name__}: {clip(first, 300)}\n  inputs: {_inputs(job)}\n"
    if not isinstance(exc, NeuronArgsError):  # ours carry their own fix
        head += ("  fix: the model raised on this graph's example inputs; call it eagerly with them to reproduce, "
                 "then fix the model or the inputs its bucket returns\n")
    return head + traceback.format_exc()


def _inputs(job: TraceJob) -> str:
    """``x=(2, 4) float32, n=3``: which bucket of its graph type a job was (a graph type has several)."""
    import torch

    return ", ".join(f"{k}={tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor)
                     else f"{k}={clip(repr(v), 40)}" for k, v in job[1].items()) or "none"


def _child_main(inherited: Sequence[TraceJob] | None, conn: Any, parent: int) -> None:
    """A trace child's body: it dies with ``parent`` (0: started by the fork server, which exits when the
    caller dies), then traces each ``(index, pickled job or None, settings, environment)`` sent until None.

    A None job is ``inherited[index]`` (forked for this call); settings and environment come with each job,
    since a kept child traces for later calls. Each answer is ``(index, status, keys or traceback, pid)``.
    """
    try:
        die_with_parent(parent or os.getppid())  # started on lifetime's start thread, which lives as long as the parent
        envs.put("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)
        while True:
            message = conn.recv()  # EOFError: the caller is gone (the finally exits quietly)
            if message is None:
                return
            index, blob, settings, env = message
            envs.replace({**env, "OMP_NUM_THREADS": "1"})
            try:
                job = inherited[index] if blob is None else pickle.loads(blob)
            except BaseException:
                status, payload = "error", f"the job did not unpickle in the trace child:\n{traceback.format_exc()}"
            else:
                status, payload = _run_job(job, settings)
            conn.send((index, status, payload, os.getpid()))
    finally:
        os._exit(0)


def _context(start_method: str | None, server_preload: Sequence[str] | None = None) -> Any:
    """fork while it is safe; once jax's client exists, a fork server preloading the lowering stack and
    ``server_preload`` (the jobs' model modules) when given, else spawn."""
    if start_method is None:
        if fork_is_safe():  # the lowering stack imported once here, inherited by each child (jax: no client yet)
            import neuron_args.deferred.trace_preload  # noqa: F401
            return mp.get_context("fork")
        if server_preload is not None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["neuron_args.deferred.trace_preload", *server_preload])
            return ctx
        start_method = "spawn"
        if ACTIVITY.say_once("parallel_trace: spawn"):
            log.warning("parallel_trace: jax's client already exists in this process, so forked children would "
                        "hang; starting trace children with spawn instead (jobs are pickled).")
    return mp.get_context(start_method)


def _start_fork_server(modules: Sequence[str]) -> None:
    """Start the fork server now: this process is about to serve (creating jax's client), so its next
    ``parallel_trace`` needs the server, whose ~3 s start then overlaps the compiles instead."""
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(["neuron_args.deferred.trace_preload", *modules])
    forkserver.ensure_running()


def parallel_trace(
    jobs: Iterable[Sequence[Any]],
    *,
    options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    timeout: float | None = None,
    start_method: str | None = None,
    in_process: Callable[[TraceJob], list[str]] | None = None,
    before_children: Callable[[], None] | None = None,
    on_result: Callable[[int, TraceResult], None] | None = None,
    cancel: threading.Event | None = None,
    keep_children: bool = False,
) -> list[TraceResult]:
    """Capture each job in a trace child; raise :class:`TraceError` after all ran if any failed.

    ``options``: the capture seam's torch.compile options; ``workers`` caps the children
    (``$NEURON_ARGS_TRACE_WORKERS``, else the CPU count); ``timeout``: each job's deadline in seconds.
    ``in_process(job)`` traces a job the trace record lists complete in this process, asserting a hit
    (status ``"loaded"``); on :class:`CacheMissError` the job goes to a child after all.
    ``before_children()`` runs once before the first child starts; ``on_result(index, result)`` as each
    job settles (the runner compiles while the rest trace); ``cancel`` stops the call as Ctrl-C does.
    """
    opts = CompileSettings.from_options(options, "parallel_trace")  # a bad option fails here, not in every child
    if keep_children:
        idle_seconds()  # a bad $NEURON_ARGS_TRACE_IDLE_SECONDS fails here, not when a child is kept
    todo = [normalize_job(j, current_autograd_mode()) for j in jobs]  # each traced in this call's mode
    # the record is the in-process tracer's (a job compiled by its caller may cache elsewhere)
    record = TraceRecord(cache_root(opts.cache_dir)) if in_process is not None else None
    prints = ["" if record is None else fingerprint(job, opts) for job in todo]
    known = {} if record is None else record.complete_keys(prints)
    here = [i for i, fp in enumerate(prints) if fp in known]
    children = [i for i, fp in enumerate(prints) if fp not in known]
    results: list[TraceResult | None] = [None] * len(todo)
    # with an in-process tracer (a long-lived runner) children start from a fork server once forking is unsafe
    server = (sorted({type(getattr(j[0], "_orig_mod", j[0])).__module__ for j in todo} - {"__main__"})
              if in_process is not None else None)
    started: list[Callable[[], None] | None] = [before_children]
    settings = (workers, DEFAULT_TIMEOUT if timeout is None else timeout, start_method, server, started, on_result,
                cancel, keep_children)
    how: list[str] = []
    if children and here and start_method is None and fork_is_safe():
        # fork the children before this process traces anything (its first lowering creates jax's client)
        how.append(_trace_in_children(todo, children, opts, *settings, results))
        children = []
    if in_process is not None:
        children += _trace_here(todo, here, in_process, results, on_result)
    if children:
        how.append(_trace_in_children(todo, sorted(children), opts, *settings, results))
    if server is not None and "fork" in how and not (keep_children and len(kept_children()) >= _worker_cap(workers)):
        _start_fork_server(server)  # unless the kept children are as many as a next call may use
    done = [r for r in results if r is not None]
    if record is not None:
        record.note({prints[i]: (r.graph_type, r.keys) for i, r in enumerate(results)
                     if r is not None and r.status != "failed"})
    failed = [r for r in done if r.status == "failed"]
    if failed:
        raise TraceError(f"{len(failed)} of {len(done)} trace jobs failed:\n"
                         + "\n".join(r.error or "" for r in failed), done)
    return done


def _worker_cap(workers: int | None) -> int:
    """The most children any call of this process may use (``workers``, else the CPU count or the env's)."""
    return workers or default_workers(sys.maxsize)


def recorded_complete(jobs: Iterable[Sequence[Any]], settings: CompileSettings) -> list[bool]:
    """For each job, whether the trace record lists its keys as complete (with an ``in_process`` tracer,
    :func:`parallel_trace` traces those in this process and starts no child for them)."""
    prints = [fingerprint(normalize_job(j, current_autograd_mode()), settings) for j in jobs]
    known = TraceRecord(cache_root(settings.cache_dir)).complete_keys(prints)
    return [fp in known for fp in prints]


def _trace_here(todo: list[TraceJob], indices: list[int], in_process: Callable[[TraceJob], list[str]],
                results: list[TraceResult | None], on_result: Callable[[int, TraceResult], None] | None = None
                ) -> list[int]:
    """Trace the jobs the record knows complete in this process; the indices that missed (for children)."""
    missed = []
    for i in indices:
        job, t0 = todo[i], time.monotonic()
        try:
            status, keys, error = "loaded", in_process(job), None
        except CacheMissError as exc:
            log.info("parallel_trace: graph type %r is not in the cache as recorded (%s); tracing it in a child",
                     job.graph_type, str(exc).splitlines()[0])
            missed.append(i)
            continue
        except Exception:
            status, keys = "failed", []
            error = f"trace of graph type {job.graph_type!r} raised in this process: {_raised(job)}"
        results[i] = TraceResult(job.graph_type, job[2], status, round(time.monotonic() - t0, 3), list(keys), error,
                                 os.getpid())
        if on_result is not None:
            on_result(i, results[i])
    return missed


class _TraceChild:
    """One long-lived trace child and the index of the job it traces now; ``call`` is the call it forked
    for (whose job list it inherited): any other call pickles its jobs to it."""

    def __init__(self, ctx: Any, todo: list[TraceJob], call: int) -> None:
        self.forked = ctx.get_start_method() == "fork"
        self.call = call
        self.conn, child_conn = ctx.Pipe()
        parent = 0 if ctx.get_start_method() == "forkserver" else os.getpid()
        self.proc = ctx.Process(target=_child_main, args=(todo if self.forked else None, child_conn, parent),
                                daemon=True, name="neuron-args-trace")
        try:
            if parent:  # PDEATHSIG follows the starting thread: a child kept for a later call outlives this call's
                start_on_lifetime_thread(self.proc.start, lambda _: self.kill())
            else:  # the fork server is its parent (and its start may wait for the server's imports)
                self.proc.start()
        finally:
            child_conn.close()
        self.pid: int = self.proc.pid
        self.job: int | None = None
        self.started = 0.0

    def give(self, todo: list[TraceJob], index: int, call: int, opts: CompileSettings) -> str | None:
        """Send ``todo[index]`` (the index when the child inherited the list, else the job pickled) with the call's
        settings and environment; why it cannot be sent, else None (a dead child's job fails when it is collected)."""
        self.job, self.started, job = index, time.monotonic(), todo[index]
        try:
            blob = None if self.forked and self.call == call else bytes(ForkingPickler.dumps(job))
            with contextlib.suppress(OSError):
                self.conn.send((index, blob, opts, envs.snapshot()))
        except Exception as exc:  # spawn/fork server: the job is pickled, and this one does not pickle
            return (f"trace job of graph type {job.graph_type!r} cannot be sent to its child ({type(exc).__name__}: "
                    f"{exc}); fix: make the model and its inputs picklable, or call parallel_trace before this "
                    "process first runs a compiled graph (forked children inherit the job)")
        return None

    def stop(self) -> None:
        """No more jobs: the child leaves on reading None (not on the pipe's end: forked siblings hold it too)."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.conn.close()
        self.proc.join(5)
        if self.proc.exitcode is None:
            self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


#: ``idle_seconds()``: a kept trace child's idle time (``$NEURON_ARGS_TRACE_IDLE_SECONDS``, default 30; 0 keeps none)
idle_seconds = functools.partial(envs.seconds, IDLE_ENV, zero_ok=True, hint=" (0 keeps no child idle)")


#: idle trace children kept for this process's next ``parallel_trace``
_KEPT: IdleChildren[_TraceChild] = IdleChildren(_TraceChild.stop)
_CALLS = itertools.count(1)
#: ``close_kept_children()`` stops them now (none left running); ``kept_children()``: their pids
close_kept_children = _KEPT.close
kept_children = _KEPT.pids


def _trace_in_children(todo: list[TraceJob], indices: list[int], opts: CompileSettings, workers: int | None,
                       deadline_s: float, start_method: str | None, server: list[str] | None,
                       before: list[Callable[[], None] | None], on_result: Callable[[int, TraceResult], None] | None,
                       cancel: threading.Event | None, keep: bool, results: list[TraceResult | None]) -> str:
    """Capture ``todo[i]`` for each index in at most ``workers`` children; returns the start method used.

    A dying or late child fails its job only; on an interrupt no child outlives the call. With ``keep``,
    kept children are taken first unless new ones would fork, and this call's are kept at its end.
    """
    hook, before[:] = before[0], [None]  # once per parallel_trace call, before the preload it may overlap
    if hook is not None:
        hook()
    ctx = _context(start_method, server)
    n_workers = min(workers or default_workers(len(indices)), len(indices))
    pending = deque(indices)
    call = next(_CALLS)
    children: list[_TraceChild] = []
    if keep and start_method is None and ctx.get_start_method() != "fork":
        children = _KEPT.take(n_workers, lambda child: child.proc.is_alive())

    def finish(child: _TraceChild, status: str, error: str | None = None, keys: list[str] | None = None,
               pid: int | None = None) -> None:
        i, job = child.job, todo[child.job]
        results[i] = TraceResult(job.graph_type, job[2], status, round(time.monotonic() - child.started, 3),
                                 keys or [], error, pid or child.proc.pid)
        child.job = None
        if on_result is not None:
            on_result(i, results[i])

    def leave(child: _TraceChild) -> None:
        children.remove(child)
        _KEPT.put(child, idle_seconds() if keep else 0, _worker_cap(workers))  # 0: stopped now

    try:
        while pending or any(c.job is not None for c in children):
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt("parallel_trace cancelled")
            if ctx.get_start_method() == "fork" and start_method is None and not fork_is_safe():
                ctx = _context(None, server)  # a replacement child: this process made jax's client since
            while pending and sum(c.job is None for c in children) < len(pending) and len(children) < n_workers:
                children.append(_TraceChild(ctx, todo, call))
            for child in [c for c in children if c.job is None]:
                if not pending:
                    leave(child)
                elif (error := child.give(todo, pending.popleft(), call, opts)) is not None:
                    finish(child, "failed", error)
            _collect(children, todo, deadline_s, finish, 1.0 if cancel is None else 0.2)
        for child in list(children):
            leave(child)
    except BaseException:  # Ctrl-C: no trace child outlives the call, nor any kept one
        for child in children:
            child.kill()
        _KEPT.close()
        raise
    return ctx.get_start_method()


# exit status 1 before any answer: Python's own exit after an uncaught error in the child's start-up
_DIED_HINT = {1: "; its traceback is on stderr. Under spawn or a fork server a child imports the caller's main "
                 "module first: a script that warms up or traces at import runs again there and fails. fix: put "
                 "the script's code under `if __name__ == \"__main__\":`"}


_KILLED_HINT = ("; fix: a signal ended it (SIGKILL with no one sending it is mostly the kernel's out-of-memory "
                "killer: see `dmesg`): trace fewer jobs at once (NEURON_ARGS_TRACE_WORKERS) or free memory, then "
                "rerun; the other jobs are not affected")


def _collect(children: list[_TraceChild], todo: list[TraceJob], deadline_s: float, finish: Any,
             poll_s: float = 1.0) -> None:
    """Wait for an answer, a death or the nearest deadline; settle each busy child's job accordingly."""
    busy = [c for c in children if c.job is not None]
    if not busy:
        return
    now = time.monotonic()
    wait_s = max(0.0, min(c.started + deadline_s - now for c in busy))
    mp.connection.wait([c.conn for c in busy] + [c.proc.sentinel for c in busy], timeout=min(wait_s, poll_s))
    for child in busy:
        label = todo[child.job].graph_type
        alive = child.proc.is_alive()  # before the poll: what a child sent before it died is read first
        try:
            answer = child.conn.recv() if child.conn.poll() else None
        except (EOFError, OSError):
            answer = "died"
        if isinstance(answer, tuple):
            _, status, payload, pid = answer
            if status == "ok":
                finish(child, "captured", keys=payload, pid=pid)
            else:
                finish(child, "failed", f"trace of graph type {label!r} raised in the child: {payload}", pid=pid)
            continue
        if answer == "died" or not alive:
            child.proc.join(5)
            code = child.proc.exitcode
            finish(child, "failed", f"trace child of graph type {label!r} died without a result "
                                    f"({describe_exit(code, brief=True)}){_DIED_HINT.get(code, '')} while tracing "
                                    f"inputs {_inputs(todo[child.job])}" + (_KILLED_HINT if code and code < 0 else ""))
        elif time.monotonic() - child.started > deadline_s:
            child.kill()
            finish(child, "failed", f"trace child of graph type {label!r} hung past its deadline of {deadline_s:g}s "
                                    f"and was killed ({describe_exit(child.proc.exitcode, brief=True)})")
        else:
            continue
        child.conn.close()
        children.remove(child)
