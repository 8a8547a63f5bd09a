"""Run a compiled graph with torch tensors: the serve hot path.

What depends only on the graph's specs is chosen at load, so a call is a check per input, one ``execute`` and one
DLPack hand-over per output. Inputs are aliased through DLPack, not copied: a position reuses its last buffer for the
same dense tensor (weights, a KV cache written in place), those passed again are checked in bulk, a cast input
(int64 -> int32: jax x64 is off) goes through a staging tensor. Outputs are the runtime's fresh result buffers.
"""
from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from neuron_args import xla_cpu
from neuron_args.lazy_modules import jaxlib_jax
from neuron_args.tensors import WORD_PAIR_DTYPES, TensorSpec, from_lowered_output

log = logging.getLogger("neuron_args.runtime")


def _input_converter(index: int, spec: TensorSpec, device: Any) -> Callable[[torch.Tensor], Any]:
    """``tensor -> device buffer`` for one graph input, remembering the buffer that aliases it; another dtype or shape
    is refused (XLA checks byte sizes only: int32 would be read as float32 bits)."""
    dtype, shape = spec.torch_dtype, torch.Size(spec.shape)
    cast = None if spec.lowered_dtype == spec.dtype else getattr(torch, spec.lowered_dtype)
    to_buffer = jaxlib_jax.dlpack_managed_tensor_to_buffer  # (capsule, device) -> buffer
    to_dlpack = torch._C._to_dlpack
    # (tensor, its data pointer, the buffer aliasing it), replaced as one tuple: threads may share it
    last: list[tuple[torch.Tensor, int, Any] | None] = [None]
    # a cast input (int64 -> int32) is cast into a per-thread staging tensor its buffer aliases
    staged = threading.local()

    def cast_in(t: torch.Tensor) -> Any:
        pair = getattr(staged, "pair", None)
        if pair is None:
            with torch.inference_mode(False):
                staging = torch.empty(shape, dtype=cast)
            buf = to_buffer(to_dlpack(staging), device, None, None)
            if buf.unsafe_buffer_pointer() != staging.data_ptr():  # not aliased: cast afresh each call
                return to_buffer(to_dlpack(t.detach().to(cast)), device, None, None)
            pair = staged.pair = (staging, buf)
        pair[0].copy_(t.detach() if t.requires_grad else t)  # the executable reads it before this returns
        return pair[1]

    def convert(t: torch.Tensor) -> Any:
        seen = last[0]
        if seen is not None and t is seen[0] and t.data_ptr() == seen[1] and t.is_contiguous() \
                and t.dtype is dtype and t.shape == shape:
            return seen[2]
        if t.dtype is not dtype or t.shape != shape:
            raise TypeError(spec.mismatch(f"executable input {index}", t))
        if t.device.type != "cpu":
            raise TypeError(f"executable input {index} is on {t.device}; XLA:CPU executables take CPU tensors")
        if cast is not None:
            return cast_in(t)
        aliasable = t.is_contiguous()
        src = t.detach() if t.requires_grad else t
        if not aliasable:
            src = src.contiguous()
        buf = to_buffer(to_dlpack(src), device, None, None)
        last[0] = (t, t.data_ptr(), buf) if aliasable and buf.unsafe_buffer_pointer() == t.data_ptr() else None
        return buf

    return convert


def _output_converter(spec: TensorSpec, copy: bool) -> Callable[[Any], torch.Tensor]:
    """``result buffer -> tensor`` through DLPack, cast back if it was lowered (a uint64 from its word pair)."""
    to_capsule = jaxlib_jax.buffer_to_dlpack_managed_tensor  # buffer -> capsule
    from_dlpack = torch._C._from_dlpack
    if spec.dtype in WORD_PAIR_DTYPES:  # a view of the words: copied only where the buffer is aliased
        return lambda a: from_lowered_output(from_dlpack(to_capsule(a)).clone() if copy else from_dlpack(to_capsule(a)),
                                             spec)
    if spec.lowered_dtype != spec.dtype:  # int32 -> int64 etc.: the cast is the one copy
        return lambda a: from_lowered_output(from_dlpack(to_capsule(a)), spec)
    if copy:
        return lambda a: from_dlpack(to_capsule(a)).clone()
    return lambda a: from_dlpack(to_capsule(a))


_handlers_missing = False  # this jaxlib makes no result handlers (said once)


def _result_handlers(outs: Sequence[Any]) -> tuple[Any, ...] | None:
    """jaxlib's C++ result handler for each output, built from one execution's outputs (shape, dtype, sharding),
    so the next executions' outputs are made without calling Python; None where this jaxlib has none (said once:
    outputs are then disassembled every call, as right and slower; ``tests/test_runtime.py`` fails)."""
    global _handlers_missing
    if _handlers_missing:
        return None
    try:
        return tuple(jaxlib_jax.array_result_handler(o.aval, o.sharding, committed=True, _skip_checks=True)
                     for o in outs)
    except (ImportError, AttributeError, TypeError) as exc:
        _handlers_missing = True
        log.warning("this jaxlib has no result handler for executable outputs (%s): each call's outputs go through "
                    "jax's Python", exc)
        return None


_is, _data_ptr, _contiguous = operator.is_, torch.Tensor.data_ptr, torch.Tensor.is_contiguous
_shape, _dtype = operator.attrgetter("shape"), operator.attrgetter("dtype")


