"""Building one cache entry (a seam's miss, or ``parallel_compile``): run its compiler, record how in
``metadata.json``. No torch, no seams: a compile worker imports neither."""
from __future__ import annotations

from collections.abc import Sequence

from neuron_args.cache import CacheEntry, executable_fields
from neuron_args.compile_start import compile_starting
from neuron_args.compilers.base import Compiler
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CompileError, CompilerArgsError
from neuron_args.flags import CompilerArgs
from neuron_args.text import graph_label


def compile_entry(entry: CacheEntry, compiler: Compiler, compiler_args: Sequence[str], target: str,
                  graph_type: str | None, metadata: EntryMetadata, *, timeout: float | None = None) -> None:
    """Compile ``entry``'s graph.hlo and record how, with the executable's size and sha256 that loads verify
    (the completion marker is the caller's)."""
    check_keyed_build(entry, metadata, compiler_args, target, graph_type)
    compile_starting(graph_type, entry.key)
    result = compiler.compile(
        hlo_path=entry.hlo_path, output_path=entry.executable_path, target=target,
        compiler_args=compiler_args, workdir=entry.path, graph_type=graph_type, key=entry.key,
        timeout=timeout,
    )
    entry.write_metadata(metadata.compiled(
        compiler_args=compiler_args, command=result.argv, seconds=round(result.seconds, 4),
        compiler=compiler.info.as_dict(), executable=executable_fields(entry.executable_path)))


def check_keyed_compiler(key: str, graph_type: str | None, recorded: str | None, given: str | None) -> None:
    """Refuse to build an entry with another compiler than it was captured for: the name is part of its key."""
    if recorded and given and given != recorded:
        raise CompileError(
            f"entry {key} (graph type {graph_type!r}) was captured for compiler {recorded!r}, whose "
            f"name is part of its key; compiling it with {given!r} would store a mismatched "
            "executable. Capture again with the same compiler option.")


def check_keyed_build(entry: CacheEntry, metadata: EntryMetadata, compiler_args: Sequence[str], target: str,
                      graph_type: str | None) -> None:
    """Refuse to build a key with other compiler arguments or another target than its ``key_components`` hold
    (metadata edited by hand); a key without arguments (native seam) or an entry recording none is not checked."""
    comps = metadata.key_components
    if comps is None:
        return
    keyed_args, keyed_target = comps.get("compiler_args"), comps.get("target")
    problems = []
    if isinstance(keyed_args, list) and metadata.compiler_args is not None:
        try:
            given = list(CompilerArgs.of(compiler_args).canonical)
        except (CompilerArgsError, TypeError) as exc:
            given = [f"<invalid: {exc}>"]
        if given != keyed_args:
            problems.append(f"compiler arguments {list(compiler_args)} (the key holds {keyed_args})")
    if isinstance(keyed_target, str) and keyed_target != target:
        problems.append(f"target {target!r} (the key holds {keyed_target!r})")
    if problems:
        raise CompileError(
            f"{graph_label(graph_type)}, key {entry.key}: not compiled with {' and '.join(problems)}: the entry's "
            f"metadata.json does not agree with its key (damaged, or edited by hand), and one key never holds an "
            f"executable built another way.\nfix: capture the graph again (re-run the warmup or parallel_trace), "
            f"or remove the entry's folder {entry.path}")

