"""Lower an aot_autograd forward graph (ATen, functionalized) to HLO with torchax + jax, x64 off (64-bit tensors
as their 32-bit type). jax and torchax are imported on the first lowering (a jax client breaks forked children)."""
from __future__ import annotations

import dataclasses
import functools
import operator
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from neuron_args.errors import LoweringError
from neuron_args.lazy_modules import jax, jnp
from neuron_args.lowering import hashing, precision
from neuron_args.scope import current_graph_type
from neuron_args.tensors import LOWERED_DTYPES, WORD_PAIR_DTYPES, TensorSpec, numpy_dtype, tensor_to_numpy
from neuron_args.text import first_line

_lock = threading.RLock()

_STATIC_HINT = (
    "Neuron graphs are static: pass torch.compile(..., dynamic=False) (and avoid "
    "torch._dynamo.mark_dynamic) so every input has fixed sizes."
)


@dataclasses.dataclass(frozen=True)
class LoweredGraph:
    """One lowered graph: the compiler's ``HloModuleProto``, the canonical text the cache key hashes (the proto is
    not stable across lowerings) and the specs :func:`neuron_args.runtime.graph_call` needs."""

    hlo_module_proto: bytes
    hlo_text: str
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    result_shapes: tuple[str, ...]
    #: ``(position, value)`` of each graph output that is not in the HLO (``None``, a Python
    #: constant), in ascending position; the HLO returns the other outputs, in order
    constant_outputs: tuple[tuple[int, Any], ...] = ()
    #: the graph draws random numbers: its last input (:data:`SEED_SPEC`, not a graph input) is the key
    seeded: bool = False
    #: positions of the graph inputs that are effect tokens (``None`` at run time), not in ``input_specs``
    token_inputs: tuple[int, ...] = ()

    @property
    def graph_input_specs(self) -> tuple[TensorSpec, ...]:
        """The specs of the FX graph's tensor inputs (``input_specs`` without the random key)."""
        return self.input_specs[:-1] if self.seeded else self.input_specs


#: the random key input of a seeded graph: two 32-bit words (the raw data of a jax PRNG key)
SEED_SPEC = TensorSpec((2,), "int32")


def lower_fx_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> LoweredGraph:
    """Lower ``gm`` for inputs shaped like ``example_inputs`` (fakes do); :class:`LoweringError` names the node."""
    for refused in (precision.refusal(gm), hashing.refusal(gm)):  # a 64-bit float computation, a hash used inside
        if refused is not None:
            raise LoweringError(_cannot_lower(*refused))
    input_specs, tokens = _input_specs(gm, example_inputs)
    output_specs, constants = _output_specs(gm)
    specs = LoweredGraph(hlo_module_proto=b"", hlo_text="", result_shapes=(),  # the HLO: _lower fills them in
                         input_specs=input_specs, output_specs=output_specs, constant_outputs=constants,
                         token_inputs=tokens)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # real tensors under aot_autograd's fake mode (graph constants, torchax's own); one lowering at a time:
    # the torchax environment and its torch modes are shared by the process
    with _lock, unset_fake_temporarily():
        try:
            return _lower(gm, specs)
        except _NeedsRandomKey:  # an op drew random numbers: lower again, with a key input
            return _lower(gm, dataclasses.replace(specs, input_specs=specs.input_specs + (SEED_SPEC,), seeded=True))


def _is_token(node: Any) -> bool:
    """``node`` is the token a ``with_effects`` node returns (its item 0)."""
    return (isinstance(node, torch.fx.Node) and node.target is operator.getitem and node.args[1] == 0
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].target is _WITH_EFFECTS)


