"""The three torch.compile backend seams (the design's ``backend.py``, ``capture_backend.py``, ``native_backend.py``).

A backend lowers each Dynamo graph once into a :class:`CompiledGraph`, which reads the scope and autograd mode **at
call time** and keeps one variant per argument set and mode: two scopes never silently share a variant.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from neuron_args import eager_fallback
from neuron_args.activity import ACTIVITY, count
from neuron_args.atomic import write_atomic
from neuron_args.cache import (
    CacheEntry,
    CompileCache,
    CorruptEntryError,
    _assert_cache_key_args,
    assert_cache_hit_enabled,
    disk_error,
    new_metadata,
)
from neuron_args.cache_key import CacheKey, autograd_mode, create_cache_hash, current_autograd_mode, graph_digest
from neuron_args.compilers import select_compiler
from neuron_args.compilers.base import compile_entry
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CacheKeyArgsConflict, CacheMissError, CompileError, LoweringError, NeuronArgsError
from neuron_args.executables import allow_eager_outputs, load_executable
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.manifest.ledger import record_graph, shape_string
from neuron_args.runtime import graph_call
from neuron_args.scope import (
    _SCOPE,
    current_graph_type,
    resolve_request,
    scoped_compiler_args,
)
from neuron_args.seams import dispatch, records, trace_memo
from neuron_args.settings import CompileSettings, PlatformArgs, resolve_compile_timeout
from neuron_args.text import graph_label

log = logging.getLogger("neuron_args.seams")

COMPILE_SEAM = "neuron_libtorch"
CAPTURE_SEAM = "neuron_libtorch_graph_capture"
NATIVE_SEAM = "neuron_native_lite"

# set by neuron_args.fastpath while it records a guarded call: called instead of each variant
call_observer: Callable[[CompiledGraph, Callable[[list[Any]], Any], list[Any]], Any] | None = None
# what _load returns for a NEFF whose outputs come from eager PyTorch (no runtime binding, allowed)
EAGER: Any = object()
#: a scope as a variant picks it: the scoped compiler args (None: none) and the scope's graph type
Scope = tuple[tuple[str, ...] | None, str | None]


class CompiledGraph:
    """What a seam hands back to aot_autograd for one graph: variants chosen by the scope at call time.
    Built from a trace memo, ``gm`` and ``lowered`` are traced and lowered on first use."""

    def __init__(self, seam: str, gm: torch.fx.GraphModule | None, lowered: Any, settings: CompileSettings,
                 user_inputs: Sequence[bool] | None, *, grad: bool, memo: trace_memo.TraceMemo | None = None,
                 trace: Callable[[], tuple[torch.fx.GraphModule, Sequence[Any]]] | None = None,
                 forget: Callable[[], None] | None = None, forward: CompiledGraph | None = None) -> None:
        self.seam = seam
        # a backward graph's forward: the backward takes the scope of its own forward call (_tagging_forward_scope),
        # else ``last_scope``, so a loss.backward() outside the scope still gets its arguments
        self.forward = forward
        self.last_scope: Scope = (None, None)
        self.keys_args = seam != NATIVE_SEAM  # the native key leaves the compiler arguments out
        self._gm = gm
        self._lowered = lowered
        self._trace, self._forget = trace, forget
        self._fw_inputs: Sequence[Any] | None = None
        # the entry built() verified last, holding the executable bytes it hashed: the variant's load takes them
        self._verified: CacheEntry | None = None
        self._materializing = threading.Lock()  # two scopes' first calls may need the graph at once
        self.settings = settings
        self.grad = grad  # Dynamo traced the graph with grad enabled (see autograd)
        self.cache = CompileCache.from_settings(settings)
        self.cache.check_root()
        self.compiler = select_compiler(settings.compiler)
        self.compile_timeout = resolve_compile_timeout(settings.compile_timeout, self.compiler.info.name)
        # the memo's prediction stands for the lowering; its plan for aot_autograd's view/mutation metadata of the
        # graph (which outputs are mutated inputs: dispatch.plan reads either)
        self.graph_sha256 = memo.graph_sha256 if memo is not None else graph_digest(lowered.hlo_text)
        self.input_specs = (memo or lowered).input_specs
        self.output_specs = (memo or lowered).output_specs
        self.fw_metadata = memo.plan if memo is not None else getattr(
            torch._guards.TracingContext.try_get(), "fw_metadata", None)
        specs = self.input_specs if lowered is None else lowered.graph_input_specs  # not a random key input
        mask = user_inputs if user_inputs is not None and len(user_inputs) == len(specs) else [True] * len(specs)
        self.input_shapes = [shape_string(s.shape) for s, user in zip(specs, mask) if user]
        # picked by what the key holds besides the graph: the scope's arguments and the autograd mode
        self._variants: dict[tuple[tuple[str, ...] | None, str], Callable[[list[Any]], Any]] = {}
        # aot_autograd calls a backward graph through disable(), whose functools.wraps copies only instance
        # attributes: without this one it calls the graph unboxed and fails
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        if self.forward is None:
            scope = self.last_scope = _SCOPE.get()
        else:
            scope = getattr(torch._C._current_autograd_node(), _SCOPE_ATTRIBUTE, None) or self.forward.last_scope
        pick = (scope[0], self.autograd())
        run = self._variants.get(pick)
        if run is None:
            run = self._variants[pick] = self._build_variant(scope)
            self._verified = None  # loaded, or not this variant's entry: its bytes are not kept
        if call_observer is not None:
            return call_observer(self, run, args)
        return run(args)

    # -- the aot graph and the lowering, lazily for a graph built from the trace memo -----------
    @property
    def gm(self) -> torch.fx.GraphModule:
        """aot_autograd's forward graph (run eagerly by the capture seam and eager-output NEFFs)."""
        if self._gm is None:
            with self._materializing:
                if self._gm is None:
                    assert self._trace is not None
                    self._gm, self._fw_inputs = self._trace()
        return self._gm

    @property
    def lowered(self) -> Any:
        """The graph lowered to HLO (the compiler's input); lowered on first use after a memo hit."""
        if self._lowered is None and (digest := self._lower()) != self.graph_sha256:
            raise LoweringError(
                f"{self.seam}: the trace memo predicted HLO sha256 {self.graph_sha256[:12]} for "
                f"{graph_label(current_graph_type())}, which now lowers to {digest[:12]} "
                f"(its lowering changed, or is not deterministic); the memo entry was removed.\nfix: run again, "
                f"or set {trace_memo.ENV}=0")
        return self._lowered

    def _lower(self) -> str:
        """Lower now (after a memo hit); the real HLO digest. A wrong prediction forgets the memo entry."""
        from neuron_args.lowering.hlo import lower_fx_graph

        gm = self.gm
        with self._materializing:
            if self._lowered is None:
                self._lowered = lower_fx_graph(gm, self._fw_inputs)
        digest = graph_digest(self._lowered.hlo_text)
        if digest != self.graph_sha256 and self._forget is not None:
            log.warning("%s: the trace memo predicted HLO sha256 %s, the lowering gives %s; memo entry removed",
                        self.seam, self.graph_sha256[:12], digest[:12])
            self._forget()
        return digest

    def autograd(self) -> str:
        """The autograd mode (a key component): ``grad`` when Dynamo traced with grad, else the caller's at call
        time (Dynamo turns inference mode off while it compiles)."""
        if self.grad:
            return "grad"
        return "inference_mode" if torch.is_inference_mode_enabled() else "no_grad"

    def _key(self, request: PlatformArgs, autograd: str | None = None) -> CacheKey:
        info = self.compiler.info
        return create_cache_hash(
            graph_sha256=self.graph_sha256,
            input_specs=[(tuple(s.shape), s.dtype) for s in self.input_specs],
            output_specs=[(tuple(s.shape), s.dtype) for s in self.output_specs],
            autograd=autograd or self.autograd(),
            compiler_args=request.compiler_args if self.keys_args else None,
            target=request.target,
            tool_versions={**dict(trace_memo.lowering_tool_versions()), "compiler": f"{info.name} {info.version}"},
        )

    def built(self, key: CacheKey) -> bool:
        """Whether ``key``'s entry is complete and verified (what trusting the memo's prediction needs); the entry
        verified is kept with the bytes it hashed, so the variant's load reads the executable no second time."""
        kept = self._verified
        entry = kept if kept is not None and kept.key == key.key else self.cache.entry(key)
        if not entry.is_complete or self.cache.verified(entry) is not None:
            return False
        self._verified = entry
        return True

    def predicted_built(self) -> bool:
        """Whether the current scope's key is built (False when the scope does not resolve: the full path
        raises then); without grad either of no_grad and inference mode will do."""
        try:
            request = resolve_request(self.settings, current_graph_type())
        except NeuronArgsError:
            return False
        return any(self.built(self._key(request, mode)) for mode in (("grad",) if self.grad else
                                                                      ("inference_mode", "no_grad")))

    # -- resolving a variant (first call under an argument set) -------------------------------
    def _build_variant(self, scope: Scope) -> Callable[[list[Any]], Any]:
        """Resolve and key the scope's request for the seam; a backward graph's under its forward's scope, labelled
        with the forward's graph type and ``.backward``."""
        with contextlib.nullcontext() if self.forward is None else scoped_compiler_args(
                scope[0], graph_type="backward" if scope[1] is None else f"{scope[1]}.backward"):
            graph_type = current_graph_type()
            request = resolve_request(self.settings, graph_type)
            key = self._key(request)
            if self._lowered is None and not self.built(key):  # the memo's key misses: lower, key the real HLO
                digest = self._lower()
                if digest != self.graph_sha256:
                    self.graph_sha256 = digest
                    key = self._key(request)
            rec = GraphOutcome(
                key=key.key, seam=self.seam, graph_type=graph_type, input_shapes=list(self.input_shapes),
                compiler_args=list(request.compiler_args), optimization_level=request.compiler_args.level,
                target=request.target,
            )
            return SEAM_VARIANTS[self.seam](self, Variant(key, request, graph_type, rec))

    def recorded(self, v: Variant, **done: Any) -> None:
        """The graph captured, compiled or found built: this process's record of it and the manifest's ledger line."""
        records.record(replace(v.rec, **done))
        record_graph(key=v.key.key, input_shapes=self.input_shapes, compiler_flags=v.request.compiler_flags(),
                     graph_type=v.graph_type)

    def write_entry(self, entry: CacheEntry, v: Variant, status: str) -> EntryMetadata:
        """Write ``graph.hlo`` atomically (never half a graph) and ``metadata.json`` of a captured or compiled graph."""
        lowered = self.lowered
        write_atomic(entry.hlo_path, lowered.hlo_module_proto)
        md = new_metadata(
            v.key, seam=self.seam, graph_type=v.graph_type, compiler_args=v.request.compiler_args,
            target=v.request.target, status=status,
            input_specs=[{"shape": list(s.shape), "dtype": s.dtype} for s in lowered.input_specs],
            output_specs=[{"shape": list(s.shape), "dtype": s.dtype} for s in lowered.output_specs],
            input_shapes=self.input_shapes,
            output_shapes=list(lowered.result_shapes),
            compiler_flags=v.request.compiler_flags(),
            compiler=self.compiler.info.as_dict(),
            # parallel_compile honours the capture's own timeout option (None: the environment, else the default)
            compile_timeout=self.settings.compile_timeout,
        )
        entry.write_metadata(md)
        return md


