"""The serve fast path: a warmed graph's call goes straight to its compiled variant.

A call through ``torch.compile`` pays, besides the executable, Dynamo's frame evaluation (eval-frame
callback, cache lookup, guards), the bytecode Dynamo generated for the frame, and aot_autograd's
runtime wrapper (copy-back of mutated inputs, output handling): 30-60 us on a decode step here,
of which the guards are ~4 us (``benchmarks/bench_serve.py``). ``torch.compiler.set_stance(
skip_guard_eval_unsafe=True)`` saves 2-10 % of the call, and drops the guards' safety.

:class:`FastPath` instead learns, from one call that went through the guarded path, how that call
reached its compiled variant, and replays exactly that:

- **arguments**: Dynamo's bytecode for the frame is read symbolically; the tensors it passes the graph
  are reads of the frame's locals and module globals through attributes and constant subscripts
  (``self._modules['wq']._parameters['weight']``, ``kwargs['input_ids']``, a KV cache's
  ``self.cache.layers[0].keys``), replayed the same way afresh every call. Reads go through
  instance dictionaries and ``dict``/``list``/``tuple`` items only (no code of their own runs);
  a tensor a module holds outside its parameters and buffers is not replayed;
- **check**: Dynamo's own guard manager for that compiled frame, run on the call's frame locals
  (shapes, dtypes, strides, devices, grad mode, the module attributes the graph specialized on);
- **copy-back**: aot_autograd's metadata says which graph outputs are new values of mutated
  inputs (a KV cache written by ``index_put_``); they are copied into those inputs, as its runtime
  wrapper does;
- **result**: the graph outputs the guarded call returned, in the same structure;
- **writes**: the constants Dynamo's bytecode writes to module-global state after the graph
  (transformers' output capturing resets ``_active_collector.global_var``/``compiling`` after every
  call), written the same way, after the graph.

It is used only when the recorded call proves the replay is exact: one compiled graph per call (no
graph break), Dynamo's bytecode for the frame only reads, calls that graph (and its own bookkeeping),
writes constants to objects reached from module globals and returns the outputs (any other call,
read of a computed value or write, e.g. to the module's own attributes, is refused), every argument
and returned tensor is identified, every mutation is a plain data mutation, and the entry has no
module hooks. Anything else, any call whose guards fail, and any Dynamo cache entry that was reset
or invalidated, goes through the guarded path: the fast path never returns what the guarded path
would not. ``FastPath.refused`` keeps why a recorded call was not learned.
"""
from __future__ import annotations

import dis
import inspect
import logging
import sys
import threading
import types
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

class Refused(Exception):
    """The recorded call cannot be replayed exactly; the reason says why (kept for inspection)."""


class UnknownBytecode(Refused):
    """Dynamo's bytecode holds an opcode :func:`_read_bytecode` does not interpret: most likely a Python or
    torch it was not written for (``tests/test_fastpath_bytecode.py`` fails then), else work outside the graph.
    Warned, not silent: the fast path is off for that graph."""


@dataclass
class Observed:
    """One CompiledGraph call seen while recording: the variant that ran, its arguments and outputs."""

    graph: Any
    run: Callable[[list[Any]], Any]
    args: list[Any]
    outs: Any


def _module_hooks(module: torch.nn.Module, other: torch.nn.Module | None = None) -> bool:
    """True when calling ``module`` (or ``other``) runs hooks around its forward (the fast path would skip them)."""
    m = _nn_module
    if m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks \
            or m._global_backward_pre_hooks:
        return True
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks:
        return True
    return other is not None and bool(other._forward_hooks or other._forward_pre_hooks or other._backward_hooks
                                      or other._backward_pre_hooks)


def _cache_entries(code: types.CodeType) -> list[Any]:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return list(_debug_get_cache_entry_list(code))


def _compile(source: str, name: str, namespace: dict[str, Any] | None = None) -> Callable[..., Any]:
    namespace = dict(namespace or {})
    exec(compile(source, f"<neuron_args.fastpath {name}>", "exec"), namespace)  # noqa: S102 - generated above
    return namespace[name]


