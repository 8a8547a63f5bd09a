"""Building one cache entry: run its compiler and record in ``metadata.json`` how it was built.

Shared by the compile seam (a miss at call time) and the deferred flow (``parallel_compile`` of
captured entries); it needs neither torch nor the seams, so a compile worker imports neither.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_args.cache import CacheEntry, executable_fields, now_iso
from neuron_args.compilers.base import Compiler


def compile_entry(entry: CacheEntry, compiler: Compiler, compiler_args: Sequence[str], target: str,
                  graph_type: str | None, metadata: Mapping[str, Any], *, timeout: float | None = None) -> None:
    """Compile ``entry``'s graph.hlo into its executable and record how (the marker is the caller's).

    The executable's size and sha256 go into the metadata: loads verify them. ``timeout`` None
    means the compiler's default (``$NEURON_ARGS_COMPILE_TIMEOUT`` first).
    """
    result = compiler.compile(
        hlo_path=entry.hlo_path, output_path=entry.executable_path, target=target,
        compiler_args=list(compiler_args), workdir=entry.path, graph_type=graph_type, key=entry.key,
        timeout=timeout,
    )
    entry.write_metadata({
        **metadata, "status": "compiled", "compiler_args": list(compiler_args), "command": result.argv,
        "compiled": now_iso(), "compile_seconds": round(result.seconds, 4), "compiler": compiler.info.as_dict(),
        **executable_fields(entry.executable_path),
    })
