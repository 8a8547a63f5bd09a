"""The ``metadata.json`` of one cache entry as one typed value, parsed and validated once where it is read.

Only :mod:`neuron_args.cache` reads and writes the file; every other module reads the attributes of
:class:`EntryMetadata`. The document itself is kept as written (``doc``): it is what is signed and
written back, so the file's bytes do not change with this type. Each field a reader uses is checked
for its type once, in :meth:`EntryMetadata.parse`: a field of another type (a hand edit, a sync tool,
another neuron-args) is a :class:`~neuron_args.errors.CorruptEntryError` naming the key and the field,
so a complete entry holding one is corrupt (moved aside and rebuilt). A field the document lacks (an
older neuron-args, an entry captured but not compiled yet) is None. Needs neither torch nor jax.
"""
from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_args.errors import CorruptEntryError

METADATA_VERSION = 1

#: ``(shape, dtype)`` of one recorded input or output (``metadata.json``: ``{"shape": [...], "dtype": "..."}``)
RecordedSpec = tuple[tuple[int, ...], str]


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError("a count of bytes")
    return value


def _seconds(value: Any) -> float:
    """A number of seconds; ``compile_timeout`` records the option as given, which may be a numeric string."""
    try:
        seconds = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else math.nan
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:
        raise TypeError("a number of seconds")
    return seconds


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("a list of strings")
    return tuple(value)


def _object(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("an object")
    return value


def _specs(value: Any) -> tuple[RecordedSpec, ...]:
    what = 'a list of {"shape": [int, ...], "dtype": str}'
    if not isinstance(value, list):
        raise TypeError(what)
    out = []
    for spec in value:
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if (not isinstance(shape, list) or not isinstance(spec.get("dtype"), str)
                or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
            raise TypeError(what)
        out.append((tuple(shape), spec["dtype"]))
    return tuple(out)


#: attribute -> (document field, parser): a parser raises TypeError naming what the field must be
_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "key": ("key", _text), "status": ("status", _text), "seam": ("seam", _text), "graph_type": ("graph_type", _text),
    "target": ("target", _text), "error": ("error", _text), "compiler_args": ("compiler_args", _texts),
    "key_components": ("key_components", _object), "compiler": ("compiler", _object),
    "input_specs": ("input_specs", _specs), "output_specs": ("output_specs", _specs),
    "input_shapes": ("input_shapes", _texts), "output_shapes": ("output_shapes", _texts),
    "compile_timeout": ("compile_timeout", _seconds), "compile_seconds": ("compile_seconds", _seconds),
    "executable_size": ("executable_size", _size), "executable_sha256": ("executable_sha256", _text),
}


@dataclass(frozen=True)
class EntryMetadata:
    """One entry's ``metadata.json``: its typed fields (None: not recorded) and the document as written."""

    doc: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    key: str | None = None
    status: str | None = None  # "pending" | "compiling" | "compiled" | "failed" | "interrupted"
    seam: str | None = None
    graph_type: str | None = None
    target: str | None = None
    error: str | None = None
    compiler_args: tuple[str, ...] | None = None  # None: not recorded (an older cache: built with the base arguments)
    key_components: Mapping[str, Any] | None = None
    compiler: Mapping[str, Any] | None = None  # {"name", "version", "format"}
    input_specs: tuple[RecordedSpec, ...] | None = None
    output_specs: tuple[RecordedSpec, ...] | None = None
    input_shapes: tuple[str, ...] | None = None
    output_shapes: tuple[str, ...] | None = None
    compile_timeout: float | None = None  # the capture's own option (None: the environment, else the default)
    compile_seconds: float | None = None
    executable_size: int | None = None
    executable_sha256: str | None = None

    @classmethod
    def parse(cls, doc: Mapping[str, Any], key: str) -> EntryMetadata:
        """The fields of the document of entry ``key``; a field of another type raises :class:`CorruptEntryError`."""
        values = {}
        for name, (field_name, parse) in _FIELDS.items():
            value = doc.get(field_name)
            if value is None:
                continue
            try:
                values[name] = parse(value)
            except TypeError as exc:
                shown = repr(value)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                problem = f"metadata.json field {field_name!r} is {shown}, not {exc}"
                raise CorruptEntryError(
                    f"cache entry {key}: {problem}; it was written by another neuron-args or damaged: remove the "
                    "entry so it is rebuilt", problem=problem) from None
        return cls(doc=dict(doc), **values)

    def __bool__(self) -> bool:
        """False for an entry with no readable metadata (absent, unreadable, or not a JSON object)."""
        return bool(self.doc)

    @property
    def compiler_name(self) -> str | None:
        return _optional_text((self.compiler or {}).get("name"))

    @property
    def compiler_version(self) -> str | None:
        return _optional_text((self.compiler or {}).get("version"))

    @property
    def executable_format(self) -> str | None:
        return _optional_text((self.compiler or {}).get("format"))

    def with_fields(self, **fields: Any) -> EntryMetadata:
        """This metadata with ``fields`` set (their values as JSON writes them), validated as any read is."""
        return EntryMetadata.parse({**self.doc, **fields}, self.key or "?")

    def compiled(self, *, compiler_args: Sequence[str], command: Sequence[str], seconds: float | None,
                 compiler: Mapping[str, Any], executable: Mapping[str, Any], **extra: Any) -> EntryMetadata:
        """A built entry's metadata: how it was compiled and the executable's size and sha256.

        One shape whether the graph was built here or on a farm worker (``extra`` says where)."""
        return self.with_fields(status="compiled", compiler_args=list(compiler_args), command=list(command),
                                compiled=now_iso(), compile_seconds=seconds, compiler=dict(compiler), **executable,
                                **extra)


def _optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


__all__ = ["METADATA_VERSION", "EntryMetadata", "RecordedSpec", "now_iso"]
