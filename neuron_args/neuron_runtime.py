"""Run a NEFF on a NeuronCore through torch-neuronx's runtime binding (sources: docs/NEURON_RUNTIME.md).

Exactly what torch-neuronx's traced modules use (``torch.classes.neuron.Model``, ``torch.ops.neuron.forward_v2``);
the cores come from the engine's ``NEURON_VISIBLE_DEVICES`` window, so an engine runs where its manifest says.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from neuron_args import envs
from neuron_args.errors import NeuronArgsError
from neuron_args.manifest.engine import VISIBLE_DEVICES_ENV, parse_visible_devices
from neuron_args.tensors import TensorSpec, from_lowered_output

RUNTIME_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
INSTALL_HINT = ("pip install torch-neuronx --extra-index-url=https://pip.repos.neuron.amazonaws.com "
                "(or pip install -e '.[neuron]' with that index)")

# torch dtype name (as the HLO holds it) -> metaneff MetaTensor.DataType name (torch_neuronx.xla_impl.trace.hlo_metaneff)
# (the name in capitals, but for these four)
METANEFF_DTYPES: dict[str, str] = {
    "float32": "FLOAT", "float64": "DOUBLE", "uint32": "INT32", "uint64": "INT64",
    **{n: n.upper() for n in ("bfloat16", "float16", "uint8", "int8", "uint16", "int16", "int32", "int64", "bool")},
}


class RuntimeBindingError(NeuronArgsError):
    """A NEFF must run but torch-neuronx's runtime binding is not importable (or cannot load it)."""


@dataclass(frozen=True)
class Binding:
    """The torch-neuronx API surface this module uses."""

    model_class: Callable[[bytes, bytes], Any]  # torch.classes.neuron.Model
    forward: Callable[[list[torch.Tensor], Any], Sequence[torch.Tensor]]  # torch.ops.neuron.forward_v2
    metaneff_pb2: Any  # torch_neuronx.proto.metaneff_pb2


def load_binding() -> Binding:
    """torch-neuronx's runtime binding; :class:`RuntimeBindingError` saying why when there is none."""
    try:
        import torch_neuronx  # noqa: F401  (loads libtorchneuron.so: registers the class and the op)
        from torch_neuronx.proto import metaneff_pb2
    except ImportError as exc:
        raise RuntimeBindingError(f"torch_neuronx is not importable ({exc})") from exc
    try:
        return Binding(torch.classes.neuron.Model, torch.ops.neuron.forward_v2, metaneff_pb2)
    except (AttributeError, RuntimeError) as exc:
        raise RuntimeBindingError(
            f"torch_neuronx imported but registered no torch.classes.neuron.Model / torch.ops.neuron.forward_v2 "
            f"({exc})") from exc