@dataclass
class FastGraph:
    """One warmed graph type's call (one Dynamo cache entry): replays its recorded call without Dynamo."""

    graph_type: str
    entry: torch.nn.Module
    wrapper: torch.nn.Module
    frame_self: Any  # the first local of the frame Dynamo compiled (the entry, or its per-instance forward)
    keys: frozenset[str]
    shapes: tuple[tuple[str, torch.Size], ...]
    defaults: dict[str, Any]
    star: tuple[str | None, str | None, frozenset[str]] | None  # forward's *args, **kwargs names; extra keys
    guard_manager: Any
    run: Callable[[list[Any]], Any]
    gather: Callable[[Mapping[str, Any]], list[Any]]  # the graph's arguments, read from the frame's locals
    mutated: tuple[tuple[int, int, bool], ...]  # (argument index, output index, leaf: detach before copy)
    copy_back: Callable[[list[Any], Any], None]  # copies the mutated inputs' new values back (aot's epilogue)
    result: Callable[[Any], Any]
    writes: Callable[[Mapping[str, Any]], None] | None = None  # the constants Dynamo's bytecode writes after the graph
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

    def arguments(self, kwargs: Mapping[str, Any], entry: torch.nn.Module | None = None) -> list[Any]:
        """The graph's flat arguments for a call with ``kwargs`` (of ``entry``: a copy of the entry, by default
        the entry), read as a served call reads them (benchmarks call the variant on them)."""
        frame_self = self.frame_self if entry is None else _compiled_frame(entry)[1]
        return self.gather(_frame(self.defaults, kwargs, frame_self, self.star))

    def _dispatch(self, kwargs: Mapping[str, Any]) -> Any:
        frame = _frame(self.defaults, kwargs, self.frame_self, self.star)
        if not self.guard_manager.check(frame):
            return MISS
        args = self.gather(frame)
        outs = self.run(args)
        self.copy_back(args, outs)
        if self.writes is not None:
            self.writes(frame)
        self.calls += 1
        return self.result(outs)


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

    def clear(self) -> None:
        self.graphs.clear()
        self.refused.clear()

    def record(self, graph_type: str, wrapper: torch.nn.Module, entry: torch.nn.Module,
               kwargs: Mapping[str, Any]) -> Any:
        """Run ``wrapper(**kwargs)`` (the guarded path) and learn a fast graph from it when exact.

        Call inside the scope and inference mode the guarded call needs; returns its result.
        """
        kwargs, outside = serving_kwargs(kwargs)
        signature = _signature(kwargs)
        if not self.enabled or (graph_type, signature) in self.refused:
            result = wrapper(**kwargs)
            _mutated(outside, None)
            return result
        seen: list[Observed] = []
        result = _observed_call(lambda: wrapper(**kwargs), seen)
        mutated: frozenset[str] | None = None  # unknown: every tensor made outside inference mode counts as written
        try:
            fast = _learn(graph_type, wrapper, entry, kwargs, seen, result)
        except Exception as exc:  # learning never breaks a served call
            why = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
            self.refused[(graph_type, signature)] = why
            if isinstance(exc, Refused) and not isinstance(exc, UnknownBytecode):  # the model's own call
                log.debug("graph type %r %s: no fast path: %s", graph_type, signature, why)
            elif ACTIVITY.say_once(f"fastpath: {why}"):  # this code met a Python or torch it does not know: said
                log.warning("graph type %r %s: the serve fast path is off for this graph (its calls take Dynamo's "
                            "guarded path: right, slower): %s", graph_type, signature, why,
                            exc_info=not isinstance(exc, Refused))
        else:
            # one fast graph per Dynamo cache entry (a shape, or the same shape with other guarded values)
            kept = [g for g in self.graphs.get(graph_type, ()) if g.valid() and g.guard_manager is not fast.guard_manager]
            self.graphs[graph_type] = [fast, *kept][:_MAX_PER_GRAPH_TYPE]
            mutated = fast.mutated_kwargs
        _mutated(outside, mutated)
        return result


