"""Cache keys of named, separately hashed components (after JAX's ``cache_key.py``), so a miss explains itself
(:func:`explain_components`); torch specs and the autograd mode are components: the HLO alone does not pin what a
call returns (64-bit types lower as 32-bit ones, the runtime converts)."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_args.flags import CompilerArgs, flag_changes

KEY_LENGTH = 32
_HEX = frozenset("0123456789abcdef")
COMPONENT_ORDER = ("graph", "input_specs", "output_specs", "autograd", "compiler_args", "target", "tool_versions")
#: the autograd modes a graph is traced and keyed in: aot_autograd traces another graph for each
AUTOGRAD_MODES = ("grad", "no_grad", "inference_mode")

InputSpec = tuple[tuple[int, ...], str]


def current_autograd_mode() -> str:
    """This thread's autograd mode: ``inference_mode`` over ``no_grad`` over ``grad``."""
    import torch  # here: importing neuron_args (and the CLI) does not import torch

    if torch.is_inference_mode_enabled():
        return "inference_mode"
    return "grad" if torch.is_grad_enabled() else "no_grad"


@contextlib.contextmanager
def autograd_mode(mode: str) -> Iterator[None]:
    """Run the block in ``mode`` (one of :data:`AUTOGRAD_MODES`)."""
    import torch

    if mode not in AUTOGRAD_MODES:
        raise ValueError(f"autograd mode {mode!r} is not one of {', '.join(AUTOGRAD_MODES)}")
    with torch.inference_mode(mode == "inference_mode"), torch.set_grad_enabled(mode == "grad"):
        yield


@dataclass(frozen=True)
class KeyComponents:
    """What a cache key is made of; None: ``compiler_args`` left out, or specs and mode of a key made outside a seam."""

    graph: str
    input_specs: tuple[InputSpec, ...]
    output_specs: tuple[InputSpec, ...] | None
    autograd: str | None
    compiler_args: tuple[str, ...] | None
    target: str
    tool_versions: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "input_specs": _specs_json(self.input_specs),
            "output_specs": None if self.output_specs is None else _specs_json(self.output_specs),
            "autograd": self.autograd,
            "compiler_args": None if self.compiler_args is None else list(self.compiler_args),
            "target": self.target,
            "tool_versions": dict(self.tool_versions),
        }

    def digest(self) -> str:
        """Hash each component on its own, then the named component hashes."""
        parts = self.as_dict()
        h = hashlib.sha256()
        for name in COMPONENT_ORDER:
            value = parts[name]
            blob = value if name == "graph" else json.dumps(value, sort_keys=True)
            h.update(f"{name}={hashlib.sha256(blob.encode()).hexdigest()}\n".encode())
        return h.hexdigest()[:KEY_LENGTH]


@dataclass(frozen=True)
class CacheKey:
    key: str
    components: KeyComponents

    def __str__(self) -> str:
        return self.key


def _specs_json(specs: Sequence[InputSpec]) -> list[dict[str, Any]]:
    return [{"shape": list(s), "dtype": d} for s, d in specs]


def _specs(specs: Sequence[tuple[Sequence[int], str]]) -> tuple[InputSpec, ...]:
    return tuple((tuple(int(d) for d in shape), str(dtype)) for shape, dtype in specs)


def is_cache_key(name: object) -> bool:
    """Whether ``name`` has a key's form (32 lowercase hex characters): entry folders, ledger lines."""
    return isinstance(name, str) and len(name) == KEY_LENGTH and _HEX.issuperset(name)


