"""Lowerings for ops torchax lowers wrong or not at all, and the way to add one.

A lowering is a jax function with the op's signature (jax arrays in place of tensors), keyed by
the op's qualified name (``"aten::addmm"``, ``"transformers::grouped_mm_fallback"``). Ours are
below; a user registers one for their own custom op with :func:`register_lowering`. They take
precedence over torchax's table and decompositions, in the graph and inside decompositions.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _sdpa_flash_for_cpu(
    query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False, *,
    attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)``.

    torch's decomposition returns the attention weights ``(N, H, L, S)`` as the second value; the op
    returns the float32 log-sum-exp ``(N, H, L)``, which a forward graph saves for backward whenever
    gradients are enabled. Computed in float32 as the CPU kernel accumulates; a fully masked row
    gives a zero output and a zero log-sum-exp, as the kernel does.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    key, value, scores, _ = _sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    finite = jnp.isfinite(peak)
    exp = jnp.where(finite, jnp.exp(scores - jnp.where(finite, peak, 0.0)), 0.0)
    total = jnp.sum(exp, axis=-1, keepdims=True)
    # as the kernel: unnormalised probabilities rounded to the input dtype, multiplied by V with
    # float32 accumulation, divided by the float32 sum at the end
    out = jnp.einsum("nhls,nhse->nhle", exp.astype(query.dtype), value, preferred_element_type=f32)
    out = jnp.where(finite, out / jnp.where(finite, total, 1.0), 0.0)
    lse = jnp.where(finite, peak + jnp.log(jnp.where(finite, total, 1.0)), 0.0)[..., 0]
    return out.astype(query.dtype), lse


def _sdpa_flash_for_cpu_backward(
    grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any, dropout_p: float,
    is_causal: bool, *, attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward``: ``(grad_query, grad_key, grad_value)``.

    The training graph's backward of the op above (torch has no decomposition for it). The flash
    backward: probabilities recomputed from the saved log-sum-exp, ``D = rowsum(dO * O)``,
    ``dS = P * (dO V^T - D)``, everything in float32 and rounded once to the inputs' dtypes. With
    grouped-query attention the key/value gradients of a shared head are summed over its group.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    kv_shape = key.shape
    keys, values, scores, scale = _sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
    probs = jnp.exp(scores - logsumexp.astype(f32)[..., None])  # masked (-inf) scores give 0
    d_out = grad_out.astype(f32)
    grad_value = jnp.einsum("nhls,nhle->nhse", probs, d_out)
    d_probs = jnp.einsum("nhle,nhse->nhls", d_out, values.astype(f32))
    delta = jnp.sum(d_out * out.astype(f32), axis=-1, keepdims=True)
    d_scores = probs * (d_probs - delta) * scale
    grad_query = jnp.einsum("nhls,nhse->nhle", d_scores, keys.astype(f32))
    grad_key = jnp.einsum("nhls,nhle->nhse", d_scores, query.astype(f32))
    group = query.shape[1] // kv_shape[1]
    if group > 1:  # sum each shared key/value head's gradient over the query heads of its group
        grad_key = grad_key.reshape(kv_shape[0], kv_shape[1], group, *grad_key.shape[2:]).sum(axis=2)
        grad_value = grad_value.reshape(kv_shape[0], kv_shape[1], group, *grad_value.shape[2:]).sum(axis=2)
    return grad_query.astype(query.dtype), grad_key.astype(key.dtype), grad_value.astype(value.dtype)


def _sdpa_scores(query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, attn_mask: Any,
                 scale: float | None) -> tuple[Any, Any, Any, float]:
    """Shared by the SDPA forward and backward: ``(key, value)`` repeated to the query's heads, the
    scaled float32 scores with every disallowed position at ``-inf``, and the scale."""
    import jax.numpy as jnp

    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: Neuron graphs lower SDPA without dropout (set the "
                         "attention dropout to 0 or call model.eval())")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:  # grouped-query attention
        key = jnp.repeat(key, heads // kv_heads, axis=1)
        value = jnp.repeat(value, heads // kv_heads, axis=1)
    f32 = jnp.float32
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = jnp.einsum("nhle,nhse->nhls", query, key, preferred_element_type=f32) * scale
    length, source = scores.shape[-2], scores.shape[-1]
    allowed = jnp.ones((length, source), dtype=bool)
    if is_causal:
        allowed = jnp.tril(allowed)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            allowed = allowed & attn_mask
        else:
            scores = scores + attn_mask.astype(f32)
    return key, value, jnp.where(allowed, scores, -jnp.inf), scale


def _grouped_mm(input: Any, weight: Any, offs: Any) -> Any:
    """``transformers::grouped_mm_fallback``: rows sorted by expert, ``offs`` = cumulative counts.

    The eager kernel loops over experts with ``offs.tolist()`` (data-dependent). Static form: each
    row's expert is the number of offsets at or below its index; every row is multiplied by its
    own expert's weight (gathered), accumulated in float32.
    """
    import jax.numpy as jnp

    rows = jnp.arange(input.shape[0])
    expert = jnp.sum(rows[:, None] >= offs[None, :].astype(rows.dtype), axis=1)
    expert = jnp.minimum(expert, weight.shape[0] - 1)  # rows past the last offset: zero in eager
    valid = rows < offs[-1]
    out = jnp.einsum("si,sio->so", input, weight[expert], preferred_element_type=jnp.float32)
    return jnp.where(valid[:, None], out, 0.0).astype(input.dtype)


def _grouped_mm_backward(input: Any, weight: Any, offs: Any, grad_output: Any) -> tuple[Any, Any]:
    """``transformers::grouped_mm_fallback_backward``: ``(grad_input, grad_weight)``, the vjp of the lowering above
    (the eager kernel loops over ``offs.tolist()`` again)."""
    return _pullback(lambda x, w: _grouped_mm(x, w, offs), grad_output, input, weight)


def _addmm(bias: Any, a: Any, b: Any, *, beta: float = 1, alpha: float = 1) -> Any:
    """``bias + a @ b`` accumulated in float32 and rounded once, as torch's CPU kernel does.

    The HLO keeps the matmul in the input dtype with a float32 result
    (``preferred_element_type``), the mixed-precision form accelerators run natively.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    out = jnp.matmul(a, b, preferred_element_type=f32 if a.dtype != jnp.float64 else None)
    if alpha != 1:
        out = out * alpha
    out = out + (bias.astype(out.dtype) if beta == 1 else beta * bias.astype(out.dtype))
    return out.astype(jnp.result_type(a.dtype, b.dtype))


