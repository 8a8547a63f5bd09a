"""SDPA's CPU flash-attention op and its backward (grouped-query heads summed in the gradient)."""
from __future__ import annotations

import math
from typing import Any

from neuron_args.lazy_modules import jnp


def sdpa_flash_for_cpu(
    query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False, *,
    attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)`` (torch's decomposition
    returns the weights instead of the log-sum-exp a backward needs), in float32 as the CPU kernel; a fully
    masked row gives zeros, as the kernel does."""
    f32 = jnp.float32
    key, value, scores, _ = sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
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


def sdpa_flash_for_cpu_backward(
    grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any, dropout_p: float,
    is_causal: bool, *, attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward`` (torch has no decomposition): the flash
    backward in float32, rounded once; a shared key/value head's gradients summed over its query group."""
    f32 = jnp.float32
    kv_shape = key.shape
    keys, values, scores, scale = sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
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


def sdpa_scores(query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, attn_mask: Any,
                 scale: float | None) -> tuple[Any, Any, Any, float]:
    """Keys and values repeated to the query's heads, the scaled float32 scores (-inf where disallowed), the scale."""
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
