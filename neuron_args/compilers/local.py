"""The local driver: runs :mod:`neuron_args.compilers.local_xla` (XLA:CPU) where neuronx-cc is absent, with
neuronx-cc's command line (so everything downstream treats both alike), on warm workers by default.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from neuron_args.activity import cleared_on_reset
from neuron_args.cache_key import tool_version
from neuron_args.compilers import workers
from neuron_args.compilers.base import Compiler, CompilerInfo

NAME = "local"
FORMAT = "xla-cpu-executable"
PROGRAM_MODULE = "neuron_args.compilers.local_xla"


@cleared_on_reset
@functools.cache
def local_version() -> str:
    """``local-xla-cpu/<jaxlib> neuron-args/<version>``, without starting a process or jax (once per process)."""
    import neuron_args

    return f"local-xla-cpu/{tool_version('jaxlib', 'unknown')} neuron-args/{neuron_args.__version__}"


class LocalCompiler(Compiler):
    """Compile with the embedded XLA:CPU program, on a warm worker or in a child Python process.

    ``program``: a stand-in command prefix (tests), run one process per graph; ``pool``: the warm workers
    (default: the shared pool, unless ``$NEURON_ARGS_WARM_WORKERS`` is 0 or ``program`` is given).
    """

    name = NAME
    display_name = "local compiler (XLA:CPU)"

    def __init__(self, program: Sequence[str] | None = None, *, pool: workers.WorkerPool | None = None) -> None:
        self.program = list(program) if program else [sys.executable, "-m", PROGRAM_MODULE]
        self.pool = pool
        self._own_program = bool(program)

    def start_compiler(self, argv: Sequence[str], *, cwd: Path, stdout: IO[bytes]) -> Any:
        pool = self.pool
        if pool is None and not self._own_program and workers.enabled():
            pool = workers.shared_pool()
        if pool is None:
            return super().start_compiler(argv, cwd=cwd, stdout=stdout)
        return pool.start(argv[len(self.program):], argv, cwd=cwd, stdout=stdout)

    @property
    def info(self) -> CompilerInfo:
        return CompilerInfo(NAME, local_version(), FORMAT)
