"""The serve fast path: a warmed graph's call runs Dynamo's own code for it, without Dynamo's frame evaluation.

A call through ``torch.compile`` pays, besides the executable, Dynamo's frame evaluation, the ``disable`` wrapper
and the seam's scope resolution: 30-60 us a decode step (``benchmarks/bench_serve.py``); skipping guard evaluation
by stance saves a few us and drops the guards. :class:`FastGraph` learns from one guarded call which Dynamo cache
entry and variant served it, then per call runs that entry's guard manager on the frame's locals and its code, with
the compiled graph's global swapped for the variant's direct call. Only an exact replay is learned (one compiled
graph, no graph break, the seam's direct call, no module hooks); anything else, a failed guard, another stance or
a dropped cache entry takes the guarded path: the fast path never returns what the guarded path would not.
"""
from __future__ import annotations

import inspect
import itertools
import logging
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo.eval_frame as _eval_frame
import torch.nn.modules.module as _nn_module

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.seams import dispatch

log = logging.getLogger("neuron_args.fastpath")
_InferenceMode = torch._C._InferenceMode

#: returned by :meth:`FastPath.call` when the call must take the guarded path
MISS: Any = object()
#: set to 0 to serve every call through the guarded path
ENV = "NEURON_ARGS_FAST_PATH"

# per graph type: fast graphs kept (one per Dynamo cache entry; most recently learned first)
_MAX_PER_GRAPH_TYPE = 32
# Dynamo's global names in the code it generates for a frame: its compiled graphs, the resumes after a graph break
_GRAPH_PREFIX, _RESUME_PREFIX = "__compiled_fn", "__resume_at"
# the globals the swapped code calls instead of Dynamo's compiled graph (one per fast graph)
_SWAPPED_NAMES = itertools.count()


class Refused(Exception):
    """The recorded call cannot be served exactly without Dynamo; the reason says why (kept for inspection)."""


class UnknownDynamo(Refused):
    """Dynamo's code for the frame is not in the form this module knows (a torch it was not written for):
    ``tests/test_fastpath_dynamo.py`` fails then; at serve time it is warned, the graph served guarded."""


@dataclass
class Observed:
    """One CompiledGraph call seen while recording: the variant that ran and its arguments."""

    graph: Any
    run: Callable[[list[Any]], Any]
    args: list[Any]


def _module_hooks(module: torch.nn.Module, other: torch.nn.Module) -> bool:
    """True when calling ``module`` (or ``other``) runs hooks around its forward (the fast path would skip them)."""
    m = _nn_module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks or module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks or other._forward_hooks
                or other._forward_pre_hooks or other._backward_hooks or other._backward_pre_hooks)


def _cache_entries(code: types.CodeType) -> list[Any]:
    return list(_eval_frame._debug_get_cache_entry_list(code))


@dataclass
class FastGraph:
    """One warmed graph type's call (one Dynamo cache entry): Dynamo's code for it, run without Dynamo."""

    graph_type: str
    entry: torch.nn.Module
    wrapper: torch.nn.Module
    frame_self: Any  # the first local of the frame Dynamo compiled (the entry, or its per-instance forward)
    keys: frozenset[str]
    shapes: tuple[tuple[str, torch.Size], ...]
    defaults: dict[str, Any]
    star: tuple[str | None, str | None, frozenset[str]] | None  # forward's *args, **kwargs names; extra keys
    guard_manager: Any
    run: Callable[[list[Any]], Any]  # the variant the recorded call ran
    code: Callable[..., Any]  # Dynamo's code for the frame, calling ``run`` directly; forward's signature
    mutated: tuple[tuple[int, int, bool], ...]  # (argument index, output index, leaf: detach before copy)
    mutated_kwargs: frozenset[str] = frozenset()  # keyword arguments whose tensors the graph writes
    calls: int = 0

    def valid(self) -> bool:
        """False once Dynamo dropped the frame's cache entry (``torch._dynamo.reset()``, invalidation)."""
        entry = self.guard_manager.cache_entry
        return entry is not None and entry.guard_manager is self.guard_manager

    def __call__(self, kwargs: Mapping[str, Any]) -> Any:
        if kwargs.keys() != self.keys:
            return MISS
        for name, shape in self.shapes:
            value = kwargs[name]
            if not isinstance(value, torch.Tensor) or value.shape != shape:
                return MISS
        stance = _eval_frame._stance  # torch.compiler.set_stance("force_eager") etc.: Dynamo decides
        if stance.stance != "default" or stance.backend is not None or _module_hooks(self.entry, self.wrapper) \
                or not self.valid():
            return MISS
        if torch.is_inference_mode_enabled():
            return self._dispatch(kwargs)
        with _InferenceMode(True):  # torch.inference_mode()'s own guard, without its Python layers (~2 us)
            return self._dispatch(kwargs)

    def _dispatch(self, kwargs: Mapping[str, Any]) -> Any:
        if not self.guard_manager.check(_frame(self.defaults, kwargs, self.frame_self, self.star)):
            return MISS
        out = self.code(self.frame_self, **kwargs)
        self.calls += 1
        return out


