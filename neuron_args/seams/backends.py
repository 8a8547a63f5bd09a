"""The three torch.compile backend seams (seed: ``backend.py``, ``capture_backend.py``, ``native_backend.py``).

One torch.compile per backend serves every graph type. Dynamo calls a backend once per graph
and shape; the backend lowers the graph to HLO once and returns a :class:`CompiledGraph`, which
reads the scope **at call time** and keeps one variant per argument set. So the same shapes
under two scopes never silently reuse the first variant, and after a variant's first call the
serve path is a contextvar read and a dict lookup: no hashing, no file I/O.

- ``neuron_libtorch``: key = graph, input specs, canonical compiler args, target, tool versions;
  compiles on a miss.
- ``neuron_libtorch_graph_capture``: same key; writes ``graph.hlo`` and a *pending* entry with the
  resolved args and runs the graph eagerly; ``parallel_compile`` builds it later.
- ``neuron_native_lite``: key leaves the args out (graph structure and I/O shapes only) and
  ``_assert_cache_key_args`` guards it.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from neuron_args.cache import (
    STATS,
    CacheEntry,
    CompileCache,
    _assert_cache_key_args,
    assert_cache_hit_enabled,
    compile_entry,
    disk_error,
    new_metadata,
)
from neuron_args.cache_key import CacheKey, create_cache_hash, graph_digest
from neuron_args.compilers import resolve_compile_timeout, select_compiler
from neuron_args.errors import CacheKeyArgsConflict, CacheMissError, CompileError, LoweringError, NeuronArgsError
from neuron_args.executables import allow_eager_outputs, load_executable
from neuron_args.flags import canonical_compiler_args, optimization_level
from neuron_args.manifest.ledger import record_graph
from neuron_args.scope import _scoped_compiler_args, current_graph_type
from neuron_args.seams import records
from neuron_args.seams.options import check_options, deferred_raise
from neuron_args.seams.platform import PlatformArgs, input_spec_pairs, resolve_request, tool_versions

log = logging.getLogger("neuron_args.seams")

COMPILE_SEAM = "neuron_libtorch"
CAPTURE_SEAM = "neuron_libtorch_graph_capture"
NATIVE_SEAM = "neuron_native_lite"
SEAMS = (COMPILE_SEAM, CAPTURE_SEAM, NATIVE_SEAM)

# native seam: first argument set seen per key in this process (the metadata covers other processes)
_native_args: dict[str, list[str]] = {}
# set by neuron_args.fastpath while it records a guarded call: called instead of each variant
call_observer: Callable[[CompiledGraph, Callable[[list[Any]], Any], list[Any]], Any] | None = None
# what _load returns for a NEFF whose outputs come from eager PyTorch (no runtime binding, allowed)
EAGER: Any = object()


class CompiledGraph:
    """What a seam hands back to aot_autograd for one graph: variants chosen by the scope at call time."""

    _boxed_call = True

    def __init__(self, seam: str, gm: torch.fx.GraphModule, lowered: Any, options: Mapping[str, Any],
                 user_inputs: Sequence[bool] | None) -> None:
        self.seam = seam
        self.gm = gm
        self.lowered = lowered
        self.options = dict(options)
        self.cache = CompileCache.from_options(options)
        self.cache.check_root()
        self.compiler = select_compiler(options)
        self.compile_timeout = resolve_compile_timeout(options, self.compiler.info.name)
        self.graph_sha256 = graph_digest(lowered.hlo_text)
        specs = lowered.input_specs
        mask = user_inputs if user_inputs is not None and len(user_inputs) == len(specs) else [True] * len(specs)
        self.input_shapes = [s.shape_string() for s, user in zip(specs, mask) if user]
        self._variants: dict[tuple[str, ...] | None, Callable[[list[Any]], Any]] = {}
        # aot_autograd's view/mutation metadata of this graph (which outputs are mutated inputs)
        self.fw_metadata = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        # aot_autograd calls a backward graph through disable(), whose functools.wraps copies only instance
        # attributes: without this one it calls the graph unboxed and fails
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        scoped = _scoped_compiler_args.get()
        run = self._variants.get(scoped)
        if run is None:
            run = self._variants[scoped] = self._build_variant()
        if call_observer is not None:
            return call_observer(self, run, args)
        return run(args)

    # -- resolving a variant (first call under an argument set) -------------------------------
    def _key(self, request: PlatformArgs) -> CacheKey:
        return create_cache_hash(
            graph_sha256=self.graph_sha256,
            input_specs=input_spec_pairs(self.lowered.input_specs),
            compiler_args=None if self.seam == NATIVE_SEAM else request.compiler_args,
            target=request.target,
            tool_versions=tool_versions(self.compiler.info),
        )

    def _build_variant(self) -> Callable[[list[Any]], Any]:
        graph_type = current_graph_type()
        request = resolve_request(self.options, graph_type)
        key = self._key(request)
        rec = records.GraphRecord(
            key=key.key, seam=self.seam, graph_type=graph_type, input_shapes=self.input_shapes,
            compiler_args=list(request.compiler_args), optimization_level=optimization_level(request.compiler_args),
            target=request.target,
        )
        if self.seam == CAPTURE_SEAM:
            rec.captures = int(self._capture(key, request, graph_type))
            self._ledger(key, request, graph_type)
            return _counted(self.gm, records.record(rec))
        if self.seam == NATIVE_SEAM:
            self._check_native_args(key, request, graph_type)
        build = functools.partial(self._compile_into, key=key, request=request, graph_type=graph_type, rec=rec)
        try:
            entry, hit = self.cache.get_or_build(key, build, graph_type=graph_type)
            run = self._load(entry, hit, key, graph_type, rec)
            if run is None:  # the entry's executable did not load: it was moved aside, build it again
                entry, hit = self.cache.get_or_build(key, build, graph_type=graph_type)
                run = self._load(entry, False, key, graph_type, rec)  # a second failure is an error
        except CacheMissError:
            rec.serve_misses = int(records.serving)
            records.record(rec)
            raise
        self._ledger(key, request, graph_type)
        rec.loads += int(hit)
        rec.executable_size = entry.executable_path.stat().st_size
        rec = records.record(rec)
        if run is EAGER:
            return _counted(self.gm, rec)
        return _counted(run, rec)

    def _load(self, entry: CacheEntry, hit: bool, key: CacheKey, graph_type: str | None,
              rec: records.GraphRecord) -> Any:
        """The loaded executable (once per process, by the entry's recorded format); :data:`EAGER` for a
        NEFF that runs eagerly here; None when a cached one does not load: it is then moved aside
        (corrupt) for the caller to rebuild."""
        try:
            exe = load_executable(entry, graph_type=graph_type, allow_eager=allow_eager_outputs(self.options))
        except NeuronArgsError:
            raise
        except Exception as exc:
            problem = f"its executable does not load ({type(exc).__name__}: {str(exc).strip()[:200]})"
            if not hit:
                raise CompileError(
                    f"graph type {graph_type!r}, key {key.key}: the {self.compiler.info.name} compiler built "
                    f"{entry.executable_path} but it does not load: {problem}\nfix: report it with graph.hlo "
                    "and command.txt of that entry") from exc
            if assert_cache_hit_enabled():
                raise self.cache.corrupt_error(entry, problem, graph_type) from None
            self.cache.quarantine(entry, problem)
            return None
        return EAGER if exe is None else exe

    def _ledger(self, key: CacheKey, request: PlatformArgs, graph_type: str | None) -> None:
        """The manifest's ledger line: written once the graph is captured, compiled or found built."""
        record_graph(key=key.key, input_shapes=self.input_shapes, compiler_flags=request.compiler_flags(),
                     graph_type=graph_type)

    def _metadata(self, key: CacheKey, request: PlatformArgs, graph_type: str | None, status: str) -> dict[str, Any]:
        lowered = self.lowered
        return new_metadata(
            key, seam=self.seam, graph_type=graph_type, compiler_args=request.compiler_args, target=request.target,
            status=status,
            input_specs=[{"shape": list(s.shape), "dtype": s.dtype} for s in lowered.input_specs],
            output_specs=[{"shape": list(s.shape), "dtype": s.dtype} for s in lowered.output_specs],
            input_shapes=self.input_shapes,
            output_shapes=list(lowered.result_shapes),
            compiler_flags=request.compiler_flags(),
            compiler=self.compiler.info.as_dict(),
            # parallel_compile honours the capture's own timeout option (None: the environment, else the default)
            compile_timeout=self.options.get("compile_timeout"),
        )

    def _compile_into(self, entry: CacheEntry, *, key: CacheKey, request: PlatformArgs, graph_type: str | None,
                      rec: records.GraphRecord) -> None:
        entry.hlo_path.write_bytes(self.lowered.hlo_module_proto)
        md = self._metadata(key, request, graph_type, status="compiling")
        entry.write_metadata(md)
        compile_entry(entry, self.compiler, request.compiler_args, request.target, graph_type, md,
                      timeout=self.compile_timeout)
        rec.compiles += 1
        rec.compile_seconds = entry.metadata().get("compile_seconds")

    def _capture(self, key: CacheKey, request: PlatformArgs, graph_type: str | None) -> bool:
        """Write a pending entry unless the key is already built; True when written."""
        entry = self.cache.entry(key)
        if entry.is_complete:
            problem = self.cache.verified(entry)
            if problem is None:
                return False
            self.cache.quarantine(entry, problem)
        try:
            with self.cache.lock(key):
                if entry.is_complete:
                    return False
                entry.reset()
                entry.hlo_path.write_bytes(self.lowered.hlo_module_proto)
                entry.write_metadata(self._metadata(key, request, graph_type, status="pending"))
                STATS.captures += 1
                return True
        except OSError as exc:
            raise disk_error(exc, entry.path, key=key.key, graph_type=graph_type) from exc

    def _check_native_args(self, key: CacheKey, request: PlatformArgs, graph_type: str | None) -> None:
        args = list(request.compiler_args)
        first = _native_args.setdefault(key.key, args)
        if canonical_compiler_args(first) != canonical_compiler_args(args):
            raise CacheKeyArgsConflict(
                f"cache key {key.key} (graph type {graph_type!r}) was compiled in this process with\n"
                f"    {first}\n  and is now requested with\n    {args}\n"
                "  The native cache keys on graph structure and I/O shapes, not on compiler flags; give the graph "
                "one argument set, or use the neuron_libtorch backend, whose key includes the arguments."
            )
        _assert_cache_key_args(self.cache.entry(key), args, graph_type=graph_type)


def _counted(fn: Callable[..., Any], rec: records.GraphRecord) -> Callable[[list[Any]], Any]:
    """A variant's call: the function, plus one flag read to count calls while a runner serves."""
    def run(args: list[Any]) -> Any:
        if records.serving:
            rec.serve_hits += 1
        return fn(*args)

    return run


def _user_input_mask(gm: torch.fx.GraphModule) -> list[bool] | None:
    """Which Dynamo graph inputs are the caller's (not lifted parameters or buffers), for the manifest."""
    mask = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name() if callable(getattr(source, "name", None)) else str(getattr(source, "name", node.name))
        mask.append(not any(part in name for part in ("_parameters", "_buffers", "._modules")))
    return mask or None


def _refuse_symbolic(example_inputs: Sequence[Any], seam: str) -> None:
    symbolic = [
        i for i, x in enumerate(example_inputs)
        if isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape))
    ]
    if symbolic:
        raise LoweringError(
            f"{seam}: Dynamo handed over a graph with symbolic sizes (inputs {symbolic}). Neuron graphs are static: "
            "each bucket shape gets its own graph and cache entry. Compile with torch.compile(..., dynamic=False)."
        )


