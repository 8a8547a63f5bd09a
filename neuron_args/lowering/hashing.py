"""``torch.hash_tensor`` (mode 0): the XOR of every element's 64-bit pattern, built exactly as two uint32 words
(jax x64 is off) that leave the HLO as ``(low, high)`` (:data:`neuron_args.tensors.WORD_PAIR_DTYPES`). A hash
used inside the graph, or of a float64 input, is refused (:func:`refusal`).
"""
from __future__ import annotations

from typing import Any

import torch

from neuron_args.lazy_modules import jnp, lax
from neuron_args.lowering.precision import WIDE

_HASH = torch.ops.aten.hash_tensor.default


def hash_tensor(x: Any, dim: Any = (), keepdim: bool = False, mode: int = 0) -> Any:
    """``aten.hash_tensor``: the uint64 XOR hash as uint32 words ``(low, high)`` on a new last axis."""
    if mode != 0:
        raise ValueError(f"torch.hash_tensor mode={mode} is not defined (mode 0, the xor reduction, is)")
    low, high = _words(x)
    dims = _reduced_dims(dim, x.ndim)
    low, high = (lax.reduce(w, jnp.uint32(0), lax.bitwise_xor, dims) for w in (low, high))
    if keepdim:
        low, high = (jnp.expand_dims(w, dims) for w in (low, high))
    return jnp.stack([low, high], axis=-1)


def _reduced_dims(dim: Any, ndim: int) -> tuple[int, ...]:
    """``dim`` as sorted non-negative axes; ``None`` or ``()`` reduce them all (torch's ``dim=[]``)."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    if ndim == 0:
        return ()
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({d % ndim for d in dims}))


def _words(x: Any) -> tuple[Any, Any]:
    """The (low, high) uint32 words of each element's 64-bit pattern."""
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.unsignedinteger):  # zero-extended
        return x.astype(jnp.uint32), jnp.zeros(x.shape, jnp.uint32)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        wide = x.astype(jnp.int32)
        return lax.bitcast_convert_type(wide, jnp.uint32), jnp.where(wide < 0, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize <= 4:
        return _float64_words(lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32))
    raise ValueError(f"torch.hash_tensor of a {dtype} tensor has no exact 32-bit lowering")


def _float64_words(bits: Any) -> tuple[Any, Any]:
    """The float64 bit pattern of float32 values given as their uint32 bits, as (low, high) words (a subnormal
    normalized, a NaN quieted, as the CPU's conversion does)."""
    u32 = jnp.uint32
    sign = bits & u32(0x80000000)
    exponent = (bits >> u32(23)) & u32(0xFF)
    mantissa = bits & u32(0x7FFFFF)
    # a subnormal: value = mantissa * 2**-149; its leading bit p (0..22) becomes the implicit bit
    lead = u32(31) - lax.clz(mantissa)
    sub_mantissa = (mantissa << (u32(23) - lead)) & u32(0x7FFFFF)
    sub_exponent = lead + u32(874)  # p - 149 + 1023
    special = exponent == u32(0xFF)
    is_nan = special & (mantissa != u32(0))
    zero = (exponent == u32(0)) & (mantissa == u32(0))
    subnormal = (exponent == u32(0)) & (mantissa != u32(0))
    wide_exponent = jnp.where(special, u32(2047), jnp.where(subnormal, sub_exponent, exponent + u32(896)))
    wide_mantissa = jnp.where(subnormal, sub_mantissa, jnp.where(is_nan, mantissa | u32(0x400000), mantissa))
    high = sign | (wide_exponent << u32(20)) | (wide_mantissa >> u32(3))
    low = (wide_mantissa & u32(7)) << u32(29)
    return jnp.where(zero, u32(0), low), jnp.where(zero, sign, high)


def refusal(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, ValueError] | None:
    """The first ``hash_tensor`` node that cannot be lowered exactly, with why and the fix; None: every hash lowers."""
    for n in gm.graph.nodes:
        if n.target is not _HASH:
            continue
        source = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        if isinstance(source, torch.Tensor) and source.dtype in WIDE:
            return n, ValueError(
                f"torch.hash_tensor of a {str(source.dtype).removeprefix('torch.')} tensor hashes its 64-bit "
                "pattern, which a Neuron graph cannot hold (float64 is lowered as float32). Hash that tensor "
                "outside the compiled function")
        users = [u for u in n.users if u.op != "output"]
        if users:
            return n, ValueError(
                f"the uint64 result of torch.hash_tensor is used by {users[0].target} inside the graph, which holds "
                "64-bit integers as 32-bit: only a hash the compiled function returns keeps all 64 bits. Return "
                "the hash and use it outside the compiled function")
    return None


def is_hash(node: Any) -> bool:
    """``node`` is a ``hash_tensor`` node: its lowered value is the (low, high) word pair."""
    return isinstance(node, torch.fx.Node) and node.target is _HASH
