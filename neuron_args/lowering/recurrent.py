"""LSTM's oneDNN layer op (what ``nn.LSTM`` calls when its input needs no gradient) and its backward,
as a scan over time steps."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jax, jnp


_LSTM = 2  # mkldnn_rnn_layer's mode for an LSTM (ideep's rnn_kind)


def mkldnn_rnn_layer(
    input: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, hx: Any, cx: Any, reverse: bool, batch_sizes: Any,
    mode: int, hidden_size: int, num_layers: int, has_biases: bool, bidirectional: bool, batch_first: bool,
    train: bool,
) -> tuple[Any, Any, Any, Any]:
    """``aten.mkldnn_rnn_layer``: one direction of one LSTM layer, ``(output, h, c, workspace)``; half precision as
    oneDNN: gates and cell state in float32, each ``h`` rounded (rounding every intermediate doubles the error)."""
    if mode != _LSTM or batch_sizes:
        raise ValueError(f"mkldnn_rnn_layer mode={mode} with batch_sizes={list(batch_sizes)}: only a padded LSTM "
                         "lowers (mode 2, no PackedSequence); pad the sequences instead of packing them")
    dtype, f32 = input.dtype, jnp.float32
    x = jnp.swapaxes(input, 0, 1) if batch_first else input  # (time, batch, features)
    projected = jnp.einsum("tbi,gi->tbg", x, w_ih, preferred_element_type=f32)
    if has_biases:
        projected = projected + b_ih.astype(f32) + b_hh.astype(f32)

    def step(carry: tuple[Any, Any], xw: Any) -> tuple[tuple[Any, Any], Any]:
        h, c = carry
        i, f, g, o = jnp.split(xw + jnp.matmul(h, w_hh.T, preferred_element_type=f32), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(dtype)
        return (h, c), h

    (h, c), out = jax.lax.scan(step, (hx[0], cx[0].astype(f32)), projected, reverse=reverse)
    out = jnp.swapaxes(out, 0, 1) if batch_first else out
    return out, h[None], c[None].astype(dtype), jnp.zeros((0,), jnp.uint8)


def mkldnn_rnn_layer_backward(
    input: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, hx: Any, cx: Any, output: Any, hy: Any, cy: Any,
    grad_output: Any, grad_hy: Any, grad_cy: Any, reverse: bool, mode: int, hidden_size: int, num_layers: int,
    has_biases: bool, train: bool, bidirectional: bool, batch_sizes: Any, batch_first: bool, workspace: Any,
) -> tuple[Any, ...]:
    """``aten.mkldnn_rnn_layer_backward``: the vjp of the layer's lowering above (a missing output gradient is zero)."""
    def layer(x: Any, w0: Any, w1: Any, w2: Any, w3: Any, h: Any, c: Any) -> tuple[Any, Any, Any]:
        out, h_n, c_n, _ = mkldnn_rnn_layer(x, w0, w1, w2, w3, h, c, reverse, batch_sizes, mode, hidden_size,
                                             num_layers, has_biases, bidirectional, batch_first, train)
        return out, h_n, c_n

    primals = (input, w_ih, w_hh, b_ih, b_hh, hx, cx)
    outs, pull = jax.vjp(layer, *primals)
    cotangents = tuple(jnp.zeros_like(o) if g is None else g.astype(o.dtype)
                       for o, g in zip(outs, (grad_output, grad_hy, grad_cy)))
    return pull(cotangents)
