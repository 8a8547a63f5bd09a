"""``torch.hash_tensor``: refused with the reason and the fix, rather than left without a lowering.

Its result is a uint64: the XOR of every element's 64-bit pattern (floats widened to float64 first). The graph
is lowered with jax x64 off, so a uint64 output is a uint32 in the HLO and the runtime widens it back: the upper
32 bits of the hash (sign, exponent and leading mantissa bits of each float64) would be lost. A wrong hash is
worse than none, so the op is refused at compile time.
"""
from __future__ import annotations

from typing import Any


def hash_tensor(x: Any, dim: Any = (), keepdim: bool = False, mode: int = 0) -> Any:
    """``aten.hash_tensor``: raises (the lowering turns it into a :class:`LoweringError` naming the op)."""
    raise ValueError("torch.hash_tensor returns a uint64 hash of 64-bit bit patterns, which a Neuron graph cannot "
                     "run: 64-bit integers are lowered as 32-bit, and the hash's upper half would be lost. Compute "
                     "the hash outside the compiled function (on its output or inputs)")
