"""Adaptive max pooling (2d/3d) with its indices and backward, and ``max_unpool``."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_args.lazy_modules import jnp


def adaptive_windows(in_sizes: Any, out_sizes: Any) -> tuple[Any, Any]:
    """Adaptive pooling's windows as constants: for each output position the flat input positions of its window
    (padded to the largest window) and which of them are real. Window ``i`` of an axis spans
    ``[floor(i * in / out), ceil((i + 1) * in / out))``."""
    axes = []
    for n_in, n_out in zip(in_sizes, out_sizes):
        starts = np.array([(i * n_in) // n_out for i in range(n_out)])
        ends = np.array([-((-(i + 1) * n_in) // n_out) for i in range(n_out)])
        taps = np.arange(int((ends - starts).max()))
        axes.append((np.minimum(starts[:, None] + taps, n_in - 1), starts[:, None] + taps < ends[:, None]))
    strides = np.cumprod([1, *in_sizes[::-1]])[:-1][::-1]
    positions, real = np.zeros([1] * (2 * len(axes)), np.int64), np.ones([1] * (2 * len(axes)), bool)
    for k, ((index, valid), stride) in enumerate(zip(axes, strides)):
        shape = [1] * (2 * len(axes))
        shape[k], shape[len(axes) + k] = index.shape
        positions = positions + index.reshape(shape) * stride
        real = real & valid.reshape(shape)
    positions, real = np.broadcast_arrays(positions, real)
    return positions.reshape(*out_sizes, -1), real.reshape(*out_sizes, -1)


def adaptive_max_pool(x: Any, output_size: Any) -> tuple[Any, Any]:
    """``aten.adaptive_max_pool{2,3}d``: ``(output, indices)``, each index the flat position of its window's first
    maximum in the input plane, as torch's kernel (torchax has no lowering)."""
    spatial = len(output_size)
    positions, real = adaptive_windows(x.shape[-spatial:], list(output_size))
    windows = jnp.where(real, x.reshape(*x.shape[:-spatial], -1)[..., positions], -jnp.inf)
    first = jnp.argmax(windows, axis=-1)[..., None]
    out = jnp.take_along_axis(windows, first, axis=-1)[..., 0]
    indices = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(positions, jnp.int32), windows.shape), first, axis=-1)
    return out.astype(x.dtype), indices[..., 0]


def adaptive_max_pool_backward(spatial: int) -> Callable[..., Any]:
    """``aten.adaptive_max_pool{2,3}d_backward``: each output's gradient added at its maximum's position."""
    def lowering(grad_output: Any, x: Any, indices: Any) -> Any:
        return scatter_into_planes(grad_output, indices, x.shape, spatial, add=True)

    return lowering


def scatter_into_planes(values: Any, indices: Any, shape: Any, spatial: int, add: bool) -> Any:
    """Zeros shaped ``shape`` with ``values`` put (or added) at the flat ``indices`` of their last ``spatial`` dims."""
    lead = tuple(shape[:-spatial])
    flat_values = values.reshape(*lead, -1)
    flat_indices = indices.reshape(flat_values.shape).astype(jnp.int32)
    out = jnp.zeros((*lead, math.prod(shape[-spatial:])), values.dtype)
    at = out.at[(*jnp.indices(flat_values.shape)[:-1], flat_indices)]
    return (at.add(flat_values) if add else at.set(flat_values)).reshape(shape)


def max_unpool(x: Any, indices: Any, output_size: Any, stride: Any = None, padding: Any = None) -> Any:
    """``aten.max_unpool{2,3}d``: each value at its index in zeros (torchax reads the indices into numpy)."""
    spatial = len(output_size)
    return scatter_into_planes(x, indices, (*x.shape[:-spatial], *output_size), spatial, add=False)
