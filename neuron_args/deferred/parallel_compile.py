"""Build every pending (captured) entry in parallel (the design's ``parallel_compile.py``).

Each graph compiles with the arguments its capture recorded, so a per-graph ``-O`` level survives the
deferred build; one failing graph does not stop the others (:class:`ParallelCompileError` after all).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from neuron_args.activity import note
from neuron_args.cache import HLO_NAME, LOCK_TIMEOUT, METADATA_NAME, CacheEntry, CompileCache, disk_error
from neuron_args.compilers import compiler_choice, select_compiler
from neuron_args.compilers.base import check_keyed_compiler, check_keyed_version, compile_entry
from neuron_args.compilers.lifetime import CancelScope, CompileCancelled, within
from neuron_args.deferred.farm import build_on, expected_compiler
from neuron_args.deferred.jobs import workers_from_env
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CompileError, CorruptEntryError, NeuronArgsError, OptionsError
from neuron_args.flags import CompilerArgs, optimization_level
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.settings import check_timeout, resolve_compile_timeout
from neuron_args.text import graph_label

log = logging.getLogger("neuron_args.deferred")

WORKERS_ENV = "NEURON_ARGS_COMPILE_WORKERS"


@dataclass
class CompileReport:
    graphs: list[GraphOutcome] = field(default_factory=list)  # ``how`` (``status``) each build ended
    seconds: float = 0.0

    @property
    def failed(self) -> list[GraphOutcome]:
        return [g for g in self.graphs if g.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "graphs": [
            {"key": g.key, "graph_type": g.graph_type, "compiler_args": g.compiler_args, "status": g.status,
             "seconds": g.compile_seconds, "executable_size": g.executable_size, "used_base_args": g.used_base_args,
             "error": g.error} for g in self.graphs]}


class ParallelCompileError(CompileError):
    """Some graphs of one :func:`parallel_compile` failed; the others were built (``report``: the whole run)."""

    def __init__(self, report: CompileReport) -> None:
        self.report = report
        failed = report.failed
        super().__init__(
            f"parallel_compile: {len(failed)} of {len(report.graphs)} graphs failed:\n"
            + "\n".join(f"  {g.graph_type!r} {g.key}: {g.error}" for g in failed)
            + "\nfix: change what each graph's error names; the failed entries stay pending, so running "
            "parallel_compile (or neuron-args compile) again builds them")

    @property
    def failures(self) -> list[GraphOutcome]:
        return self.report.failed

    def __reduce__(self) -> tuple[type[ParallelCompileError], tuple[CompileReport]]:
        return (type(self), (self.report,))


@dataclass(frozen=True)
class CompileProgress:
    """One finished graph, for the terminal; ``more``: keys still arrive, so ``total`` is the count so far."""

    done: int
    total: int
    graph: GraphOutcome
    elapsed: float
    remaining_estimate: float
    more: bool = False

    def line(self) -> str:
        g = self.graph
        left = "more graphs arriving" if self.more else f"~{self.remaining_estimate:.0f}s left"
        return (f"[{self.done}/{self.total}{'+' if self.more else ''}] {g.graph_type or '-'} {g.key[:12]} {g.status} "
                f"in {g.compile_seconds or 0.0:.1f}s (elapsed {self.elapsed:.1f}s, {left})")


def pending_graph(entry: CacheEntry, base_args: Sequence[str] | None) -> tuple[EntryMetadata | None, GraphOutcome]:
    """A pending entry's metadata (None: damaged) and the outcome of its build with its recorded arguments, else
    the base ones (an older cache)."""
    try:
        md = entry.info()
    except CorruptEntryError as exc:
        return None, GraphOutcome(
            entry.key, entry.graph_type, compiler_args=list(base_args or []), how="failed", compile_seconds=0.0,
            error=f"{graph_label(entry.graph_type)}, key {entry.key}: {exc.problem}; the entry stays pending.\nfix: "
                  f"capture the graph again (re-run the warmup or parallel_trace), or remove the entry's folder {entry.path}")
    recorded = md.compiler_args
    args = list(recorded) if recorded is not None else list(base_args or [])
    level = None
    with contextlib.suppress(ValueError):  # a malformed level fails the build, with the compiler's words
        level = optimization_level(args)
    return md, GraphOutcome(entry.key, md.graph_type, list(md.input_shapes or []), args, level, how="compiled",
                            compile_seconds=0.0, used_base_args=recorded is None)


def _build(root: str, key: str, base_args: list[str] | None, compiler_name: str | None, timeout: float | None,
           scope: CancelScope, farm: cf.Executor | None) -> GraphOutcome:
    """Build one pending entry under its key's lock, on one of the call's threads: here, or on ``farm``
    (``farm.build_on``: its task shipped, the worker's answer checked as untrusted, written marker last). A cancelled
    ``scope`` starts nothing, ends a lock wait and kills (or lets go of) the compile."""
    cache = CompileCache(root)
    entry = cache.entry(key)
    report = None
    t0 = time.monotonic()
    try:
        scope.check()
        with within(scope), cache.lock(key, stop=scope.wait, timeout=LOCK_TIMEOUT, graph_type=entry.graph_type):
            md, report = pending_graph(entry, base_args)
            if md is None:  # damaged metadata fails the graph, complete or not: nothing vouches for its executable
                return report
            if entry.is_complete:
                return replace(report, how="already-complete")
            scope.check()
            size = (_build_here(entry, md, report.compiler_args, compiler_name, timeout) if farm is None else
                    build_on(farm, entry, md, report.compiler_args, compiler_name, timeout, scope))
            ended: dict[str, Any] = {"executable_size": size}
    except (CompileCancelled, InterruptedError):
        ended = {"how": "cancelled"}
    except NeuronArgsError as exc:  # with no report yet, the lock wait failed: nothing was touched
        ended = {"how": "failed", "error": str(exc) if report is not None else f"{exc}\nThe entry stays pending."}
    except Exception as exc:  # a thread must report, not die: one graph never stops the others
        ended = {"how": "failed", "error": f"{type(exc).__name__}: {exc}"}
    if report is None:
        report = pending_graph(entry, base_args)[1]
    return replace(report, **ended, compile_seconds=round(time.monotonic() - t0, 3))


def _build_here(entry: CacheEntry, md: EntryMetadata, compiler_args: list[str], compiler_name: str | None,
                timeout: float | None) -> int:
    """Compile ``entry`` (its key's lock held) in a compiler process of this machine; the executable's size.
    ``timeout`` None: the capture's option, else the environment's or the compiler's."""
    key, graph_type = entry.key, md.graph_type
    if not entry.hlo_path.is_file():
        raise CompileError(
            f"entry {key} (graph type {graph_type!r}) is pending but has no {HLO_NAME}: its capture did not "
            f"finish writing it. Fix: capture it again (re-run the warmup or parallel_trace), or remove {entry.path}")
    compiler = select_compiler(compiler_name or md.compiler_name)
    check_keyed_compiler(key, graph_type, md.compiler_name, compiler.info.name)
    check_keyed_version(key, graph_type, compiler.info, expected_compiler(md)[1], "on this machine")
    if timeout is None and md.compile_timeout is not None:  # the capture's own option
        timeout = resolve_compile_timeout(md.compile_timeout, compiler.info.name)
    try:
        compile_entry(entry, compiler, compiler_args, md.build_target, graph_type, md, timeout=timeout)
        entry.mark_complete()
    except OSError as exc:
        raise disk_error(exc, entry.path, key=key, graph_type=graph_type) from exc
    return entry.executable_path.stat().st_size


#: ``default_workers(n)``: the compile threads for ``n`` graphs (``$NEURON_ARGS_COMPILE_WORKERS``, else the CPUs)
default_workers = functools.partial(workers_from_env, WORKERS_ENV)


class _Terminated(KeyboardInterrupt):
    """SIGTERM during :func:`parallel_compile`: handled like Ctrl-C, then the signal is re-delivered."""


@contextlib.contextmanager
def _interrupts_cancel(scope: CancelScope) -> Iterator[list[int]]:
    """While compiling, Ctrl-C and SIGTERM kill the running compilers at once; only the first raises, so a
    second can never interrupt the clean-up; a SIGTERM is re-delivered at the end (die of it, as the sender
    expects). Main thread only, over default dispositions only."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_signal(signum: int, frame: Any) -> None:
        scope.cancel()
        if not received:
            received.append(signum)
            raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    saved = {}
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(sig) == default:
            saved[sig] = signal.signal(sig, on_signal)
    try:
        yield received
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if received[:1] == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)


#: How long an interrupted parallel_compile waits for its killed compiles to report.
CANCEL_GRACE_SECONDS = 10.0
#: The graphs an executor builds at once when ``workers`` does not say (each waited for on a thread here).
FARM_IN_FLIGHT = 256


def parallel_compile(
    cache_dir: str | os.PathLike[str],
    *,
    base_compiler_args: Sequence[str] | str | None = None,
    compiler: str | None = None,
    executor: cf.Executor | None = None,
    workers: int | None = None,
    progress: Callable[[CompileProgress], None] | None = None,
    quiet: bool = False,
    raise_on_error: bool = True,
    compile_timeout: float | None = None,
    keys: Iterable[str] | None = None,
) -> CompileReport:
    """Compile every pending entry under ``cache_dir`` with its recorded arguments.

    ``workers`` threads (``$NEURON_ARGS_COMPILE_WORKERS``, else the CPU count) each drive a compiler process,
    or wait on any ``executor``'s worker (a cluster's too; ``workers`` None: up to ``FARM_IN_FLIGHT`` at once).
    ``compile_timeout`` bounds each compile (None: the capture's option, else ``$NEURON_ARGS_COMPILE_TIMEOUT``,
    else the compiler's default). ``keys`` streams the work instead of the scan (read on a thread of its own, so it
    may block; repeats skipped). Ctrl-C or SIGTERM cancels the queue, kills running compilers (lets go of an
    executor's), logs the outcome and propagates; interrupted entries stay pending.
    """
    cache = CompileCache(cache_dir)
    if cache.root.exists() and not cache.root.is_dir():
        raise OptionsError(f"parallel_compile: cache_dir {cache.root} is not a directory; pass the compile cache "
                           "the capture wrote into (options['cache_dir'] of the capture seam)")
    statuses = [(e, e.status) for e in cache.entries()] if keys is None else []
    pending = [e.key for e, status in statuses if _buildable(e, status)]
    for entry in (e for e, status in statuses if status == "crashed" and not e.has_metadata):
        log.warning("parallel_compile: entry %s has no readable %s, so its compiler arguments are unknown and it is "
                    "not compiled; capture it again (re-run the warmup or parallel_trace), or remove %s",
                    entry.key, METADATA_NAME, entry.path)
    report = CompileReport()
    note("compile_reports", report)  # a warmup that raises (Ctrl-C, a trace failure) still lists what this built
    t0 = time.monotonic()
    if keys is None and not pending:
        return report
    if compile_timeout is not None:
        check_timeout(compile_timeout, "parallel_compile(compile_timeout)")  # a bad value fails before any work
    if compiler is not None:  # "auto" on either path: each entry's own compiler (its name is part of the key)
        chosen = compiler_choice(compiler, "parallel_compile(compiler)")
        compiler = None if chosen == "auto" else chosen
    base = CompilerArgs.of(base_compiler_args)
    scope = CancelScope()
    n_hint = len(pending) if keys is None else os.cpu_count() or 1  # streamed: as many as the machine runs
    # a thread per graph in flight: it compiles, or waits for the executor's worker (FARM_IN_FLIGHT at most)
    threads = workers or (default_workers(n_hint) if executor is None else FARM_IN_FLIGHT)
    pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="neuron-args-compile")
    run = _CompileRun(cache.root, pool, executor, base, compiler, compile_timeout, scope)
    with _interrupts_cancel(scope) as received:
        try:
            if keys is None:
                for key in pending:
                    run.submit(key)
            else:
                run.feed(keys)
            for graph in run.finished():
                report.graphs.append(graph)
                n, elapsed = len(report.graphs), time.monotonic() - t0
                total = len(run.futures)
                event = CompileProgress(n, total, graph, elapsed, elapsed / n * (total - n), more=run.feeding)
                if graph.used_base_args and not quiet:
                    log.warning("parallel_compile: entry %s has no recorded compiler_args (older cache); compiled "
                                "it with the base arguments %s", graph.key, base.argv)
                if not quiet:
                    log.info("parallel_compile %s", event.line())
                if progress is not None:
                    progress(event)
            if received:  # the handler's exception was dropped where it landed (a __del__, a gc callback)
                raise _Terminated() if received[0] == signal.SIGTERM else KeyboardInterrupt()
        except KeyboardInterrupt:
            received.append(0)  # from here on a further Ctrl-C or SIGTERM only cancels again
            run.cancel(report)
            raise
        except BaseException:  # a progress callback raised: nothing more starts, running compiles end
            run.stop()
            raise
        finally:
            if not received:
                pool.shutdown(wait=True)
    if run.feed_error is not None:  # the caller's key iterable raised: its error, after the compiles it fed
        raise run.feed_error

    report.seconds = round(time.monotonic() - t0, 3)
    report.graphs.sort(key=lambda g: g.key)
    if raise_on_error and report.failed:
        raise ParallelCompileError(report)
    return report


class _CompileRun:
    """The compiles of one :func:`parallel_compile` call: submitted as keys arrive, reported in completion
    order (each future puts itself on ``done``) while a feeder thread may still submit."""

    _END = object()

    def __init__(self, root: Path, pool: cf.ThreadPoolExecutor, farm: cf.Executor | None, base: list[str],
                 compiler: str | None, timeout: float | None, scope: CancelScope) -> None:
        self.root, self.pool, self.farm, self.base = root, pool, farm, base
        self.compiler, self.timeout, self.scope = compiler, timeout, scope
        self.futures: dict[cf.Future, str] = {}
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.stopped = False
        self.feed_error: BaseException | None = None
        self.feeding = False

    def submit(self, key: str) -> None:
        cache = CompileCache(self.root)
        entry = cache.entry(key)
        cache.pull(entry, entry.graph_type)  # a remote cache that holds it makes it complete: nothing to compile
        with self.lock:
            if self.stopped or key in self.futures.values():
                return
            fut = self.pool.submit(_build, str(self.root), key, self.base, self.compiler, self.timeout, self.scope,
                                   self.farm)
            self.futures[fut] = key
        fut.add_done_callback(self.done.put)

    def feed(self, keys: Iterable[str]) -> None:
        """Submit what ``keys`` yields, from a thread of its own (the iterable may block between keys)."""
        self.feeding = True

        def body() -> None:
            try:
                for key in keys:
                    if self.stopped:
                        break
                    self.submit(key)
            except BaseException as exc:  # noqa: BLE001 - raised on the calling thread once the compiles end
                self.feed_error = exc
            finally:
                self.done.put(self._END)

        threading.Thread(target=body, name="neuron-args-compile-feed", daemon=True).start()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def finished(self) -> Iterator[GraphOutcome]:
        """Each graph's report as its compile ends, until every key is submitted and every compile ended."""
        taken = 0
        while self.feeding or taken < len(self.futures):
            item = self.done.get()
            if item is self._END:
                self.feeding = False
                continue
            taken += 1
            yield item.result()

    def cancel(self, report: CompileReport) -> None:
        """After Ctrl-C: stop, cancel what is queued, kill what runs, wait (bounded) and log the outcome."""
        self.stop()
        self.scope.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)  # every future is the pool's: the queued ones cancelled
        # a cancelled future never completes (nobody notifies it): wait for the ones that started only
        done, not_done = cf.wait([f for f in self.futures if not f.cancelled()], timeout=CANCEL_GRACE_SECONDS)
        ended = {g.key: g.status for g in report.graphs}
        for fut, key in self.futures.items():
            if key not in ended:
                graph = fut.result() if fut in done and not fut.cancelled() and fut.exception() is None else None
                if graph is not None:
                    report.graphs.append(graph)  # the interrupt's compile_report: what each graph came to
                ended[key] = "cancelled" if graph is None else graph.status
        groups = [sorted(k[:12] for k, s in ended.items() if s in statuses)
                  for statuses in (("compiled", "already-complete"), ("failed",), ("cancelled",))]
        log.warning(
            "parallel_compile interrupted in %s: %d built, %d failed, %d cancelled (left pending; a rerun builds "
            "them)%s\n  built: %s\n  failed: %s\n  cancelled: %s", self.root, *map(len, groups),
            f"; {len(not_done)} compile(s) did not stop within {CANCEL_GRACE_SECONDS:g} s" if not_done else "",
            *(" ".join(keys) or "-" for keys in groups))


def _buildable(entry: CacheEntry, status: str) -> bool:
    """Pending, or crashed with its capture whole (a build killed after its metadata, before its marker)."""
    return status == "pending" or (status == "crashed" and entry.has_metadata and entry.hlo_path.is_file())


def pending_keys(cache_dir: str | os.PathLike[str]) -> list[str]:
    return [e.key for e in CompileCache(cache_dir).entries() if _buildable(e, e.status)]