@dataclass
class FastPath:
    """A runner's fast graphs by graph type, plus why a recorded call could not become one."""

    graphs: dict[str, list[FastGraph]] = field(default_factory=dict)
    refused: dict[tuple[str, Any], str] = field(default_factory=dict)
    enabled: bool = field(default_factory=lambda: envs.flag(ENV))

    def call(self, graph_type: str, kwargs: Mapping[str, Any]) -> Any:
        """The result of a warmed call, or :data:`MISS` (then take the guarded path)."""
        kwargs, outside = serving_kwargs(kwargs)
        for fast in self.graphs.get(graph_type, ()):
            out = fast(kwargs)
            if out is not MISS:
                if outside:
                    _mutated(outside, fast.mutated_kwargs)
                return out
        return MISS

    def record(self, graph_type: str, wrapper: torch.nn.Module, entry: torch.nn.Module,
               kwargs: Mapping[str, Any]) -> Any:
        """Run ``wrapper(**kwargs)``, the guarded path (in ``NeuronRunner.run``'s context); learn from it when exact."""
        kwargs, outside = serving_kwargs(kwargs)
        signature = tuple(sorted((k, tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__)
                                 for k, v in kwargs.items()))
        learn = self.enabled and (graph_type, signature) not in self.refused
        seen: list[Observed] = []
        result = _observed_call(lambda: wrapper(**kwargs), seen) if learn else wrapper(**kwargs)
        fast = None
        if learn:
            try:
                fast = _learn(graph_type, wrapper, entry, kwargs, seen)
            except Exception as exc:  # learning never breaks a served call
                why = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
                self.refused[(graph_type, signature)] = why
                if isinstance(exc, Refused) and not isinstance(exc, UnknownDynamo):  # the model's own call
                    log.debug("graph type %r %s: no fast path: %s", graph_type, signature, why)
                elif ACTIVITY.say_once(f"fastpath: {why}"):  # this code met a torch it does not know: said
                    log.warning("graph type %r %s: the serve fast path is off for this graph (its calls take "
                                "Dynamo's guarded path: right, slower): %s", graph_type, signature, why,
                                exc_info=not isinstance(exc, Refused))
            else:  # one fast graph per Dynamo cache entry (a shape, or the same shape with other guarded values)
                kept = [g for g in self.graphs.get(graph_type, ())
                        if g.valid() and g.guard_manager is not fast.guard_manager]
                self.graphs[graph_type] = [fast, *kept][:_MAX_PER_GRAPH_TYPE]
        # no fast graph: what the graph wrote is unknown, so every tensor made outside inference mode counts
        _mutated(outside, None if fast is None else fast.mutated_kwargs)
        return result


def _aliasable(value: Any) -> bool:
    return type(value) is torch.Tensor and not value.is_inference() and not value.requires_grad \
        and value.layout is torch.strided and not value.is_conj() and not value.is_neg() \
        and not value.is_quantized and value.device.type != "meta"


