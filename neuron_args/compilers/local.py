"""The local driver: runs :mod:`neuron_args.compilers.local_xla` (XLA:CPU) where neuronx-cc is absent.

The command line has the same shape as neuronx-cc's, only the program differs, so everything
downstream (command.txt, the log, the error decoding, the cache) treats both compilers alike.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from neuron_args.activity import cleared_on_reset
from neuron_args.compilers.base import Compiler, CompilerInfo

NAME = "local"
FORMAT = "xla-cpu-executable"
PROGRAM_MODULE = "neuron_args.compilers.local_xla"

@cleared_on_reset
@functools.cache
def local_version() -> str:
    """``local-xla-cpu/<jaxlib> neuron-args/<version>``, without starting a process or jax (once per process)."""
    from importlib import metadata

    import neuron_args

    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        jaxlib = "unknown"
    return f"local-xla-cpu/{jaxlib} neuron-args/{neuron_args.__version__}"


class LocalCompiler(Compiler):
    """Compile with the embedded XLA:CPU program, in a child Python process.

    ``program`` is the command prefix that starts it (default: this interpreter running
    :mod:`neuron_args.compilers.local_xla`); tests point it at a stand-in.
    """

    name = NAME
    display_name = "local compiler (XLA:CPU)"

    def __init__(self, program: Sequence[str] | None = None) -> None:
        self.program = list(program) if program else [sys.executable, "-m", PROGRAM_MODULE]

    @property
    def info(self) -> CompilerInfo:
        return CompilerInfo(NAME, local_version(), FORMAT)
