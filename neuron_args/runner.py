"""A model runner: the design's ``load_model`` wiring, warmup in either flow, and a serve context.

Every compile site resolves a graph type's arguments through one :class:`CompilerArgsResolver`, so both flows give
the same cache key."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import linecache
import logging
import os
import queue
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from neuron_args import eager_fallback
from neuron_args.activity import ACTIVITY, Tally, commit, tally
from neuron_args.cache import CacheStats, CompileCache, cache_root
from neuron_args.compilers.base import on_compile_start
from neuron_args.deferred import FLOWS, CompileProgress, build_trace_job, parallel_compile, parallel_trace
from neuron_args.deferred.parallel_compile import CompileReport, ParallelCompileError, pending_keys
from neuron_args.deferred.parallel_trace import recorded_complete
from neuron_args.deferred.trace_record import TraceRecord, fingerprint
from neuron_args.errors import NeuronArgsError
from neuron_args.fastpath import MISS, FastPath
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.graphs import GraphSpec, bucket_kwargs, declared_graphs
from neuron_args.manifest.config import build_config
from neuron_args.manifest.engine import get_server_prefix, manifest_root
from neuron_args.manifest.folder_lock import hold_engine
from neuron_args.manifest.ledger import register_tp_group
from neuron_args.scope import CompilerArgsResolver, current_graph_type, scoped_compiler_args
from neuron_args.seams import records
from neuron_args.flags import optimization_level
from neuron_args.seams.backends import CAPTURE_SEAM, COMPILE_SEAM
from neuron_args.settings import CompileSettings, base_compiler_args, check_timeout
from neuron_args.target import given_or_default

log = logging.getLogger("neuron_args.runner")

ALLOW_BREAKS_HINT = ("remove the break, or allow graph breaks where you want them: NeuronRunner(fullgraph=False), "
                     "@pytest.mark.neuron_allow_graph_breaks or --neuron-allow-graph-breaks")


class GraphBreakError(NeuronArgsError):
    """Dynamo split a graph type's forward into several graphs (Neuron serves whole graphs); ``graph_type`` is the
    graph type whose warmup fails (the pytest plugin names it)."""

    def __init__(self, message: str, graph_type: str | None = None) -> None:
        super().__init__(message)
        self.graph_type = graph_type


class UndeclaredGraphError(NeuronArgsError):
    """A call while serving matched none of the model's declared buckets (it would run eagerly)."""


#: ``ACTIVITY.reused``, each counted as its first warmup was (``neuron_compile_counter`` adds them, naming them)
REUSED: list[GraphOutcome] = ACTIVITY.reused


@dataclass
class WarmupReport:
    flow: str
    graph_types: list[str]
    seconds: float
    counts: CacheStats
    compile_report: Any = None
    manifest_path: Any = None
    deferred_counts: CacheStats = field(default_factory=CacheStats)  # the part trace children and compile workers did
    graphs: list[GraphOutcome] = field(default_factory=list)  # every graph of the chosen graph types (bucket, how)
    reused: list[str] = field(default_factory=list)  # graph types warmed before by this runner
    traced: list[Any] = field(default_factory=list)  # the parallel flow's TraceResults ("loaded": no child)

    @property
    def keys(self) -> list[str]:
        return sorted({g.key for g in self.graphs})


@dataclass(frozen=True)
class WarmupProgress:
    """One in-process warmup step: ``compiling`` as its compiler starts, else ``loaded`` (the cache held it) or
    ``captured`` (a pending entry for ``parallel_compile``) once the bucket ran."""

    done: int
    total: int
    graph_type: str
    bucket: str
    how: str = "compiling"

    def line(self) -> str:
        where = f"{self.graph_type} {self.bucket} ({self.done}/{self.total})"
        return {"loaded": f"loaded {where} from the cache", "captured": f"captured {where} for parallel_compile",
                "compiling": f"compiling {where}\u2026"}[self.how]


@dataclass
class ServeSession:
    counts: CacheStats = field(default_factory=CacheStats)
    calls: dict[str, int] = field(default_factory=dict)
    undeclared: list[str] = field(default_factory=list)  # calls that matched no declared bucket


_RUNNER_IDS = itertools.count(1)


