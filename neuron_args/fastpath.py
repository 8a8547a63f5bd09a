"""The serve fast path: a warmed graph's call goes straight to its compiled variant.

A call through ``torch.compile`` pays, besides the executable, Dynamo's frame evaluation (eval-frame
callback, cache lookup, guards), the bytecode Dynamo generated for the frame, and aot_autograd's
runtime wrapper (copy-back of mutated inputs, output handling): 30-60 us on a decode step here,
of which the guards are ~4 us (``benchmarks/bench_serve.py``). ``torch.compiler.set_stance(
skip_guard_eval_unsafe=True)`` saves 2-10 % of the call, and drops the guards' safety.

:class:`FastPath` instead learns, from one call that went through the guarded path, how that call
reached its compiled variant, and replays exactly that:

- **arguments**: each flat graph argument is found by identity among the call's keyword arguments
  and the entry module's parameters and buffers, then read the way Dynamo's bytecode reads it
  (``self._modules['wq']._parameters['weight']``), afresh every call;
- **check**: Dynamo's own guard manager for that compiled frame, run on the call's frame locals
  (shapes, dtypes, strides, devices, grad mode, the module attributes the graph specialized on);
- **copy-back**: aot_autograd's metadata says which graph outputs are new values of mutated
  inputs (a KV cache written by ``index_put_``); they are copied into those inputs, as its runtime
  wrapper does;
- **result**: the graph outputs the guarded call returned, in the same structure.

It is used only when the recorded call proves the replay is exact: one compiled graph per call (no
graph break), Dynamo's bytecode for the frame only gathers arguments, calls the graph and returns
its outputs (no side effects to replay), every argument and returned tensor is identified, every
mutation is a plain data mutation, and the entry has no module hooks. Anything else, any call whose
guards fail, and any Dynamo cache entry that was reset or invalidated, goes through the guarded
path: the fast path never returns what the guarded path would not.
"""
from __future__ import annotations

import dis
import inspect
import logging
import os
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo.eval_frame as _eval_frame
import torch.nn.modules.module as _nn_module

from neuron_args.seams import dispatch

log = logging.getLogger("neuron_args.fastpath")

#: returned by :meth:`FastPath.call` when the call must take the guarded path
MISS: Any = object()
#: set to 0 to serve every call through the guarded path
ENV = "NEURON_ARGS_FAST_PATH"

# per graph type: fast graphs kept (one per Dynamo cache entry; most recently learned first)
_MAX_PER_GRAPH_TYPE = 32

# Dynamo bytecode that only gathers arguments, calls the graph and unpacks its outputs
_PURE_OPS = frozenset({
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PUSH_NULL", "POP_TOP", "COPY", "SWAP", "DUP_TOP", "ROT_TWO",
    "ROT_THREE", "ROT_FOUR", "ROT_N", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR",
    "LOAD_FAST_LOAD_FAST", "LOAD_CONST", "LOAD_SMALL_INT", "LOAD_ATTR", "LOAD_METHOD", "BINARY_SUBSCR",
    "STORE_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST", "DELETE_FAST", "BUILD_LIST", "BUILD_TUPLE",
    "LIST_EXTEND", "LIST_APPEND", "LIST_TO_TUPLE", "UNPACK_SEQUENCE", "RETURN_VALUE", "RETURN_CONST",
    "PRECALL", "CALL", "CALL_FUNCTION", "CALL_METHOD", "KW_NAMES", "MAKE_CELL", "COPY_FREE_VARS",
})
_CALL_OPS = frozenset({"CALL", "CALL_FUNCTION", "CALL_METHOD"})
# attributes the prologue reads to reach parameters and buffers, and Dynamo's bookkeeping calls
_READ_ATTRS = frozenset({"_modules", "_parameters", "_buffers"})
_BOOKKEEPING_CALLS = frozenset({"record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit"})


class Refused(Exception):
    """The recorded call cannot be replayed exactly; the reason says why (kept for inspection)."""


@dataclass
class Observed:
    """One CompiledGraph call seen while recording: the variant that ran, its arguments and outputs."""

    graph: Any
    run: Callable[[list[Any]], Any]
    args: list[Any]
    outs: Any