def serving_kwargs(kwargs: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, torch.Tensor]]:
    """``kwargs`` with each tensor made outside inference mode aliased as an inference tensor (no copy); the originals.

    Warmup traces with inference tensors and Dynamo's guards tell the kinds apart: an outside tensor would be traced
    again once per graph. The graph writes the same memory; a written original's version is bumped (``_mutated``)."""
    for v in kwargs.values():  # the common case (inference tensors, ints) in one plain loop
        if isinstance(v, torch.Tensor) and not v.is_inference():
            break
    else:
        return kwargs, {}
    outside = {k: v for k, v in kwargs.items() if _aliasable(v)}
    if not outside:
        return kwargs, {}
    with torch.inference_mode():
        aliases = {k: torch.empty(0, dtype=v.dtype, device=v.device).set_(v.untyped_storage(), v.storage_offset(),
                                                                          v.size(), v.stride())
                   for k, v in outside.items()}
    return {**kwargs, **aliases}, outside


def _mutated(outside: Mapping[str, torch.Tensor], written: frozenset[str] | None) -> None:
    """Bump the version of the originals the graph wrote through their aliases (all of them when ``written`` is
    unknown: autograd then refuses a stale saved tensor rather than use it)."""
    bumped = [t for k, t in outside.items() if written is None or k in written]
    if bumped:
        torch.autograd.graph.increment_version(bumped)


# threads recording a guarded call -> the CompiledGraph calls seen in it
_recording: dict[int, list[Observed]] = {}
_recording_lock = threading.Lock()


def _observer(graph: Any, run: Callable[[list[Any]], Any], args: list[Any]) -> Any:
    """``backends.call_observer`` while any thread records: runs the variant, keeps it for that thread."""
    flat = list(args)  # aot may clear a boxed argument list
    outs = run(args)
    seen = _recording.get(threading.get_ident())
    if seen is not None:
        seen.append(Observed(graph, run, flat))
    return outs


def _observed_call(call: Callable[[], Any], seen: list[Observed]) -> Any:
    """``call()`` with every CompiledGraph call this thread makes recorded in ``seen`` (not other threads' calls)."""
    from neuron_args.seams import backends

    me = threading.get_ident()
    with _recording_lock:
        _recording[me] = seen
        backends.call_observer = _observer
    try:
        return call()
    finally:
        with _recording_lock:
            del _recording[me]
            if not _recording:
                backends.call_observer = None