class ServedForward:
    """An entry module's ``forward`` while it belongs to a runner: eager outside ``serve()``, routed inside.
    Installed before the module is compiled (Dynamo's guards never see it change); an object, so it pickles."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runner = None if torch.compiler.is_compiling() else ACTIVITY.serving
        if runner is None or eager_fallback.IN_RUNNER_CALL.get() or all(spec.entry is not self.module
                                                                          for spec in runner.graphs.values()):
            # traced, not serving, a runner's own call, or a module it does not hold (a deepcopy kept as eager copy)
            return type(self.module).forward(self.module, *args, **kwargs)
        return runner._served_call(self.module, args, kwargs)


def _tensor_signature(kwargs: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple(sorted((name, tuple(v.shape), str(v.dtype)) for name, v in kwargs.items()
                        if isinstance(v, torch.Tensor)))


#: one trace at a time in this process, with its record bookkeeping (a streamed parallel warmup traces on two threads)
_TRACING = threading.RLock()


class NeuronRunner:
    """Compile, warm up and serve a model's declared graphs with per-graph compiler arguments."""

    def __init__(
        self,
        model: Any,
        *,
        graphs: Sequence[GraphSpec] | None = None,
        compiler_args: str | Sequence[str] | None = None,
        target: str | None = None,
        compiler: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        optimization_level: int | None = None,
        backend: str = COMPILE_SEAM,
        manifest_config: Mapping[str, Any] | None = None,
        local_rank: int = 0,
        tp_group: tuple[Sequence[int], int] | None = None,
        fullgraph: bool = True,
        compile_timeout: float | None = None,
        allow_eager_outputs: bool | None = None,
    ) -> None:
        self.model = model
        declared = list(graphs) if graphs is not None else declared_graphs(model)
        self.graphs: dict[str, GraphSpec] = {g.graph_type: g for g in declared}
        target = given_or_default(target, "NeuronRunner(target=...)")  # a bad target fails here, before any compile
        base = base_compiler_args(compiler_args, source="NeuronRunner(compiler_args=...)")  # a bad list fails here
        # the design's load_model: base args at the caller level; the policy only without an explicit level
        self.resolver = CompilerArgsResolver.from_model(model, base, explicit_optimization_level=optimization_level)
        self.cache_dir = cache_root(cache_dir)
        timeout = None if compile_timeout is None else check_timeout(compile_timeout, "NeuronRunner compile_timeout")
        self.settings = CompileSettings(
            compiler_args=self.resolver.base_args, target=target, cache_dir=str(self.cache_dir),
            compiler=compiler, compile_timeout=timeout,
            # None: $NEURON_ARGS_ALLOW_EAGER_OUTPUTS (neuron_args.executables)
            allow_eager_outputs=None if allow_eager_outputs is None else bool(allow_eager_outputs),
            # Dynamo shares compiled frames between torch.compile calls with equal options (and so another
            # runner's graphs, its variants and records); a runner of its own traces its own graphs
            runner=f"{os.getpid():x}-{next(_RUNNER_IDS)}")
        #: what the runner's torch.compile calls get (each backend call turns them back into settings)
        self.options: dict[str, Any] = self.settings.as_options()
        self.backend = backend
        self.fullgraph = fullgraph
        self.manifest_config = dict(manifest_config or {})
        self.local_rank = local_rank
        #: ``warmup()`` writes the engine's manifest unless told otherwise (the pytest plugin emits once per session)
        self.emit_manifests = True
        #: who is warming up now, recorded on each graph's first warmup (the pytest plugin sets the test id)
        self.origin: str | None = None
        self.warmed: dict[str, list[GraphOutcome]] = {}
        self._manifest_hold: Any = None  # the manifest folder this job holds from its first warmup to its emit
        if tp_group is not None:
            register_tp_group(*tp_group)
        self._compiled: dict[int, Any] = {}
        #: the open ``serve()`` block's session (calls per graph type so far), else None
        self.serving: ServeSession | None = None
        self._bucket_signatures: dict[int, list[tuple[str, str, tuple[Any, ...]]]] = {}
        for spec in declared:  # calls routed while serving; an entry with its own per-instance forward is left alone
            if "forward" not in spec.entry.__dict__:
                spec.entry.forward = ServedForward(spec.entry)  # type: ignore[method-assign]
        self.fast_path = FastPath()

    # -- the compile sites -----------------------------------------------------------------------
    @property
    def cache(self) -> CompileCache:
        return CompileCache(self.cache_dir)

    def spec(self, graph_type: str) -> GraphSpec:
        try:
            return self.graphs[graph_type]
        except KeyError:
            raise NeuronArgsError(
                f"graph type {graph_type!r} is not declared by {type(self.model).__name__}; "
                f"declared: {sorted(self.graphs)}") from None

    def compiled(self, graph_type: str) -> Any:
        """The one torch.compile of this graph type's entry module (shared by graph types on one entry)."""
        entry = self.spec(graph_type).entry
        fn = self._compiled.get(id(entry))
        if fn is None:
            fn = self._compiled[id(entry)] = torch.compile(entry, backend=self.backend, options=self.options,
                                                            dynamic=False, fullgraph=self.fullgraph)
        return fn

    def scope(self, graph_type: str | None) -> contextlib.AbstractContextManager[None]:
        """The in-process compile site: ``scoped_compiler_args(resolve_graph_compiler_args(graph_type))``."""
        return scoped_compiler_args(self.resolver.args_for(graph_type), graph_type=graph_type)

    def run(self, graph_type: str, kwargs: Mapping[str, Any]) -> Any:
        """Run one graph under its resolved scope (the signature example models' ``generate`` takes)."""
        if self.serving is not None:
            self.serving.calls[graph_type] = self.serving.calls.get(graph_type, 0) + 1
        out = self.fast_path.call(graph_type, kwargs)  # a warmed call: guards, then its variant
        if out is not MISS:
            return out
        fn = self.compiled(graph_type)
        try:
            with self.scope(graph_type), torch.inference_mode(), eager_fallback.runner_call():
                return self.fast_path.record(graph_type, fn, self.spec(graph_type).entry, kwargs)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:
            # UserError: a Python branch on a data-dependent size ("Could not guard on data-dependent expression")
            if not self.fullgraph or not getattr(exc, "real_stack", None) and not isinstance(
                    exc, torch._dynamo.exc.Unsupported):
                raise
            raise GraphBreakError(graph_break_message(graph_type, exc), graph_type=graph_type) from None
        except torch._dynamo.exc.InternalTorchDynamoError as exc:  # Dynamo's own failure: say where, and what to try
            raise GraphBreakError(dynamo_failure_message(graph_type, exc), graph_type=graph_type) from exc

    # -- warmup ------------------------------------------------------------------------------------
    @staticmethod
    def _example(make: Any, graph_type: str = "?", bucket: str = "?") -> dict[str, Any]:
        """Example inputs made as serving makes them (inference tensors), so Dynamo's guards match at serve."""
        with torch.inference_mode():
            return bucket_kwargs(graph_type, bucket, make())

    def warmup(
        self,
        graph_types: Iterable[str] | None = None,
        flow: str = "in-process",
        *,
        progress: Callable[[Any], None] | None = None,
        trace_timeout: float | None = None,
        emit: bool | None = None,
    ) -> WarmupReport:
        """Compile every bucket of the chosen graph types, in-process or through the deferred flow; a graph type warmed
        before is not traced again (its first warmup's graphs are reported, into :data:`REUSED`). ``emit`` defaults to
        ``self.emit_manifests``."""
        if flow not in FLOWS:
            raise ValueError(f"flow must be one of {FLOWS}, got {flow!r}")
        chosen = list(self.graphs) if graph_types is None else [self.spec(g).graph_type for g in graph_types]
        todo = [g for g in chosen if g not in self.warmed]
        reused = [g for g in chosen if g in self.warmed]
        t0 = time.monotonic()
        warm = self._warmup_in_process if flow == "in-process" else functools.partial(
            self._warmup_parallel, trace_timeout=trace_timeout)
        first = self._manifest_hold is None
        self._hold_manifest_folder()
        try:
            # a warmup compiles (as the parallel flow's capture and compiles do): $NEURON_LIBTORCH_ASSERT_CACHE_HIT
            # asserts after it, and a conftest or CI job that exports it must not fail the warmup
            with tally(assert_hit=False) as here:
                compile_report, deferred, traced = warm(todo, progress) if todo else (None, CacheStats(), [])
        except BaseException:  # a job whose first warmup failed emits nothing: another job of the engine goes on
            if first:
                self._release_manifest_folder()
            raise
        counts = CacheStats(**here.counts.snapshot())
        counts.add(deferred.snapshot())
        for g in reused:
            REUSED.extend(self.warmed[g])
        graphs = [w for g in chosen for w in self.warmed.get(g, [])]
        report = WarmupReport(flow, chosen, round(time.monotonic() - t0, 3), counts, compile_report,
                              graphs=graphs, reused=reused, traced=traced, deferred_counts=deferred)
        if self.emit_manifests if emit is None else emit:
            report.manifest_path = self.emit_manifest()
        return report

    def _warmup_in_process(self, graph_types: list[str], progress: Callable[[Any], None] | None
                           ) -> tuple[None, CacheStats, list[Any]]:
        """Run each bucket here; what it built counts in the warmup's tally (no compile report, nothing deferred)."""
        prestart_compile_worker(self.settings, unless_warm=True)  # it starts while the first graph is traced
        total = sum(len(self.spec(g).buckets) for g in graph_types)
        done = 0
        resolved: dict[str, tuple[str, list[str]]] = {}  # trace record: job fingerprint -> keys
        for g in graph_types:
            warmed: list[GraphOutcome] = []
            for bucket, make in self.spec(g).buckets.items():
                done += 1
                kwargs = self._example(make, g, bucket)
                started: list[str] = []  # the keys whose compile this bucket started

                def starting(_graph_type: str | None, key: str) -> None:  # called inside this bucket's run only
                    if progress is not None and not started:
                        progress(WarmupProgress(done, total, g, bucket))
                    started.append(key)

                with on_compile_start(starting), tally() as bucket_tally:
                    self.run(g, kwargs)
                touched = self._touched(g, bucket, bucket_tally)
                if progress is not None and not started and touched:
                    how = "captured" if any(w.how == "captured" for w in touched) else "loaded"
                    progress(WarmupProgress(done, total, g, bucket, how))
                warmed += touched
                resolved[fingerprint(self._job(g, kwargs), self.settings)] = (
                    g, [w.key for w in touched])
            self.warmed[g] = warmed
        if self.backend == COMPILE_SEAM:  # the capture seam's keys: a parallel warmup of this cache starts no child
            TraceRecord(self.cache_dir).note(resolved)
        return None, CacheStats(), []

    def _job(self, graph_type: str, kwargs: dict[str, Any]) -> Any:
        """One bucket's trace job, traced in inference mode: the mode :meth:`run` serves in (its keys are serve's)."""
        return build_trace_job(self.resolver, self.spec(graph_type).entry, kwargs, graph_type, "inference_mode")

    def _touched(self, graph_type: str, bucket: str, run: Tally) -> list[GraphOutcome]:
        """The graphs one bucket's run built, loaded or captured (several under an allowed graph break)."""
        done: dict[str, GraphOutcome] = {}
        counts = run.counts.snapshot()
        for event in run.outcomes:
            done[event.key] = done[event.key].merged(event) if event.key in done else event
        out = []
        for key, d in done.items():
            rec = records.RECORDS.get(key)
            if rec is None or not (d.compiles or d.captures or d.loads):  # nothing, or records cleared (ACTIVITY.reset)
                continue
            how = "compiled" if d.compiles else "captured" if d.captures else "loaded"
            out.append(replace(rec, graph_type=graph_type, bucket=bucket, how=how, counts=counts, origin=self.origin))
        return out

    def _warmup_parallel(self, graph_types: list[str], progress: Callable[[Any], None] | None, *,
                         trace_timeout: float | None) -> tuple[Any, CacheStats, list[Any]]:
        buckets = [(g, b, self._example(make, g, b)) for g in graph_types for b, make in self.spec(g).buckets.items()]
        jobs = [self._job(g, kwargs) for g, _, kwargs in buckets]
        ahead = _ServeAhead(self, jobs, [b for _, b, _ in buckets], progress) if self.backend == COMPILE_SEAM else None
        trace = functools.partial(parallel_trace, jobs, options=self.options, timeout=trace_timeout,
                                  before_children=lambda: prestart_compile_worker(self.settings),
                                  in_process=None if ahead is None else ahead.here, keep_children=True)
        compile_ = functools.partial(parallel_compile, self.cache_dir, base_compiler_args=self.resolver.base_args,
                                     compiler=self.settings.compiler, raise_on_error=False,
                                     progress=progress if ahead is None else ahead.built)
        if ahead is not None and not all(recorded_complete(jobs, self.settings)):
            traced, compile_report = self._trace_and_compile(trace, compile_, ahead)
        else:  # a warm cache (each job traced here, no child) or a seam of the caller's: one step after the other
            traced = trace(on_result=None if ahead is None else ahead.captured)
            compile_report = compile_()
        compile_report = _own_failures_raised(compile_report, {k for t in traced for k in t.keys})
        if ahead is not None:
            ahead.settle()
            if ahead.graph_breaks:  # the graphs are built; the graph type is not one graph
                raise ahead.graph_breaks[0]
        here = {} if ahead is None else ahead.loaded
        skip = {w.key for ws in here.values() for w in ws}  # traced here: counted in the warmup's tally already
        built = {g.key: g for g in compile_report.graphs if g.status == "compiled"}
        deferred = {key: self._deferred_outcome(key, built.get(key), record=key not in skip)
                    for key in sorted({k for t in traced if t.status != "loaded" for k in t.keys})}
        for i, ((g, bucket, _), result) in enumerate(zip(buckets, traced)):
            if result.status == "loaded":
                self.warmed.setdefault(g, []).extend(here[i])
                continue
            for key in result.keys:
                c = deferred[key].compiles
                self.warmed.setdefault(g, []).append(replace(
                    deferred[key], graph_type=g, bucket=bucket, how="compiled" if c else "loaded",
                    counts={"hits": 1 - c, "misses": c, "compiles": c, "captures": c}, origin=self.origin))
        # what the trace children and compile workers did; ``built`` may hold other pending entries of the cache
        counts = CacheStats(hits=len(deferred.keys() - skip - built.keys()), misses=len(built), compiles=len(built),
                            captures=len(built))
        return compile_report, counts, traced

    def _trace_and_compile(self, trace: Callable[..., list[Any]], compile_: Callable[..., Any],
                           ahead: _ServeAhead) -> tuple[list[Any], Any]:
        """Trace in children on a thread of its own while ``parallel_compile`` here builds each capture as its
        child reports it (then every other pending entry); a trace failure is raised after the compiles."""
        keys = ahead.queue = queue.SimpleQueue()
        cancel, box = threading.Event(), {}

        def run_trace() -> None:
            try:
                box["traced"] = trace(on_result=ahead.captured, cancel=cancel)
            except BaseException as exc:  # noqa: BLE001 - raised on the warmup's thread below
                box["error"] = exc
            finally:
                keys.put(None)

        def streamed() -> Iterator[str]:
            while (key := keys.get()) is not None:
                yield key
            yield from pending_keys(self.cache_dir)  # what else the scan of the cache would build (repeats skipped)

        # in the warmup's context: the jobs it traces here count into the warmup's tally
        thread = threading.Thread(target=contextvars.copy_context().run, args=(run_trace,), name="neuron-args-trace",
                                  daemon=True)
        thread.start()
        try:
            compile_report = compile_(keys=streamed())
        except Exception as exc:  # the trace's own error (if any) comes first, as when the compile followed it
            thread.join()
            if "error" in box:
                raise box["error"] from exc
            raise
        except BaseException:  # Ctrl-C: no trace child outlives the warmup
            cancel.set()
            thread.join(30)
            raise
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["traced"], compile_report

    def _run_asserting_hit(self, job: Any) -> Tally:
        """Run a trace job's graph here under the hit assertion; its counts are held, for the caller to pass on or
        not (a miss, or any failure, counts nowhere: the job is then traced in a child, which counts it)."""
        with tally(assert_hit=True, held=True) as probe:
            self.run(job.graph_type, job[1])
        return probe

    def _deferred_outcome(self, key: str, built: GraphOutcome | None, record: bool) -> GraphOutcome:
        """A graph a trace child and a compile worker handled (``built``: its compile), from its entry; ``record``:
        as this process's record too."""
        entry = self.cache.entry(key)
        md = entry.info()
        args = list(md.compiler_args or [])
        outcome = GraphOutcome(
            key=key, seam=md.seam or CAPTURE_SEAM, graph_type=md.graph_type, input_shapes=list(md.input_shapes or []),
            compiler_args=args, optimization_level=optimization_level(args), target=md.target or self.settings.target,
            compiles=int(built is not None), captures=int(built is not None),
            loads=int(built is None and entry.is_complete), compile_seconds=built.compile_seconds if built else None,
            executable_size=entry.executable_path.stat().st_size if entry.is_complete else None)
        return records.record(outcome) if record else outcome

    # -- serve ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def serve(self, assert_cache_hit: bool = True) -> Iterator[ServeSession]:
        """Serve, counting cache activity; inside, a cache miss raises :class:`CacheMissError`
        (``assert_cache_hit=False``: as ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` says); an entry call matching no bucket
        :class:`UndeclaredGraphError`."""
        session = ServeSession()
        self.serving = session
        was = ACTIVITY.serving, ACTIVITY.assert_hit
        ACTIVITY.serving = self
        if assert_cache_hit:
            ACTIVITY.assert_hit = True
        try:
            with tally() as served:
                yield session
        finally:
            ACTIVITY.serving, ACTIVITY.assert_hit = was
            self.serving = None
            session.counts = served.counts

    def _signatures(self, module: torch.nn.Module) -> list[tuple[str, str, tuple[Any, ...]]]:
        """``(graph_type, bucket, tensor signature)`` of every declared bucket running through ``module``."""
        found = self._bucket_signatures.get(id(module))
        if found is None:
            found = self._bucket_signatures[id(module)] = [
                (spec.graph_type, bucket, _tensor_signature(self._example(make, spec.graph_type, bucket)))
                for spec in self.graphs.values() if spec.entry is module for bucket, make in spec.buckets.items()]
        return found

    def _served_call(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A direct call of an entry module while serving: run it as the declared graph it matches."""
        sig = inspect.signature(type(module).forward)
        bound = sig.bind(module, *args, **kwargs)
        call: dict[str, Any] = {}
        for name, value in list(bound.arguments.items())[1:]:  # [0] is the module itself
            kind = sig.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                call.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise UndeclaredGraphError(
                        f"{type(module).__name__} called while serving with extra positional arguments (*{name}); "
                        "the runner runs graphs with keyword arguments: use run(graph_type, kwargs)")
            else:
                call[name] = value
        signature = _tensor_signature(call)
        types = list(dict.fromkeys(g for g, _, sig in self._signatures(module) if sig == signature))
        if (label := current_graph_type()) in types:
            types = [label]
        if len(types) == 1:
            return self.run(types[0], call)
        shapes = ", ".join(f"{n}={list(s)}" for n, s, _ in signature) or "no tensors"
        declared = "; ".join(f"{g} {b}: " + (", ".join(f"{n}={list(s)}" for n, s, _ in sig) or "-")
                             for g, b, sig in self._signatures(module)) or "(none)"
        what = (f"matches buckets of several graph types ({', '.join(types)}); run it with run(graph_type, kwargs) "
                "or inside scoped_compiler_args(..., graph_type=...)") if types else (
            "matches no declared bucket, so it would run eagerly (Neuron would compile it at serve time); declare "
            "its shape as a bucket in neuron_graphs(), or call it outside serve()")
        message = (f"{type(module).__name__} called while serving with {shapes}: the call {what}. "
                   f"Declared buckets of this entry: {declared}")
        for g, b, sig in [] if types else self._signatures(module):  # shapes alone would read as a match
            if [(n, s) for n, s, _ in sig] == [(n, s) for n, s, _ in signature]:
                casts = ", ".join(f"{n} is {d}, declared {want}"
                                  for (n, _, d), (_, _, want) in zip(signature, sig) if d != want)
                message += f". The shapes match {g} {b} but not the dtypes ({casts}): cast the inputs to them"
                break
        if self.serving is not None:
            self.serving.undeclared.append(message)
        raise UndeclaredGraphError(message)

    # -- manifest ------------------------------------------------------------------------------------
    def emit_manifest(self) -> Any:
        """Write this engine's manifest when ``VLLM_NEURON_MANIFEST_DIR`` is set (local rank 0 only); then another
        job of this engine waiting for the manifest folder goes on."""
        from neuron_args.manifest.emit import emit_manifest  # here, not at the top: it is named as this method

        try:
            if manifest_root() is None:
                return None
            return emit_manifest(cache_dir=self.cache_dir, config=self.manifest_config_block(),
                                 local_rank=self.local_rank)
        finally:
            self._release_manifest_folder()

    def _release_manifest_folder(self) -> None:
        hold, self._manifest_hold = self._manifest_hold, None
        if hold is not None:
            hold.release()

    def _hold_manifest_folder(self) -> None:
        """Hold the engine's manifest folder from the first warmup to the emit, so a second job of the engine
        waits instead of losing its ledger lines to this one's emit."""
        root = manifest_root()
        if self._manifest_hold is not None or root is None or not self.emit_manifests or self.local_rank != 0:
            return
        try:
            self._manifest_hold = hold_engine(root, get_server_prefix())
        except (OSError, ValueError) as exc:  # the manifest never breaks warmup: its emit says what went wrong
            log.warning("manifest folder %s could not be held for this job (%s: %s); a second job emitting there at "
                        "once could lose this one's graphs", root, type(exc).__name__, exc)
            return
        weakref.finalize(self, self._manifest_hold.release)

    def manifest_config_block(self) -> dict[str, Any] | None:
        """The manifest's ``config`` block for this runner (None, with a warning, when it cannot be built)."""
        cfg = dict(self.manifest_config)
        try:
            return build_config(
                model=cfg.pop("model", type(self.model).__name__), target=self.settings.target,
                **{k: cfg.pop(k, None) for k in ("dtype", "max_num_seqs", "max_model_len", "topology")},
                neuron_config={"cache_dir": str(self.cache_dir), "compiler_args": self.resolver.base_args.argv,
                               "per_graph": self.resolver.per_graph,
                               "explicit_optimization_level": self.resolver.explicit_optimization_level,
                               "graph_types": {r.key: r.graph_type for r in records.records()
                                               if self.cache.entry(r.key).path.is_dir()},
                               **cfg.pop("neuron_config", {})},
                vllm_config=cfg.pop("runner_config", cfg or None),
            )
        except Exception as exc:  # the manifest never breaks warmup
            log.warning("manifest config could not be built (%s: %s); emitting without it", type(exc).__name__, exc)
            return None


class _ServeAhead:
    """Serving's own trace of each job, taken as soon as its keys are built, so it overlaps the compiles still
    running instead of following them; a job whose trace fails or misses here is left to serving."""

    def __init__(self, runner: NeuronRunner, jobs: list[Any], buckets: list[str],
                 progress: Callable[[Any], None] | None) -> None:
        self.runner, self.jobs, self.buckets, self.progress = runner, jobs, buckets, progress
        self.index = {id(job): i for i, job in enumerate(jobs)}
        self.loaded: dict[int, list[GraphOutcome]] = {}  # jobs traced here (their entries were complete): their graphs
        self.waiting: dict[int, set[str]] = {}  # captured jobs whose keys are not all built yet
        self.done: set[str] = set()
        self.graph_breaks: list[GraphBreakError] = []  # under fullgraph: the warmup fails, as in-process
        self.lock = threading.Lock()  # ``captured`` comes from the trace's thread when streaming
        self.queue: queue.SimpleQueue[str | None] | None = None  # streaming: pending keys for ``parallel_compile``

    def captured(self, i: int, result: Any) -> None:
        """Job ``i``'s ``parallel_trace`` result: a captured job waits for its keys (streaming: pending ones queued)."""
        if result.status == "captured" and result.keys:
            with self.lock:
                self.waiting[i] = set(result.keys)
            for key in result.keys if self.queue is not None else ():
                if self.runner.cache.entry(key).status == "pending":
                    self.queue.put(key)

    def built(self, event: Any) -> None:
        """``parallel_compile``'s progress callback: pass the event on, then trace the jobs it completed."""
        if self.progress is not None:
            self.progress(event)
        if event.graph.status not in ("compiled", "already-complete"):
            return
        with self.lock:
            self.done.add(event.graph.key)
        self._trace_ready(lambda keys: keys <= self.done)

    def here(self, job: Any) -> list[str]:
        """``parallel_trace``'s ``in_process``: a job the trace record lists complete, run here asserting a hit (a
        ``CacheMissError`` counts nowhere: the job goes to a child, which counts it). A graph break fails the warmup
        as the same GraphBreakError a child's capture gets (after the compiles), not as a trace failure."""
        i = self.index[id(job)]
        try:
            with _TRACING:  # one trace at a time (the serve-ahead trace may run on another thread)
                probe = self.runner._run_asserting_hit(job)
                commit(probe.counts)  # the warmup's: it loaded these graphs
                self.loaded[i] = self.runner._touched(job.graph_type, self.buckets[i], probe)
        except GraphBreakError as exc:
            self.graph_breaks.append(exc)
            return []
        return [w.key for w in self.loaded[i]]

    def settle(self) -> None:
        """After the compiles: trace the captured jobs whose entries were complete already (no compile here
        reported them); only this fullgraph trace shows their graph breaks."""
        self._trace_ready(lambda keys: all(self.runner.cache.entry(k).is_complete for k in keys))

    def _trace_ready(self, ready: Callable[[set[str]], bool]) -> None:
        """Serving's own trace of each waiting job whose keys are ``ready`` (once: it stops waiting first), taken
        early: its counts are not the warmup's (held, never passed on)."""
        with self.lock:
            jobs = [i for i, keys in self.waiting.items() if ready(keys)]
            for i in jobs:
                del self.waiting[i]
        for job in (self.jobs[i] for i in jobs):
            with _TRACING:
                try:
                    self.runner._run_asserting_hit(job)
                except GraphBreakError as exc:  # the children capture without fullgraph: the break shows here
                    self.graph_breaks.append(exc)
                except Exception as exc:  # noqa: BLE001 - serving traces it again and raises there
                    log.debug("graph type %r: not traced ahead of serving (%s: %s)", job.graph_type,
                              type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


def _own_failures_raised(report: Any, own: set[str]) -> Any:
    """A warmup fails for its own graphs' compiles only: the other pending entries it builds as the scan of the cache
    would (an earlier interrupted session's, another model's on a shared cache) are logged when they fail."""
    for g in report.failed:
        if g.key not in own:
            log.warning("parallel warmup: pending entry %s (graph type %r) of the cache, not one of this warmup's graphs, "
                        "did not compile (it stays pending; `neuron-args cache ls` shows it, removing its folder drops "
                        "it): %s", g.key, g.graph_type, (str(g.error or "").splitlines() or ["failed"])[0])
    if any(g.key in own for g in report.failed):
        raise ParallelCompileError(CompileReport(graphs=[g for g in report.graphs if g.status != "failed"
                                                         or g.key in own], seconds=report.seconds))
    return report


def prestart_compile_worker(settings: CompileSettings, *, unless_warm: bool = False) -> None:
    """Start one warm local-compiler worker now, without waiting, so the first compile finds it ready (none for
    neuronx-cc, an unknown compiler, ``NEURON_ARGS_WARM_WORKERS=0``, or ``unless_warm`` and a warm trace record)."""
    from neuron_args.compilers import select_compiler, workers
    from neuron_args.compilers.local import LocalCompiler

    if not workers.enabled() or unless_warm and TraceRecord(cache_root(settings.cache_dir)).all_complete():
        return
    with contextlib.suppress(NeuronArgsError):
        if isinstance(select_compiler(settings.compiler), LocalCompiler):
            workers.shared_pool().prestart(1, wait=False)


def graph_break_message(graph_type: str, exc: BaseException) -> str:
    """What a graph break under ``fullgraph`` says: graph type, Dynamo's reason, the user's file:line, the fix."""
    reason = getattr(exc, "gb_type", None) or str(exc).strip().splitlines()[0]
    detail = str(getattr(exc, "msg", "") or "").strip()
    explanation = next((line.strip() for line in detail.splitlines() if line.strip().startswith("Explanation:")), "")
    stack = getattr(exc, "real_stack", None) or []
    frame = stack[-1] if stack else None
    where = f"{frame.filename}:{frame.lineno} (in {frame.name})" if frame is not None else "an unknown line"
    text = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)) if frame is not None else ""
    line = f"\n    {text.strip()}" if text and text.strip() else ""
    if isinstance(exc.__cause__, torch._dynamo.exc.ObservedException):  # the model's own raise, not a break
        return (f"graph type {graph_type!r}: the model raised while it was traced, at {where}:{line}\n  "
                f"{exc.__cause__}\n  This is an error of the model's forward for these inputs, not a graph break "
                "(allowing graph breaks would not help). Fix: call the entry module eagerly with the bucket's inputs "
                "to debug it (torch.compiler.set_stance('force_eager')).")
    return (f"graph break in graph type {graph_type!r} at {where}:{line}\n  Dynamo's reason: {reason}"
            + (f" ({explanation})" if explanation else "")
            + "\n  Neuron serves whole graphs: this graph type would become several graphs (and several compiles). "
            f"Fix: {ALLOW_BREAKS_HINT}.")


def dynamo_failure_message(graph_type: str, exc: BaseException) -> str:
    """What an internal Dynamo error says: the graph type, the user's last frame, Dynamo's words, the usual cause."""
    text = str(exc)
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)', text.split("from user code:", 1)[-1]) \
        if "from user code:" in text else []
    where = "an unknown line"
    if frames:
        file, line, name, code = frames[-1]
        where = f"{file}:{line} (in {name}):\n    {code.strip()}"
    return (f"graph type {graph_type!r} cannot be traced as one graph: Dynamo failed at {where}\n  Dynamo's error: "
            f"{text.strip().splitlines()[0] if text.strip() else type(exc).__name__}\n  Dynamo fails here by itself "
            "(torch.compile(entry, backend='eager', fullgraph=True) fails the same way), most often on a size computed "
            "from a tensor's value (torch.arange(n, n + length) with n read from a tensor, such as a cache's filled "
            "length). Fix: compute sizes from shapes and pass positions as tensors (transformers' cache_position and "
            "position_ids), or run this part of the model eagerly.")


__all__ = ["CompileProgress", "GraphBreakError", "NeuronRunner", "REUSED", "ServeSession", "UndeclaredGraphError",
           "WarmupProgress", "WarmupReport", "graph_break_message"]
