"""Manifest baselines: write one with ``--neuron-update-baseline``, compare against it otherwise.

A baseline is the manifest in its *stable* form: what legitimately changes between two runs of
the same build is left out (the package snapshot, NEFF sizes and timestamps, cache paths, the
cache directory), and the per-key graph-type map is cut down to the manifest's own graphs (the
runner's map lists every graph its process ever resolved, which depends on what ran before).
The comparison is :func:`neuron_args.manifest.diff.diff_manifests`, which also ignores those
fields; failures show its readable lines.
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from pytest_neuron_args.assertions import ManifestView

BASELINE_DIRNAME = ".neuron-baseline"
VOLATILE_GRAPH_FIELDS = ("created_timestamp", "neff_size", "hlo_path", "neff_path")
CACHE_DIR_PLACEHOLDER = "<cache_dir>"


def normalize(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline form of a manifest document (a new dict; ``doc`` is left alone)."""
    out = copy.deepcopy(dict(doc))
    out.pop("environment", None)
    graphs = out.get("graphs")
    if isinstance(graphs, list):
        out["graphs"] = [{k: v for k, v in g.items() if k not in VOLATILE_GRAPH_FIELDS} if isinstance(g, dict) else g
                         for g in graphs]
    keys = {g.get("graph_hash") for g in out.get("graphs") or [] if isinstance(g, dict)}
    config = out.get("config")
    neuron_config = config.get("neuron_config") if isinstance(config, dict) else None
    if isinstance(neuron_config, dict):
        if "cache_dir" in neuron_config:
            neuron_config["cache_dir"] = CACHE_DIR_PLACEHOLDER
        if isinstance(neuron_config.get("graph_types"), dict):
            neuron_config["graph_types"] = {k: v for k, v in sorted(neuron_config["graph_types"].items()) if k in keys}
    return out


def baseline_path(given: Path | None, rootpath: Path, test_name: str) -> Path:
    """``--neuron-baseline`` as a ``.json`` file, or a directory of ``<test>.json``; default ``<rootdir>/.neuron-baseline/``."""
    if given is not None and given.suffix == ".json":
        return given
    return (given if given is not None else rootpath / BASELINE_DIRNAME) / f"{test_name}.json"


class Baseline:
    """The ``neuron_baseline`` fixture: ``check(manifest)`` writes or compares one baseline file."""

    def __init__(self, path: Path, *, nodeid: str, update: bool, update_hint: str,
                 on_write: Any = None, on_check: Any = None) -> None:
        self.path = path
        self.nodeid = nodeid
        self.update = update
        self.update_hint = update_hint
        self._on_write = on_write
        self._on_check = on_check  # gets {"nodeid", "path", "status", "lines"} of every check (summaries)

    def _note(self, status: str, lines: list[str] | None = None) -> None:
        if self._on_check is not None:
            self._on_check({"nodeid": self.nodeid, "path": str(self.path), "status": status, "lines": list(lines or [])})

    def check(self, manifest: ManifestView | Mapping[str, Any] | str | os.PathLike[str]) -> Any:
        """Compare ``manifest`` with the baseline (or write it, when updating); the diff when it passes."""
        __tracebackhide__ = True
        from neuron_args.manifest.diff import diff_manifests

        if isinstance(manifest, ManifestView):
            doc: Mapping[str, Any] = manifest.doc
        elif isinstance(manifest, Mapping):
            doc = manifest
        else:
            doc = ManifestView.load(manifest).doc
        new = normalize(doc)
        if self.update:
            text = json.dumps(new, indent=2, sort_keys=True) + "\n"
            try:
                old_text: str | None = self.path.read_text(encoding="utf-8")
            except OSError:
                old_text = None
            if old_text == text:
                self._note("unchanged")
                return None
            write_atomic(self.path, text)
            self._note("written" if old_text is None else "updated")
            if self._on_write is not None:
                self._on_write(str(self.path))
            return None
        if not self.path.is_file():
            self._note("missing")
            raise AssertionError(
                f"no manifest baseline for {self.nodeid} at {self.path}.\n"
                f"Create it (then review and commit it) with:\n    {self.update_hint}")
        try:
            old = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            self._note("unreadable")
            raise AssertionError(f"manifest baseline {self.path} is unreadable ({type(exc).__name__}: {exc}); "
                                 f"rewrite it with:\n    {self.update_hint}") from None
        diff = diff_manifests(normalize(old), new)
        self._note("match" if diff.empty else "differs", None if diff.empty else diff.lines())
        if not diff.empty:
            raise AssertionError("\n".join([
                f"the manifest differs from its baseline {self.path}:",
                *(f"  {line}" for line in diff.lines()),
                "(- in the baseline only, + in this run only, ~ changed; environment, timestamps, NEFF sizes "
                "and cache paths are ignored)",
                f"If the change is intended, update the baseline with:\n    {self.update_hint}",
            ]))
        return diff

    def __repr__(self) -> str:
        return f"Baseline({str(self.path)!r}, update={self.update})"


__all__ = ["BASELINE_DIRNAME", "Baseline", "baseline_path", "normalize"]