@dataclass
class Variant:
    """One argument set of a graph, resolved on its first call: the request, its key and its record."""

    key: CacheKey
    request: PlatformArgs
    graph_type: str | None
    rec: GraphOutcome


def _compiled_variant(graph: CompiledGraph, v: Variant) -> Callable[[list[Any]], Any]:
    """``neuron_libtorch`` and ``neuron_native_lite``: a miss compiles, a hit loads; the native key leaves the
    arguments out (graph structure and I/O shapes only): one key keeps one argument set (:func:`_one_native_args`)."""
    build = functools.partial(_compile_into, graph, v)
    on_hit = None if graph.keys_args else _one_native_args(graph, v)
    try:
        entry, hit = graph.cache.get_or_build(v.key, build, graph_type=v.graph_type, on_hit=on_hit)
        kept = graph._verified  # a hit built() verified: load the bytes it hashed
        run = _load(graph, kept if hit and kept is not None and kept.key == entry.key else entry, hit, v)
        if run is None:  # the entry's executable did not load: it was moved aside, build it again
            entry, hit = graph.cache.get_or_build(v.key, build, graph_type=v.graph_type, on_hit=on_hit)
            run = _load(graph, entry, False, v)  # a second failure is an error
    except CacheMissError:
        records.record(replace(v.rec, serve_misses=int(ACTIVITY.serving is not None)))
        raise
    except CompileError as exc:  # recorded: the session's table lists the graph as failed, with its key
        records.record(replace(v.rec, failures=1, error=next(iter(str(exc).splitlines()), type(exc).__name__)))
        raise
    graph.recorded(v, loads=v.rec.loads + int(hit), executable_size=entry.executable_path.stat().st_size)
    if run is EAGER:
        return _counted(graph.gm, v.key.key)
    # a graph built from the trace memo and found built is a plain inference graph: nothing to add
    return _counted(run if graph._lowered is None else graph_call(run, graph._lowered), v.key.key)