class NeuronBackend:
    """A torch.compile backend for one seam. Module-level instances, so compiled models pickle."""

    def __init__(self, seam: str) -> None:
        if seam not in SEAMS:
            raise ValueError(f"unknown seam {seam!r}; one of {SEAMS}")
        self.seam = seam
        self.__name__ = seam

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (backend_for, (self.seam,))

    def __repr__(self) -> str:
        return f"NeuronBackend({self.seam!r})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        from neuron_args.lowering.hlo import lower_fx_graph
        from neuron_args.seams.dispatch import dispatched

        try:
            opts = check_options(options, self.seam)
            _refuse_symbolic(example_inputs, self.seam)
            user_inputs = _user_input_mask(gm)
            graphs: list[CompiledGraph] = []

            def fw_compiler(fx_gm: torch.fx.GraphModule, fw_inputs: Sequence[Any]) -> CompiledGraph:
                graphs.append(CompiledGraph(self.seam, fx_gm, lower_fx_graph(fx_gm, fw_inputs), opts, user_inputs))
                return graphs[-1]

            # aot's runtime wrapper only when the graph needs more than a copy-back of mutated inputs
            return dispatched(aot_autograd(fw_compiler=fw_compiler)(gm, example_inputs), graphs, gm, example_inputs)
        except NeuronArgsError as exc:  # Dynamo would wrap it in BackendCompilerFailed: raise it at call time
            return deferred_raise(exc)


neuron_libtorch = NeuronBackend(COMPILE_SEAM)
neuron_libtorch_graph_capture = NeuronBackend(CAPTURE_SEAM)
neuron_native_lite = NeuronBackend(NATIVE_SEAM)
_BACKENDS = {b.seam: b for b in (neuron_libtorch, neuron_libtorch_graph_capture, neuron_native_lite)}


def backend_for(seam: str) -> NeuronBackend:
    return _BACKENDS[seam]


def register_backends() -> None:
    """Register the three seams by name (also discovered through the ``torch_dynamo_backends`` entry points)."""
    from torch._dynamo.backends import registry

    for name, backend in _BACKENDS.items():
        # an entry point still pending means torch's lookup is loading us and registers it itself
        if name not in registry._COMPILER_FNS and registry._BACKENDS.get(name) is None:
            registry.register_backend(compiler_fn=backend, name=name)


register_backends()