def _module_hooks(module: torch.nn.Module) -> bool:
    """True when calling ``module`` runs hooks around its forward (the fast path would skip them)."""
    m = _nn_module
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)


def _cache_entries(code: types.CodeType) -> list[Any]:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return list(_debug_get_cache_entry_list(code))


def _check_bytecode(code: types.CodeType, attrs: frozenset[str] = frozenset()) -> None:
    """Refuse unless the frame's Dynamo bytecode only gathers arguments, calls one graph and returns.

    ``attrs``: plain instance attributes of the frame's first local it may also read (the module a
    per-instance forward object holds)."""
    compiled: set[str] = set()
    calls = bookkeeping = 0
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op not in _PURE_OPS:
            raise Refused(f"Dynamo's bytecode for the frame does more than call the graph ({op} {ins.argval!r})")
        if op == "LOAD_GLOBAL":
            name = str(ins.argval).removeprefix("NULL + ")
            if name.startswith("__compiled_fn"):
                compiled.add(name)
            elif not name.startswith("__import_"):
                raise Refused(f"Dynamo's bytecode loads the global {name!r} (a graph break or side effect)")
        elif op in ("LOAD_ATTR", "LOAD_METHOD"):
            name = str(ins.argval).removeprefix("NULL|self + ")
            if name in _BOOKKEEPING_CALLS:
                bookkeeping += 1
            elif name not in _READ_ATTRS and name not in attrs:
                raise Refused(f"Dynamo's bytecode reads the attribute {name!r} outside the graph")
        elif op in _CALL_OPS:
            calls += 1
    if len(compiled) != 1 or calls != 1 + bookkeeping:
        raise Refused(f"Dynamo's bytecode calls {len(compiled)} compiled graphs and {calls - bookkeeping} "
                      "functions; exactly one graph call replays")


def _tensor_paths(value: Any, expr: str, depth: int = 2) -> list[tuple[int, str]]:
    """``(id(tensor), python expression)`` for tensors in a keyword argument (lists/tuples/dicts inside)."""
    if isinstance(value, torch.Tensor):
        return [(id(value), expr)]
    if depth == 0:
        return []
    if type(value) in (list, tuple):
        return [p for i, v in enumerate(value) for p in _tensor_paths(v, f"{expr}[{i}]", depth - 1)]
    if type(value) is dict:
        return [p for k, v in value.items() if type(k) is str for p in _tensor_paths(v, f"{expr}[{k!r}]", depth - 1)]
    return []


def _state_paths(entry: torch.nn.Module) -> dict[int, str]:
    """``id(tensor) -> expression reading it from `self``` for every parameter and buffer of ``entry``."""
    paths: dict[int, str] = {}
    for kind, named in (("_parameters", entry.named_parameters), ("_buffers", entry.named_buffers)):
        for name, t in named(remove_duplicate=False):
            *mods, attr = name.split(".")
            expr = "self" + "".join(f"._modules[{m!r}]" for m in mods) + f".{kind}[{attr!r}]"
            paths.setdefault(id(t), expr)
    return paths