def _learn(graph_type: str, wrapper: torch.nn.Module, entry: torch.nn.Module, kwargs: Mapping[str, Any],
           seen: list[Observed]) -> FastGraph:
    """The fast graph serving calls like the recorded one, or :class:`Refused`."""
    if len(seen) != 1:
        raise Refused(f"the call ran {len(seen)} compiled graphs (graph breaks or nested compiles); one replays")
    obs = seen[0]
    if _module_hooks(entry, wrapper):
        raise Refused("the entry module has hooks")
    try:
        plan = dispatch.plan(obs.graph.fw_metadata, len(obs.args))
    except dispatch.NotPlain as why:  # an output aliasing an input or intermediate too
        raise Refused(str(why)) from None

    # the Dynamo cache entry this call ran, its guards, and its code
    forward, frame_self = _compiled_frame(entry)
    code = forward.__code__
    n_named = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[1:n_named]
    varargs = code.co_varnames[n_named] if code.co_flags & inspect.CO_VARARGS else None
    varkw = code.co_varnames[n_named + bool(varargs)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    extra = frozenset(kwargs) - frozenset(names)
    if extra and varkw is None:
        raise Refused(f"the call passes keyword arguments forward does not name: {sorted(extra)}")
    defaults = dict(zip(names[code.co_argcount - 1 - len(forward.__defaults__ or ()):code.co_argcount - 1],
                        forward.__defaults__ or ()))
    defaults.update(forward.__kwdefaults__ or {})
    missing = [n for n in names if n not in kwargs and n not in defaults]
    if missing:
        raise Refused(f"forward arguments {missing} are not passed")
    star = (varargs, varkw, extra) if varargs or varkw else None
    frame = _frame(defaults, kwargs, frame_self, star)
    entry_used = next((e for e in _cache_entries(code) if e.guard_manager.check(frame)), None)
    if entry_used is None:
        raise Refused(f"no Dynamo cache entry of {type(entry).__name__}.forward accepts the call")
    mutated_kwargs = frozenset(name for name, v in kwargs.items()
                               if any(v is obs.args[i] for i, _, _ in plan.mutated))
    shapes = tuple((k, v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    code_fn, name = _swapped(entry_used.code, forward, obs, plan)
    fast = FastGraph(
        graph_type=graph_type, entry=entry, wrapper=wrapper, frame_self=frame_self, keys=frozenset(kwargs),
        shapes=shapes, defaults=defaults, star=star, guard_manager=entry_used.guard_manager, run=obs.run,
        code=code_fn, mutated=plan.mutated, mutated_kwargs=mutated_kwargs,
    )
    weakref.finalize(fast, code_fn.__globals__.pop, name, None)  # the variant is not kept past its fast graph
    return fast


def _swapped(code: types.CodeType, forward: Callable[..., Any], obs: Observed, plan: dispatch.Plan
             ) -> tuple[Callable[..., Any], str]:
    """Dynamo's ``code`` for ``forward``'s frame as a function with forward's signature, calling the observed
    variant directly where it called the compiled graph (through Dynamo's ``disable`` and the seam's call);
    and the global name the variant's call is installed under (the module's globals: what the code reads)."""
    g = forward.__globals__  # Dynamo installs its compiled graph among the globals of the frame's module
    if any(n.startswith(_RESUME_PREFIX) for n in code.co_names):
        raise Refused("Dynamo's code for the frame resumes after a graph break (its resume function is Dynamo's)")
    graphs = [n for n in code.co_names if n.startswith(_GRAPH_PREFIX)]
    if not graphs and any(_seam_call(g.get(n)) is not None for n in code.co_names):
        raise UnknownDynamo(f"Dynamo's code for the frame names its compiled graph otherwise than {_GRAPH_PREFIX}* "
                            f"(torch {torch.__version__}: see neuron_args/fastpath.py's _swapped)")
    if len(graphs) != 1:
        raise Refused(f"Dynamo's code for the frame calls {len(graphs)} compiled graphs of its own (the graph ran in "
                      "a frame it calls: a graph break there); one replays")
    seam_call = _seam_call(g.get(graphs[0]))
    if seam_call is None:
        raise Refused(f"{graphs[0]} is not the seam's direct call (aot_autograd's runtime wrapper kept)")
    if seam_call.graph is not obs.graph:
        raise UnknownDynamo(f"{graphs[0]} calls another graph than the recorded call ran (torch "
                            f"{torch.__version__}: see neuron_args/fastpath.py's _swapped)")
    name = f"__neuron_args_fast_{next(_SWAPPED_NAMES)}"
    g[name] = dispatch.direct_call(obs.run, plan)
    mine = code.replace(co_names=tuple(name if n == graphs[0] else n for n in code.co_names))
    fn = types.FunctionType(mine, g, forward.__name__, forward.__defaults__, forward.__closure__)
    fn.__kwdefaults__ = forward.__kwdefaults__
    return fn, name


def _compiled_frame(entry: torch.nn.Module) -> tuple[Callable[..., Any], Any]:
    """The function whose frame Dynamo compiled for ``entry``'s calls, and its first local: ``type(entry).forward``,
    or the ``__call__`` of a forward object the instance holds (the runner's ``ServedForward``)."""
    own = entry.__dict__.get("forward")
    if own is not None and not inspect.isfunction(own) and not inspect.ismethod(own):
        return type(own).__call__, own
    return type(entry).forward, entry


def _frame(defaults: Mapping[str, Any], kwargs: Mapping[str, Any], frame_self: Any,
           star: tuple[str | None, str | None, frozenset[str]] | None) -> dict[str, Any]:
    """The compiled frame's locals for this call, as Dynamo's guards see them (``*args``/``**kwargs`` too)."""
    frame = {**defaults, **kwargs, "self": frame_self}
    if star is not None:
        varargs, varkw, extra = star
        if varargs:
            frame[varargs] = ()
        if varkw:  # in call order, as Python builds it
            frame[varkw] = {k: frame.pop(k) for k in kwargs if k in extra}
    return frame


def _seam_call(obj: Any) -> Any:
    """The seam's direct call (``.graph``, ``.plan``) inside Dynamo's ``disable`` wrappers of ``obj``, or None."""
    while obj is not None and getattr(obj, "graph", None) is None:
        obj = getattr(obj, "_torchdynamo_orig_callable", None)
    return obj