def _load(graph: CompiledGraph, entry: CacheEntry, hit: bool, v: Variant) -> Any:
    """The loaded executable; :data:`EAGER`: run eagerly; None: a cached one did not load (moved aside: rebuild)."""
    try:
        exe = load_executable(entry, graph_type=v.graph_type,
                              allow_eager=allow_eager_outputs(graph.settings.allow_eager_outputs))
    except Exception as exc:
        if isinstance(exc, NeuronArgsError) and not isinstance(exc, CorruptEntryError):
            raise
        problem = (exc.problem if isinstance(exc, CorruptEntryError) else
                   f"its executable does not load ({type(exc).__name__}: {str(exc).strip()[:200]})")
        if not hit:
            raise CompileError(
                f"{graph_label(v.graph_type)}, key {v.key.key}: the {graph.compiler.info.name} compiler built "
                f"{entry.executable_path} but it does not load: {problem}\nfix: report it with graph.hlo "
                "and command.txt of that entry") from exc
        if assert_cache_hit_enabled():
            raise graph.cache.corrupt_error(entry, problem, v.graph_type) from None
        graph.cache.quarantine(entry, problem)
        return None
    return EAGER if exe is None else exe


def _compile_into(graph: CompiledGraph, v: Variant, entry: CacheEntry) -> None:
    md = graph.write_entry(entry, v, "compiling")
    compile_entry(entry, graph.compiler, v.request.compiler_args, v.request.target, v.graph_type, md,
                  timeout=graph.compile_timeout)
    v.rec = replace(v.rec, compiles=v.rec.compiles + 1, compile_seconds=entry.info().compile_seconds)


