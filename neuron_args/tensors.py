"""Tensor specs and dtypes shared by lowering and the runtime (a leaf: torch and numpy only); 64-bit dtypes live
in the HLO as their 32-bit type (jax x64 is off)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: torch dtype -> the dtype the graph is lowered with (jax x64 off).
LOWERED_DTYPES: dict[str, str] = {
    "int64": "int32",
    "uint64": "uint32",
    "float64": "float32",
    "complex128": "complex64",
    # XLA has no complex32: conversions to it round each part to float16 in the graph (elementwise.py), the runtime
    # casts the complex64 result back (exact)
    "complex32": "complex64",
}

#: torch dtypes a graph *output* of which leaves the HLO as two uint32 words ``(low, high)`` on a last axis of 2,
#: so all 64 bits reach torch (``torch.hash_tensor``, :mod:`neuron_args.lowering.hashing`)
WORD_PAIR_DTYPES = frozenset({"uint64"})


@dataclass(frozen=True)
class TensorSpec:
    """Shape and torch dtype name (``"float32"``, ``"int64"``, ``"bfloat16"``) of one tensor."""

    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch."))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def lowered_dtype(self) -> str:
        """The dtype name of this tensor inside the HLO (64-bit types become 32-bit)."""
        return LOWERED_DTYPES.get(self.dtype, self.dtype)

    @property
    def lowered_output_shape(self) -> tuple[int, ...]:
        """The shape of this tensor as an HLO result (a word pair adds a last axis of 2)."""
        return (*self.shape, 2) if self.dtype in WORD_PAIR_DTYPES else self.shape

    @property
    def lowered_output_dtype(self) -> str:
        """The dtype name of this tensor as an HLO result (a word pair is uint32)."""
        return "uint32" if self.dtype in WORD_PAIR_DTYPES else self.lowered_dtype

    def mismatch(self, what: str, t: torch.Tensor) -> str:
        """The error for ``t`` passed where ``what`` (``"NEFF input 0"``) takes a tensor of this spec."""
        return (f"{what} expects {self.dtype}{list(self.shape)}, got {str(t.dtype).removeprefix('torch.')}"
                f"{list(t.shape)}: the graph was compiled for other inputs (pass tensors shaped like the ones it was "
                "traced with)")


def from_lowered_output(t: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """An HLO result as the tensor ``spec`` names (a uint64 from its little-endian words, a view; 64-bit types cast)."""
    if spec.dtype in WORD_PAIR_DTYPES:
        return t.contiguous().view(spec.torch_dtype).reshape(spec.shape)
    if spec.lowered_dtype != spec.dtype:
        return t.to(spec.torch_dtype)
    return t


# dtypes numpy lacks (ml_dtypes has them, by the same name): torch dtype name -> same-width integer torch dtype
_BIT_VIEWS: dict[str, torch.dtype] = {
    "bfloat16": torch.int16,
    "float8_e4m3fn": torch.int8,
    "float8_e5m2": torch.int8,
    "float8_e4m3fnuz": torch.int8,
    "float8_e5m2fnuz": torch.int8,
}


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a torch dtype name (``"bfloat16"`` -> ``ml_dtypes.bfloat16``)."""
    if name in _BIT_VIEWS:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"torch dtype {name!r} has no numpy/XLA equivalent") from None


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of the same dtype (a view where possible)."""
    t = t.detach()
    name = str(t.dtype).removeprefix("torch.")
    if name in _BIT_VIEWS:
        return t.view(_BIT_VIEWS[name]).numpy().view(numpy_dtype(name))
    return t.numpy()
