"""The one compiler interface both drivers implement: ``graph.hlo`` plus neuronx-cc arguments into an
executable, run as a child process (a bad option can abort a process) with the same argv; only ``program`` differs.
:func:`compile_entry` builds one cache entry with it (a seam's miss, or ``parallel_compile``) and records how in
``metadata.json``. No torch, no seams: a compile worker imports neither.
"""
from __future__ import annotations

import abc
import contextlib
import contextvars
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from neuron_args.activity import ACTIVITY
from neuron_args.cache import CacheEntry
from neuron_args.compilers.process import LOG_FILE, CompileResult, run_compiler, start_process, temp_output_path
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CompileError, CompilerArgsError, CompilerArgsWarning
from neuron_args.flags import CompilerArgs
from neuron_args.settings import resolve_compile_timeout
from neuron_args.target import Target, parse_target
from neuron_args.text import graph_label

#: Options the driver sets itself; a caller's copy is dropped (``--target`` must agree).
DRIVER_OPTIONS = ("--target", "--framework", "--output", "--logfile")
#: A work folder given in the arguments is shared by every compile (xdist workers, parallel_compile):
#: each compile gets its own ``<folder>/<key>`` in it.
WORKDIR_OPTIONS = ("--workdir", "--compile_workdir")


_compile_listener: contextvars.ContextVar[Callable[[str | None, str], None]] = contextvars.ContextVar(
    "neuron_args_compile_start", default=lambda graph_type, key: None)


@contextlib.contextmanager
def on_compile_start(listener: Callable[[str | None, str], None]) -> Iterator[None]:
    """Call ``listener(graph_type, key)`` as each compile this context starts inside the block begins (a warmup's
    progress says "compiling" only when a compiler really starts)."""
    token = _compile_listener.set(listener)
    try:
        yield
    finally:
        _compile_listener.reset(token)


@dataclass(frozen=True)
class CompilerInfo:
    """Which compiler built an executable; recorded in ``metadata.json`` and in the cache key."""

    name: str  # "local" | "neuronx-cc"
    version: str
    executable_format: str  # "xla-cpu-executable" | "neff"

    def as_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "format": self.executable_format}


def prepare_compiler_args(
    compiler_args: Sequence[str], *, target: Target, graph_type: str | None, key: str | None
) -> list[str]:
    """Validate a neuronx-cc argument list (before any process starts: a typo fails fast with
    :class:`CompilerArgsError`) and drop the options the driver sets itself."""
    args = CompilerArgs.parse(compiler_args, graph_type=graph_type)  # a checked value: not parsed again
    given = args.value("--target")
    if given is not None and given != target:
        raise CompilerArgsError(
            f"{graph_label(graph_type)}, key {key or '(none)'}: compiler_args hold "
            f"'--target {given}' but the compile target is {target!r}; remove --target from the "
            "compiler arguments (the driver sets it from the target) or change the target"
        )
    for name in ("--output", "--logfile"):
        if args.value(name) is not None and ACTIVITY.say_once(f"driver option {name}"):
            warnings.warn(CompilerArgsWarning(
                f"{graph_label(graph_type)}, key {key or '(none)'}: {name} in the compiler arguments is ignored: "
                "the compile cache keeps each graph's executable and compiler log in its entry "
                "(<cache>/<key>/graph_<key>.neff and log-neuron-cc.txt; `neuron-args cache ls` lists them). "
                f"Fix: remove {name} from the compiler arguments ($NEURON_CC_FLAGS, options['compiler_args'] "
                "or the model's policy)."), stacklevel=3)
    args = args.without(DRIVER_OPTIONS)
    for name in WORKDIR_OPTIONS:
        folder = args.value(name)
        if folder is not None and key:
            args = CompilerArgs([*args.without([name]), f"{name}={os.path.join(folder, key)}"])
    return args.argv


