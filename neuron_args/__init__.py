"""neuron-args: per-graph neuronx-cc compiler arguments, carried by a scope to every compile seam. Importing it is
cheap and starts no threads: torch-dependent pieces load on first attribute access, jax when a graph is lowered."""
from __future__ import annotations

import importlib
from typing import Any

from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CACHE_DIR_ENV, CompileCache, _assert_cache_key_args
from neuron_args.cache_key import create_cache_hash, explain_components
from neuron_args.errors import (
    CacheKeyArgsConflict,
    CacheMissError,
    CompileError,
    CompilerArgsError,
    CompilerArgsWarning,
    LoweringError,
    NeuronArgsError,
    OptionsError,
    PolicyError,
    TraceError,
)
from neuron_args.flags import canonical_compiler_args, validate_compiler_args, with_optimization_level
from neuron_args.scope import CompilerArgsResolver, apply_scoped_compiler_args, scoped_compiler_args

__version__ = "0.1.0"

NEURON_LIBTORCH_ASSERT_CACHE_HIT = ASSERT_CACHE_HIT_ENV
NEURON_LIBTORCH_CACHE_DIR = CACHE_DIR_ENV
VLLM_NEURON_MANIFEST_DIR = "VLLM_NEURON_MANIFEST_DIR"

_LAZY = {
    "NeuronRunner": "neuron_args.runner",
    "GraphSpec": "neuron_args.graphs",
    "parallel_trace": "neuron_args.deferred",
    "parallel_compile": "neuron_args.deferred",
    "ParallelCompileError": "neuron_args.deferred",
    "build_trace_job": "neuron_args.deferred",
    "TraceJob": "neuron_args.deferred",
    "emit_manifest": "neuron_args.manifest.emit",
    "record_graph": "neuron_args.manifest.ledger",
    "get_server_prefix": "neuron_args.manifest.engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'neuron_args' has no attribute {name!r}")


__all__ = [
    "NEURON_LIBTORCH_ASSERT_CACHE_HIT", "NEURON_LIBTORCH_CACHE_DIR", "VLLM_NEURON_MANIFEST_DIR",
    "CacheKeyArgsConflict", "CacheMissError", "CompileCache", "CompileError", "CompilerArgsError",
    "CompilerArgsResolver", "CompilerArgsWarning", "LoweringError", "NeuronArgsError", "OptionsError", "PolicyError",
    "TraceError",
    "_assert_cache_key_args", "apply_scoped_compiler_args", "canonical_compiler_args", "create_cache_hash",
    "explain_components", "scoped_compiler_args", "validate_compiler_args", "with_optimization_level", *_LAZY,
]
