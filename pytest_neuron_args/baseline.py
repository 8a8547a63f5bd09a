"""Manifest baselines (written with ``--neuron-update-baseline``, else compared): the manifest without what changes
between two runs of one build, its graph-type map cut to its own graphs (a runner's depends on what ran before).
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from neuron_args.manifest.show import BASELINE_CACHE_DIR_PLACEHOLDER as CACHE_DIR_PLACEHOLDER
from neuron_args.manifest.show import BASELINE_DIRNAME
from neuron_args.manifest.show import BASELINE_VOLATILE_GRAPH_FIELDS as VOLATILE_GRAPH_FIELDS
from neuron_args.untrusted import MANIFEST_LIMIT, read_json
from pytest_neuron_args.assertions import ManifestView
from pytest_neuron_args.state import NeuronSession


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
                 on_check: Any = None) -> None:
        self.path = path
        self.nodeid = nodeid
        self.update = update
        self.update_hint = update_hint
        self._on_check = on_check  # gets {"nodeid", "path", "status", "lines"} of every check (summaries)

    def _note(self, status: str, lines: list[str] | None = None) -> None:
        if self._on_check is not None:
            self._on_check({"nodeid": self.nodeid, "path": str(self.path), "status": status,
                            "lines": list(lines or [])})

    def check(self, manifest: ManifestView | Mapping[str, Any] | str | os.PathLike[str]) -> Any:
        """Compare ``manifest`` with the baseline (or write it, when updating); the diff when it passes."""
        __tracebackhide__ = True
        from neuron_args.manifest.diff import diff_manifests

        if not isinstance(manifest, (ManifestView, Mapping)):
            manifest = ManifestView.load(manifest)
        new = normalize(manifest.doc if isinstance(manifest, ManifestView) else manifest)
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
            return None
        if not self.path.is_file():
            self._note("missing")
            raise AssertionError(
                f"no manifest baseline for {self.nodeid} at {self.path}.\n"
                f"Create it (then review and commit it) with:\n    {self.update_hint}")
        try:
            old = read_json(self.path, MANIFEST_LIMIT)
            if not isinstance(old, dict):
                raise ValueError(f"a JSON {type(old).__name__}, not an object")
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


def name_parts(path: Path) -> tuple[str, str]:
    """(test part, settings variant) of a baseline file's name: ``t.py__test_a[O2].json`` -> (``t.py__test_a``,
    ``O2``). Test names are made file-safe (no brackets), so a trailing ``[...]`` is always the variant."""
    stem = path.stem
    if stem.endswith("]") and "[" in stem:
        return stem[:stem.rindex("[")], stem[stem.rindex("[") + 1:-1]
    return stem, ""


def covers(args: list[str], anchor: Path) -> bool:
    """Whether collection arguments take in every test below ``anchor`` (a path at or above it, no ``::``)."""
    paths = (Path(arg).resolve() for arg in args if "::" not in arg)
    return any(path == anchor or path in anchor.parents for path in paths)


def tidy(inventory: dict[str, dict[str, Any]], used: set[str], variant: str, *, update: bool,
         complete: bool) -> dict[str, list[str]]:
    """Baseline files (of ``inventory``: folder -> ``{"tests", "covered", "skipped"}``) left unused, not checked, and
    removed, by the names the summary reads. An existing test's unchecked file is kept; one whose test is gone (known
    only when its folder was covered by a whole collection and the run ``complete``) is unused, and removed only under
    ``--neuron-update-baseline`` (a partial run never removes anything, as syrupy)."""
    found: dict[str, list[str]] = {"baselines_unused": [], "baselines_unchecked": [], "baselines_removed": []}
    for folder, info in sorted(inventory.items()):
        root = Path(folder)
        if not root.is_dir():
            continue
        tests = set(info.get("tests", []))
        skipped = list(info.get("skipped", []))
        for path in sorted(root.glob("*.json")):
            if str(path) in used:
                continue
            name, path_variant = name_parts(path)
            # its test exists: collected, or in a module or folder whose collection was skipped
            if name in tests or any(not p or name == p or name.startswith(p + "_") for p in skipped):
                if path_variant == variant:
                    found["baselines_unchecked"].append(str(path))
                continue
            if not (complete and info.get("covered")):
                continue  # its test may exist and simply not be collected this time
            if update:
                path.unlink(missing_ok=True)
            found["baselines_removed" if update else "baselines_unused"].append(str(path))
    return found


def tidy_session(session: NeuronSession) -> None:
    """Count (and under ``--neuron-update-baseline`` remove) baselines the session left unused (controller)."""
    s = session.settings
    if s.baseline is not None and s.baseline.suffix == ".json":
        return  # one file for every test: nothing to tidy
    data = session.merged()
    if data["baseline_inventory"] is None or session.config.option.collectonly:
        return  # nothing collected (e.g. --collect-only under xdist), or nothing ran: no check to count
    used = {c["path"] for c in data["baseline_checks"]}
    # Ctrl-C: the tests that did not run still exist; nothing is removed on their account
    session.baselines_tidied = tidy(data["baseline_inventory"], used, s.baseline_variant(), update=s.update_baseline,
                                    complete=not session.interrupted)


__all__ = ["BASELINE_DIRNAME", "Baseline", "baseline_path", "covers", "name_parts", "normalize", "tidy",
           "tidy_session"]
