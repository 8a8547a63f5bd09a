"""Manifests from the session's ledger: the session manifest per engine, and one test's view of it.

Nothing emits until the session ends, so no process consumes another's lines; a test's view copies its own
warmup's lines into a ledger in its tmp folder and emits that.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_args import envs
from neuron_args.manifest.engine import MANIFEST_DIR_ENV, VISIBLE_DEVICES_ENV
from neuron_args.manifest.ledger import Ledger, ledger_dir, ledger_engines, read_ledger

_ENGINE = re.compile(r"^dev(\d+)_(\d+)$")


def engine_devices(engine_id: str) -> str | None:
    """The ``NEURON_VISIBLE_DEVICES`` value whose engine id is ``engine_id`` (None for ``nodev``)."""
    match = _ENGINE.match(engine_id)
    if match is None:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    return str(first) if first == last else f"{first}-{last}"


def _config(config: Mapping[str, Any] | None, ledger: Ledger, keys: set[str]) -> dict[str, Any] | None:
    """``config`` with ``neuron_config.graph_types`` set to the graph types of these graphs."""
    if config is None:
        return None
    out = json.loads(json.dumps(config, default=str))
    neuron_config = out.get("neuron_config")
    if isinstance(neuron_config, dict):
        neuron_config["graph_types"] = {key: g.graph_type for key, g in sorted(ledger.graphs.items())
                                        if key in keys and g.graph_type}
    return out


def emit_engines(source: Path, target: Path, *, cache_dir: Path, config: Mapping[str, Any] | None,
                 keys: Iterable[str] | None = None, failures: list[str] | None = None) -> list[Path]:
    """Write ``<target>/<engine-id>/manifest.json`` for each engine of ``source``'s ledger (only ``keys``, if given);
    ``source == target`` consumes the ledger (the session's end), else ``source`` is left alone (a test's view)."""
    from neuron_args.manifest.emit import emit_manifest

    wanted = None if keys is None else set(keys)
    written = []
    for engine in ledger_engines(source):
        ledger = read_ledger(ledger_dir(source, engine))
        chosen = {k for k in ledger.graphs if wanted is None or k in wanted}
        if not chosen:
            continue
        lines = ledger.lines(chosen)
        if source != target:
            folder = Path(ledger_dir(target, engine))
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "view.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
        ranks = max(r["rank"] for r in lines)
        with envs.overridden({MANIFEST_DIR_ENV: str(target), VISIBLE_DEVICES_ENV: engine_devices(engine)}):
            path = emit_manifest(cache_dir=cache_dir, config=_config(config, ledger, chosen),
                                 rank_map=list(range(ranks + 1)), failures=failures)
        if path is not None:
            written.append(Path(path))
    return written


__all__ = ["emit_engines", "engine_devices"]
