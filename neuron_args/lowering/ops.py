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
    import jax
    import jax.numpy as jnp

    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: Neuron inference graphs lower SDPA without dropout")
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
    scores = jnp.where(allowed, scores, -jnp.inf)
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


#: qualified op name (``namespace::name`` or ``namespace::name.overload``) -> jax lowering
LOWERINGS: dict[str, Callable[..., Any]] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_flash_for_cpu,
    "aten::addmm": _addmm,
    "transformers::grouped_mm_fallback": _grouped_mm,
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


def install(env: Any) -> None:
    """Put :data:`LOWERINGS` in a torchax environment, so decompositions use them too."""
    _installed.append(env)
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