def _aliasable(value: Any) -> bool:
    return type(value) is torch.Tensor and not value.is_inference() and not value.requires_grad \
        and value.layout is torch.strided and not value.is_conj() and not value.is_neg() \
        and not value.is_quantized and value.device.type != "meta"


def serving_kwargs(kwargs: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, torch.Tensor]]:
    """``kwargs`` with each tensor made outside ``torch.inference_mode()`` replaced by an inference tensor on the
    same memory (no copy), and those originals by name.

    Warmup traces with inference tensors, and Dynamo's guards tell the two kinds apart (dispatch keys:
    ``ADInplaceOrView``): a served tensor from outside inference mode would otherwise be traced again,
    once per graph. The graph reads and writes the same memory either way; the original of a tensor
    the graph writes gets its version bumped (:func:`_mutated`), as an in-place write would.
    """
    for v in kwargs.values():  # the common case (inference tensors, ints) in one plain loop
        if isinstance(v, torch.Tensor) and not v.is_inference():
            break
    else:
        return kwargs, {}
    if not any(_aliasable(v) for v in kwargs.values()):
        return kwargs, {}
    outside = {k: v for k, v in kwargs.items() if _aliasable(v)}
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


def _signature(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__)
                        for k, v in kwargs.items()))


# threads recording a guarded call -> the CompiledGraph calls seen in it
_recording: dict[int, list[Observed]] = {}
_recording_lock = threading.Lock()


def _observer(graph: Any, run: Callable[[list[Any]], Any], args: list[Any]) -> Any:
    """``backends.call_observer`` while any thread records: runs the variant, keeps it for that thread."""
    flat = list(args)  # aot may clear a boxed argument list
    outs = run(args)
    seen = _recording.get(threading.get_ident())
    if seen is not None:
        seen.append(Observed(graph, run, flat, outs))
    return outs