def _captured_variant(graph: CompiledGraph, v: Variant) -> Callable[[list[Any]], Any]:
    """``neuron_libtorch_graph_capture``: the compile seam's key; writes ``graph.hlo`` and a *pending*
    entry with the resolved arguments and runs the graph eagerly (``parallel_compile`` builds it)."""
    graph.recorded(v, captures=int(_capture(graph, v)))
    return _counted(graph.gm, v.key.key)


def _capture(graph: CompiledGraph, v: Variant) -> bool:
    """Write a pending entry unless the key is already built; True when written."""
    cache, key = graph.cache, v.key
    entry = cache.entry(key)
    if not entry.is_complete:
        cache.pull(entry, v.graph_type)  # a remote cache that holds it: nothing to capture
    if entry.is_complete:
        problem = cache.verified(entry)
        if problem is None:
            return False
        cache.quarantine(entry, problem)
    try:
        with cache.lock(key):
            if entry.is_complete:
                return False
            entry.reset()
            graph.write_entry(entry, v, "pending")
            count("captures")
            return True
    except OSError as exc:
        raise disk_error(exc, entry.path, key=key.key, graph_type=v.graph_type) from exc


#: what the first call of a variant does in each seam
SEAM_VARIANTS: dict[str, Callable[[CompiledGraph, Variant], Callable[[list[Any]], Any]]] = {
    COMPILE_SEAM: _compiled_variant, CAPTURE_SEAM: _captured_variant, NATIVE_SEAM: _compiled_variant}
