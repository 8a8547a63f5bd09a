"""Antialiased bilinear and bicubic resizes (``interpolate(antialias=True)``) and their backward, with
the separable filter weights torch's CPU kernel uses."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_args.lazy_modules import jnp


def triangle(x: Any) -> Any:
    return np.maximum(0.0, 1.0 - np.abs(x))


def cubic(x: Any, a: float = -0.5) -> Any:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def antialias_weights(in_size: int, out_size: int, align_corners: bool, scale: float | None,
                       kernel: Callable[[Any], Any], support: float) -> Any:
    """The ``(out_size, in_size)`` matrix of an antialiased resize along one axis, as torch's CPU kernel builds it:
    the filter stretched by the downscale factor, each output's taps normalised to sum to one."""
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale else in_size / out_size
    reach = support * ratio if ratio >= 1.0 else support
    invscale = 1.0 / ratio if ratio >= 1.0 else 1.0
    weights = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = ratio * (i + 0.5)
        lo, hi = max(int(center - reach + 0.5), 0), min(int(center + reach + 0.5), in_size)
        taps = kernel((np.arange(lo, hi) - center + 0.5) * invscale)
        if taps.sum() != 0:
            weights[i, lo:hi] = taps / taps.sum()
    return weights


def _resize(kernel: Callable[[Any], Any], support: float, equation: str, x: Any, output_size: Any, input_size: Any,
            align_corners: bool, scales_h: float | None = None, scales_w: float | None = None) -> Any:
    """``equation`` over the constant row and column weight matrices and ``x``, in float32, in ``x``'s dtype."""
    (out_h, out_w), (in_h, in_w) = output_size, input_size[-2:]
    rows = jnp.asarray(antialias_weights(in_h, out_h, align_corners, scales_h, kernel, support), jnp.float32)
    cols = jnp.asarray(antialias_weights(in_w, out_w, align_corners, scales_w, kernel, support), jnp.float32)
    return jnp.einsum(equation, rows, x.astype(jnp.float32), cols, precision="highest").astype(x.dtype)


def upsample_aa(kernel: Callable[[Any], Any], support: float) -> Callable[..., Any]:
    """The lowering of ``aten._upsample_{bilinear,bicubic}2d_aa`` (torchax's fails to trace): a separable resize with
    constant weight matrices, ``W_h @ x @ W_w^T`` per image and channel."""
    def lowering(x: Any, output_size: Any, align_corners: bool, scales_h: float | None = None,
                 scales_w: float | None = None) -> Any:
        return _resize(kernel, support, "oh,...hw,pw->...op", x, output_size, x.shape, align_corners, scales_h,
                       scales_w)

    return lowering


def upsample_aa_backward(kernel: Callable[[Any], Any], support: float) -> Callable[..., Any]:
    """The lowering of ``aten._upsample_{bilinear,bicubic}2d_aa_backward``: the forward's weights transposed (a
    closure, not a partial of functions: the trace memo digests a closure's cells across processes)."""
    def lowering(grad_output: Any, output_size: Any, input_size: Any, align_corners: bool,
                 scales_h: float | None = None, scales_w: float | None = None) -> Any:
        return _resize(kernel, support, "oh,...op,pw->...hw", grad_output, output_size, input_size, align_corners,
                       scales_h, scales_w)

    return lowering
