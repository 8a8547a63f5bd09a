"""The compilers behind one interface: neuronx-cc on Neuron hosts, the embedded XLA:CPU one elsewhere.

Selection, highest first: ``options["compiler"]``, the ``NEURON_ARGS_COMPILER`` environment
variable, then ``auto`` (neuronx-cc when it is on PATH, else local). Nothing here imports jax:
the local compiler runs in its own process.
"""
from __future__ import annotations

import shutil

from neuron_args import envs
from neuron_args.compilers.base import Compiler, CompilerInfo
from neuron_args.compilers.local import LocalCompiler
from neuron_args.compilers.neuronx_cc import NeuronxCcCompiler
from neuron_args.errors import CompileError, CompilerArgsError

COMPILER_ENV = "NEURON_ARGS_COMPILER"
COMPILER_CHOICES = ("auto", "local", "neuronx-cc")

__all__ = [
    "COMPILER_CHOICES",
    "COMPILER_ENV",
    "CompilerInfo",
    "LocalCompiler",
    "NeuronxCcCompiler",
    "compiler_choice",
    "select_compiler",
]


def compiler_choice(requested: object, source: str = "options['compiler']") -> str:
    """``requested`` as one of :data:`COMPILER_CHOICES` (any case, spaces around); else a CompilerArgsError."""
    name = requested.strip().lower() if isinstance(requested, str) else None
    if name not in COMPILER_CHOICES:
        raise CompilerArgsError(
            f"unknown compiler {requested!r} (from {source}); choose one of "
            + ", ".join(repr(c) for c in COMPILER_CHOICES)
        )
    return name


def select_compiler(requested: str | None = None) -> Compiler:
    """The compiler ``requested`` (``options["compiler"]``; else the environment, else PATH detection) names."""
    source = COMPILER_ENV if requested is None else "options['compiler']"
    name = compiler_choice((envs.text(COMPILER_ENV) or "auto") if requested is None else requested, source)
    found = shutil.which("neuronx-cc")
    if name == "auto":
        name = "neuronx-cc" if found else "local"
    if name == "local":
        return LocalCompiler()
    if not found:
        raise CompileError(
            f"compiler 'neuronx-cc' was requested (from {source}) but is not on PATH. On a Neuron "
            "host install it from the Neuron repository (pip install neuronx-cc "
            "--extra-index-url=https://pip.repos.neuron.amazonaws.com) and activate that "
            "environment; elsewhere use compiler='local' (or NEURON_ARGS_COMPILER=local)."
        )
    return NeuronxCcCompiler()
