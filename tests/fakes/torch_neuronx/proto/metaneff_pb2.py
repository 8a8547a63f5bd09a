"""A stand-in for ``torch_neuronx.proto.metaneff_pb2``: the protobuf API subset neuron-args uses.

``MetaNeff()`` with repeated ``input_tensors``/``output_tensors`` (``.add()``), each ``MetaTensor``
with ``name`` (bytes, as the real field), ``shape`` (assigned with ``[:] =``) and ``data_type``
(a ``MetaTensor.DataType`` value, numbered as torch-neuronx's metaneff.proto); ``SerializeToString()``
and ``MetaNeff.FromString()``. The wire form here is JSON: only this fake reads it back.
"""
from __future__ import annotations

import json


class _Enum:
    def __init__(self, values: dict[str, int]) -> None:
        self._values = dict(values)
        for name, number in values.items():
            setattr(self, name, number)

    def Name(self, number: int) -> str:  # noqa: N802 (protobuf's spelling)
        for name, n in self._values.items():
            if n == number:
                return name
        raise ValueError(f"enum has no value {number}")


class MetaTensor:
    DataType = _Enum({"UNDEFINED": 0, "FLOAT": 1, "INT32": 2, "BYTE": 3, "STRING": 4, "BOOL": 5, "UINT8": 6,
                      "INT8": 7, "UINT16": 8, "INT16": 9, "INT64": 10, "FLOAT16": 12, "DOUBLE": 13, "BFLOAT16": 14})

    def __init__(self) -> None:
        self._name = b""
        self.shape: list[int] = []
        self._data_type = 0

    @property
    def name(self) -> bytes:
        return self._name

    @name.setter
    def name(self, value: bytes) -> None:
        if not isinstance(value, bytes):
            raise TypeError(f"MetaTensor.name is a bytes field, got {type(value).__name__}")
        self._name = value

    @property
    def data_type(self) -> int:
        return self._data_type

    @data_type.setter
    def data_type(self, value: int) -> None:
        self.DataType.Name(value)  # ValueError for a number the enum lacks, as protobuf
        self._data_type = value


class _Repeated(list):
    def add(self) -> MetaTensor:
        item = MetaTensor()
        self.append(item)
        return item


class MetaNeff:
    def __init__(self) -> None:
        self.input_tensors = _Repeated()
        self.output_tensors = _Repeated()

    def SerializeToString(self) -> bytes:  # noqa: N802
        side = lambda ts: [{"name": t.name.decode(), "shape": list(t.shape), "data_type": t.data_type} for t in ts]  # noqa: E731
        return json.dumps({"input_tensors": side(self.input_tensors),
                           "output_tensors": side(self.output_tensors)}).encode()

    @classmethod
    def FromString(cls, data: bytes) -> MetaNeff:  # noqa: N802
        message, raw = cls(), json.loads(data)
        for field in ("input_tensors", "output_tensors"):
            for item in raw[field]:
                t = getattr(message, field).add()
                t.name, t.shape[:], t.data_type = item["name"].encode(), item["shape"], item["data_type"]
        return message
