"""The compile-artifact manifest: a per-engine ``manifest.json`` of every graph it compiled.

Off unless ``VLLM_NEURON_MANIFEST_DIR`` names a directory. Seams call :func:`record_graph`; after warmup local
rank 0 calls :func:`emit_manifest`. A diff imports deepdiff only when two manifests differ.
"""
from __future__ import annotations

from neuron_args.manifest.config import build_config, environment_snapshot
from neuron_args.manifest.diff import ManifestDiff, diff_manifests
from neuron_args.manifest.emit import emit_manifest
from neuron_args.manifest.engine import (
    MANIFEST_DIR_ENV,
    get_server_prefix,
    manifest_root,
    parse_visible_devices,
)
from neuron_args.manifest.ledger import (
    clear_tp_group,
    current_tp_rank,
    record_graph,
    register_tp_group,
)
from neuron_args.manifest.jsonable import to_jsonable
from neuron_args.manifest.schema import MANIFEST_VERSION, validate_manifest

__all__ = [
    "MANIFEST_DIR_ENV",
    "MANIFEST_VERSION",
    "ManifestDiff",
    "build_config",
    "clear_tp_group",
    "current_tp_rank",
    "diff_manifests",
    "emit_manifest",
    "environment_snapshot",
    "get_server_prefix",
    "manifest_root",
    "parse_visible_devices",
    "record_graph",
    "register_tp_group",
    "to_jsonable",
    "validate_manifest",
]