def _input_specs(gm: torch.fx.GraphModule,
                 example_inputs: Sequence[Any]) -> tuple[tuple[TensorSpec, ...], tuple[int, ...]]:
    """The tensor inputs' specs, and the positions of the effect tokens ``with_effects`` orders on (``None``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise LoweringError(
            f"graph has {len(placeholders)} inputs but {len(example_inputs)} example inputs were "
            "given; pass the example inputs the forward compiler received"
        )
    specs, tokens = [], []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if node.users and all(u.target is _WITH_EFFECTS and u.args[0] is node for u in node.users):
            tokens.append(i)
            continue
        if not isinstance(value, torch.Tensor):
            kind = "a symbolic size" if isinstance(value, torch.SymInt) else type(value).__name__
            raise LoweringError(f"graph input {node.name!r} is {kind}, not a tensor. {_STATIC_HINT}")
        if any(not isinstance(d, int) for d in value.shape):
            raise LoweringError(f"graph input {node.name!r} has symbolic shape {tuple(value.shape)}. {_STATIC_HINT}")
        specs.append(TensorSpec.of(value))
    return tuple(specs), tuple(tokens)


def _output_specs(gm: torch.fx.GraphModule) -> tuple[tuple[TensorSpec, ...], tuple[tuple[int, Any], ...]]:
    """The tensor outputs' specs, and the outputs kept out of the HLO (a ``None`` gradient, an effect token)."""
    specs, constants = [], []
    for i, node in enumerate(_returned(gm)):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
            raise LoweringError(f"graph output {i} ({node}) is the symbolic value {val}. {_symbolic_hint(gm, val)}")
        if _is_token(node):
            constants.append((i, None))
            continue
        if node is None or (not isinstance(val, torch.Tensor) and isinstance(val, _CONSTANT_TYPES)):
            constants.append((i, val))
            continue
        if not isinstance(val, torch.Tensor):
            raise LoweringError(
                f"graph output {i} ({node}) is {type(val).__name__}, not a tensor with a recorded "
                "value (meta['val']) or a constant; only aot_autograd graphs returning tensors lower"
            )
        # static: every size an int, or a symbolic one whose expression is a constant
        if not all(isinstance(d, int) or d.node.maybe_as_int() is not None for d in val.shape):
            raise LoweringError(
                f"graph output {i} has symbolic shape {tuple(val.shape)}. {_symbolic_hint(gm, val.shape)}"
            )
        specs.append(TensorSpec.of(val))
    return tuple(specs), tuple(constants)


def _returned(gm: torch.fx.GraphModule) -> tuple[Any, ...]:
    """The values the graph's output node lists."""
    values = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    return tuple(values) if isinstance(values, (tuple, list)) else (values,)


