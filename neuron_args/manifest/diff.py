"""Compare two manifests by ``graph_hash``, ignoring what changes between two runs of one deployment (timestamps,
NEFF sizes, cache and absolute paths, ``environment`` unless asked for). A changed flag changes the key, so one
removed and one added graph with the same input shapes are also reported as a likely replacement with its flag
changes: the "why did this recompile" answer.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from neuron_args.errors import CompilerArgsError
from neuron_args.flags import CompilerArgs, flag_changes
from neuron_args.manifest.schema import json_path
from neuron_args.manifest.show import manifest_graphs, recorded_graph_types
from neuron_args.text import clip, format_shapes

__all__ = ["ManifestDiff", "compiler_flag_changes", "diff_manifests"]

_COMPARED_GRAPH_FIELDS = ("ranks", "input_shapes", "output_shapes")
_SUMMARY_FIELDS = ("graph_hash", "input_shapes", "compiler_flags", "ranks")  # of an added or removed graph
_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")


def _short(value: Any, limit: int = 120) -> str:
    return clip(json.dumps(value, sort_keys=True, default=str), limit)


def compiler_flag_changes(old: str | None, new: str | None) -> dict[str, list]:
    """``{"added": [tokens], "removed": [tokens], "changed": [{"option", "old", "new"}]}`` of two flag lines, in
    canonical form when they parse (``-O 3`` == ``-O3``), else as token multisets."""
    return flag_changes(_tokens(old), _tokens(new)).as_dict()


def _tokens(line: str | None) -> list[str]:
    """A manifest's flag line read back: its canonical form, else its tokens, else its words."""
    try:
        args = CompilerArgs(line or "")
    except (CompilerArgsError, TypeError):
        return str(line or "").split()
    try:
        return list(args.canonical)
    except CompilerArgsError:
        return args.argv


def _value_line(change: Mapping[str, Any]) -> str:
    """A changed leaf (``{"path", "change": added / removed / changed, "old", "new"}``) as a line."""
    path, kind = change["path"], change["change"]
    if kind == "added":
        return f"{path}: added {_short(change['new'])}"
    if kind == "removed":
        return f"{path}: removed (was {_short(change['old'])})"
    return f"{path}: {_short(change['old'])} -> {_short(change['new'])}"


def _value_changes(old: Any, new: Any, prefix: str, *, ignore_paths: bool) -> list[dict]:
    if old == new:  # before importing deepdiff (~0.25 s): a matching baseline does not need it
        return []
    from deepdiff import DeepDiff
    from deepdiff.helper import NotPresent

    tree = DeepDiff(old, new, view="tree", verbose_level=2)
    changes: list[dict] = []
    for report, levels in tree.items():
        for level in levels:
            path = json_path(level.path(output_format="list"), prefix)
            t1, t2 = level.t1, level.t2
            if isinstance(t1, NotPresent) or report.endswith("_added"):
                changes.append({"path": path, "change": "added", "new": t2})
            elif isinstance(t2, NotPresent) or report.endswith("_removed"):
                changes.append({"path": path, "change": "removed", "old": t1})
            elif not (ignore_paths and all(isinstance(t, str) and _ABSOLUTE.match(t) for t in (t1, t2))):
                # (two absolute paths: they differ by machine, not by build)
                changes.append({"path": path, "change": "changed", "old": t1, "new": t2})
    return sorted(changes, key=lambda c: c["path"])


def _compare_graphs(old: Mapping, new: Mapping) -> dict:
    """A graph in both manifests (``graph_hash``) or a likely replacement (``old_hash``, ``new_hash``), with what
    changed: ``compiler_flags`` (:func:`compiler_flag_changes`) and ``{"old", "new"}`` of each compared field."""
    old_hash, new_hash = str(old.get("graph_hash")), str(new.get("graph_hash"))
    change: dict[str, Any] = (
        {"graph_hash": old_hash} if old_hash == new_hash else {"old_hash": old_hash, "new_hash": new_hash})
    if old.get("compiler_flags") != new.get("compiler_flags"):
        flags = compiler_flag_changes(old.get("compiler_flags"), new.get("compiler_flags"))
        if any(flags.values()):  # added, removed or changed options
            change["compiler_flags"] = flags
    change.update({name: {"old": old.get(name), "new": new.get(name)}
                   for name in _COMPARED_GRAPH_FIELDS if old.get(name) != new.get(name)})
    return change


def _graph_change_lines(change: Mapping[str, Any]) -> list[str]:
    """What :func:`_compare_graphs` found changed, a phrase each."""
    out: list[str] = []
    for name, value in change.items():
        if name == "compiler_flags":
            out.append("compiler_flags " + ", ".join([*(f"{c['old']} -> {c['new']}" for c in value.get("changed", [])),
                                                      *(f"added {t}" for t in value.get("added", [])),
                                                      *(f"removed {t}" for t in value.get("removed", []))]))
        elif name in _COMPARED_GRAPH_FIELDS:
            text = format_shapes if name in ("input_shapes", "output_shapes") else _short
            out.append(f"{name} {text(value['old'])} -> {text(value['new'])}")
    return out


def _graphs_by_hash(doc: Mapping) -> dict[str, Mapping]:
    return {g["graph_hash"]: g for g in manifest_graphs(doc) if isinstance(g.get("graph_hash"), str)}


