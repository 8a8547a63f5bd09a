"""``F.linear_cross_entropy``'s opt-in chunked custom ops, without chunks: eager loops over batch chunks to keep the
``(N, C)`` logits out of memory, a Neuron graph's memory is the compiler's (the chunk arguments only steer eager)."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jax, jnp


def _weighted_nll(x: Any, linear_weight: Any, target: Any, linear_bias: Any, weight: Any,
                  ignore_index: int) -> tuple[Any, Any]:
    """Per row: ``-log_softmax(x W^T + b)[target]`` and its class weight (0 on ``ignore_index`` rows)."""
    logits = jnp.matmul(x, linear_weight.T, preferred_element_type=jnp.float32)
    if linear_bias is not None:
        logits = logits + linear_bias.astype(jnp.float32)
    ignored = target == ignore_index
    target = jnp.where(ignored, 0, target)
    picked = jnp.take_along_axis(logits, target[:, None], axis=1)[:, 0]
    nll = jax.nn.logsumexp(logits, axis=1) - picked
    w = jnp.ones(target.shape, jnp.float32) if weight is None else weight.astype(jnp.float32)[target]
    return nll, jnp.where(ignored, 0, w)


def batch_chunked(x: Any, linear_weight: Any, target: Any, linear_bias: Any, weight: Any, reduction: str,
                  ignore_index: int, label_smoothing: float, batch_chunk_size: int, acc_policy: str, acc_dtype: Any,
                  allow_retain_graph: bool, compute_input_grad: bool, compute_linear_weight_grad: bool,
                  compute_linear_bias_grad: bool) -> tuple[Any, Any, Any, Any]:
    """The scalar (``mean``/``sum``) op: ``(loss, grad_input, grad_linear_weight, grad_linear_bias)``, a gradient
    not asked for empty (``(0, 0)``, ``(0,)``) as eager returns it."""
    if label_smoothing > 0:
        raise ValueError("linear_cross_entropy does not support label smoothing (eager refuses it too)")
    dtype = x.dtype

    def loss(x: Any, linear_weight: Any, linear_bias: Any) -> Any:
        nll, w = _weighted_nll(x, linear_weight, target, linear_bias, weight, ignore_index)
        total = (w * nll).sum()
        if reduction == "sum":
            return total
        d = w.sum()
        return total / jnp.where(d == 0, jnp.nan, d)

    bias = jnp.zeros(linear_weight.shape[:-1], dtype) if linear_bias is None else linear_bias
    value, (gx, gw, gb) = jax.value_and_grad(loss, argnums=(0, 1, 2))(x, linear_weight, bias)
    return (value.astype(dtype),
            gx.astype(dtype) if compute_input_grad else jnp.zeros((0, 0), dtype),
            gw.astype(dtype) if compute_linear_weight_grad else jnp.zeros((0, 0), dtype),
            gb.astype(dtype) if compute_linear_bias_grad else jnp.zeros((0,), dtype))


def batch_chunked_no_reduction(x: Any, linear_weight: Any, target: Any, linear_bias: Any, weight: Any,
                               ignore_index: int, batch_chunk_size: int, acc_policy: str, acc_dtype: Any) -> Any:
    """The ``reduction='none'`` op: each row's weighted loss, ``(N,)``."""
    nll, w = _weighted_nll(x, linear_weight, target, linear_bias, weight, ignore_index)
    return (w * nll).astype(x.dtype)