def _pullback(forward: Callable[..., Any], grad_output: Any, *primals: Any) -> tuple[Any, ...]:
    """The gradients of ``forward`` at ``primals`` for ``grad_output``: a backward op as the vjp of its
    forward op's lowering, so forward and backward come from one definition."""
    import jax

    out, pull = jax.vjp(forward, *primals)
    return pull(grad_output.astype(out.dtype))


def _lowered_op(op: Any, *args: Any) -> Callable[..., Any]:
    """``op(*tensors, *args)`` as a function of jax arrays, lowered as the graph lowers it (a lowering
    here, torchax's, or torch's decomposition); its first output when it has several."""
    env = _installed[-1]

    def forward(*arrays: Any) -> Any:
        # fresh lists: some torchax lowerings extend theirs in place (convolution's padding)
        out = op(*env.j2t_iso(arrays), *(list(a) if isinstance(a, (list, tuple)) else a for a in args))
        return env.t2j_iso(out[0] if isinstance(out, (tuple, list)) else out)

    return forward


def _backward_of(forward_op: Any, primals: int, masked: bool = False) -> Callable[..., Any]:
    """The lowering of a backward op ``(grad_output, *primals, *args[, output_mask])``: the vjp of
    ``forward_op(*primals, *args)`` at the primals (None where the output mask says so)."""
    def lowering(grad_output: Any, *rest: Any) -> Any:
        arrays, args = rest[:primals], rest[primals:]
        mask = args[-1] if masked else [True] * primals
        args = args[:-1] if masked else args
        grads = _pullback(_lowered_op(forward_op, *args), grad_output, *arrays)
        grads = tuple(g if wanted else None for g, wanted in zip(grads, mask))
        return grads if primals > 1 else grads[0]

    return lowering


def _adaptive_avg_pool_backward(forward_op: Any, spatial: int) -> Callable[..., Any]:
    """The lowering of ``aten._adaptive_avg_pool{2,3}d_backward``: the vjp of the pooling, whose output size is
    the gradient's."""
    def lowering(grad_output: Any, input: Any) -> Any:
        return _pullback(_lowered_op(forward_op, list(grad_output.shape[-spatial:])), grad_output, input)[0]

    return lowering


def _weight_norm_backward(grad_w: Any, saved_v: Any, saved_g: Any, saved_norms: Any, dim: int) -> tuple[Any, Any]:
    """``aten._weight_norm_interface_backward``: ``(grad_v, grad_g)``, the vjp of the forward's ``w``."""
    return _pullback(_lowered_op(aten._weight_norm_interface.default, dim), grad_w, saved_v, saved_g)


