"""neuron-args: per-graph neuronx-cc compiler arguments, carried by a scope to every compile seam."""
from __future__ import annotations

from neuron_args.errors import (
    CacheKeyArgsConflict,
    CacheMissError,
    CompileError,
    CompilerArgsError,
    LoweringError,
    NeuronArgsError,
    PolicyError,
    TraceError,
)
from neuron_args.scope import apply_scoped_compiler_args, scoped_compiler_args

__version__ = "0.1.0"

__all__ = [
    "CacheKeyArgsConflict",
    "CacheMissError",
    "CompileError",
    "CompilerArgsError",
    "LoweringError",
    "NeuronArgsError",
    "PolicyError",
    "TraceError",
    "apply_scoped_compiler_args",
    "scoped_compiler_args",
]
