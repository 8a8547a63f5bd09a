"""Run a compiled graph with torch tensors: the serve hot path.

A :class:`LoadedExecutable` is built once per graph per process; everything that depends only on
the graph's specs (dtype casts, bfloat16 reinterpretation) is chosen at load, so a call is one
conversion per input, ``xla_cpu.execute`` and one copy per output. Outputs are copied because
the runtime hands back read-only views of its own buffers and torch may write into what it gets
(aot_autograd copies mutated buffers back, users modify outputs in place).

numpy has no bfloat16/float8: those go through ``ml_dtypes`` by reinterpreting the bits (no copy
on the way in). jax x64 is off, so 64-bit inputs are cast to the 32-bit type the graph was lowered
with and outputs are cast back to the torch dtype recorded from the graph.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neuron_args import xla_cpu
from neuron_args.lowering.hlo import TensorSpec

# dtypes numpy lacks: torch dtype name -> (same-width integer torch dtype, ml_dtypes name)
_BIT_VIEWS: dict[str, tuple[torch.dtype, str]] = {
    "bfloat16": (torch.int16, "bfloat16"),
    "float8_e4m3fn": (torch.int8, "float8_e4m3fn"),
    "float8_e5m2": (torch.int8, "float8_e5m2"),
    "float8_e4m3fnuz": (torch.int8, "float8_e4m3fnuz"),
    "float8_e5m2fnuz": (torch.int8, "float8_e5m2fnuz"),
}


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a torch dtype name (``"bfloat16"`` -> ``ml_dtypes.bfloat16``)."""
    if name in _BIT_VIEWS:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _BIT_VIEWS[name][1]))
    if name == "bool":
        return np.dtype(np.bool_)
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"torch dtype {name!r} has no numpy/XLA equivalent") from None


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of the same dtype (a view where possible)."""
    t = t.detach()
    name = str(t.dtype).removeprefix("torch.")
    if name in _BIT_VIEWS:
        return t.view(_BIT_VIEWS[name][0]).numpy().view(numpy_dtype(name))
    return t.numpy()


def _input_converter(index: int, spec: TensorSpec) -> Callable[[torch.Tensor], np.ndarray]:
    """``tensor -> host array`` for one graph input; a tensor of another dtype/shape is refused
    (XLA only checks byte sizes: an int32 tensor would be read as float32 bits)."""
    dtype, shape = spec.torch_dtype, torch.Size(spec.shape)
    if spec.dtype in _BIT_VIEWS:
        bits, np_dtype = _BIT_VIEWS[spec.dtype][0], numpy_dtype(spec.dtype)
        to_numpy = lambda t: t.detach().view(bits).numpy().view(np_dtype)  # noqa: E731
    elif spec.lowered_dtype != spec.dtype:  # int64 -> int32 etc. (jax x64 off)
        lowered = numpy_dtype(spec.lowered_dtype)
        to_numpy = lambda t: t.detach().numpy().astype(lowered)  # noqa: E731
    else:
        to_numpy = lambda t: t.detach().numpy()  # noqa: E731

    def convert(t: torch.Tensor) -> np.ndarray:
        if t.dtype is not dtype or t.shape != shape:
            raise TypeError(
                f"executable input {index} expects {spec.dtype}{list(spec.shape)}, got "
                f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}: the graph was compiled for "
                "other inputs (pass tensors shaped like the ones it was traced with)"
            )
        return to_numpy(t)

    return convert


def _output_converter(spec: TensorSpec) -> Callable[[np.ndarray], torch.Tensor]:
    if spec.dtype in _BIT_VIEWS:
        bits = _BIT_VIEWS[spec.dtype][0]
        np_bits = np.dtype(str(bits).removeprefix("torch."))
        torch_dtype = spec.torch_dtype
        return lambda a: torch.from_numpy(a.view(np_bits).copy()).view(torch_dtype)
    if spec.lowered_dtype == spec.dtype:
        return lambda a: torch.from_numpy(a.copy())
    target = numpy_dtype(spec.dtype)
    return lambda a: torch.from_numpy(a.astype(target))  # astype copies: int32 -> int64 etc.


class LoadedExecutable:
    """An executable loaded once per process; call with torch tensors."""

    __slots__ = ("executable", "input_specs", "output_specs", "_convert_in", "_convert_out")

    def __init__(
        self, executable: Any, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec]
    ) -> None:
        self.executable = executable
        self.input_specs = tuple(input_specs)
        self.output_specs = tuple(output_specs)
        self._convert_in = tuple(_input_converter(i, s) for i, s in enumerate(self.input_specs))
        self._convert_out = tuple(_output_converter(s) for s in self.output_specs)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], input_specs: Sequence[TensorSpec],
        output_specs: Sequence[TensorSpec],
    ) -> LoadedExecutable:
        """Load a serialized executable file (``graph_<key>.neff`` from the local compiler)."""
        return cls.from_bytes(Path(path).read_bytes(), input_specs, output_specs)

    @classmethod
    def from_bytes(
        cls, blob: bytes, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec]
    ) -> LoadedExecutable:
        return cls(xla_cpu.deserialize_executable(blob), input_specs, output_specs)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        """Run on CPU tensors shaped like ``input_specs``; fresh writable tensors out."""
        if len(args) != len(self._convert_in):
            raise TypeError(f"executable takes {len(self._convert_in)} tensors, got {len(args)}")
        outs = xla_cpu.execute(self.executable, [f(a) for f, a in zip(self._convert_in, args)])
        return [f(o) for f, o in zip(self._convert_out, outs)]