def _symbolic_hint(gm: torch.fx.GraphModule, value: Any) -> str:
    """Why ``value`` (a shape or a symbolic scalar) is not static, and the fix; an unbacked size names the first op
    that made one from tensor values and the user's line."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if not free_unbacked_symbols(value):
        return _STATIC_HINT
    origin = next((n for n in gm.graph.nodes if n.op == "call_function" and free_unbacked_symbols(n.meta.get("val"))),
                  None)
    made, fix = "", None
    if origin is not None:
        where = _user_source(origin)
        made = f" (op {_op_name(origin)}" + (f", from {where})" if where else ")")
        fix = _data_dependent_fix(_op_name(origin), gm.graph)
    return (f"Its size depends on tensor values{made}, which a static Neuron graph cannot hold: " + (fix or (
        "keep sizes fixed (a mask with torch.where instead of boolean indexing or nonzero), or compute that part "
        "outside the compiled function.")))


#: graph outputs returned as they are, outside the HLO
_CONSTANT_TYPES = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
                   torch.memory_format)


def _lower(gm: torch.fx.GraphModule, specs: LoweredGraph) -> LoweredGraph:
    """``specs`` with the HLO of ``gm`` lowered for them."""
    from neuron_args.lowering.torchax_compat import import_torchax

    import_torchax()  # before any torchax submodule import (see torchax_compat)
    graph_fn = _jax_function(gm, specs)
    args = [jax.ShapeDtypeStruct(s.shape, numpy_dtype(s.lowered_dtype)) for s in specs.input_specs]
    try:
        # x64 off whatever the process set: int64 -> s32 is part of the graph (and its key).
        # keep_unused: every graph input stays an HLO parameter, one-to-one with the runtime args.
        with jax.enable_x64(False), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Explicitly requested dtype", UserWarning)
            lowered = jax.jit(graph_fn, keep_unused=True).lower(*args)
    except (LoweringError, _NeedsRandomKey):
        raise
    except Exception as e:  # jax tracing errors outside any one node
        raise LoweringError(f"lowering the graph to HLO failed: {type(e).__name__}: {e}") from e
    computation = lowered.compiler_ir("hlo")
    result = computation.program_shape().result_shape()
    shapes = result.tuple_shapes() if result.is_tuple() else [result]
    from jaxlib import _hlo

    canonical = _hlo.HloPrintOptions.canonical()  # the text: no ids, metadata or source paths; every constant in full
    canonical.print_large_constants = True
    canonical.print_metadata = False
    return dataclasses.replace(specs, hlo_module_proto=computation.as_serialized_hlo_module_proto(),
                               hlo_text=computation.get_hlo_module().to_string(canonical),
                               result_shapes=tuple(", ".join(str(d) for d in s.dimensions()) for s in shapes))


@functools.cache
def _environment() -> Any:
    """One torchax environment per process, adapted to whole ATen graphs (created lazily, under ``_lock``)."""
    from torchax.tensor import Environment, Tensor

    class GraphEnvironment(Environment):
        #: the key random ops split while a seeded graph lowers (None: the graph has no key input)
        graph_key: Any = None

        def get_and_rotate_prng_key(self, generator: Any = None) -> Any:
            # never the process's own key (it would be baked into the HLO): a seeded graph takes a key input
            if self.graph_key is None:
                raise _NeedsRandomKey()
            self.graph_key, key = jax.random.split(self.graph_key)
            return key

        def _should_use_torchax_tensor(self, device: Any) -> bool:
            # factories inside the graph carry device='cpu': every tensor of a traced graph is a torchax one
            return True

        def _to_copy(self, the_tensor: Any, new_dtype: Any, new_device: Any) -> Any:
            # a device move means nothing inside one graph (device='cpu' would copy a tracer out): dtype only
            the_tensor = _constant(self, the_tensor)
            if new_dtype is torch.complex32:  # no XLA type: complex64 holding complex32's values
                from neuron_args.lowering.elementwise import to_complex32

                wide = super()._to_copy(the_tensor, torch.complex64, None)
                return Tensor(to_complex32(wide.jax()), self)
            return super()._to_copy(the_tensor, new_dtype, None)

    from neuron_args.lowering import ops

    env = GraphEnvironment()
    ops.install(env)
    return env


def _constant(env: Any, value: Any) -> Any:
    """A real torch tensor held by the graph (get_attr, lifted constant) as a torchax tensor; anything else as is."""
    from torchax.tensor import Tensor
    from torchax.view import View

    if not isinstance(value, torch.Tensor) or isinstance(value, (Tensor, View)):
        return value
    if isinstance(value, torch._subclasses.FakeTensor):
        raise LoweringError("the graph holds a fake tensor constant; its values are unknown")
    return Tensor(jnp.asarray(tensor_to_numpy(value)), env)


def _jax_function(gm: torch.fx.GraphModule, specs: LoweredGraph) -> Any:
    """``gm`` as a function of the arrays ``specs.input_specs`` describes, returning its tensor outputs."""
    from torchax.tensor import Tensor
    from torchax.view import View

    from neuron_args.lowering import ops, scalars

    env = _environment()
    constants = frozenset(i for i, _ in specs.constant_outputs)
    out_dtypes = [numpy_dtype(s.lowered_output_dtype) for s in specs.output_specs]
    # the tensor outputs that are torch.hash_tensor's (low, high) words already
    words = [hashing.is_hash(n) for i, n in enumerate(_returned(gm)) if i not in constants]
    checks = _runtime_checks(gm)

    class ToJax(torch.fx.Interpreter):
        def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
            return _constant(env, super().get_attr(target, args, kwargs))

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            # FX hands over immutable lists, which some torchax lowerings extend in place (convolution)
            args, kwargs = _plain_lists(args), _plain_lists(kwargs)
            if target in ops.FLOAT32_INSIDE:
                return ops.in_float32(target, args, kwargs, self._node.meta.get("val"))
            if target is _WITH_EFFECTS:
                return _with_effects(*args, **kwargs)
            if (out := scalars.lower(target, self._node, args, kwargs)) is not NotImplemented:
                return out
            lowering = ops.lowering_for(target, self._node)
            if lowering is not None:
                jax_args, jax_kwargs = env.t2j_iso((args, kwargs))
                return env.j2t_iso(lowering(*jax_args, **jax_kwargs))
            if isinstance(target, torch._ops.OpOverload) and target.namespace not in _TORCHAX_NAMESPACES:
                return _custom_op(target, args, kwargs)
            return super().call_function(target, args, kwargs)

        def run_node(self, n: torch.fx.Node) -> Any:
            self._node = n
            if n in checks:  # a compiled graph cannot raise: runtime checks of tensor values are left out
                return None
            try:
                return _as_traced_dtype(super().run_node(n), n.meta.get("val"))
            except (LoweringError, _NeedsRandomKey):
                raise
            except Exception as e:
                raise LoweringError(_cannot_lower(n, e)) from e

    def neuron_graph(*arrays: Any) -> tuple[Any, ...]:
        if specs.seeded:  # random ops split the key input
            *arrays, key_data = arrays
            env.graph_key = jax.random.wrap_key_data(jax.lax.bitcast_convert_type(key_data, jax.numpy.uint32))
        inputs: list[Any] = [Tensor(a, env) for a in arrays]
        for i in specs.token_inputs:
            inputs.insert(i, None)
        try:
            with env:
                outs = ToJax(gm).run(*inputs)
        finally:
            env.graph_key = None
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        outs = [o for i, o in enumerate(outs) if i not in constants]
        result = []
        for i, (out, spec, dtype, pair) in enumerate(zip(outs, specs.output_specs, out_dtypes, words)):
            out = _constant(env, out)
            if not isinstance(out, (Tensor, View)):
                raise LoweringError(f"graph output {i} is {type(out).__name__}, not a tensor")
            arr = out.jax()
            if tuple(arr.shape) != (spec.lowered_output_shape if pair else spec.shape):
                raise LoweringError(
                    f"graph output {i} lowered with shape {tuple(arr.shape)}, "
                    f"torch says {spec.shape}"
                )
            if spec.dtype in WORD_PAIR_DTYPES and not pair:  # a uint64 held as uint32: its high word is 0
                arr = jax.numpy.stack([arr.astype(dtype), jax.numpy.zeros(arr.shape, dtype)], axis=-1)
            # torchax may promote differently from torch; the HLO result keeps torch's dtype
            result.append(arr if arr.dtype == dtype else arr.astype(dtype))
        return tuple(result)

    return neuron_graph


def _as_traced_dtype(out: Any, val: Any) -> Any:
    """A node's value in the dtype torch traced it with (64-bit types as their 32-bit HLO types): torchax infers
    some otherwise (``torch.full(size, 0)`` is float32 to it), and a later op then fails or loses precision."""
    from torchax.tensor import Tensor

    if isinstance(val, torch.Tensor) and isinstance(out, Tensor):
        name = str(val.dtype).removeprefix("torch.")
        try:
            want = numpy_dtype(LOWERED_DTYPES.get(name, name))
        except TypeError:  # no XLA type: the op's own lowering decides
            return out
        return out if out.jax().dtype == want else Tensor(out.jax().astype(want), out._env)
    if isinstance(val, (tuple, list)) and isinstance(out, (tuple, list)) and len(val) == len(out):
        items = [_as_traced_dtype(o, v) for o, v in zip(out, val)]
        if all(a is b for a, b in zip(items, out)):
            return out
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # a namedtuple, a tuple, a list
    return out


def _runtime_checks(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes only serving runtime assertions on tensor values (:data:`_ASSERTS` and what feeds nothing else):
    an executable cannot raise, so they are not lowered and a call that breaks one gives wrong values."""
    checks: set[torch.fx.Node] = set()
    for n in reversed(gm.graph.nodes):
        if n.op == "call_function" and (n.target in _ASSERTS or (n.users and all(u in checks for u in n.users))):
            checks.add(n)
    return checks


