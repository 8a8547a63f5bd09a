"""An entry's ``metadata.json`` as one typed value, parsed once where read and kept as written (``doc``: what is
signed); a field of another type is a :class:`~neuron_args.errors.CorruptEntryError`, an absent one None."""
from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from neuron_args.errors import CorruptEntryError
from neuron_args.flags import CompilerArgs
from neuron_args.target import DEFAULT_TARGET, Target, parse_target
from neuron_args.text import clip, graph_label

METADATA_VERSION = 1

#: ``(shape, dtype)`` of one recorded input or output (``metadata.json``: ``{"shape": [...], "dtype": "..."}``)
RecordedSpec = tuple[tuple[int, ...], str]


def _checked(test: Callable[[Any], bool], what: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    """A field's parser: ``convert(value)`` when ``test(value)``, else a TypeError saying what the field must be."""
    def parse(value: Any) -> Any:
        with contextlib.suppress(ValueError):  # float("x"): not a number, said by the TypeError below
            if test(value):
                return convert(value)
        raise TypeError(what)
    return parse


def _spec(s: Any) -> bool:
    return (isinstance(s, dict) and isinstance(s.get("dtype"), str) and isinstance(s.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in s["shape"]))


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


#: the parser of each field type of :class:`EntryMetadata`, which drives the parse (a parser raises TypeError naming
#: what the field must be)
_PARSERS: dict[str, Callable[[Any], Any]] = {
    "str | None": _checked(lambda v: isinstance(v, str), "a string"),
    "tuple[str, ...] | None": _checked(_texts, "a list of strings", tuple),
    # read back once into the value type (a CompilerArgsError is a ValueError: an argv no process takes is corrupt)
    "CompilerArgs | None": _checked(_texts, "a list of strings", CompilerArgs),
    "Mapping[str, Any] | None": _checked(lambda v: isinstance(v, dict), "an object"),
    # compile_timeout records the option as given, which may be a numeric string
    "float | None": _checked(lambda v: isinstance(v, (int, float, str)) and not isinstance(v, bool) and float(v) >= 0,
                             "a number of seconds", float),
    "int | None": _checked(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a count of bytes"),
    "tuple[RecordedSpec, ...] | None": _checked(lambda v: isinstance(v, list) and all(map(_spec, v)),
                                                'a list of {"shape": [int, ...], "dtype": str}',
                                                lambda v: tuple((tuple(s["shape"]), s["dtype"]) for s in v)),
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
    compiler_args: CompilerArgs | None = None  # None: not recorded (an older cache: built with the base arguments)
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
    created: str | None = None  # ISO time the entry was captured or built (``cache ls`` of an s3:// cache shows it)

    @classmethod
    def parse(cls, doc: Mapping[str, Any], key: str) -> EntryMetadata:
        """The fields of the document of entry ``key``; a field of another type raises :class:`CorruptEntryError`."""
        values = {}
        for typed in fields(cls):
            name, value = typed.name, doc.get(typed.name)
            if name == "doc" or value is None:
                continue
            try:
                values[name] = _PARSERS[typed.type](value)
            except TypeError as exc:
                graph_type = doc.get("graph_type")
                raise corrupt(key, graph_type if isinstance(graph_type, str) else None,
                              f"metadata.json field {name!r} is {clip(repr(value), 80)}, not {exc}") from None
        return cls(doc=dict(doc), **values)

    def __bool__(self) -> bool:
        return bool(self.doc)

    compiler_name = property(lambda self: self._compiler("name"))
    compiler_version = property(lambda self: self._compiler("version"))
    executable_format = property(lambda self: self._compiler("format"))

    @property
    def build_target(self) -> Target:
        """The target to build this entry for: the recorded one (checked: metadata is untrusted), else the default."""
        entry = f"cache entry {self.key or '(no key recorded)'} ({graph_label(self.graph_type)})"
        return parse_target(self.target or DEFAULT_TARGET, f"metadata.json of {entry}")

    def _compiler(self, what: str) -> str | None:
        value = (self.compiler or {}).get(what)
        return value if isinstance(value, str) else None

    def compiled(self, *, compiler_args: Sequence[str], command: Sequence[str], seconds: float | None,
                 compiler: Mapping[str, Any], executable: Mapping[str, Any], **extra: Any) -> EntryMetadata:
        """A built entry's metadata, one shape whether built here or on a farm worker (``extra`` says where)."""
        return EntryMetadata.parse({**self.doc, "status": "compiled", "compiler_args": list(compiler_args),
                                    "command": list(command), "compiled": now_iso(), "compile_seconds": seconds,
                                    "compiler": dict(compiler), **executable, **extra}, self.key or "?")


def corrupt(key: str, graph_type: str | None, problem: str) -> CorruptEntryError:
    """The error of an entry whose metadata.json this neuron-args cannot use as recorded (moved aside, rebuilt)."""
    return CorruptEntryError(
        f"cache entry {key} ({graph_label(graph_type)}): {problem}; it was written by another neuron-args or damaged: "
        "a run that can write the cache moves it aside and rebuilds it, or remove the entry", problem=problem)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


__all__ = ["METADATA_VERSION", "EntryMetadata", "RecordedSpec", "corrupt", "now_iso"]
