"""Build every pending (captured) entry in parallel (seed: ``parallel_compile.py``).

Each graph compiles with the ``compiler_args`` recorded in its metadata by the capture seam, so a
per-graph ``-O`` level survives the deferred build. An entry from an older cache has no recorded
arguments; it compiles with the base arguments passed in, and the report says so. One failing
graph does not stop the others; the call raises :class:`CompileError` after all finished (or,
with ``raise_on_error=False``, returns a report whose ``failed`` lists them).
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from neuron_args.cache import CompileCache
from neuron_args.errors import CompileError, NeuronArgsError
from neuron_args.flags import split_compiler_args
from neuron_args.deferred.farm import submit_graph

log = logging.getLogger("neuron_args.deferred")

WORKERS_ENV = "NEURON_ARGS_COMPILE_WORKERS"


@dataclass
class GraphCompileReport:
    key: str
    graph_type: str | None
    compiler_args: list[str]
    status: str  # "compiled" | "failed" | "already-complete"
    seconds: float = 0.0
    executable_size: int | None = None
    used_base_args: bool = False
    error: str | None = None


@dataclass
class CompileReport:
    graphs: list[GraphCompileReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[GraphCompileReport]:
        return [g for g in self.graphs if g.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "graphs": [asdict(g) for g in self.graphs]}


@dataclass(frozen=True)
class CompileProgress:
    """One finished graph: what the plugin routes to the terminal."""

    done: int
    total: int
    graph: GraphCompileReport
    elapsed: float
    remaining_estimate: float

    def line(self) -> str:
        g = self.graph
        return (f"[{self.done}/{self.total}] {g.graph_type or '-'} {g.key[:12]} {g.status} in {g.seconds:.1f}s "
                f"(elapsed {self.elapsed:.1f}s, ~{self.remaining_estimate:.0f}s left)")


def _compile_pending(root: str, key: str, base_args: list[str] | None, compiler_name: str | None) -> GraphCompileReport:
    """Worker body (module level so a process pool can run it): compile one pending entry."""
    from neuron_args.compilers import select_compiler
    from neuron_args.seams.backends import compile_entry

    cache = CompileCache(root)
    entry = cache.entry(key)
    md = entry.metadata()
    graph_type = md.get("graph_type")
    recorded = md.get("compiler_args")
    args = list(recorded) if recorded is not None else list(base_args or [])
    report = GraphCompileReport(key, graph_type, args, "compiled", used_base_args=recorded is None)
    t0 = time.monotonic()
    try:
        with cache.lock(key):
            if entry.is_complete:
                report.status = "already-complete"
                return report
            recorded_compiler = (md.get("compiler") or {}).get("name")
            compiler = select_compiler({"compiler": compiler_name or recorded_compiler})
            if recorded_compiler and compiler.info.name != recorded_compiler:
                raise CompileError(
                    f"entry {key} (graph type {graph_type!r}) was captured for compiler {recorded_compiler!r}, whose "
                    f"name is part of its key; compiling it with {compiler.info.name!r} would store a mismatched "
                    "executable. Capture again with the same compiler option.")
            compile_entry(entry, compiler, args, md.get("target") or "trn2", graph_type, md)
            entry.mark_complete()
            report.executable_size = entry.executable_path.stat().st_size
    except NeuronArgsError as exc:
        report.status, report.error = "failed", str(exc)
    except Exception as exc:  # a worker must report, not die: one graph never stops the others
        report.status, report.error = "failed", f"{type(exc).__name__}: {exc}"
    report.seconds = round(time.monotonic() - t0, 3)
    return report


def default_workers(n: int) -> int:
    env = os.environ.get(WORKERS_ENV)
    return max(1, int(env)) if env else max(1, min(os.cpu_count() or 1, n))


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
) -> CompileReport:
    """Compile every pending entry under ``cache_dir`` with its recorded arguments.

    ``executor`` may be any ``concurrent.futures.Executor`` (a cluster executor too); the default
    is a process pool of ``workers`` (``$NEURON_ARGS_COMPILE_WORKERS``, else the CPU count).
    """
    cache = CompileCache(cache_dir)
    pending = [e.key for e in cache.entries() if e.status == "pending"]
    report = CompileReport()
    t0 = time.monotonic()
    if not pending:
        return report
    base = split_compiler_args(base_compiler_args)
    own = executor is None
    # fork is safe here: workers never touch jax, they run the compiler as a subprocess
    pool = executor or cf.ProcessPoolExecutor(max_workers=workers or default_workers(len(pending)),
                                              mp_context=mp.get_context("fork"))
    try:
        with warnings.catch_warnings():
            # Python warns on any fork once jax's threads exist; these workers never call jax
            warnings.filterwarnings("ignore", message=r".*os\.fork\(\) was called", category=RuntimeWarning)
            # inputs shipped, results shipped back: workers need not see the cache folder (deferred/farm.py)
            futures = [submit_graph(pool, cache.root, key, base, compiler, timeout=compile_timeout) for key in pending]
        for n, fut in enumerate(cf.as_completed(futures), start=1):
            graph = fut.result()
            report.graphs.append(graph)
            elapsed = time.monotonic() - t0
            event = CompileProgress(n, len(pending), graph, elapsed, elapsed / n * (len(pending) - n))
            if graph.used_base_args and not quiet:
                log.warning("parallel_compile: entry %s has no recorded compiler_args (older cache); compiled it "
                            "with the base arguments %s", graph.key, base)
            if not quiet:
                log.info("parallel_compile %s", event.line())
            if progress is not None:
                progress(event)
    finally:
        if own:
            pool.shutdown(wait=True)
    report.seconds = round(time.monotonic() - t0, 3)
    report.graphs.sort(key=lambda g: g.key)
    if raise_on_error and report.failed:
        err = CompileError(f"parallel_compile: {len(report.failed)} of {len(report.graphs)} graphs failed:\n" + "\n".join(
            f"  {g.graph_type!r} {g.key}: {g.error}" for g in report.failed))
        err.report = report  # type: ignore[attr-defined]
        raise err
    return report


def pending_keys(cache_dir: str | os.PathLike[str]) -> list[str]:
    return [e.key for e in CompileCache(Path(cache_dir)).entries() if e.status == "pending"]
