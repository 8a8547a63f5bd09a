"""A stand-in for torch-neuronx's runtime binding: exactly the surface ``neuron_args.neuron_runtime`` uses.

Importing the real ``torch_neuronx`` loads ``libtorchneuron.so``, which registers the TorchScript
class ``torch.classes.neuron.Model(neff, metaneff)`` and the op ``torch.ops.neuron.forward_v2(inputs,
model)``. Importing this package installs Python stand-ins under the same names (``uninstall()``
removes them). A load checks the NEFF bytes and the metaneff; a call checks every input against
the metaneff (count, shape, data type, as the runtime does) and returns zero tensors of the
metaneff's output shapes and types.

Records: ``LOADS`` and ``CALLS`` (in-process lists), and with ``FAKE_NEURON_RUNTIME_RECORD`` set,
one JSON line per load/call appended to that file (for tests that run real processes). A load
records ``NEURON_RT_VISIBLE_CORES`` as the runtime would read it when it initializes.
``FAKE_NEURON_RUNTIME_MODE=load-fails`` makes every load raise as a failed ``nrt_load`` does.
"""
from __future__ import annotations

import hashlib
import json
import os
from types import SimpleNamespace

import torch

from torch_neuronx.proto import metaneff_pb2

LOADS: list[dict] = []
CALLS: list[dict] = []

# metaneff data type -> torch dtype (what the runtime hands back)
_TORCH = {
    "FLOAT": torch.float32, "DOUBLE": torch.float64, "BFLOAT16": torch.bfloat16, "FLOAT16": torch.float16,
    "UINT8": torch.uint8, "INT8": torch.int8, "UINT16": torch.uint16, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "BOOL": torch.bool,
}


def _record(event: dict) -> None:
    path = os.environ.get("FAKE_NEURON_RUNTIME_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**event, "pid": os.getpid()}) + "\n")


def _describe(tensors) -> list[dict]:
    return [{"name": t.name.decode(), "shape": list(t.shape), "dtype": metaneff_pb2.MetaTensor.DataType.Name(t.data_type)}
            for t in tensors]


class Model:
    """``torch.classes.neuron.Model(neff: bytes, metaneff: bytes)``: loads the NEFF (``nrt_load``)."""

    def __init__(self, neff: bytes, metaneff: bytes) -> None:
        if not isinstance(neff, bytes) or not neff:
            raise RuntimeError("fake nrt_load: the NEFF must be non-empty bytes")
        if not isinstance(metaneff, bytes):
            raise RuntimeError("fake nrt_load: the metaneff must be serialized bytes")
        if os.environ.get("FAKE_NEURON_RUNTIME_MODE") == "load-fails":
            raise RuntimeError("fake nrt_load: NRT_RESOURCE (no free NeuronCore)")
        self.meta = metaneff_pb2.MetaNeff.FromString(metaneff)
        self.index = len(LOADS)
        event = {"event": "load", "model": self.index, "neff_sha256": hashlib.sha256(neff).hexdigest(),
                 "inputs": _describe(self.meta.input_tensors), "outputs": _describe(self.meta.output_tensors),
                 "visible_cores": os.environ.get("NEURON_RT_VISIBLE_CORES")}
        LOADS.append(event)
        _record(event)


def forward_v2(inputs: list, model: Model) -> list:
    """``torch.ops.neuron.forward_v2(inputs, model)``: execute; zeros of the metaneff's output specs."""
    if not isinstance(model, Model):
        raise RuntimeError(f"forward_v2: expected a neuron Model, got {type(model).__name__}")
    expected = model.meta.input_tensors
    if len(inputs) != len(expected):
        raise RuntimeError(f"forward_v2: the NEFF takes {len(expected)} inputs, got {len(inputs)}")
    for t, meta in zip(inputs, expected):
        want = _TORCH[metaneff_pb2.MetaTensor.DataType.Name(meta.data_type)]
        if not isinstance(t, torch.Tensor) or list(t.shape) != list(meta.shape) or t.dtype != want:
            raise RuntimeError(f"forward_v2: {meta.name.decode()} expects {want}{list(meta.shape)}, got "
                               f"{getattr(t, 'dtype', type(t))}{list(getattr(t, 'shape', []))}")
        if not t.is_contiguous():
            raise RuntimeError(f"forward_v2: {meta.name.decode()} is not contiguous")
    event = {"event": "call", "model": model.index,
             "inputs": [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for t in inputs]}
    CALLS.append(event)
    _record(event)
    return [torch.zeros(list(m.shape), dtype=_TORCH[metaneff_pb2.MetaTensor.DataType.Name(m.data_type)])
            for m in model.meta.output_tensors]


_saved: dict[str, object] = {}


def install() -> None:
    """Register the stand-ins as ``torch.classes.neuron`` / ``torch.ops.neuron``, as libtorchneuron.so does."""
    for namespace, value in ((torch.classes, SimpleNamespace(Model=Model)),
                             (torch.ops, SimpleNamespace(forward_v2=forward_v2))):
        _saved.setdefault(namespace.__name__, namespace.__dict__.get("neuron"))
        setattr(namespace, "neuron", value)


def uninstall() -> None:
    """Undo :func:`install` (tests that import this package in-process)."""
    for namespace in (torch.classes, torch.ops):
        previous = _saved.pop(namespace.__name__, None)
        namespace.__dict__.pop("neuron", None)
        if previous is not None:
            setattr(namespace, "neuron", previous)


install()
