"""Backward ops torchax has no lowering for, as the ``jax.vjp`` of their forward op's lowering
(pools, padding, grid sampler, weight norm, convolution)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from neuron_args.lazy_modules import jax, jnp
from neuron_args.lowering.torchax_compat import INSTALLED

aten = torch.ops.aten


def pullback(forward: Callable[..., Any], grad_output: Any, *primals: Any) -> tuple[Any, ...]:
    """``forward``'s gradients at ``primals`` for ``grad_output``: a backward op's lowering from its forward's."""
    out, pull = jax.vjp(forward, *primals)
    return pull(grad_output.astype(out.dtype))


def lowered_op(op: Any, *args: Any) -> Callable[..., Any]:
    """``op(*tensors, *args)`` as a function of jax arrays, lowered as the graph lowers it (a lowering
    here, torchax's, or torch's decomposition); its first output when it has several."""
    env = INSTALLED[-1]

    def forward(*arrays: Any) -> Any:
        # fresh lists: some torchax lowerings extend theirs in place (convolution's padding)
        out = op(*env.j2t_iso(arrays), *(list(a) if isinstance(a, (list, tuple)) else a for a in args))
        return env.t2j_iso(out[0] if isinstance(out, (tuple, list)) else out)

    return forward


def backward_of(forward_op: Any, primals: int, masked: bool = False) -> Callable[..., Any]:
    """The lowering of a backward op ``(grad_output, *primals, *args[, output_mask])``: the vjp of
    ``forward_op(*primals, *args)`` at the primals (None where the output mask says so)."""
    def lowering(grad_output: Any, *rest: Any) -> Any:
        arrays, args = rest[:primals], rest[primals:]
        mask = args[-1] if masked else [True] * primals
        args = args[:-1] if masked else args
        grads = pullback(lowered_op(forward_op, *args), grad_output, *arrays)
        grads = tuple(g if wanted else None for g, wanted in zip(grads, mask))
        return grads if primals > 1 else grads[0]

    return lowering


def adaptive_pool_backward(forward_op: Any, spatial: int) -> Callable[..., Any]:
    """The lowering of ``aten._adaptive_{avg,max}_pool{2,3}d_backward``: the vjp of the pooling to the gradient's
    size (a max pool's ``indices`` are where the vjp of its lowering puts each gradient: not read)."""
    def lowering(grad_output: Any, input: Any, indices: Any = None) -> Any:
        return pullback(lowered_op(forward_op, list(grad_output.shape[-spatial:])), grad_output, input)[0]

    return lowering


def weight_norm_backward(grad_w: Any, saved_v: Any, saved_g: Any, saved_norms: Any, dim: int) -> tuple[Any, Any]:
    """``aten._weight_norm_interface_backward``: ``(grad_v, grad_g)``, the vjp of the forward's ``w``."""
    return pullback(lowered_op(aten._weight_norm_interface.default, dim), grad_w, saved_v, saved_g)


def convolution_backward(
    grad_output: Any, input: Any, weight: Any, bias_sizes: Any, stride: Any, padding: Any, dilation: Any,
    transposed: bool, output_padding: Any, groups: int, output_mask: Any,
) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward``: ``(grad_input, grad_weight, grad_bias)``, each None unless asked for."""
    conv = lowered_op(aten.convolution.default, None, stride, padding, dilation, transposed, output_padding,
                       groups)
    grad_input, grad_weight = pullback(conv, grad_output, input, weight)
    grad_bias = None
    if output_mask[2]:
        axes = (0, *range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output, axis=axes, dtype=jnp.float32).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)
