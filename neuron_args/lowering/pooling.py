"""Max pooling torchax does not lower: adaptive (2d/3d) with its indices (its backward: the vjp, in gradients),
``max_unpool``, and ``fractional_max_pool{2,3}d`` with windows from the graph's ``random_samples`` input as torch's
``generate_intervals`` (NaN: the first maximum, where torch keeps the last)."""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from neuron_args.lazy_modules import jnp


def adaptive_windows(in_sizes: Any, out_sizes: Any) -> tuple[Any, Any]:
    """Each output position's flat input positions (padded to the largest window) and which are real, as constants;
    window ``i`` of an axis spans ``[floor(i * in / out), ceil((i + 1) * in / out))``."""
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


def max_unpool(x: Any, indices: Any, output_size: Any, stride: Any = None, padding: Any = None) -> Any:
    """``aten.max_unpool{2,3}d``: each value at its flat index in zeros of ``output_size`` (torchax reads indices)."""
    lead = x.shape[:-len(output_size)]
    values = x.reshape(*lead, -1)
    flat = jnp.zeros((*lead, math.prod(output_size)), x.dtype)
    at = flat.at[(*jnp.indices(values.shape)[:-1], indices.reshape(values.shape).astype(jnp.int32))]
    return at.set(values).reshape(*lead, *output_size)


def _starts(sample: Any, size: int, out: int, pool: int) -> Any:
    """torch's ``generate_intervals``: ``int((i + u) * alpha) - int(u * alpha)``, the last window at the end."""
    if out == 1:
        return jnp.full(sample.shape + (1,), size - pool, jnp.int32)
    alpha = jnp.asarray((size - pool) / (out - 1), sample.dtype)
    i = jnp.arange(out, dtype=sample.dtype)
    seq = ((i + sample[..., None]) * alpha).astype(jnp.int32) - (sample[..., None] * alpha).astype(jnp.int32)
    return seq.at[..., -1].set(size - pool)


def _fractional_max_pool(order: tuple[int, ...], x: Any, kernel_size: Any, output_size: Any,
                         samples: Any) -> tuple[Any, Any]:
    """``aten.fractional_max_pool{2,3}d``, spatial dim ``d``'s windows from sample ``order[d]``."""
    kernel = tuple(kernel_size)
    output_size = tuple(output_size)
    dims = len(order)
    batched = x.ndim == dims + 2
    if not batched:
        x, samples = x[None], samples if samples.ndim == 3 else samples[None]
    spatial = x.shape[-dims:]
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    index = jnp.zeros((n, c) + tuple(output_size) + tuple(kernel), jnp.int32)
    for d in range(dims):  # the flat input positions of each output's window, (N, C, *out, *pool)
        start = _starts(samples[..., order[d]], spatial[d], output_size[d], kernel[d])  # (N, C, out)
        shape = [n, c] + [1] * (2 * dims)
        shape[2 + d], shape[2 + dims + d] = output_size[d], kernel[d]
        index = index + (start[..., None] + jnp.arange(kernel[d])).reshape(shape) * math.prod(spatial[d + 1:])
    index = index.reshape(n, c, -1)
    values = jnp.take_along_axis(flat, index, axis=-1).reshape(n, c, *output_size, -1)
    best = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    where = jnp.take_along_axis(index.reshape(n, c, *output_size, -1), best[..., None], axis=-1)[..., 0]
    if not batched:
        out, where = out[0], where[0]
    return out, where


#: the height's windows from sample 1, the width's from sample 0 (torch's); 3d: time, height, width from 0, 1, 2
fractional_max_pool2d = functools.partial(_fractional_max_pool, (1, 0))
fractional_max_pool3d = functools.partial(_fractional_max_pool, (0, 1, 2))
