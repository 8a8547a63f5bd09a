"""Capture every graph in child processes (the design's ``parallel_trace.py``).

At most ``workers`` long-lived children trace the jobs, each job after job: for each one a
child opens ``scoped_compiler_args(job[2])`` and calls the model compiled with the capture seam, in
the autograd mode of the ``parallel_trace`` call (or the one the job records: the runner's jobs say
``inference_mode``, the mode it serves in): so the keys are the ones the caller's serve resolves,
``graph.hlo`` and a pending entry with the resolved arguments land in the cache and nothing is
compiled; then it resets Dynamo, so the next job starts from no compiled frames or guards, and
reports that job's keys alone. A child pays its start-up (Dynamo's first compile, jax's client)
once for all its jobs instead of once per job.

Children fork while that is safe: they inherit the job list and are sent an index, so the model
is not pickled. Once jax's CPU client exists in this process a forked child's first jax call
hangs, so the trace then falls back to spawn (each job is pickled to its child) and says so
once; with an ``in_process`` tracer (a long-lived runner) it starts them from a fork server
instead, which imports torch, jax and torchax once for all of them (jobs are pickled too).

A long-lived caller (the runner: ``keep_children=True``) keeps its children when the call
returns, idle, for its next call in this process: a later runner's jobs are pickled to them (as
to a fork server's children) instead of a new set of children starting, each paying its start
again, from a fork server this process would start for them (an interpreter importing torch,
jax and torchax). At most as many are kept as a call may use; they leave after
``$NEURON_ARGS_TRACE_IDLE_SECONDS`` (30) idle, at :func:`close_kept_children` (the pytest plugin
calls it at the session's end), on an interrupt of any call, and with this process; a kept child
that died is replaced. A later runner's warmup of 3 graphs took 1.2 s with kept children, 2.4 s
with children from the fork server and 16.5 s spawned (``benchmarks/bench_trace_children.py``).
Children are started on the compile workers' start thread (:mod:`neuron_args.compilers.lifetime`),
so a child kept for a later call outlives the thread whose call started it.

Every job has a deadline and fails alone: a job that raises fails with the child's traceback
and the child goes on; a child that hangs past the deadline is killed, and one that dies
(a crash, a signal, an exit) fails the job it was tracing; the remaining jobs go on in a new
child. :class:`TraceError` names each failed graph type after all jobs ran, never a stuck run.

On a warm cache no child is needed: given an ``in_process`` tracer (the runner passes its own),
the jobs whose keys the trace record lists as complete are traced in this process instead,
asserting a cache hit, so a changed model still misses and goes to a child (see
:mod:`neuron_args.deferred.trace_record`).
"""
from __future__ import annotations

import contextlib
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
from typing import TYPE_CHECKING, Any

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.compilers.lifetime import die_with_parent, start_on_lifetime_thread
from neuron_args.deferred.jobs import TraceJob, normalize_job, workers_from_env
from neuron_args.deferred.trace_record import TraceRecord, fingerprint
from neuron_args.errors import CacheMissError, NeuronArgsError, TraceError
from neuron_args.text import clip

if TYPE_CHECKING:
    from neuron_args.settings import CompileSettings

log = logging.getLogger("neuron_args.deferred")

WORKERS_ENV = "NEURON_ARGS_TRACE_WORKERS"
DEFAULT_TIMEOUT = 600.0
#: seconds a kept trace child waits idle for this process's next ``parallel_trace`` before it leaves
IDLE_ENV = "NEURON_ARGS_TRACE_IDLE_SECONDS"
DEFAULT_IDLE: float = envs.variable(IDLE_ENV).default


@dataclass
class TraceResult:
    graph_type: str | None
    compiler_args: list[str] | None
    status: str  # "captured" (in a child) | "loaded" (complete: traced in this process) | "failed"
    seconds: float
    keys: list[str] = field(default_factory=list)
    error: str | None = None
    pid: int | None = None  # the process that traced it (a trace child, or this one for "loaded")


def default_workers(n_jobs: int) -> int:
    return workers_from_env(WORKERS_ENV, n_jobs)