def _convolution_backward(
    grad_output: Any, input: Any, weight: Any, bias_sizes: Any, stride: Any, padding: Any, dilation: Any,
    transposed: bool, output_padding: Any, groups: int, output_mask: Any,
) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward``: ``(grad_input, grad_weight, grad_bias)``, each None unless asked for."""
    import jax.numpy as jnp

    conv = _lowered_op(aten.convolution.default, None, stride, padding, dilation, transposed, output_padding,
                       groups)
    grad_input, grad_weight = _pullback(conv, grad_output, input, weight)
    grad_bias = None
    if output_mask[2]:
        axes = (0, *range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output, axis=axes, dtype=jnp.float32).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


#: qualified op name (``namespace::name`` or ``namespace::name.overload``) -> jax lowering
LOWERINGS: dict[str, Callable[..., Any]] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_flash_for_cpu,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_flash_for_cpu_backward,
    "aten::addmm": _addmm,
    "aten::convolution_backward": _convolution_backward,
    # backward ops torchax has no lowering for: the vjp of their forward op
    "aten::avg_pool2d_backward": _backward_of(aten.avg_pool2d.default, 1),
    "aten::avg_pool3d_backward": _backward_of(aten.avg_pool3d.default, 1),
    "aten::_adaptive_avg_pool2d_backward": _adaptive_avg_pool_backward(aten._adaptive_avg_pool2d.default, 2),
    "aten::_adaptive_avg_pool3d_backward": _adaptive_avg_pool_backward(aten._adaptive_avg_pool3d.default, 3),
    "aten::replication_pad1d_backward": _backward_of(aten.replication_pad1d.default, 1),
    "aten::replication_pad2d_backward": _backward_of(aten.replication_pad2d.default, 1),
    "aten::replication_pad3d_backward": _backward_of(aten.replication_pad3d.default, 1),
    "aten::grid_sampler_2d_backward": _backward_of(aten.grid_sampler_2d.default, 2, masked=True),
    "aten::grid_sampler_3d_backward": _backward_of(aten.grid_sampler_3d.default, 2, masked=True),
    "aten::_weight_norm_interface_backward": _weight_norm_backward,
    "transformers::grouped_mm_fallback": _grouped_mm,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_backward,
}

_installed: list[Any] = []  # lowering environments created so far (one per process)


def register_lowering(op_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: lower op ``op_name`` (e.g. ``"mylib::fused_rope"``) with a jax function.

    The function receives jax arrays where the op receives tensors (other arguments unchanged)
    and returns jax arrays shaped as the op's outputs. Use it for a custom op of your own whose
    graph node does not lower.
    """
    if "::" not in op_name:
        raise ValueError(f"op name {op_name!r} must be qualified, e.g. 'mylib::my_op' or 'aten::addmm'")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        LOWERINGS[op_name] = fn
        for env in _installed:
            _install_one(env, op_name, fn)
        return fn

    return register


def lowering_for(target: Any) -> Callable[..., Any] | None:
    """The registered lowering of FX target ``target`` (an ``OpOverload``), or None."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    name = schema.name  # "aten::addmm"
    overload = schema.overload_name
    return LOWERINGS.get(f"{name}.{overload}" if overload else name) or LOWERINGS.get(name)


#: Ops whose CPU kernels compute half-precision inputs in float32 and round once at the end. Lowered
#: the same way (inputs up, outputs down to torch's dtype) instead of rounding every intermediate
#: HLO op to bfloat16. Matmuls and convolutions are left alone: their HLO stays in the model's dtype
#: for the Neuron compiler.
FLOAT32_INSIDE: frozenset[Any] = frozenset({
    aten.native_layer_norm.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.gelu.default,
    aten.silu.default,
    aten.native_group_norm.default,
})

_HALF = (torch.bfloat16, torch.float16)


def in_float32(op: Any, args: Any, kwargs: Any, result: Any) -> Any:
    """Run ``op`` on torchax tensors with half inputs upcast; cast outputs to ``result``'s dtypes."""
    from torch.utils._pytree import tree_map

    def up(x: Any) -> Any:
        return x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype in _HALF else x

    out = op(*tree_map(up, args), **tree_map(up, kwargs))
    if isinstance(out, (tuple, list)):
        return type(out)(o.to(r.dtype) if isinstance(r, torch.Tensor) else o for o, r in zip(out, result))
    return out.to(result.dtype) if isinstance(result, torch.Tensor) else out


#: ops torchax lowers wrongly, computed with torch's own decomposition instead: torchax's
#: ``native_layer_norm_backward`` calls a jax function that does not exist, its
#: ``max_pool2d_with_indices_backward`` adds each gradient to a whole window instead of its argmax
TORCH_DECOMPOSED: tuple[Any, ...] = (aten.native_layer_norm_backward, aten.max_pool2d_with_indices_backward)


def install(env: Any) -> None:
    """Put :data:`LOWERINGS` in a torchax environment, so decompositions use them too, and route
    :data:`TORCH_DECOMPOSED` to torch's decompositions."""
    from torch._decomp import decomposition_table
    from torchax.ops.ops_registry import Operator

    _installed.append(env)
    for packet in TORCH_DECOMPOSED:
        env._ops.pop(packet, None)
        for name in packet.overloads():
            op = getattr(packet, name)
            env._ops.pop(op, None)
            if op in decomposition_table:
                env._decomps[op] = Operator(op, decomposition_table[op], is_jax_function=False,
                                            is_user_defined=False, needs_env=False, is_view_op=False)
    for name, fn in LOWERINGS.items():
        _install_one(env, name, fn)


def _install_one(env: Any, op_name: str, fn: Callable[..., Any]) -> None:
    from torchax.ops.ops_registry import Operator

    namespace, _, rest = op_name.partition("::")
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace, None), name, None)
    op = getattr(packet, overload or "default", None) if packet is not None else None
    if op is not None:  # an op not registered yet is found by name at call time (lowering_for)
        env._ops[op] = Operator(op, fn, is_jax_function=True, is_user_defined=True, needs_env=False,
                                is_view_op=False)
