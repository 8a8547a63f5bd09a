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
                 on_write: Any = None, on_check: Any = None) -> None:
        self.path = path
        self.nodeid = nodeid
        self.update = update
        self.update_hint = update_hint
        self._on_write = on_write
        self._on_check = on_check  # gets {"nodeid", "path", "status", "lines"} of every check (summaries)

    def _note(self, status: str, lines: list[str] | None = None) -> None:
        if self._on_check is not None:
            self._on_check({"nodeid": self.nodeid, "path": str(self.path), "status": status,
                            "lines": list(lines or [])})

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
            old = read_json(self.path, MANIFEST_LIMIT)
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


# ----------------------------------------------------------------------------- keeping baselines tidy


def owner_name(path: Path) -> str:
    """The test part of a baseline file's name (``t.py__test_a[O2].json`` -> ``t.py__test_a``).

    Test names are made file-safe (no brackets), so a trailing ``[...]`` is always the settings variant.
    """
    stem = path.stem
    return stem[:stem.rindex("[")] if stem.endswith("]") and "[" in stem else stem


def variant_part(path: Path) -> str:
    stem = path.stem
    return stem[stem.rindex("[") + 1:-1] if stem.endswith("]") and "[" in stem else ""


def covers(args: list[str], anchor: Path) -> bool:
    """Whether collection arguments take in every test below ``anchor`` (a path at or above it, no ``::``)."""
    for arg in args:
        if "::" in arg:
            continue
        path = Path(arg).resolve()
        if path == anchor or path in anchor.parents:
            return True
    return False


def _skipped_owner(name: str, prefixes: list[str]) -> bool:
    """Whether a baseline's test part lies in a module or folder whose collection was skipped."""
    return any(not p or name == p or name.startswith(p + "_") for p in prefixes)


def tidy(inventory: dict[str, dict[str, Any]], used: set[str], variant: str, *, update: bool,
         complete: bool) -> tuple[list[str], list[str], list[str]]:
    """Baseline files this session left unused, those it did not check, and those it removed.

    ``inventory`` maps each baseline folder to ``{"tests": [test parts of collected tests using
    neuron_baseline], "covered": bool, "skipped": [test-part prefixes of modules and folders whose
    collection was skipped]}`` (covered: every test below the folder's anchor was collected).
    Not checked: a file of a collected test for these settings that no check used (skipped, failed
    before its check, interrupted), or of a test in a skipped module (an ``importorskip`` in a
    conftest): those tests exist, their baselines are kept. Unused: when the folder's tests were
    all collected, a file whose test no longer exists. Only those are removed, and only under
    ``--neuron-update-baseline`` (a ``-k``/partial run never removes anything, as in syrupy).
    """
    unused: list[str] = []
    unchecked: list[str] = []
    removed: list[str] = []
    for folder, info in sorted(inventory.items()):
        root = Path(folder)
        if not root.is_dir():
            continue
        tests = set(info.get("tests", []))
        skipped = list(info.get("skipped", []))
        for path in sorted(root.glob("*.json")):
            if str(path) in used:
                continue
            name = owner_name(path)
            if name in tests or _skipped_owner(name, skipped):
                if variant_part(path) == variant:
                    unchecked.append(str(path))
                continue
            if not (complete and info.get("covered")):
                continue  # its test may exist and simply not be collected this time
            if update:
                path.unlink(missing_ok=True)
                removed.append(str(path))
            else:
                unused.append(str(path))
    return unused, unchecked, removed


def tidy_session(session: NeuronSession) -> None:
    """Count (and under ``--neuron-update-baseline`` remove) baselines the session left unused (controller)."""
    if session.is_worker or session.is_rank_worker:
        return
    s = session.settings
    if s.baseline is not None and s.baseline.suffix == ".json":
        return  # one file for every test: nothing to tidy
    parts = [session.export(), *session.workers.values()]
    inventories = [p["baseline_inventory"] for p in parts if p.get("baseline_inventory") is not None]
    if not inventories or session.config.option.collectonly:
        return  # nothing collected (e.g. --collect-only under xdist), or nothing ran: no check to count
    inventory: dict[str, dict[str, Any]] = {}
    for inv in inventories:
        for folder, info in inv.items():
            into = inventory.setdefault(folder, {"tests": [], "covered": True, "skipped": []})
            for name in ("tests", "skipped"):
                into[name] = sorted(set(into[name]) | set(info.get(name, [])))
            into["covered"] = into["covered"] and bool(info.get("covered"))
    # Ctrl-C: the tests that did not run still exist; nothing is removed on their account
    complete = not session.interrupted and all(
        p.get("collection_complete", True) for p in parts if p.get("baseline_inventory") is not None)
    used = {c["path"] for p in parts for c in p.get("baseline_checks", [])}
    session.baselines_unused, session.baselines_unchecked, session.baselines_removed = tidy(
        inventory, used, s.baseline_variant(), update=s.update_baseline, complete=complete)


__all__ = ["BASELINE_DIRNAME", "Baseline", "baseline_path", "covers", "normalize", "owner_name", "tidy",
           "tidy_session", "variant_part"]
