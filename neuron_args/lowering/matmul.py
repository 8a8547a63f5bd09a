"""Matrix products torchax lowers wrong or not at all: ``addmm`` with its scalars, ``addbmm`` rounded per batch as
eager, and the grouped matmul of transformers' mixture-of-experts layers with its backward."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jnp, lax
from neuron_args.lowering.gradients import pullback


def grouped_mm(input: Any, weight: Any, offs: Any) -> Any:
    """``transformers::grouped_mm_fallback`` (rows sorted by expert, ``offs`` = cumulative counts): each row times
    its expert's gathered weight in float32, where the eager kernel loops over ``offs.tolist()``."""
    rows = jnp.arange(input.shape[0])
    expert = jnp.sum(rows[:, None] >= offs[None, :].astype(rows.dtype), axis=1)
    expert = jnp.minimum(expert, weight.shape[0] - 1)  # rows past the last offset: zero in eager
    valid = rows < offs[-1]
    out = jnp.einsum("si,sio->so", input, weight[expert], preferred_element_type=jnp.float32)
    return jnp.where(valid[:, None], out, 0.0).astype(input.dtype)


def grouped_mm_backward(input: Any, weight: Any, offs: Any, grad_output: Any) -> tuple[Any, Any]:
    """``transformers::grouped_mm_fallback_backward``: ``(grad_input, grad_weight)``, the vjp of the lowering above."""
    return pullback(lambda x, w: grouped_mm(x, w, offs), grad_output, input, weight)


def addmm(bias: Any, a: Any, b: Any, *, beta: float = 1, alpha: float = 1) -> Any:
    """``bias + a @ b`` accumulated in float32 and rounded once, as torch's CPU kernel does (the matmul stays in
    the input dtype with a float32 result, as accelerators run it)."""
    f32 = jnp.float32
    out = jnp.matmul(a, b, preferred_element_type=f32 if a.dtype != jnp.float64 else None)
    if alpha != 1:
        out = out * alpha
    out = out + (bias.astype(out.dtype) if beta == 1 else beta * bias.astype(out.dtype))
    return out.astype(jnp.result_type(a.dtype, b.dtype))


def addbmm(input: Any, batch1: Any, batch2: Any, *, beta: float = 1, alpha: float = 1) -> Any:
    """``beta * input + alpha * sum_i batch1[i] @ batch2[i]`` as torch's CPU kernel computes it: one :func:`addmm` per
    batch into the result, each rounded to the dtype (``beta`` on the first only). A half-precision result summed once
    instead differs from eager's by several units in the last place."""
    dtype = jnp.result_type(batch1.dtype, batch2.dtype)
    shape = (batch1.shape[1], batch2.shape[2])
    out = jnp.zeros(shape, dtype) if beta == 0 else jnp.broadcast_to(input, shape).astype(dtype)
    if batch1.shape[0] == 0:
        return out if beta in (0, 1) else (beta * out).astype(dtype)
    out = addmm(out, batch1[0], batch2[0], beta=beta, alpha=alpha)
    out, _ = lax.scan(lambda acc, ab: (addmm(acc, ab[0], ab[1], alpha=alpha), None), out, (batch1[1:], batch2[1:]))
    return out