class Compiler(abc.ABC):
    """A compiler driver: it sets ``name``, ``display_name``, ``program`` (the command prefix that starts its
    compiler) and :attr:`info`; the argv and the run are shared."""

    name = "compiler"
    display_name = "compiler"
    program: list[str]

    @property
    @abc.abstractmethod
    def info(self) -> CompilerInfo:
        """Name, version and executable format (part of the cache key)."""

    @property
    def default_timeout(self) -> float:
        """Seconds a compile may take when no timeout is given (see :data:`neuron_args.settings.DEFAULT_TIMEOUTS`)."""
        return resolve_compile_timeout(None, self.name)

    def start_compiler(self, argv: Sequence[str], *, cwd: Path, stdout: IO[bytes]) -> Any:
        """Start the compile ``argv`` describes (a driver may hand it to a warm worker instead)."""
        return start_process(argv, cwd=cwd, stdout=stdout)

    def build_argv(
        self,
        *,
        hlo_path: Path,
        output_path: Path,
        target: str,
        compiler_args: Sequence[str],
        log_path: Path,
    ) -> list[str]:
        """``<program> compile graph.hlo --framework XLA --target <t> --output <o> --logfile <l> <args>``."""
        return [
            *self.program, "compile", str(hlo_path),
            "--framework", "XLA",
            "--target", target,
            "--output", str(output_path),
            "--logfile", str(log_path),
            *compiler_args,
        ]  # fmt: skip

    def compile(
        self,
        *,
        hlo_path: Path,
        output_path: Path,
        target: Target | str,
        compiler_args: Sequence[str],
        workdir: Path,
        graph_type: str | None = None,
        key: str | None = None,
        timeout: float | None = None,
    ) -> CompileResult:
        """Compile ``hlo_path`` into ``output_path`` (the log and command.txt go to ``workdir``); bad arguments
        raise :class:`CompilerArgsError` before anything starts, a failed, crashed or timed-out compile
        :class:`CompileError` (``timeout`` None: ``$NEURON_ARGS_COMPILE_TIMEOUT``, else the compiler's default)."""
        timeout = self.default_timeout if timeout is None else timeout
        # a Target was checked where it entered; a plain str (a cache entry's metadata, a direct call) enters here
        target = parse_target(target, f"the target of {graph_label(graph_type)}, key {key or '(none)'}")
        args = prepare_compiler_args(compiler_args, target=target, graph_type=graph_type, key=key)
        # absolute: the child runs with the work directory as its cwd
        workdir, output_path = Path(workdir).absolute(), Path(output_path).absolute()
        log_path = workdir / LOG_FILE
        tmp = temp_output_path(output_path)
        common = dict(hlo_path=Path(hlo_path).absolute(), target=target, compiler_args=args, log_path=log_path)
        return run_compiler(
            compiler=self.display_name,
            argv=self.build_argv(output_path=tmp, **common),
            recorded_argv=self.build_argv(output_path=output_path, **common),
            tmp_output=tmp,
            output_path=output_path,
            workdir=workdir,
            log_path=log_path,
            graph_type=graph_type,
            key=key,
            timeout=timeout,
            start_child=self.start_compiler,
        )


def compile_entry(entry: CacheEntry, compiler: Compiler, compiler_args: Sequence[str], target: str,
                  graph_type: str | None, metadata: EntryMetadata, *, timeout: float | None = None) -> None:
    """Compile ``entry``'s graph.hlo and record how, with the executable's size and sha256 that loads verify
    (the completion marker is the caller's)."""
    check_keyed_build(entry, metadata, compiler_args, target, graph_type)
    _compile_listener.get()(graph_type, entry.key)
    result = compiler.compile(
        hlo_path=entry.hlo_path, output_path=entry.executable_path, target=target,
        compiler_args=compiler_args, workdir=entry.path, graph_type=graph_type, key=entry.key,
        timeout=timeout,
    )
    entry.write_metadata(metadata.compiled(
        compiler_args=compiler_args, command=result.argv, seconds=round(result.seconds, 4),
        compiler=compiler.info.as_dict(),
        executable={"executable_size": result.output_size, "executable_sha256": result.output_sha256}))


def check_keyed_compiler(key: str, graph_type: str | None, recorded: str | None, given: str | None) -> None:
    """Refuse to build an entry with another compiler than it was captured for: the name is part of its key."""
    if recorded and given and given != recorded:
        raise CompileError(
            f"entry {key} (graph type {graph_type!r}) was captured for compiler {recorded!r}, whose "
            f"name is part of its key; compiling it with {given!r} would store a mismatched "
            "executable. Capture again with the same compiler option.")


def check_keyed_version(key: str, graph_type: str | None, info: CompilerInfo, keyed: str | None, where: str) -> None:
    """Refuse to build a key with another compiler version than it hashed (``keyed`` None: not recorded)."""
    if keyed is not None and info.version != keyed:
        raise CompileError(
            f"{graph_label(graph_type)}, key {key}: the {info.name} {where} is version {info.version!r} but the key "
            f"was computed for {keyed!r}; an executable built here would be stored under a key that lies. fix: "
            f"install {info.name} {keyed} {where} (the same environment as the capture), or capture again with "
            f"version {info.version}.")


def check_keyed_build(entry: CacheEntry, metadata: EntryMetadata, compiler_args: Sequence[str], target: str,
                      graph_type: str | None) -> None:
    """Refuse to build a key with other compiler arguments or another target than its ``key_components`` hold
    (metadata edited by hand, or recording no arguments: the base ones stand in); a key without arguments (native
    seam) is not checked."""
    comps = metadata.key_components
    if comps is None:
        return
    keyed_args, keyed_target = comps.get("compiler_args"), comps.get("target")
    problems = []
    if isinstance(keyed_args, list):
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