def core_window(environ: Mapping[str, str] | None = None) -> str | None:
    """``NEURON_RT_VISIBLE_CORES`` for this process (``"2-3"``, ``"4"``; None without a window): tensor-parallel rank
    ``r`` takes the ``r``-th equal slice of the ``NEURON_VISIBLE_DEVICES`` window. The runtime takes one range, so
    a window with gaps, or one that does not split evenly among the ranks, is refused."""
    env = envs.environ() if environ is None else environ
    value = env.get(VISIBLE_DEVICES_ENV, "").strip()
    if not value:
        return None
    cores = parse_visible_devices(value)
    first, last = min(cores), max(cores)
    if sorted(cores) != list(range(first, last + 1)):
        raise NeuronArgsError(
            f"{VISIBLE_DEVICES_ENV}={value!r} is not one contiguous range of NeuronCores, and the Neuron runtime "
            f"reserves one range ({RUNTIME_CORES_ENV}, e.g. '{first}-{last}'); give each engine a contiguous window")
    ranks = int(env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE") or 1)
    rank = int(env.get("LOCAL_RANK") or env.get("RANK") or 0)
    count = last - first + 1
    if ranks > 1:
        if count % ranks or not 0 <= rank < ranks:
            raise NeuronArgsError(
                f"{VISIBLE_DEVICES_ENV}={value!r} ({count} cores) cannot give rank {rank} of {ranks} tensor-parallel "
                f"ranks an equal share; give the engine a multiple of {ranks} cores")
        count //= ranks
        first += rank * count
        last = first + count - 1
    return str(first) if first == last else f"{first}-{last}"


def apply_core_window(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``NEURON_RT_VISIBLE_CORES`` from the engine's window before the runtime initializes (an explicit one
    naming other cores is an error: the manifest would name cores the engine does not run on)."""
    env = envs.environ() if environ is None else environ
    window = core_window(env)
    if window is None:
        return env.get(RUNTIME_CORES_ENV)
    explicit = env.get(RUNTIME_CORES_ENV)
    if explicit is not None and explicit.strip() != window:
        raise NeuronArgsError(
            f"{RUNTIME_CORES_ENV}={explicit!r} but {VISIBLE_DEVICES_ENV}={env[VISIBLE_DEVICES_ENV]!r} gives this "
            f"process cores {window}: it would run on other cores than its manifest names; unset "
            f"{RUNTIME_CORES_ENV} (it is derived from {VISIBLE_DEVICES_ENV}) or make them agree")
    env[RUNTIME_CORES_ENV] = window
    return window


def metaneff(binding: Binding, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec]) -> bytes:
    """The serialized ``MetaNeff`` of a graph, as torch-neuronx's ``hlo_metaneff`` builds it."""
    pb = binding.metaneff_pb2
    message = pb.MetaNeff()
    for prefix, specs, tensors in (("input", input_specs, message.input_tensors),
                                   ("output", output_specs, message.output_tensors)):
        for index, spec in enumerate(specs):
            tensor = tensors.add()
            tensor.name = f"{prefix}{index}".encode("utf8")  # the runtime looks tensors up as input#/output#
            output = prefix == "output"  # a uint64 output is two uint32 words in the HLO
            tensor.shape[:] = list(spec.lowered_output_shape if output else spec.shape)
            lowered = spec.lowered_output_dtype if output else spec.lowered_dtype
            if lowered not in METANEFF_DTYPES:
                raise NeuronArgsError(
                    f"a NEFF tensor of dtype {spec.dtype} has no Neuron runtime data type (supported: "
                    f"{', '.join(sorted(METANEFF_DTYPES))}); cast it in the model before the graph boundary")
            tensor.data_type = getattr(pb.MetaTensor.DataType, METANEFF_DTYPES[lowered])
    return message.SerializeToString()


class NeffExecutable:
    """A NEFF loaded on this engine's NeuronCores; call with CPU tensors shaped like ``input_specs``."""

    __slots__ = ("model", "forward", "input_specs", "output_specs", "_in_casts", "_out_casts")

    def __init__(self, model: Any, forward: Callable[[list[torch.Tensor], Any], Sequence[torch.Tensor]],
                 input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec]) -> None:
        self.model = model
        self.forward = forward
        self.input_specs = tuple(input_specs)
        self.output_specs = tuple(output_specs)
        # 64-bit tensors are 32-bit inside the NEFF: cast in (None: no cast), back out (a uint64 output from its words)
        self._in_casts = tuple(None if s.lowered_dtype == s.dtype else getattr(torch, s.lowered_dtype)
                               for s in self.input_specs)
        self._out_casts = tuple(s.lowered_output_dtype != s.dtype for s in self.output_specs)

    @classmethod
    def load(cls, neff: bytes, input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec],
             binding: Binding | None = None, *, path: str | os.PathLike[str]) -> NeffExecutable:
        """Load a NEFF (read and checked from ``path`` by the caller) onto the engine's cores through torch-neuronx."""
        binding = binding or load_binding()
        apply_core_window()
        meta = metaneff(binding, input_specs, output_specs)
        try:
            model = binding.model_class(neff, meta)
        except RuntimeError as exc:  # nrt_load failed: no free core, a NEFF for another target...
            raise RuntimeBindingError(
                f"the Neuron runtime could not load {path} ({exc}); check the NEFF's target against this host "
                f"and that {RUNTIME_CORES_ENV}={envs.text(RUNTIME_CORES_ENV) or '<all>'} names free cores "
                "(neuron-ls lists them)") from exc
        return cls(model, binding.forward, input_specs, output_specs)

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        if len(args) != len(self.input_specs):
            raise TypeError(f"NEFF takes {len(self.input_specs)} tensors, got {len(args)}")
        inputs = []
        for index, (t, spec, cast) in enumerate(zip(args, self.input_specs, self._in_casts)):
            if t.dtype is not spec.torch_dtype or tuple(t.shape) != spec.shape:
                raise TypeError(spec.mismatch(f"NEFF input {index}", t))
            t = t.detach()
            inputs.append((t if cast is None else t.to(cast)).contiguous())
        outs = self.forward(inputs, self.model)
        if len(outs) != len(self.output_specs):
            raise RuntimeBindingError(
                f"the NEFF returned {len(outs)} tensors where its cache entry records {len(self.output_specs)} outputs: "
                "the NEFF and the entry's metadata disagree; remove the entry so it is rebuilt")
        return [from_lowered_output(o, spec) if cast else o
                for o, spec, cast in zip(outs, self.output_specs, self._out_casts)]


__all__ = ["Binding", "INSTALL_HINT", "NeffExecutable", "RUNTIME_CORES_ENV", "RuntimeBindingError",
           "apply_core_window", "core_window", "load_binding", "metaneff"]
