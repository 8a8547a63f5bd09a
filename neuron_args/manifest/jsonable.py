"""Plain JSON data from whatever a runner's config objects hold (the manifest's config block): dataclasses and
objects become dicts of their public fields, enums their name, torch dtypes their string, sets sorted lists,
non-finite floats strings, cycles ``"<cycle: Type>"``, anything else its clipped repr."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import enum
import json
import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence, Set
from pathlib import PurePath
from typing import Any

from neuron_args.text import clip

__all__ = ["to_jsonable"]

_MAX_DEPTH = 48
_MAX_NODES = 200_000
_MAX_REPR = 2_000


def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as exc:  # a __repr__ that raises
        return f"<unrepresentable {type(obj).__qualname__}: {type(exc).__name__}>"
    return clip(text, _MAX_REPR)


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(name, str):
        return _safe_repr(obj)
    return f"{module}.{name}" if isinstance(module, str) and module != "builtins" else name


class _Coercer:
    """One :func:`to_jsonable` pass: the containers on the path (cycles) and a node budget (huge input: reprs)."""

    def __init__(self) -> None:
        self.active: set[int] = set()
        self.nodes = 0

    def key(self, key: Any) -> str:
        if isinstance(key, str) and not isinstance(key, enum.Enum):
            return str(key)
        value = self.convert(key, _MAX_DEPTH - 1)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    def convert(self, obj: Any, depth: int) -> Any:
        self.nodes += 1
        if obj is None or obj is True or obj is False:
            return obj
        if isinstance(obj, enum.Enum):
            return obj.name if obj.name is not None else _safe_repr(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else repr(float(obj))
        special = self._special(obj)
        if special is not _NOTHING:
            return special
        if depth >= _MAX_DEPTH or self.nodes > _MAX_NODES:
            return _safe_repr(obj)
        if isinstance(obj, type) or callable(obj) and not dataclasses.is_dataclass(obj):
            return _qualified_name(obj)
        if id(obj) in self.active:
            return f"<cycle: {type(obj).__name__}>"
        self.active.add(id(obj))
        try:
            return self._container(obj, depth + 1)
        finally:
            self.active.discard(id(obj))

    def _special(self, obj: Any) -> Any:
        """Leaf types with a natural JSON form; ``_NOTHING`` when ``obj`` is not one."""
        cls = type(obj)
        module = cls.__module__ or ""
        if isinstance(obj, PurePath):
            return os.fspath(obj)
        if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
            return obj.isoformat()
        if isinstance(obj, _dt.timedelta):
            return obj.total_seconds()
        if isinstance(obj, (bytes, bytearray, memoryview, complex)):
            return _safe_repr(obj if not isinstance(obj, memoryview) else bytes(obj))
        if module.startswith("torch"):
            torch = sys.modules.get("torch")
            if torch is not None:
                if isinstance(obj, (torch.dtype, torch.device)) or cls.__name__ in ("dtype", "device"):
                    return str(obj)  # "torch.bfloat16", "cpu"
                if isinstance(obj, torch.Tensor):
                    return f"tensor(shape={list(obj.shape)}, dtype={obj.dtype})"
        if module == "numpy" or module.startswith("numpy."):
            if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
                return self.convert(obj.item(), _MAX_DEPTH - 1)
            if cls.__name__ == "ndarray":
                return f"ndarray(shape={list(obj.shape)}, dtype={obj.dtype})"
            if "dtype" in cls.__name__.lower():
                return str(obj)
        if isinstance(obj, logging.Logger):
            return f"<logger {obj.name}>"
        if type(obj).__name__ in ("Decimal", "Fraction"):
            return str(obj)
        return _NOTHING

    def _container(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, Mapping):
            return {self.key(k): self.convert(v, depth) for k, v in list(obj.items())}
        if dataclasses.is_dataclass(obj):
            fields = _set_attributes(obj, [field.name for field in dataclasses.fields(obj)])
            return {name: self.convert(value, depth) for name, value in fields.items()}
        if isinstance(obj, Sequence):  # str and bytes never get here: convert and _special took them
            return [self.convert(v, depth) for v in list(obj)]
        if isinstance(obj, Set):
            items = [self.convert(v, depth) for v in list(obj)]
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
        dump = getattr(obj, "model_dump", None)  # pydantic models
        if callable(dump) and hasattr(type(obj), "model_fields"):
            with contextlib.suppress(Exception):
                return self.convert(dump(), depth)
        attrs = _public_attributes(obj)
        if attrs:  # no public state: its repr says more than {}
            return {name: self.convert(value, depth) for name, value in attrs.items()}
        return _safe_repr(obj)


_NOTHING = object()


def _set_attributes(obj: Any, names: Iterable[str]) -> dict[str, Any]:
    """The attributes of ``obj`` among ``names`` that are set (an unset slot or ``init=False`` field is not)."""
    found: dict[str, Any] = {}
    for name in names:
        with contextlib.suppress(AttributeError):
            found[name] = getattr(obj, name)
    return found


def _public_attributes(obj: Any) -> dict[str, Any]:
    """``vars(obj)`` and the set ``__slots__`` values, without private names (``__dict__`` and ``__weakref__`` too)."""
    found: dict[str, Any] = {}
    with contextlib.suppress(TypeError):  # no __dict__
        found = {k: v for k, v in vars(obj).items() if isinstance(k, str) and not k.startswith("_")}
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names = (slots,) if isinstance(slots, str) else slots
        found.update(_set_attributes(obj, [n for n in names if not n.startswith("_") and n not in found]))
    return found


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data (see the module docstring); never raises."""
    try:
        return _Coercer().convert(obj, 0)
    except Exception:  # belt and braces: coercion must never break an emit
        return _safe_repr(obj)