def tool_version(dist: str, absent: str = "absent") -> str:
    """The installed version of ``dist`` (package metadata, no import) a key holds; ``absent`` if not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return absent


_SLICE = 1 << 20


def graph_digest(graph_text: str | bytes) -> str:
    """sha256 of the graph text (UTF-8), encoded in 1 MiB slices: encoding 100 MB at once costs more than hashing."""
    if isinstance(graph_text, bytes):
        return hashlib.sha256(graph_text).hexdigest()
    h = hashlib.sha256()
    for start in range(0, len(graph_text), _SLICE):
        h.update(graph_text[start:start + _SLICE].encode())
    return h.hexdigest()


def create_cache_hash(
    *,
    graph_text: str | bytes | None = None,
    graph_sha256: str | None = None,
    input_specs: Sequence[tuple[Sequence[int], str]],
    compiler_args: CompilerArgs | Sequence[str] | None,
    target: str,
    tool_versions: Mapping[str, str],
    output_specs: Sequence[tuple[Sequence[int], str]] | None = None,
    autograd: str | None = None,
) -> CacheKey:
    """Key a graph (text or its :func:`graph_digest`) on its components; ``compiler_args=None`` leaves the args out."""
    if (graph_text is None) == (graph_sha256 is None):
        raise TypeError("create_cache_hash needs exactly one of graph_text or graph_sha256")
    if autograd is not None and autograd not in AUTOGRAD_MODES:
        raise ValueError(f"autograd mode {autograd!r} is not one of {', '.join(AUTOGRAD_MODES)}")
    components = KeyComponents(
        graph=graph_sha256 if graph_sha256 is not None else graph_digest(graph_text),  # type: ignore[arg-type]
        input_specs=_specs(input_specs),
        output_specs=None if output_specs is None else _specs(output_specs),
        autograd=autograd,
        compiler_args=None if compiler_args is None else CompilerArgs.of(compiler_args).canonical,
        target=target,
        tool_versions=tuple(sorted((str(k), str(v)) for k, v in tool_versions.items())),
    )
    return CacheKey(components.digest(), components)


def _spec_str(spec: Any) -> str:
    if not isinstance(spec, Mapping) or not isinstance(spec.get("shape", []), list):  # read from a metadata.json
        return repr(spec)
    return f"{spec.get('dtype')}[{', '.join(str(d) for d in spec.get('shape', []))}]"


def _explain_specs(kind: str, a: Any, b: Any) -> list[str]:
    """``output_specs: output 0 float32[4] -> float64[4]``: the specs that differ, one line each."""
    name = f"{kind}_specs"

    def count(v: Any) -> str:  # None: a key made without them (outside a seam)
        return f"{len(v)} {kind}s" if isinstance(v, list) else "unrecorded" if v is None else repr(v)

    if not isinstance(a, list) or not isinstance(b, list):
        return [] if a == b else [f"{name}: {count(a)} -> {count(b)}"]
    return ([f"{name}: {count(a)} -> {count(b)}"] if len(a) != len(b) else []) + [
        f"{name}: {kind} {i} {_spec_str(x)} -> {_spec_str(y)}" for i, (x, y) in enumerate(zip(a, b)) if x != y]


def explain_compiler_args(a: Any, b: Any) -> list[str]:
    """Flag-level difference of two canonical argument lists: changed, added, removed (one line saying what they hold
    when either is not a list of strings: None, or damaged in a metadata.json)."""
    if not all(isinstance(v, (list, tuple)) and all(isinstance(t, str) for t in v) for v in (a, b)):
        return [f"compiler_args: {a!r} -> {b!r}"]
    change = flag_changes(a, b)
    lines = [f"compiler_args: changed {old} -> {new}" for _, old, new in change.changed]
    lines += [f"compiler_args: added {t}" for t in change.added]
    lines += [f"compiler_args: removed {t}" for t in change.removed]
    if not lines and list(a) != list(b):
        lines.append(f"compiler_args: order {list(a)} -> {list(b)}")
    return lines


def explain_components(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Readable lines saying which key components differ between two ``as_dict()`` forms, and how."""
    lines: list[str] = []
    if a.get("graph") != b.get("graph"):
        lines.append(f"graph: different graph content (sha256 {str(a.get('graph'))[:12]} -> {str(b.get('graph'))[:12]})")
    lines += _explain_specs("input", a.get("input_specs"), b.get("input_specs"))
    lines += _explain_specs("output", a.get("output_specs"), b.get("output_specs"))
    if a.get("autograd") != b.get("autograd"):
        lines.append(f"autograd: {a.get('autograd')} -> {b.get('autograd')}")
    if a.get("compiler_args") != b.get("compiler_args"):
        lines += explain_compiler_args(a.get("compiler_args"), b.get("compiler_args"))
    if a.get("target") != b.get("target"):
        lines.append(f"target: {a.get('target')} -> {b.get('target')}")
    ta, tb = a.get("tool_versions") or {}, b.get("tool_versions") or {}
    if not isinstance(ta, Mapping) or not isinstance(tb, Mapping):  # damaged in a metadata.json: what each holds
        return lines + ([f"tool_versions: {ta!r} -> {tb!r}"] if ta != tb else [])
    return lines + [f"tool_versions: {tool} {ta.get(tool)} -> {tb.get(tool)}" for tool in sorted(set(ta) | set(tb))
                    if ta.get(tool) != tb.get(tool)]