def fork_is_safe() -> bool:
    """False once this process created a jax/XLA client (forked children would hang on first use)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    if xb is not None and getattr(xb, "_backends", None):
        return False
    xla_cpu = sys.modules.get("neuron_args.xla_cpu")
    return not (xla_cpu is not None and xla_cpu.clients_created())


def neuron_compiled(obj: Any) -> Any | None:
    """``obj`` when it is already ``torch.compile``-d with one of the neuron seams, else None.

    Walks what Dynamo keeps of the compile (``dynamo_ctx.callback`` -> ... -> the backend, and the
    closure of a compiled function) without relying on one torch version's exact nesting.
    """
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
    """Capture one job under its own scope: ``("ok", keys)`` or ``("error", traceback)``.

    A job whose model is already compiled with a neuron seam is called as it is, with its own
    backend and options (its ``cache_dir`` included); any other model is compiled here with the
    capture seam and ``settings`` (as torch.compile options). Afterwards Dynamo is reset, so the next job in this child
    starts from no compiled frames or guards (its graphs are traced and keyed afresh).
    """
    import torch

    from neuron_args.scope import scoped_compiler_args
    from neuron_args.seams import records

    from neuron_args.autograd_modes import autograd_mode

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


def _raised(job: Any) -> str:
    """The exception a job raised as its reader needs it first: what, on which inputs, the fix; then the traceback."""
    exc = sys.exc_info()[1]
    kwargs = job[1] if isinstance(job, tuple) and len(job) == 3 and isinstance(job[1], Mapping) else {}
    inputs = ", ".join(f"{k}={_describe(v)}" for k, v in kwargs.items()) or "none"
    head = f"{type(exc).__name__}: {clip(str(exc).splitlines()[0] if str(exc) else '', 300)}\n  inputs: {inputs}\n"
    if not isinstance(exc, NeuronArgsError):  # ours carry their own fix
        head += ("  fix: the model raised on this graph's example inputs; call it eagerly with them to reproduce, "
                 "then fix the model or the inputs its bucket returns\n")
    return head + traceback.format_exc()


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return clip(repr(value), 40)


def _serve_jobs(inherited: Sequence[TraceJob] | None, settings: CompileSettings, conn: Any) -> None:
    """Child body: trace each job the parent sends, one at a time, until it sends None or closes the pipe.

    A message is ``(index, pickled job, options, environment)``; the job is None when the child forked
    for this call's list, and takes ``inherited[index]`` (the parent's list as it was at the fork: the
    model is not pickled). It is unpickled here, so a job that does not unpickle fails alone. The
    options and the environment are the call's: a kept child, or one from a fork server started
    earlier, traces for a later call, whose options and ``$NEURON_CC_FLAGS``/``$NEURON_ARGS_TARGET``
    (read into the key) may differ. Each answer is ``(index, status, keys or traceback, pid)``.
    """
    envs.put("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, blob, job_settings, env = message
        envs.replace({**env, "OMP_NUM_THREADS": "1"})
        try:
            job = inherited[index] if blob is None else pickle.loads(blob)
        except BaseException:
            status, payload = "error", f"the job did not unpickle in the trace child:\n{traceback.format_exc()}"
        else:
            status, payload = _run_job(job, settings if job_settings is None else job_settings)
        conn.send((index, status, payload, os.getpid()))


def _child_main(inherited: Sequence[TraceJob] | None, settings: CompileSettings, conn: Any, parent: int) -> None:
    """A trace child's body: it dies with ``parent`` (0: started by the fork server, which exits when the
    caller dies), then traces what it is sent (:func:`_serve_jobs`)."""
    try:
        die_with_parent(parent or os.getppid())  # started on lifetime's start thread, which lives as long as the parent
        _serve_jobs(inherited, settings, conn)
    finally:
        os._exit(0)


def _context(start_method: str | None, server_preload: Sequence[str] | None = None) -> Any:
    """fork while it is safe; once jax's client exists, a fork server when ``server_preload`` is given, else spawn.

    The fork server (started once per process) imports :mod:`neuron_args.deferred.trace_preload`
    and the ``server_preload`` modules (the jobs' model modules) once; each child then forks from
    it instead of starting an interpreter and importing torch, jax and torchax again (spawn).
    """
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
    """Start the fork server now, without waiting for its imports (a long-lived runner's children just forked).

    This process is about to serve, which creates jax's client; its next ``parallel_trace`` then needs
    the fork server, whose start (an interpreter importing torch, jax, torchax and ``modules``, ~3 s)
    now overlaps the compiles and the serve instead of delaying that trace.
    """
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(["neuron_args.deferred.trace_preload", *modules])
    forkserver.ensure_running()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


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

    ``options`` are the capture seam's torch.compile options (cache_dir, compiler_args base,
    target, compiler). ``workers`` caps the children (``$NEURON_ARGS_TRACE_WORKERS``, else the
    CPU count); ``timeout`` is each job's deadline in seconds.

    ``in_process(job)`` lets a warm cache skip the children: a job whose keys the trace record
    (:mod:`neuron_args.deferred.trace_record`, kept in the cache of ``options`` only when
    ``in_process`` is given) lists as complete is handed to it instead. It
    traces the job in this process asserting a cache hit and returns the keys it resolved
    (status ``"loaded"``); if it raises :class:`CacheMissError` (the model or its arguments
    changed since the record), the job is traced in a child after all.

    ``before_children()`` is called once, just before the first child starts (never when no job
    needs one): the runner starts a compile worker there, to be warm when the captures are built.

    ``on_result(index, result)`` is called on this thread as each job settles (its index in
    ``jobs``), before the others finish: the runner compiles a job's captured keys while the
    children still trace the rest (see ``NeuronRunner``'s parallel warmup). ``cancel``, set from
    another thread, stops the call as Ctrl-C does (no child outlives it; ``KeyboardInterrupt``).

    ``keep_children`` keeps the children idle for this process's next call (see the module's
    docstring); its next call takes them instead of starting new ones from a fork server.
    """
    from neuron_args.cache import cache_root
    from neuron_args.settings import CompileSettings

    from neuron_args.autograd_modes import current_autograd_mode

    opts = CompileSettings.from_options(options, "parallel_trace")  # a bad option fails here, not in every child
    if keep_children:
        idle_seconds()  # a bad $NEURON_ARGS_TRACE_IDLE_SECONDS fails here, not when a child is kept
    todo = [normalize_job(j, current_autograd_mode()) for j in jobs]  # each traced in this call's mode
    # the record is the in-process tracer's (a job compiled by its caller may cache elsewhere)
    record = TraceRecord(cache_root(opts.cache_dir)) if in_process is not None else None
    prints, known = _recorded(todo, opts, record)
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
    if server is not None and "fork" in how and not (keep_children and _KEPT.count() >= _worker_cap(workers)):
        _start_fork_server(server)  # unless the kept children are as many as a next call may use
    done = [r for r in results if r is not None]
    if record is not None:
        record.note({prints[i]: (r.graph_type, r.keys) for i, r in enumerate(results)
                     if r is not None and r.status != "failed"})
    failed = [r for r in done if r.status == "failed"]
    if failed:
        raise TraceError(f"{len(failed)} of {len(done)} trace jobs failed:\n" + "\n".join(r.error or "" for r in failed),
                         done)
    return done


def _worker_cap(workers: int | None) -> int:
    """The most children any call of this process may use (``workers``, else the CPU count or the env's)."""
    return workers or default_workers(sys.maxsize)


def recorded_complete(jobs: Iterable[Sequence[Any]], settings: CompileSettings) -> list[bool]:
    """For each job, whether the trace record lists its keys as complete (with an ``in_process`` tracer,
    :func:`parallel_trace` traces those in this process and starts no child for them)."""
    from neuron_args.cache import cache_root
    from neuron_args.autograd_modes import current_autograd_mode

    prints, known = _recorded([normalize_job(j, current_autograd_mode()) for j in jobs], settings,
                              TraceRecord(cache_root(settings.cache_dir)))
    return [fp in known for fp in prints]


def _recorded(todo: list[TraceJob], opts: CompileSettings, record: TraceRecord | None
              ) -> tuple[list[str], dict[str, list[str]]]:
    """Each job's fingerprint and, of those, the ones ``record`` lists complete (no record: none)."""
    if record is None:
        return [""] * len(todo), {}
    prints = [fingerprint(job, opts) for job in todo]
    return prints, record.complete_keys(prints)


def _trace_here(todo: list[TraceJob], indices: list[int], in_process: Callable[[TraceJob], list[str]],
                results: list[TraceResult | None], on_result: Callable[[int, TraceResult], None] | None = None
                ) -> list[int]:
    """Trace the jobs the record knows complete in this process; the indices that missed (for children)."""
    missed = []
    for i in indices:
        job, t0 = todo[i], time.monotonic()
        try:
            keys = in_process(job)
        except CacheMissError as exc:
            log.info("parallel_trace: graph type %r is not in the cache as recorded (%s); tracing it in a child",
                     job.graph_type, str(exc).splitlines()[0])
            missed.append(i)
            continue
        except Exception:
            results[i] = TraceResult(job.graph_type, job[2], "failed", round(time.monotonic() - t0, 3), [],
                                     f"trace of graph type {job.graph_type!r} raised in this process: {_raised(job)}",
                                     os.getpid())
        else:
            results[i] = TraceResult(job.graph_type, job[2], "loaded", round(time.monotonic() - t0, 3), list(keys),
                                     pid=os.getpid())
        if on_result is not None:
            on_result(i, results[i])
    return missed


class _TraceChild:
    """One long-lived trace child and the job it is tracing now (an index into the job list), if any.

    ``call`` is the ``parallel_trace`` call it forked for (its job list is the child's ``inherited``);
    any other call, when the child is kept, pickles its jobs to it.
    """

    def __init__(self, ctx: Any, todo: list[TraceJob], opts: CompileSettings, call: int) -> None:
        self.forked = ctx.get_start_method() == "fork"
        self.call = call
        self.conn, child_conn = ctx.Pipe()
        parent = 0 if ctx.get_start_method() == "forkserver" else os.getpid()
        self.proc = ctx.Process(target=_child_main, args=(todo if self.forked else None, opts, child_conn, parent),
                                daemon=True, name="neuron-args-trace")
        try:
            if parent:  # PDEATHSIG follows the starting thread: a child kept for a later call outlives this call's
                start_on_lifetime_thread(self.proc.start, lambda _: self.kill())
            else:  # the fork server is its parent (and its start may wait for the server's imports)
                self.proc.start()
        finally:
            child_conn.close()
        self.job: int | None = None
        self.started = 0.0

    def give(self, index: int, job: TraceJob, call: int, opts: CompileSettings) -> None:
        """Send a job: its index when forked for this call (the child has the list), else the job itself,
        pickled here, with the call's options and this process's environment now.

        A job that does not pickle raises here (the child waits on); a child that died between
        jobs is not an error here: its job fails as a death when it is collected.
        """
        self.job, self.started = index, time.monotonic()
        blob = None if self.forked and self.call == call else bytes(ForkingPickler.dumps(job))
        with contextlib.suppress(OSError):
            self.conn.send((index, blob, opts, envs.snapshot()))

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


def idle_seconds() -> float:
    """How long a kept trace child waits idle (``$NEURON_ARGS_TRACE_IDLE_SECONDS``, default 30; 0 keeps none)."""
    return envs.seconds(IDLE_ENV, zero_ok=True, hint=" (0 keeps no child idle)")


class _KeptChildren:
    """Idle trace children kept for this process's next ``parallel_trace`` (``keep_children=True``).

    A timer stops them all once the last one put back waited :func:`idle_seconds`; a child taken
    is checked alive (a dead one is dropped, and the call starts another in its place).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.children: list[_TraceChild] = []
        self.timer: threading.Timer | None = None

    def put(self, child: _TraceChild, cap: int) -> None:
        """Keep ``child``; the oldest kept beyond ``cap`` (the most a next call may use) are stopped."""
        idle = idle_seconds()
        if idle <= 0:
            child.stop()
            return
        with self.lock:
            self.children.append(child)
            extra, self.children = self.children[:-cap], self.children[-cap:]
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(idle, self.close)
            self.timer.daemon = True
            self.timer.start()
        for old in extra:
            old.stop()

    def take(self, n: int) -> list[_TraceChild]:
        """Up to ``n`` live kept children (removed from the kept ones); dead ones are dropped."""
        with self.lock:
            alive = [c for c in self.children if c.proc.is_alive()]
            for child in self.children:
                if child not in alive:
                    child.kill()
            taken, self.children = alive[:n], alive[n:]
        return taken

    def count(self) -> int:
        with self.lock:
            return len(self.children)

    def close(self) -> None:
        with self.lock:
            children, self.children = self.children, []
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        for child in children:
            child.stop()


_KEPT = _KeptChildren()
_CALLS = itertools.count(1)


def close_kept_children() -> None:
    """Stop the trace children kept idle for a next ``parallel_trace`` (none left running)."""
    _KEPT.close()


def kept_children() -> list[int]:
    """The pids of the trace children kept idle now."""
    with _KEPT.lock:
        return [c.proc.pid for c in _KEPT.children]


def _trace_in_children(todo: list[TraceJob], indices: list[int], opts: CompileSettings, workers: int | None,
                       deadline_s: float, start_method: str | None, server: list[str] | None,
                       before: list[Callable[[], None] | None], on_result: Callable[[int, TraceResult], None] | None,
                       cancel: threading.Event | None, keep: bool, results: list[TraceResult | None]) -> str:
    """Capture ``todo[i]`` for each index in at most ``workers`` long-lived children, each tracing job after job.

    A child that dies or passes a job's deadline fails that job only; the jobs still to go are
    traced in a new child. On an interrupt no child outlives the call. With ``keep`` the children
    kept by an earlier call are taken first whenever new ones would not fork (they would start from
    a fork server or spawn, and get their jobs pickled all the same), and this call's children are
    kept when it ends. Returns the start method used.
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
        children = _KEPT.take(n_workers)

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
        if keep:
            _KEPT.put(child, _worker_cap(workers))
        else:
            child.stop()

    try:
        while pending or any(c.job is not None for c in children):
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt("parallel_trace cancelled")
            if ctx.get_start_method() == "fork" and start_method is None and not fork_is_safe():
                ctx = _context(None, server)  # a replacement child: this process made jax's client since
            while pending and sum(c.job is None for c in children) < len(pending) and len(children) < n_workers:
                children.append(_TraceChild(ctx, todo, opts, call))
            for child in [c for c in children if c.job is None]:
                if pending:
                    _give(child, pending.popleft(), todo, finish, call, opts)
                else:
                    leave(child)
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


def _inputs_text(job: TraceJob) -> str:
    """``inputs x=[2, 4]``: which bucket of its graph type a job was (a graph type has several)."""
    shapes = [f"{k}={list(v.shape)}" for k, v in job[1].items() if hasattr(v, "shape")]
    return "inputs " + (", ".join(shapes) or "without tensors")


def _give(child: _TraceChild, i: int, todo: list[TraceJob], finish: Any, call: int, opts: CompileSettings) -> None:
    try:
        child.give(i, todo[i], call, opts)
    except Exception as exc:  # spawn/fork server: the job is pickled, and this one does not pickle
        finish(child, "failed", f"trace job of graph type {todo[i].graph_type!r} cannot be sent to its child "
                                f"({type(exc).__name__}: {exc}); fix: make the model and its inputs picklable, "
                                "or call parallel_trace before this process first runs a compiled graph (forked "
                                "children inherit the job)")


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
                                    f"({_exit_text(code)}){_DIED_HINT.get(code, '')} while tracing "
                                    f"{_inputs_text(todo[child.job])}" + (_KILLED_HINT if code and code < 0 else ""))
        elif time.monotonic() - child.started > deadline_s:
            child.proc.kill()
            child.proc.join(5)
            finish(child, "failed", f"trace child of graph type {label!r} hung past its deadline of {deadline_s:g}s "
                                    f"and was killed ({_exit_text(child.proc.exitcode)})")
        else:
            continue
        child.conn.close()
        children.remove(child)