_WITH_EFFECTS = torch.ops.higher_order.with_effects


def _with_effects(token: Any, op: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``with_effects(token, op, ...)``: ``aten._linalg_check_errors`` is a runtime check, left out as the others
    (:func:`_runtime_checks`); any other effect-ordered op (``print``) has no lowering."""
    if op is torch.ops.aten._linalg_check_errors.default:
        return (None,)
    raise NoLowering(
        f"{op} is an effect-ordered op (Python side effects in call order), which a Neuron graph cannot run; "
        "call it outside the compiled function")


#: runtime assertions on values (they return nothing)
_ASSERTS = frozenset({torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.default,
                      torch.ops.aten._assert_async.msg})

#: op namespaces torchax lowers itself; any other op (a custom op) needs a registered lowering
_TORCHAX_NAMESPACES = ("aten", "prims", "_c10d_functional", "torchvision", "xla")


class _NeedsRandomKey(Exception):
    """An op drew random numbers while a graph without a key input lowered."""


class NoLowering(Exception):
    """An op with no lowering (its message says how to add one)."""


def _custom_op(op: torch._ops.OpOverload, args: Any, kwargs: Any) -> Any:
    """A custom op: its CompositeImplicitAutograd decomposition if it has one, else no lowering."""
    out = op.decompose(*args, **kwargs)
    if out is NotImplemented:
        raise NoLowering(
            f"custom op {op._schema.name} has no lowering; register a jax one with "
            f"@neuron_args.lowering.register_lowering({op._schema.name!r})"
        )
    return out


def _plain_lists(value: Any) -> Any:
    if isinstance(value, torch.fx.immutable_collections.immutable_list):
        return [_plain_lists(v) for v in value]
    if isinstance(value, torch.fx.immutable_collections.immutable_dict):
        return {k: _plain_lists(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain_lists(v) for v in value)
    return value


#: ops that cannot be static, and what the model can do instead
_DATA_DEPENDENT = {
    "aten._local_scalar_dense.default": (
        "the graph reads a tensor's value into Python (.item(), int(t), .tolist(), a tensor in an if) and uses it "
        "as more than a value (a size, a slice bound, a branch), which a static graph cannot: derive it from "
        "shapes, keep it a tensor, or pass it in as a Python constant"),
    "aten.nonzero.default": "its output size depends on tensor values; use torch.nonzero_static(x, size=n) (padded "
                            "with fill_value) or a fixed-size mask (torch.where) instead",
    "aten.masked_select.default": "its output size depends on tensor values; use torch.where with a fixed size",
    "aten._unique2.default": "its output size depends on tensor values; count over the known value range instead "
                             "(a one-hot sum), or compute it outside the compiled function",
    "aten.unique_consecutive.default": "its output size depends on tensor values; compute it outside the compiled "
                                       "function",
    "aten.repeat_interleave.Tensor": "its output size is the sum of the repeats; pass output_size= (the total, known "
                                     "from shapes) to repeat_interleave",
}

#: said after the fix of a value read in a graph traced through transformers' code only
_STATIC_CACHE_HINT = ("a transformers decoder with a StaticCache reads the cache's filled length this way when it gets "
                      "no attention_mask (pass one; neuron_args.hf.StaticCausalLM does)")


def _data_dependent_fix(op: str, graph: torch.fx.Graph) -> str | None:
    """The fix for a data-dependent op (a value read in transformers' code also names its StaticCache)."""
    fix = _DATA_DEPENDENT.get(op)
    if fix is not None and op == "aten._local_scalar_dense.default" and any(
            f"{os.sep}transformers{os.sep}" in (n.meta.get("stack_trace") or "") for n in graph.nodes):
        fix = f"{fix}; {_STATIC_CACHE_HINT}"
    return fix


def _cannot_lower(n: torch.fx.Node, error: Exception, fix: str | None = None) -> str:
    """The message for a node that does not lower: the op, the graph type, the user's line, the fix (``fix``, else
    the ways around any op)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    op = _op_name(n)
    missing = type(error).__name__ in ("OperatorNotFound", "NoLowering")
    graph_type = current_graph_type()
    where = _user_source(getattr(error, "node", None) or n)  # a read's use (scalars.NotAValue): its line
    of_type = "" if graph_type is None else f" of graph type {graph_type!r}"  # none: a plain torch.compile
    lines = [
        f"cannot lower op {op} (FX node {n.name!r}){of_type} to HLO: "
        + (f"no lowering exists for it ({error})" if missing else f"{type(error).__name__}: {first_line(str(error))}"),
    ]
    if op in _DATA_DEPENDENT:
        lines.append(f"  {_data_dependent_fix(op, n.graph)}")
    elif "complex32" in str(error):
        lines.append("  torch.complex32 (chalf) has no XLA type: compute in torch.complex64")
    elif free_unbacked_symbols(n.meta.get("val")):
        lines.append("  its output size depends on tensor values (a boolean mask index, nonzero): keep sizes fixed "
                     "with torch.where, or compute it outside the compiled function")
        if _boolean_index(n):
            lines.append(f"  {_BOOLEAN_INDEX_FIX}")
    if where:
        lines.append(f"  it comes from {where}")
    lines.append("  fix: " + (fix or (
        "express that line with ops that lower (the error names the one that does not), move it "
        "out of the compiled graph (compute it eagerly before or after the compiled call), or register a "
        "jax lowering for the op with neuron_args.lowering.register_lowering")))
    return "\n".join(lines)


#: a boolean-mask index keeps as many rows as the mask has true values; picking known rows by position is static
_BOOLEAN_INDEX_FIX = (
    "x[mask] keeps as many elements as the mask has true values, unknown while tracing: index by position "
    "instead, e.g. the last true of each row: last = torch.where(mask, torch.arange(mask.shape[-1]), -1).argmax(-1); "
    "x[torch.arange(x.shape[0]), last]. In a model you do not edit (a transformers sequence classifier picking its "
    "last eos token so), compile the part before the selection (its base model) and pick the rows and apply the head "
    "outside the compiled graph, or wrap the model so that its forward selects by index")


def _boolean_index(n: torch.fx.Node) -> bool:
    """``n`` indexes by a boolean mask (``aten.index.Tensor`` with a bool index)."""
    return n.target is torch.ops.aten.index.Tensor and any(
        isinstance(i, torch.fx.Node) and getattr(i.meta.get("val"), "dtype", None) is torch.bool
        for i in (n.args[1] if len(n.args) > 1 else ()))


def _user_source(n: torch.fx.Node) -> str:
    """``file:line`` and code of the user's frame that produced node ``n``, or the nearest node with one (Dynamo
    keeps its stack; aot_autograd's own nodes have none)."""
    seen, ring = {n}, [n]
    while ring:
        for node in ring:
            lines = (node.meta.get("stack_trace") or "").rstrip().splitlines()
            frame = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip().startswith('File "')), None)
            if frame is not None:
                where = lines[frame].strip().removeprefix("File ")
                code = lines[frame + 1].strip() if frame + 1 < len(lines) else ""
                return f"{where}: {code}" if code else where
        ring = [m for node in ring for m in (*node.all_input_nodes, *node.users) if m not in seen]
        seen.update(ring)
    return ""


def _op_name(n: torch.fx.Node) -> str:
    target = n.target
    if isinstance(target, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)  # "aten.index_put.default"
    return getattr(target, "__name__", None) or str(target)