SEAMS = tuple(SEAM_VARIANTS)


def _one_native_args(graph: CompiledGraph, v: Variant) -> Callable[[CacheEntry], None]:
    """The native seam's one argument set per key, in this process and in the entry; the check a hit repeats
    (another process may have built the key with other arguments meanwhile)."""
    args = v.request.compiler_args
    first = ACTIVITY.native_args.setdefault(v.key.key, args)
    if first.canonical != args.canonical:
        raise CacheKeyArgsConflict(
            f"cache key {v.key.key} ({graph_label(v.graph_type)}) was compiled in this process with\n"
            f"    {first.argv}\n  and is now requested with\n    {args.argv}\n"
            "  The native cache keys on graph structure and I/O shapes, not on compiler flags; give the graph "
            "one argument set, or use the neuron_libtorch backend, whose key includes the arguments."
        )
    check = functools.partial(_assert_cache_key_args, compiler_args=args, graph_type=v.graph_type)
    check(graph.cache.entry(v.key))
    return check


def _counted(fn: Callable[..., Any], key: str) -> Callable[[list[Any]], Any]:
    """A variant's call: the function, plus one flag read to count calls while a runner serves."""
    def run(args: list[Any]) -> Any:
        if ACTIVITY.serving is not None and (held := ACTIVITY.records.get(key)) is not None:
            ACTIVITY.records[key] = held.served_once()  # the fast path's one write: no function of records.py
        return fn(*args)

    return run


def _user_input_mask(gm: torch.fx.GraphModule) -> list[bool] | None:
    """Which Dynamo graph inputs are the caller's (not lifted parameters or buffers), for the manifest."""
    mask = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name() if callable(getattr(source, "name", None)) else str(getattr(source, "name", node.name))
        mask.append(not any(part in name for part in ("_parameters", "_buffers", "._modules")))
    return mask or None


def _refuse_symbolic(example_inputs: Sequence[Any], seam: str) -> None:
    symbolic = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.SymInt)
                or isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape)]
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

    def __reduce__(self) -> str:
        return self.seam  # pickled by name: the module-level instance below

    def __repr__(self) -> str:
        return f"NeuronBackend({self.seam!r})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd

        from neuron_args.lowering.hlo import lower_fx_graph

        mode = current_autograd_mode()  # Dynamo calls its backend in the caller's grad mode (inference mode off)
        try:
            opts = CompileSettings.from_options(options, self.seam)
            _refuse_symbolic(example_inputs, self.seam)
            user_inputs = _user_input_mask(gm)
            fp = trace_memo.fingerprint(gm, example_inputs) if trace_memo.enabled() else None
            memo = None if fp is None else trace_memo.load(CompileCache.from_settings(opts), fp)
            fast = None if memo is None else self._from_memo(memo, fp, gm, example_inputs, opts, user_inputs, mode)
            if fast is not None:
                return fast
            graphs: list[CompiledGraph] = []

            def compiler(fx_gm: torch.fx.GraphModule, inputs: Sequence[Any], backward: bool) -> CompiledGraph:
                graphs.append(CompiledGraph(self.seam, fx_gm, lower_fx_graph(fx_gm, inputs), opts,
                                            None if backward else user_inputs, grad=mode == "grad",
                                            forward=graphs[0] if backward else None))
                return graphs[-1]

            aot_result = aot_autograd(fw_compiler=functools.partial(compiler, backward=False),
                                      bw_compiler=functools.partial(compiler, backward=True))(gm, example_inputs)
            # aot's runtime wrapper only when the graph needs more than a copy-back of mutated inputs
            p = dispatch.direct_plan(graphs, gm, example_inputs)
            if p is None:
                return _tagging_forward_scope(aot_result) if mode == "grad" else aot_result
            if fp is not None:
                fresh = trace_memo.TraceMemo(graphs[0].graph_sha256, tuple(graphs[0].input_specs),
                                             tuple(graphs[0].output_specs), p)
                if fresh != memo:
                    trace_memo.store(graphs[0].cache, fp, fresh)
            return dispatch.direct_call(graphs[0], p)
        except NeuronArgsError as exc:  # Dynamo would wrap it in BackendCompilerFailed: raise it at call time
            return functools.partial(_raise, exc)

    def _from_memo(self, memo: trace_memo.TraceMemo, fp: str, gm: torch.fx.GraphModule,
                   example_inputs: Sequence[Any], opts: CompileSettings,
                   user_inputs: Sequence[bool] | None, mode: str) -> Callable[..., Any] | None:
        """The direct call of a graph built from the memo, when the current scope's predicted key is built
        and the trace is one Dynamo calls directly; None: trace in full."""
        if len(example_inputs) != memo.plan.n_args or dispatch.inputs_need_aot(example_inputs, gm) is not None:
            return None
        graph = CompiledGraph(self.seam, None, None, opts, user_inputs, grad=mode == "grad", memo=memo,
                              trace=functools.partial(_aot_forward, gm, list(example_inputs), mode),
                              forget=functools.partial(trace_memo.forget, CompileCache.from_settings(opts), fp))
        if not graph.predicted_built():
            log.debug("trace memo %s not used: the predicted key's entry is not built", fp[:12])
            return None
        log.debug("trace memo %s used: aot_autograd and the lowering skipped", fp[:12])
        return dispatch.direct_call(graph, memo.plan)  # its n_args checked above: the recorded plan is the plan


