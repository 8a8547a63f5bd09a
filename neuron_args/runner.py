"""A model runner: the seed's ``load_model`` wiring, warmup in either flow, and a serve context.

The runner owns one torch.compile per entry module per backend, resolves each graph type's
arguments through :class:`CompilerArgsResolver` at every compile site (warmup, serve, trace job),
and so gives the same cache key in both flows.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_args.cache import ASSERT_CACHE_HIT_ENV, STATS, CacheStats, CompileCache, cache_root
from neuron_args.deferred import CompileProgress, build_trace_job, parallel_compile, parallel_trace
from neuron_args.errors import NeuronArgsError
from neuron_args.graphs import GraphSpec
from neuron_args.resolver import CompilerArgsResolver
from neuron_args.scope import scoped_compiler_args
from neuron_args.seams import records
from neuron_args.flags import optimization_level
from neuron_args.seams.backends import CAPTURE_SEAM, COMPILE_SEAM
from neuron_args.seams.platform import base_compiler_args

log = logging.getLogger("neuron_args.runner")

FLOWS = ("in-process", "parallel")
# Every bucket is a static graph, so one entry recompiles once per shape; Dynamo's default limit (8 per
# code object, shared by every torch.compile of the same class in a process) would silently fall back to eager.
RECOMPILE_LIMIT = 256


@dataclass
class WarmupReport:
    flow: str
    graph_types: list[str]
    seconds: float
    counts: CacheStats
    compile_report: Any = None
    manifest_path: Any = None


@dataclass
class ServeSession:
    counts: CacheStats = field(default_factory=CacheStats)
    calls: dict[str, int] = field(default_factory=dict)


class NeuronRunner:
    """Compile, warm up and serve a model's declared graphs with per-graph compiler arguments."""

    def __init__(
        self,
        model: Any,
        *,
        graphs: Sequence[GraphSpec] | None = None,
        compiler_args: str | Sequence[str] | None = None,
        target: str = "trn2",
        compiler: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        optimization_level: int | None = None,
        backend: str = COMPILE_SEAM,
        manifest_config: Mapping[str, Any] | None = None,
        local_rank: int = 0,
        tp_group: tuple[Sequence[int], int] | None = None,
        allow_eager_outputs: bool | None = None,
    ) -> None:
        self.model = model
        declared = list(graphs if graphs is not None else model.neuron_graphs())
        self.graphs: dict[str, GraphSpec] = {g.graph_type: g for g in declared}
        base = base_compiler_args({"compiler_args": compiler_args})
        # the seed's load_model: base args at the caller level; the policy only without an explicit level
        self.resolver = CompilerArgsResolver.from_model(model, base, explicit_optimization_level=optimization_level)
        self.cache_dir = cache_root({"cache_dir": cache_dir})
        self.options: dict[str, Any] = {
            "compiler_args": list(self.resolver.base_args), "target": target, "cache_dir": str(self.cache_dir),
            "compiler": compiler,
        }
        if allow_eager_outputs is not None:  # None: $NEURON_ARGS_ALLOW_EAGER_OUTPUTS (neuron_args.executables)
            self.options["allow_eager_outputs"] = allow_eager_outputs
        self.backend = backend
        self.manifest_config = dict(manifest_config or {})
        self.local_rank = local_rank
        if tp_group is not None:
            from neuron_args.manifest.ledger import register_tp_group

            register_tp_group(*tp_group)
        self._compiled: dict[int, Any] = {}
        self._serving: ServeSession | None = None
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True

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
                                                            dynamic=False)
        return fn

    def resolve(self, graph_type: str | None) -> list[str] | None:
        return self.resolver.resolve_graph_compiler_args(graph_type)

    def scope(self, graph_type: str | None) -> contextlib.AbstractContextManager[None]:
        """The in-process compile site: ``scoped_compiler_args(resolve_graph_compiler_args(graph_type))``."""
        return scoped_compiler_args(self.resolve(graph_type), graph_type=graph_type)

    def run(self, graph_type: str, kwargs: Mapping[str, Any]) -> Any:
        """Run one graph under its resolved scope (the signature example models' ``generate`` takes)."""
        if self._serving is not None:
            self._serving.calls[graph_type] = self._serving.calls.get(graph_type, 0) + 1
        fn = self.compiled(graph_type)
        try:
            with self.scope(graph_type), torch.inference_mode():
                return fn(**kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            raise NeuronArgsError(
                f"graph type {graph_type!r}: Dynamo's recompile limit ({torch._dynamo.config.recompile_limit}) was "
                "reached for this entry, past which it would silently run eager and skip the compiler. Too many "
                "shapes or models of one class in this process: call torch._dynamo.reset() between models, or "
                "raise torch._dynamo.config.recompile_limit.") from exc

    # -- warmup ------------------------------------------------------------------------------------
    def _selected(self, graph_types: Iterable[str] | None) -> list[str]:
        chosen = list(graph_types) if graph_types is not None else list(self.graphs)
        for g in chosen:
            self.spec(g)
        return chosen

    @staticmethod
    def _example(make: Any) -> Mapping[str, Any]:
        """Example inputs made as serving makes them (inference tensors), so Dynamo's guards match at serve."""
        with torch.inference_mode():
            return make()

    def warmup(
        self,
        graph_types: Iterable[str] | None = None,
        flow: str = "in-process",
        *,
        progress: Any = None,
        trace_timeout: float | None = None,
        emit: bool = True,
    ) -> WarmupReport:
        """Compile every bucket of the chosen graph types, in-process or through the deferred flow."""
        if flow not in FLOWS:
            raise ValueError(f"flow must be one of {FLOWS}, got {flow!r}")
        chosen = self._selected(graph_types)
        before, t0 = STATS.snapshot(), time.monotonic()
        compile_report = None
        if flow == "in-process":
            for g in chosen:
                for make in self.spec(g).buckets.values():
                    self.run(g, self._example(make))
        else:
            jobs = [build_trace_job(self.resolver, self.spec(g).entry, self._example(make), g)
                    for g in chosen for make in self.spec(g).buckets.values()]
            traced = parallel_trace(jobs, options=self.options, timeout=trace_timeout)
            compile_report = parallel_compile(self.cache_dir, base_compiler_args=self.resolver.base_args,
                                              compiler=self.options["compiler"], progress=progress)
        counts = CacheStats.since(before)
        if compile_report is not None:
            counts = self._record_deferred(traced, compile_report)
        report = WarmupReport(flow, chosen, round(time.monotonic() - t0, 3), counts, compile_report)
        if emit:
            report.manifest_path = self.emit_manifest()
        return report

    def _record_deferred(self, traced: Any, compile_report: Any) -> CacheStats:
        """The graphs the trace children and the compile workers handled, as this process's records."""
        built = {g.key: g for g in compile_report.graphs if g.status == "compiled"}
        keys = sorted({k for t in traced for k in t.keys})
        for key in keys:
            entry = self.cache.entry(key)
            md = entry.metadata()
            args = md.get("compiler_args") or []
            records.record(records.GraphRecord(
                key=key, seam=md.get("seam", CAPTURE_SEAM), graph_type=md.get("graph_type"),
                input_shapes=md.get("input_shapes", []), compiler_args=args,
                optimization_level=optimization_level(args), target=md.get("target", self.options["target"]),
                compiles=int(key in built), captures=int(key in built),
                compile_seconds=built[key].seconds if key in built else None,
                executable_size=entry.executable_path.stat().st_size if entry.is_complete else None,
            ))
        return CacheStats(hits=len(keys) - len(built), misses=len(built), compiles=len(built), captures=len(built))

    # -- serve ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def serve(self, assert_cache_hit: bool = True) -> Iterator[ServeSession]:
        """Serve with ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` set (restored after) and count cache activity."""
        session = ServeSession()
        before = STATS.snapshot()
        old = os.environ.get(ASSERT_CACHE_HIT_ENV)
        if assert_cache_hit:
            os.environ[ASSERT_CACHE_HIT_ENV] = "1"
        self._serving = session
        was_serving, records.serving = records.serving, True
        try:
            yield session
        finally:
            records.serving = was_serving
            self._serving = None
            if assert_cache_hit:
                if old is None:
                    os.environ.pop(ASSERT_CACHE_HIT_ENV, None)
                else:
                    os.environ[ASSERT_CACHE_HIT_ENV] = old
            session.counts = CacheStats.since(before)

    # -- manifest ------------------------------------------------------------------------------------
    def emit_manifest(self) -> Any:
        """Write this engine's manifest when ``VLLM_NEURON_MANIFEST_DIR`` is set (local rank 0 only)."""
        from neuron_args.manifest.emit import build_config, emit_manifest
        from neuron_args.manifest.engine import manifest_root

        if manifest_root() is None:
            return None
        cfg = dict(self.manifest_config)
        try:
            config = self._manifest_config(cfg, build_config)
        except Exception as exc:  # the manifest never breaks warmup
            log.warning("manifest config could not be built (%s: %s); emitting without it", type(exc).__name__, exc)
            config = None
        return emit_manifest(cache_dir=self.cache_dir, config=config, local_rank=self.local_rank)

    def _manifest_config(self, cfg: dict[str, Any], build_config: Any) -> dict[str, Any]:
        return build_config(
            model=cfg.pop("model", type(self.model).__name__), target=self.options["target"],
            dtype=cfg.pop("dtype", None), max_num_seqs=cfg.pop("max_num_seqs", None),
            max_model_len=cfg.pop("max_model_len", None), topology=cfg.pop("topology", None),
            neuron_config={"cache_dir": str(self.cache_dir), "compiler_args": self.resolver.base_args,
                           "per_graph": self.resolver.per_graph,
                           "explicit_optimization_level": self.resolver.explicit_optimization_level,
                           "graph_types": {r.key: r.graph_type for r in records.records()
                                           if (self.cache_dir / r.key).is_dir()},
                           **cfg.pop("neuron_config", {})},
            vllm_config=cfg.pop("runner_config", cfg or None),
        )


__all__ = ["CompileProgress", "NeuronRunner", "ServeSession", "WarmupReport"]
