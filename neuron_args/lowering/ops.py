"""Lowerings this project provides for ATen ops torchax lowers wrong or not at all.

Each entry is a jax function with the ATen op's signature; :func:`install` puts them in the
lowering environment ahead of torchax's own table and decompositions. Add an op here (with a
test comparing it with eager) when a model's graph needs it.
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


#: ATen op -> jax lowering, installed ahead of torchax's table.
LOWERINGS: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa_flash_for_cpu,
    aten.addmm.default: _addmm,
}


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
    """Register :data:`LOWERINGS` in a torchax environment (as jax functions)."""
    from torchax.ops.ops_registry import Operator

    for op, fn in LOWERINGS.items():
        env._ops[op] = Operator(op, fn, is_jax_function=True, is_user_defined=True, needs_env=False,
                                is_view_op=False)