def _compile(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
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
    gather: Callable[[torch.nn.Module, Mapping[str, Any]], list[Any]]
    mutated: tuple[tuple[int, int, bool], ...]  # (argument index, output index, leaf: detach before copy)
    copy_back: Callable[[list[Any], Any], None]  # copies the mutated inputs' new values back (aot's epilogue)
    result: Callable[[Any], Any]
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
        entry = self.entry
        stance = _eval_frame._stance  # torch.compiler.set_stance("force_eager") etc.: Dynamo decides
        if stance.stance != "default" or stance.backend is not None or _module_hooks(entry) \
                or _module_hooks(self.wrapper) or not self.valid():
            return MISS
        if torch.is_inference_mode_enabled():
            return self._dispatch(entry, kwargs)
        with torch.inference_mode():
            return self._dispatch(entry, kwargs)

    def _dispatch(self, entry: torch.nn.Module, kwargs: Mapping[str, Any]) -> Any:
        frame = _frame(self.defaults, kwargs, self.frame_self, self.star)
        if not self.guard_manager.check(frame):
            return MISS
        args = self.gather(entry, kwargs)
        outs = self.run(args)
        self.copy_back(args, outs)
        self.calls += 1
        return self.result(outs)


@dataclass
class FastPath:
    """A runner's fast graphs by graph type, plus why a recorded call could not become one."""

    graphs: dict[str, list[FastGraph]] = field(default_factory=dict)
    refused: dict[tuple[str, Any], str] = field(default_factory=dict)
    enabled: bool = field(default_factory=lambda: os.environ.get(ENV, "1") != "0")

    def call(self, graph_type: str, kwargs: Mapping[str, Any]) -> Any:
        """The result of a warmed call, or :data:`MISS` (then take the guarded path)."""
        for fast in self.graphs.get(graph_type, ()):
            out = fast(kwargs)
            if out is not MISS:
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
        signature = _signature(kwargs)
        if not self.enabled or (graph_type, signature) in self.refused:
            return wrapper(**kwargs)
        seen: list[Observed] = []
        result = _observed_call(lambda: wrapper(**kwargs), seen)
        try:
            fast = _learn(graph_type, wrapper, entry, kwargs, seen, result)
        except Refused as why:
            self.refused[(graph_type, signature)] = str(why)
            log.debug("graph type %r %s: no fast path: %s", graph_type, signature, why)
        except Exception as exc:  # learning never breaks a served call
            self.refused[(graph_type, signature)] = f"{type(exc).__name__}: {exc}"
            log.debug("graph type %r: fast path not learned", graph_type, exc_info=True)
        else:
            # one fast graph per Dynamo cache entry (a shape, or the same shape with other guarded values)
            kept = [g for g in self.graphs.get(graph_type, ()) if g.valid() and g.guard_manager is not fast.guard_manager]
            self.graphs[graph_type] = [fast, *kept][:_MAX_PER_GRAPH_TYPE]
        return result


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
    if _module_hooks(entry) or _module_hooks(wrapper):
        raise Refused("the entry module has hooks")
    try:
        plan = dispatch.plan(obs.graph.fw_metadata, len(obs.args))
    except dispatch.NotPlain as why:
        raise Refused(str(why)) from None
    outs = list(obs.outs) if isinstance(obs.outs, (list, tuple)) else None
    n_mut = plan.n_mutated
    if outs is None or len(outs) != n_mut + plan.n_outputs:
        raise Refused("the graph's outputs are not the plain form aot_autograd metadata describes")

    # arguments: keyword arguments first, then the entry's parameters and buffers
    sources = {tid: expr for name, value in kwargs.items() for tid, expr in _tensor_paths(value, f"kw[{name!r}]")}
    for tid, expr in _state_paths(entry).items():
        sources.setdefault(tid, expr)
    exprs = []
    for i, a in enumerate(obs.args):
        expr = sources.get(id(a)) if isinstance(a, torch.Tensor) else None
        if expr is None:
            raise Refused(f"graph argument {i} is neither a keyword argument nor a parameter/buffer of the entry")
        exprs.append(expr)
    gather = _compile("def gather(self, kw):\n    return [" + ", ".join(exprs) + "]\n", "gather")

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
    _check_bytecode(entry_used.code, _module_attrs(frame_self) if frame_self is not entry else frozenset())
    shapes = tuple((k, v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return FastGraph(
        graph_type=graph_type, entry=entry, wrapper=wrapper, frame_self=frame_self, keys=frozenset(kwargs),
        shapes=shapes,
        defaults=defaults, star=star, guard_manager=entry_used.guard_manager, run=obs.run, gather=gather,
        mutated=plan.mutated, copy_back=plan.copy_back, result=make_result,
    )


def _compiled_frame(entry: torch.nn.Module) -> tuple[Callable[..., Any], Any]:
    """The function whose frame Dynamo compiled for ``entry``'s calls, and its first local.

    ``type(entry).forward`` bound to the entry, unless the instance has a forward object of its own
    (the runner's ``ServedForward``): Dynamo then compiled that object's ``__call__``.
    """
    own = entry.__dict__.get("forward")
    if own is not None and not inspect.isfunction(own) and not inspect.ismethod(own):
        return type(own).__call__, own
    return type(entry).forward, entry


def _module_attrs(obj: Any) -> frozenset[str]:
    """Names of ``obj``'s plain instance attributes that hold modules (pure reads for Dynamo's prologue)."""
    return frozenset(k for k, v in vars(obj).items() if isinstance(v, torch.nn.Module))


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