def _observed_call(call: Callable[[], Any], seen: list[Observed]) -> Any:
    """``call()`` with every CompiledGraph call this thread makes recorded in ``seen``.

    Other threads keep running (and compiling) meanwhile; only their calls are not recorded.
    """
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
           seen: list[Observed], result: Any) -> FastGraph:
    """The fast graph replaying the recorded call, or :class:`Refused`."""
    if len(seen) != 1:
        raise Refused(f"the call ran {len(seen)} compiled graphs (graph breaks or nested compiles); one replays")
    obs = seen[0]
    if _module_hooks(entry, wrapper):
        raise Refused("the entry module has hooks")
    try:
        plan = dispatch.plan(obs.graph.fw_metadata, len(obs.args))
    except dispatch.NotPlain as why:
        raise Refused(str(why)) from None
    outs = list(obs.outs) if isinstance(obs.outs, (list, tuple)) else None
    n_mut = plan.n_mutated
    if outs is None or len(outs) != n_mut + plan.n_outputs:
        raise Refused("the graph's outputs are not the plain form aot_autograd metadata describes")

    # result: the same tensors, in the same structure
    user = {id(o): k for k, o in enumerate(outs) if k >= n_mut}

    def expr_of(value: Any) -> str:
        k = user.get(id(value)) if isinstance(value, torch.Tensor) else None
        if k is None:
            raise Refused(f"the call returns a {type(value).__name__} that is not a graph output as computed")
        kind = plan.kinds[k - n_mut]
        if kind not in dispatch.OWNED:  # aot_autograd regenerates aliases of inputs/intermediates itself
            raise Refused(f"the call returns graph output {k}, which aliases ({kind}) rather than owns its data")
        return f"outs[{k}]"

    if isinstance(result, torch.Tensor):
        body = expr_of(result)
    elif type(result) in (tuple, list):
        items = ", ".join(expr_of(v) for v in result)
        body = f"({items},)" if type(result) is tuple else f"[{items}]"
    else:
        raise Refused(f"the call returns a {type(result).__name__}; a tensor, tuple or list replays")
    make_result = _compile(f"def result(outs):\n    return {body}\n", "result")

    # the Dynamo cache entry this call ran, its guards, and its bytecode
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
    g = forward.__globals__  # the globals of Dynamo's code for the frame (its compiled graph is one)
    replay = _read_bytecode(entry_used.code, g)

    # arguments: the tensors Dynamo's bytecode passes the graph, read the same way afresh every call
    sources: dict[int, _Path] = {}
    for value in replay.graph_args:
        if isinstance(value, _Path):
            tensor = _evaluate(value, frame, g)
            if isinstance(tensor, torch.Tensor) and not _module_attribute(value, frame, g):
                sources.setdefault(id(tensor), value)
    paths = []
    for i, a in enumerate(obs.args):
        path = sources.get(id(a)) if isinstance(a, torch.Tensor) else None
        if path is None:
            raise Refused(f"graph argument {i} is neither a keyword argument nor a parameter/buffer of the entry, "
                          "nor a tensor held by a non-module object the frame reaches (a KV cache)")
        paths.append(path)
    mutated_kwargs = frozenset(name for i, _, _ in plan.mutated
                               if (name := _keyword_of(paths[i], kwargs, star)) is not None)
    gather = _compile(_gather_source(paths), "gather", {"g": g})
    shapes = tuple((k, v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return FastGraph(
        graph_type=graph_type, entry=entry, wrapper=wrapper, frame_self=frame_self, keys=frozenset(kwargs),
        shapes=shapes,
        defaults=defaults, star=star, guard_manager=entry_used.guard_manager, run=obs.run, gather=gather,
        mutated=plan.mutated, copy_back=plan.copy_back, result=make_result, writes=_writes(replay.writes, g),
        mutated_kwargs=mutated_kwargs,
    )


def _keyword_of(path: _Path, kwargs: Mapping[str, Any], star: tuple[str | None, str | None, frozenset[str]] | None
                ) -> str | None:
    """The keyword argument ``path`` reads as a whole (``f['x']``, or ``f['kwargs']['x']`` through ``**kwargs``)."""
    if path.root != "f":
        return None
    if not path.steps:
        return path.name if path.name in kwargs else None
    if star is not None and path.name == star[1] and len(path.steps) == 1 and path.steps[0][0] == "[]":
        key = path.steps[0][1]
        return key if key in kwargs else None
    return None


def _gather_source(paths: list[_Path]) -> str:
    """``def gather(f)`` reading ``paths`` in order, each shared prefix once (as Dynamo's bytecode keeps them in
    temporaries: a decoder's 30 arguments share ``self.module._modules['model']...``)."""
    def prefixes(p: _Path) -> list[_Path]:
        return [_Path(p.root, p.name, p.steps[:k]) for k in range(len(p.steps))]

    uses: dict[_Path, int] = {}
    for p in paths:
        for q in prefixes(p):
            uses[q] = uses.get(q, 0) + 1
    named: dict[_Path, str] = {}
    lines = ["def gather(f):"]

    def expr(p: _Path) -> str:
        for k in range(len(p.steps), -1, -1):
            base = named.get(_Path(p.root, p.name, p.steps[:k]))
            if base is not None:
                return base + "".join(f".{key}" if kind == "." else f"[{key!r}]" for kind, key in p.steps[k:])
        return p.source()

    for p in paths:
        for q in prefixes(p):
            if uses[q] > 1 and q not in named:
                lines.append(f"    t{len(named)} = {expr(q)}")
                named[q] = f"t{len(named)}"
    lines.append("    return [" + ", ".join(expr(p) for p in paths) + "]")
    return "\n".join(lines) + "\n"


def _module_attribute(path: _Path, frame: Mapping[str, Any], g: Mapping[str, Any]) -> bool:
    """True when ``path`` ends with a plain attribute of an ``nn.Module``: a tensor a module holds outside its
    parameters and buffers (not replayed: a module's state is its registered tensors)."""
    if not path.steps or path.steps[-1][0] != ".":
        return False
    return isinstance(_evaluate(_Path(path.root, path.name, path.steps[:-1]), frame, g), torch.nn.Module)


def _writes(writes: list[tuple[str, _Path | None, str, Any]], g: Mapping[str, Any]) -> Callable[..., None] | None:
    """The function replaying Dynamo's writes of constants after the graph call, or None when there are none."""
    if not writes:
        return None
    namespace: dict[str, Any] = {"g": g, "set_attr": _dynamo_util(_SETATTR_CALL)}
    lines = ["def writes(f):"]
    for k, (kind, target, name, value) in enumerate(writes):
        namespace[f"c{k}"] = value
        if kind == "global":
            lines.append(f"    g[{name!r}] = c{k}")
        elif kind == "attr":
            lines.append(f"    {target.source()}.{name} = c{k}")
        else:
            lines.append(f"    set_attr({target.source()}, {name!r}, c{k})")
    return _compile("\n".join(lines) + "\n", "writes", namespace)


def _compiled_frame(entry: torch.nn.Module) -> tuple[Callable[..., Any], Any]:
    """The function whose frame Dynamo compiled for ``entry``'s calls, and its first local.

    ``type(entry).forward`` bound to the entry, unless the instance has a forward object of its own
    (the runner's ``ServedForward``): Dynamo then compiled that object's ``__call__``.
    """
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


# -- reading Dynamo's bytecode for the frame ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Path:
    """A value Dynamo's bytecode reads: a frame local (``f``) or a global of the frame's module (``g``), then
    attribute (``.``) and constant-subscript (``[]``) steps."""

    root: str
    name: str
    steps: tuple[tuple[str, Any], ...] = ()

    def then(self, kind: str, key: Any) -> _Path:
        return _Path(self.root, self.name, (*self.steps, (kind, key)))

    def source(self) -> str:
        """Python reading this value from the frame's locals ``f`` and globals ``g``."""
        return f"{self.root}[{self.name!r}]" + "".join(
            f".{key}" if kind == "." else f"[{key!r}]" for kind, key in self.steps)

    def __str__(self) -> str:
        return self.name + "".join(f".{key}" if kind == "." else f"[{key!r}]" for kind, key in self.steps)


@dataclass(frozen=True)
class _Const:
    value: Any


class _Opaque:
    """A value the bytecode made (a graph output, a list, a bookkeeping call's result): moved, never read from."""


_NULL, _OPAQUE = object(), _Opaque()
# constants a replayed write may store (what transformers' output capturing resets its global to)
_CONST_TYPES = (type(None), bool, int, float, str)
_NO_EFFECT_CALLS = ("record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit")  # Dynamo's bookkeeping
_SETATTR_CALL = "object_setattr_ignore_descriptor"  # how Dynamo replays ``obj.name = value`` on an object


@dataclass
class _Replay:
    """What Dynamo's bytecode for the frame does: the graph call's arguments, then writes of constants."""

    graph_args: list[Any]
    writes: list[tuple[str, _Path | None, str, Any]]  # (how, object or None for a global, name, constant)


_VERSIONS = (f" (Python {sys.version_info.major}.{sys.version_info.minor}, torch {torch.__version__}: on a new one, "
             "teach neuron_args/fastpath.py's _read_bytecode the opcode; or the frame does work outside the graph)")


def _dynamo_util(name: str) -> Any:
    import torch._dynamo.utils as utils

    return getattr(utils, name, None)


def _read_bytecode(code: types.CodeType, g: Mapping[str, Any]) -> _Replay:
    """Interpret Dynamo's bytecode symbolically, or :class:`Refused` for anything that is not: reads of frame
    locals and globals, one graph call, Dynamo's bookkeeping calls, writes of constants to objects reached from
    module globals (transformers' output capturing resets one after every call), and moving the outputs."""
    after = sys.version_info >= (3, 13)  # CALL pops [callable, self_or_null, args] (3.13), before [null_or_fn, ...]
    n_in = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) \
        + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    local: dict[str, Any] = {name: _Path("f", name) for name in code.co_varnames[:n_in]}
    stack: list[Any] = []
    kw_names: Any = ()
    graph_args: list[Any] | None = None
    writes: list[tuple[str, _Path | None, str, Any]] = []
    no_effect = [f for f in map(_dynamo_util, _NO_EFFECT_CALLS) if f is not None]
    setattr_fn = _dynamo_util(_SETATTR_CALL)

    def pop(n: int = 1) -> list[Any]:
        if len(stack) < n:
            raise UnknownBytecode(f"Dynamo's bytecode for the frame is not understood (stack underflow){_VERSIONS}")
        taken = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return taken

    def load(name: str) -> Any:
        if name not in local:
            raise Refused(f"Dynamo's bytecode reads the local {name!r} before setting it")
        return local[name]

    def resolve(value: Any) -> Any:
        """The object a global-rooted path names (callees: Dynamo's own utilities, the compiled graph)."""
        if not isinstance(value, _Path) or value.root != "g":
            return _NULL
        return _evaluate(value, {}, g)

    def write(how: str, target: Any, name: str, value: Any) -> None:
        where = f"{target}.{name}" if how != "global" else name
        if not isinstance(value, _Const) or not isinstance(value.value, _CONST_TYPES):
            raise Refused(f"Dynamo's bytecode writes {where} = a value the call computed, outside the graph")
        if how != "global" and (not isinstance(target, _Path) or target.root != "g"):
            raise Refused(f"Dynamo's bytecode writes {where} outside the graph (state the frame reaches; only "
                          "writes of constants to module-global state replay)")
        if graph_args is None:
            raise Refused(f"Dynamo's bytecode writes {where} before the graph call, outside the graph")
        writes.append((how, target if how != "global" else None, name, value.value))

    for ins in dis.get_instructions(code):
        op, arg, val = ins.opname, ins.arg, ins.argval
        if op in ("RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PRECALL", "MAKE_CELL", "COPY_FREE_VARS"):
            continue
        if op == "PUSH_NULL":
            stack.append(_NULL)
        elif op == "POP_TOP":
            pop()
        elif op == "COPY":
            stack.append(stack[-arg])
        elif op == "SWAP":
            stack[-1], stack[-arg] = stack[-arg], stack[-1]
        elif op in ("LOAD_CONST", "LOAD_SMALL_INT"):
            stack.append(_Const(val))
        elif op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST"):
            stack.extend(load(n) for n in (val if isinstance(val, tuple) else (val,)))
        elif op in ("STORE_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST"):
            names = val if isinstance(val, tuple) else (val,)
            if op == "STORE_FAST_LOAD_FAST":
                local[names[0]] = pop()[0]
                stack.append(load(names[1]))
            else:
                for n in names:
                    local[n] = pop()[0]
        elif op == "DELETE_FAST":
            local.pop(val, None)
        elif op == "LOAD_GLOBAL":
            if val not in g:
                raise Refused(f"Dynamo's bytecode loads {val!r}, not a global of the frame's module")
            pushed = [_Path("g", val)]
            if arg & 1:
                pushed = [*pushed, _NULL] if after else [_NULL, *pushed]
            stack.extend(pushed)
        elif op in ("LOAD_ATTR", "LOAD_METHOD"):
            (obj,) = pop()
            if not isinstance(obj, _Path):
                raise Refused(f"Dynamo's bytecode reads the attribute {val!r} of a value it made, outside the graph")
            attr = obj.then(".", val)
            method = op == "LOAD_METHOD" or (sys.version_info >= (3, 12) and arg & 1)
            stack.extend(([attr, _NULL] if after else [_NULL, attr]) if method else [attr])
        elif op == "BINARY_SUBSCR":
            obj, key = pop(2)
            if not isinstance(key, _Const) or not isinstance(key.value, (str, int)):
                raise Refused("Dynamo's bytecode subscripts with a computed key, outside the graph")
            stack.append(obj.then("[]", key.value) if isinstance(obj, _Path) else _OPAQUE)
        elif op in ("BUILD_LIST", "BUILD_TUPLE"):
            pop(arg)
            stack.append(_OPAQUE)
        elif op in ("LIST_EXTEND", "LIST_APPEND"):
            pop()
        elif op == "LIST_TO_TUPLE":
            pop()
            stack.append(_OPAQUE)
        elif op == "UNPACK_SEQUENCE":
            pop()
            stack.extend([_OPAQUE] * arg)
        elif op == "KW_NAMES":
            kw_names = val
        elif op in ("CALL", "CALL_KW"):
            if op == "CALL_KW":
                (kw,) = pop()
                kw_names = kw.value if isinstance(kw, _Const) else ("?",)
            args = pop(arg)
            first, second = pop(2)
            if after:
                callee, args = first, ([] if second is _NULL else [second]) + args
            else:
                callee, args = (second, args) if first is _NULL else (first, [second, *args])
            kws, kw_names = kw_names, ()
            fn = resolve(callee)
            if isinstance(callee, _Path) and callee.root == "g" and not callee.steps \
                    and callee.name.startswith("__compiled_fn"):
                if graph_args is not None or kws:
                    raise Refused("Dynamo's bytecode calls compiled graphs more than once; one graph call replays")
                graph_args = args
            elif any(fn is f for f in no_effect) and not kws:
                pass  # Dynamo's bookkeeping call (no effect on the module): nothing to replay
            elif fn is setattr_fn and fn is not None and not kws and len(args) == 3 \
                    and isinstance(args[1], _Const) and isinstance(args[1].value, str):
                write("setattr", args[0], args[1].value, args[2])
            else:
                raise Refused(f"Dynamo's bytecode calls {callee if isinstance(callee, _Path) else 'a value'} "
                              "outside the graph (a graph break or side effect)")
            stack.append(_OPAQUE)
        elif op == "STORE_ATTR":
            value, obj = pop(2)
            write("attr", obj, val, value)
        elif op == "STORE_GLOBAL":
            write("global", None, val, pop()[0])
        elif op in ("RETURN_VALUE", "RETURN_CONST"):
            break
        else:
            raise UnknownBytecode(f"Dynamo's bytecode for the frame has {op} {val!r}, an opcode the fast path's reader "
                                  f"does not interpret{_VERSIONS}")
    if graph_args is None:
        raise Refused("Dynamo's bytecode for the frame calls no compiled graph")
    return _Replay(graph_args, writes)


def _evaluate(path: _Path, f: Mapping[str, Any], g: Mapping[str, Any]) -> Any:
    """``path``'s value now, read only through instance/module dictionaries and ``dict``/``list``/``tuple``
    items (so reading it runs no code of its own: skipping or reordering Dynamo's reads changes nothing)."""
    root = f if path.root == "f" else g
    if path.name not in root:
        raise Refused(f"{path} is not there to read")
    obj = root[path.name]
    for kind, key in path.steps:
        if kind == "[]":
            if type(obj) not in (dict, list, tuple):
                raise Refused(f"{path}: Dynamo's bytecode subscripts a {type(obj).__name__} (code of its own)")
            obj = obj[key]
            continue
        cls = type(obj)
        static = inspect.getattr_static(cls, key, None)
        if cls.__getattribute__ not in (object.__getattribute__, types.ModuleType.__getattribute__) \
                or hasattr(type(static), "__set__") or hasattr(type(static), "__delete__") \
                or key not in getattr(obj, "__dict__", ()):
            raise Refused(f"{path}: .{key} of a {cls.__name__} is not a plain instance attribute")
        obj = obj.__dict__[key]
    return obj