def _raise(error: NeuronArgsError, *args: Any) -> Any:
    """A seam's error as a graph raising it: the caller sees it, not Dynamo's ``BackendCompilerFailed`` around it."""
    raise error.with_traceback(None)


#: the attribute of aot_autograd's backward node (its ctx) that holds its forward call's scope
_SCOPE_ATTRIBUTE = "_neuron_args_forward_scope"
#: autograd nodes between an output and aot's node (views and aliases aot's runtime wrapper regenerates)
_DEPTH = 4


def _tagging_forward_scope(aot_result: Callable[..., Any]) -> Callable[..., Any]:
    """aot_autograd's call, setting its scope on the aot_autograd node its outputs come from (one tagged is an earlier
    call's): a forward may run under several scopes before a ``backward()``, which runs outside them all."""
    @functools.wraps(aot_result)
    def call(*args: Any, **kwargs: Any) -> Any:
        outputs = aot_result(*args, **kwargs)
        outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        stack = [(o.grad_fn, 0) for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
        seen: set[int] = set()
        while stack:
            node, depth = stack.pop()
            if node is None or id(node) in seen or depth > _DEPTH:
                continue
            seen.add(id(node))
            if hasattr(getattr(node, "_forward_cls", None), "_aot_id"):  # aot_autograd's CompiledFunction node (ctx)
                if not hasattr(node, _SCOPE_ATTRIBUTE):
                    setattr(node, _SCOPE_ATTRIBUTE, _SCOPE.get())
                continue
            stack.extend((n, depth + 1) for n, _ in node.next_functions)
        return outputs

    return call


def _aot_forward(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 mode: str) -> tuple[torch.fx.GraphModule, Sequence[Any]]:
    """aot_autograd's forward graph of a Dynamo graph and its inputs, traced after a memo hit in that call's mode."""
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, Sequence[Any]]] = []

    def grab(fx_gm: torch.fx.GraphModule, fw_inputs: Sequence[Any]) -> torch.fx.GraphModule:
        got.append((fx_gm, list(fw_inputs)))
        return fx_gm

    with autograd_mode(mode):
        aot_autograd(fw_compiler=grab)(gm, example_inputs)
    if len(got) != 1:
        raise LoweringError(f"aot_autograd compiled {len(got)} graphs where the trace memo recorded one; "
                            f"set {trace_memo.ENV}=0")
    return got[0]


neuron_libtorch = NeuronBackend(COMPILE_SEAM)
neuron_libtorch_graph_capture = NeuronBackend(CAPTURE_SEAM)
neuron_native_lite = NeuronBackend(NATIVE_SEAM)

eager_fallback.install(lambda fn: fn.seam if isinstance(fn, NeuronBackend) else None)
