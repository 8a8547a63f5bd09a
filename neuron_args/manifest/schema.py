"""Manifest schema, version 1 (``manifest.schema.json`` next to this module describes each field).

``graphs[]`` is sorted by ``graph_hash`` (two manifests diff line by line); a graph the ledger proves was traced is
listed even when its cache folder is gone, its cache fields null: null means "not in the cache when the manifest
was written", never a guess. ``jsonschema`` is imported only by :func:`validate_manifest`.
"""
from __future__ import annotations

import copy
import functools
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

from neuron_args.text import clip

__all__ = [
    "CONFIG_FIELDS",
    "GRAPH_FIELDS",
    "MANIFEST_FILENAME",
    "MANIFEST_VERSION",
    "TOPOLOGY_DEFAULTS",
    "json_path",
    "schema",
    "validate_manifest",
]

MANIFEST_VERSION = "1"
MANIFEST_FILENAME = "manifest.json"
SCHEMA_RESOURCE = "manifest.schema.json"


def schema() -> dict:
    """The JSON Schema (draft 2020-12) of manifest version 1, as a fresh dict."""
    return json.loads(resources.files("neuron_args.manifest").joinpath(SCHEMA_RESOURCE).read_text("utf-8"))


# The field lists of emit, config and diff, read from the schema: one description of a manifest's fields.
_DEFS = schema()["$defs"]
CONFIG_FIELDS: tuple[str, ...] = tuple(_DEFS["config"]["properties"])
#: every topology count defaults to 1 (one device, no parallelism)
TOPOLOGY_DEFAULTS: dict[str, int | bool] = {
    name: False if spec.get("type") == "boolean" else 1 for name, spec in _DEFS["topology"]["properties"].items()
}
GRAPH_FIELDS: tuple[str, ...] = tuple(_DEFS["graph"]["properties"])


@functools.lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator

    doc = schema()
    Draft202012Validator.check_schema(doc)
    return Draft202012Validator(doc)


def json_path(parts: Iterable[Any], prefix: str = "") -> str:
    """``prefix`` then a JSON path of keys and indices: ``graphs[0].ranks``."""
    out = prefix
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate_manifest(doc: Mapping) -> list[str]:
    """Human-readable problems with ``doc`` (``[]``: a valid version-1 manifest): the JSON Schema's, then what a
    schema cannot say (ranks sorted, graphs sorted by ``graph_hash``, each hash once)."""
    if not isinstance(doc, Mapping):
        return [f"(top level): a manifest is a JSON object, got {type(doc).__name__}"]
    plain = copy.deepcopy(dict(doc))
    problems = [
        f"{json_path(error.absolute_path) or '(top level)'}: {clip(error.message, 300)}"
        for error in sorted(_validator().iter_errors(plain), key=lambda e: list(map(str, e.absolute_path)))
    ]
    graphs = plain.get("graphs")
    if isinstance(graphs, list):
        for index, graph in enumerate(graphs):
            ranks = graph.get("ranks") if isinstance(graph, Mapping) else None
            if isinstance(ranks, list) and all(type(r) is int for r in ranks) and ranks != sorted(ranks):
                problems.append(f"graphs[{index}].ranks: {ranks} is not sorted")
        str_hashes = [h for g in graphs if isinstance(g, Mapping) and isinstance(h := g.get("graph_hash"), str)]
        problems += [f"graphs: graph_hash {h!r} is listed more than once"
                     for h, n in Counter(str_hashes).items() if n > 1]
        if str_hashes != sorted(str_hashes):
            problems.append("graphs: entries are not sorted by graph_hash")
    return problems
