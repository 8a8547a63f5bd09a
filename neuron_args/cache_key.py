"""Cache keys built from named, separately hashed components (after JAX's ``cache_key.py``).

Keeping the components (not only the digest) lets a miss be explained by construction: two keys
differ in the graph, the input specs, the compiler arguments, the target or a tool version, and
:func:`explain_components` says which and how.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_args.flags import canonical_compiler_args, flag_changes

KEY_LENGTH = 32
_HEX = frozenset("0123456789abcdef")
COMPONENT_ORDER = ("graph", "input_specs", "compiler_args", "target", "tool_versions")

InputSpec = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class KeyComponents:
    """What a cache key is made of. ``compiler_args`` is ``None`` for a key that leaves them out."""

    graph: str
    input_specs: tuple[InputSpec, ...]
    compiler_args: tuple[str, ...] | None
    target: str
    tool_versions: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "input_specs": [{"shape": list(s), "dtype": d} for s, d in self.input_specs],
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


def is_cache_key(name: object) -> bool:
    """Whether ``name`` has a key's form (32 lowercase hex characters): entry folders, ledger lines."""
    return isinstance(name, str) and len(name) == KEY_LENGTH and _HEX.issuperset(name)


_SLICE = 1 << 20


def graph_digest(graph_text: str | bytes) -> str:
    """sha256 of the canonical graph text (UTF-8); the only pass over a possibly large text.

    A str is encoded in 1 MiB slices: encoding a 100 MB text at once costs more than hashing it
    (fresh pages for the copy), slices stay in cache. Same digest as hashing ``text.encode()``.
    """
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
    compiler_args: Sequence[str] | None,
    target: str,
    tool_versions: Mapping[str, str],
) -> CacheKey:
    """Key a graph on its content, input specs, canonical compiler args, target and tool versions.

    Pass ``compiler_args=None`` for a key that ignores the arguments (the native seam); pass the
    graph either as text or as a digest already computed by :func:`graph_digest`.
    """
    if (graph_text is None) == (graph_sha256 is None):
        raise TypeError("create_cache_hash needs exactly one of graph_text or graph_sha256")
    components = KeyComponents(
        graph=graph_sha256 if graph_sha256 is not None else graph_digest(graph_text),  # type: ignore[arg-type]
        input_specs=tuple((tuple(int(d) for d in shape), str(dtype)) for shape, dtype in input_specs),
        compiler_args=None if compiler_args is None else tuple(canonical_compiler_args(list(compiler_args))),
        target=target,
        tool_versions=tuple(sorted((str(k), str(v)) for k, v in tool_versions.items())),
    )
    return CacheKey(components.digest(), components)


def _spec_str(spec: Mapping[str, Any]) -> str:
    return f"{spec.get('dtype')}[{', '.join(str(d) for d in spec.get('shape', []))}]"


def explain_compiler_args(a: Sequence[str] | None, b: Sequence[str] | None) -> list[str]:
    """Flag-level difference of two canonical argument lists: changed, added, removed."""
    if a is None or b is None:
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
    sa, sb = list(a.get("input_specs") or []), list(b.get("input_specs") or [])
    if sa != sb:
        if len(sa) != len(sb):
            lines.append(f"input_specs: {len(sa)} inputs -> {len(sb)} inputs")
        for i, (x, y) in enumerate(zip(sa, sb)):
            if x != y:
                lines.append(f"input_specs: input {i} {_spec_str(x)} -> {_spec_str(y)}")
    if a.get("compiler_args") != b.get("compiler_args"):
        lines += explain_compiler_args(a.get("compiler_args"), b.get("compiler_args"))
    if a.get("target") != b.get("target"):
        lines.append(f"target: {a.get('target')} -> {b.get('target')}")
    ta, tb = dict(a.get("tool_versions") or {}), dict(b.get("tool_versions") or {})
    for tool in sorted(set(ta) | set(tb)):
        if ta.get(tool) != tb.get(tool):
            lines.append(f"tool_versions: {tool} {ta.get(tool)} -> {tb.get(tool)}")
    return lines