def _summary(graph: Mapping) -> dict:
    return {name: graph.get(name) for name in _SUMMARY_FIELDS}


def _replacements(removed: list[Mapping], added: list[Mapping]) -> list[dict]:
    """A removed and an added graph each alone in its list with its input shapes: the one likely replaced the other."""
    def alone(graphs: list[Mapping]) -> dict[str, Mapping]:
        shapes = [json.dumps(g.get("input_shapes")) for g in graphs]
        counts = Counter(shapes)
        return {text: g for text, g in zip(shapes, graphs) if counts[text] == 1}

    olds, news = alone(removed), alone(added)
    return [_compare_graphs(olds[text], news[text]) for text in sorted(olds.keys() & news.keys())]


@dataclass
class ManifestDiff:
    """The difference of two manifests. ``empty`` when nothing that matters changed."""

    manifest_version: dict[str, Any] | None = None  # {"old", "new"}
    added_graphs: list[dict] = field(default_factory=list)
    removed_graphs: list[dict] = field(default_factory=list)
    changed_graphs: list[dict] = field(default_factory=list)  # _compare_graphs of each: JSON data, like the rest
    replacements: list[dict] = field(default_factory=list)
    config: list[dict] = field(default_factory=list)  # changed leaves: {"path", "change", "old", "new"}
    environment: list[dict] = field(default_factory=list)
    graph_types: dict[str, str] = field(default_factory=dict)  # key -> graph type, from both configs

    @property
    def empty(self) -> bool:
        return not (
            self.manifest_version or self.added_graphs or self.removed_graphs
            or self.changed_graphs or self.config or self.environment
        )

    def lines(self) -> list[str]:
        """Readable lines (``[]`` when empty): ``+`` added, ``-`` removed, ``~`` changed."""
        out: list[str] = []
        if self.manifest_version:
            out.append(f"manifest_version: {self.manifest_version['old']!r} -> {self.manifest_version['new']!r}")
        for sign, graphs in (("-", self.removed_graphs), ("+", self.added_graphs)):
            out += [f"{sign} graph {self._name(g['graph_hash'])}  inputs {format_shapes(g.get('input_shapes'))}  "
                    f"flags {g.get('compiler_flags') or '-'}" for g in graphs]
        for r in self.replacements:
            what = _graph_change_lines(r) or ["same flags, shapes and ranks: the graph or tool versions changed"]
            out.append(
                f"~ graph {self._name(r['old_hash'])} -> {r['new_hash'][:12]} (same input shapes): " + "; ".join(what)
            )
        for c in self.changed_graphs:
            out.append(f"~ graph {self._name(c['graph_hash'])}: " + "; ".join(_graph_change_lines(c)))
        out += [f"~ {_value_line(c)}" for c in (*self.config, *self.environment)]
        return out

    def _name(self, key: Any) -> str:
        """``<hash12>``, with its graph type when a config names it: ``4d0a12345678 (decode)``."""
        graph_type = self.graph_types.get(str(key))
        return f"{str(key)[:12]}" + (f" ({graph_type})" if graph_type else "")

    def as_dict(self) -> dict:
        """JSON-able form (the CLI's ``--json``)."""
        shown = [f.name for f in fields(self) if f.name != "graph_types"]  # graph_types only names graphs in lines()
        return {"same": self.empty, **{name: getattr(self, name) for name in shown}}


def _stable_config(doc: Mapping) -> Any:
    """``config`` without the cache directory (machine-specific) and graph types of keys not among the manifest's
    graphs (a runner maps every key its process resolved): what differs between two runs of one build."""
    config = doc.get("config")
    if not isinstance(config, Mapping) or not isinstance(config.get("neuron_config"), Mapping):
        return config
    neuron_config = {k: v for k, v in config["neuron_config"].items() if k not in ("cache_dir", "remote_cache")}
    if isinstance(neuron_config.get("graph_types"), Mapping):
        keys = set(_graphs_by_hash(doc))
        neuron_config["graph_types"] = {k: v for k, v in neuron_config["graph_types"].items() if k in keys}
    return {**config, "neuron_config": neuron_config}


def diff_manifests(old: Mapping, new: Mapping, *, include_environment: bool = False) -> ManifestDiff:
    """Compare two manifest documents (``old`` -> ``new``); see the module docstring."""
    versions = {"old": old.get("manifest_version"), "new": new.get("manifest_version")}
    old_graphs, new_graphs = _graphs_by_hash(old), _graphs_by_hash(new)
    removed = [old_graphs[h] for h in sorted(old_graphs.keys() - new_graphs.keys())]
    added = [new_graphs[h] for h in sorted(new_graphs.keys() - old_graphs.keys())]
    return ManifestDiff(
        manifest_version=versions if versions["old"] != versions["new"] else None,
        added_graphs=[_summary(g) for g in added],
        removed_graphs=[_summary(g) for g in removed],
        changed_graphs=[change for h in sorted(old_graphs.keys() & new_graphs.keys())
                        if len(change := _compare_graphs(old_graphs[h], new_graphs[h])) > 1],  # beyond its hash
        replacements=_replacements(removed, added),
        config=_value_changes(_stable_config(old), _stable_config(new), "config", ignore_paths=True),
        environment=(_value_changes(old.get("environment"), new.get("environment"), "environment", ignore_paths=False)
                     if include_environment else []),
        graph_types={**recorded_graph_types(old), **recorded_graph_types(new)},
    )