class _Stable:
    """The inputs the last call passed again, aliased by their buffers, with what each one's own check compares."""

    __slots__ = ("pick", "tensors", "ptrs", "shapes", "dtypes", "held", "rest")

    def __init__(self, positions: list[int], args: Sequence[torch.Tensor], bufs: list[Any]) -> None:
        pick = operator.itemgetter(*positions)
        self.pick = pick if len(positions) > 1 else (lambda a: (pick(a),))
        self.tensors = self.pick(args)
        self.ptrs = [t.data_ptr() for t in self.tensors]
        self.shapes = [t.shape for t in self.tensors]
        self.dtypes = [t.dtype for t in self.tensors]
        kept = set(positions)
        self.held = [b if i in kept else None for i, b in enumerate(bufs)]
        self.rest = tuple(i for i in range(len(bufs)) if i not in kept)

    def buffers(self, args: Sequence[torch.Tensor]) -> list[Any] | None:
        """The held buffers (other positions None) when every stable input is still the same dense tensor."""
        sub = self.pick(args)
        if all(map(_is, sub, self.tensors)) and list(map(_data_ptr, sub)) == self.ptrs \
                and all(map(_contiguous, sub)) and list(map(_shape, sub)) == self.shapes \
                and list(map(_dtype, sub)) == self.dtypes:
            return list(self.held)
        return None


class LoadedExecutable:
    """An executable loaded once per process; call with torch tensors."""

    __slots__ = ("executable", "input_specs", "output_specs", "_convert_in", "_convert_out", "_execute",
                 "_wait", "_stable", "_previous", "_handlers")

    def __init__(
        self, executable: Any, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec]
    ) -> None:
        self.executable = executable
        self.input_specs = tuple(input_specs)
        self.output_specs = tuple(output_specs)
        device = executable.local_devices()[0]
        # an executable that may return an input's buffer as an output (donation) gets its outputs copied
        copy = any("input_output_alias" in m.to_string() for m in executable.hlo_modules())
        self._convert_in = tuple(_input_converter(i, s, device) for i, s in enumerate(self.input_specs))
        self._convert_out = tuple(_output_converter(s, copy) for s in self.output_specs)
        self._execute = executable.execute_sharded
        # an asynchronous client returns before the results exist; DLPack needs them ready
        self._wait = not xla_cpu.is_sync_client(executable.client)
        # the inputs passed again call after call, checked in bulk (replaced as one object: threads share it)
        self._stable: _Stable | None = None
        self._previous: tuple[torch.Tensor, ...] = ()
        self._handlers: tuple[Any, ...] | None = None  # set by the first call

    @classmethod
    def from_bytes(
        cls, blob: bytes, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec],
        client: Any = None,
    ) -> LoadedExecutable:
        """Load a serialized executable (the local compiler's ``graph_<key>.neff``, read and checked by the caller)."""
        return cls(xla_cpu.deserialize_executable(blob, client), input_specs, output_specs)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        """Run on CPU tensors shaped like ``input_specs``; fresh writable tensors out."""
        result = self._execute(self.input_buffers(args))
        handlers = self._handlers
        if handlers is None:  # the first call: its outputs, disassembled, give the result handlers of the next
            outs = [o[0] for o in result.disassemble_into_single_device_arrays()]
            self._handlers = _result_handlers(outs)
        else:
            outs = result.consume_with_handlers(handlers)
        if self._wait:
            for o in outs:
                o.block_until_ready()
        return [f(o) for f, o in zip(self._convert_out, outs)]

    def input_buffers(self, args: Sequence[torch.Tensor]) -> list[Any]:
        """The device buffers of a call's inputs: the stable ones' after one bulk check, the others converted."""
        convert = self._convert_in
        if len(args) != len(convert):
            raise TypeError(f"executable takes {len(convert)} tensors, got {len(args)}")
        stable = self._stable
        bufs = None if stable is None else stable.buffers(args)
        if bufs is None:
            bufs = [f(a) for f, a in zip(convert, args)]
            self._learn(tuple(args), bufs)
        else:
            for i in stable.rest:
                bufs[i] = convert[i](args[i])
        return bufs

    def _learn(self, args: tuple[torch.Tensor, ...], bufs: list[Any]) -> None:
        """After a call checked input by input: the inputs that are the previous call's tensors again, dense
        and aliased by their buffers, are checked in bulk from the next call on."""
        previous, self._previous = self._previous, args
        positions = [i for i, (t, b) in enumerate(zip(args, bufs))
                     if i < len(previous) and t is previous[i] and self.input_specs[i].lowered_dtype ==
                     self.input_specs[i].dtype and t.is_contiguous() and b.unsafe_buffer_pointer() == t.data_ptr()]
        self._stable = _Stable(positions, args, bufs) if positions else None


def graph_call(run: Callable[..., Sequence[Any]], lowered: Any) -> Callable[..., list[Any]]:
    """``run`` as the call of the FX graph ``lowered`` came from: a seeded graph gets a fresh random key from torch's
    generator (``torch.manual_seed`` repeats runs), outputs kept out of the HLO are put back, aot's tokens dropped."""
    constants, seeded = tuple(lowered.constant_outputs), bool(lowered.seeded)
    tokens = frozenset(getattr(lowered, "token_inputs", ()))
    if not constants and not seeded and not tokens:
        return run

    def call(*args: Any) -> list[Any]:
        if tokens:
            args = tuple(a for i, a in enumerate(args) if i not in tokens)
        if seeded:
            args = (*args, torch.randint(-2**31, 2**31 - 1, (2,), dtype=torch.int32))
        outs = list(run(*args))
        for i, value in constants:
            outs.insert(i, value)
        return outs

    return call
