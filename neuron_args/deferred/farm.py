"""Compile farm: ship a pending graph's inputs to a worker, ship the executable back.

A worker (a pool child, a thread, a Dask worker on another host) never touches the cache folder: the caller
sends a :class:`CompileTask` to any ``concurrent.futures.Executor`` and writes the entry itself (:func:`build_on`,
under the key's lock, marker last), so a worker that dies mid-compile leaves the graph pending, never half an entry.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import os
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from neuron_args.cache import HLO_NAME, CacheEntry, executable_file_name
from neuron_args.compilers.base import check_keyed_build, check_keyed_compiler, check_keyed_version
from neuron_args.compilers.lifetime import CancelScope, CompileCancelled, within
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CompileError, NeuronArgsError
from neuron_args.untrusted import HLO_LIMIT, UntrustedFileError, is_sha256, read_bounded, read_tail

__all__ = ["CompileOutcome", "CompileTask", "build_on", "commit_outcome", "prepare_task", "run_compile_task"]

#: How often a worker checks whether its Dask task was cancelled, and a caller waiting on one whether its run was.
CANCEL_POLL_SECONDS = 0.3


@dataclass(frozen=True)
class CompileTask:
    """Everything a worker needs to compile one graph; no path of the caller's machine."""

    key: str
    graph_type: str | None
    hlo: bytes
    compiler_args: tuple[str, ...]
    target: str
    compiler: str  # "local" | "neuronx-cc"
    compiler_version: str | None  # the version the key was computed with; None: not recorded
    timeout: float | None = None


@dataclass(frozen=True)
class CompileOutcome:
    """What a worker sends back; ``workdir`` is its private folder (gone by then), for path rewriting."""

    key: str
    status: str  # "compiled" | "failed" | "cancelled"
    worker: str  # host:pid
    workdir: str
    executable: bytes | None = None
    executable_sha256: str | None = None
    log: bytes = b""
    argv: tuple[str, ...] = ()
    compiler: dict[str, str] = field(default_factory=dict)
    compile_seconds: float = 0.0
    worker_seconds: float = 0.0
    error: str | None = None


def expected_compiler(metadata: EntryMetadata) -> tuple[str | None, str | None]:
    """``(name, version)`` of the compiler the key hashed (``tool_versions``), else the metadata's record."""
    name, version = metadata.compiler_name, metadata.compiler_version
    tools = (metadata.key_components or {}).get("tool_versions")
    keyed = tools.get("compiler") if isinstance(tools, dict) else None
    if isinstance(keyed, str) and " " in keyed:
        keyed_name, keyed_version = keyed.split(" ", 1)
        if name in (None, keyed_name):
            name, version = keyed_name, keyed_version
    return name, version


def prepare_task(entry: CacheEntry, metadata: EntryMetadata, compiler_args: Sequence[str], *,
                 compiler_name: str | None = None, timeout: float | None = None) -> CompileTask:
    """The task for one pending entry, read in the caller's process (which holds the cache); ``compiler_name``
    None: the entry's own compiler (its name is part of the key)."""
    graph_type = metadata.graph_type
    name, version = expected_compiler(metadata)
    check_keyed_compiler(entry.key, graph_type, name, compiler_name)
    check_keyed_build(entry, metadata, compiler_args, metadata.build_target, graph_type)
    try:
        hlo = read_bounded(entry.hlo_path, HLO_LIMIT)  # the shared cache's file: a planted FIFO never blocks
    except (OSError, UntrustedFileError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CompileError(
            f"cannot read the HLO module of entry {entry.key} (graph type {graph_type!r}) at {entry.hlo_path}: "
            f"{why}. Capture the graph again (it writes graph.hlo) or remove the entry.") from None
    if timeout is None:  # the capture's own option
        timeout = metadata.compile_timeout
    return CompileTask(key=entry.key, graph_type=graph_type, hlo=hlo, compiler_args=tuple(compiler_args),
                       target=metadata.build_target, compiler=compiler_name or name or "auto",
                       compiler_version=version, timeout=timeout)


# ----------------------------------------------------------------------------- worker side


@contextlib.contextmanager
def _dask_cancels(scope: CancelScope, label: str) -> Iterator[None]:
    """On a Dask worker, cancel ``scope`` (killing the compiler's group) once this task is cancelled; elsewhere
    nothing (importing Dask costs ~1 s)."""
    worker = None
    if "distributed" in sys.modules:
        with contextlib.suppress(ImportError, ValueError, AttributeError):  # not on a Dask worker's task
            from distributed import get_worker
            from distributed.worker import thread_state

            worker, key = get_worker(), thread_state.key
    if worker is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(CANCEL_POLL_SECONDS):
            ts = worker.state.tasks.get(key)
            if ts is None or ts.state in ("cancelled", "released", "forgotten"):
                scope.cancel()

    watcher = threading.Thread(target=watch, name=f"neuron-args-farm-watch-{label}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def run_compile_task(task: CompileTask) -> CompileOutcome:
    """Worker body: compile one task. A deterministic failure is a ``failed`` outcome (not retried); it raises
    only for trouble of the worker itself (a full temp disk), which ``retries=`` may retry."""
    from neuron_args.compilers import select_compiler

    start = time.monotonic()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix=f"neuron-args-farm-{task.key[:12]}-")
    where = f"graph type {task.graph_type!r}, key {task.key}, on worker {worker}"

    def outcome(status: str, **fields: Any) -> CompileOutcome:
        log_path = Path(workdir) / "log-neuron-cc.txt"
        # its end, where the errors are: a verbose compile's log may pass what the caller takes (MAX_LOG_BYTES)
        log = read_tail(log_path, MAX_LOG_BYTES)[0] if log_path.is_file() else b""
        return CompileOutcome(key=task.key, status=status, worker=worker, workdir=workdir, log=log,
                              worker_seconds=round(time.monotonic() - start, 3), **fields)

    try:
        try:
            compiler = select_compiler(task.compiler)
            info = compiler.info
        except NeuronArgsError as exc:
            return outcome("failed", error=f"{where}: {exc}")
        try:
            check_keyed_version(task.key, task.graph_type, info, task.compiler_version, f"on worker {worker}")
        except CompileError as exc:
            return outcome("failed", compiler=info.as_dict(), error=str(exc))
        # the entry's own file names, so the recorded argv differs from the entry's only in the folder
        hlo_path = Path(workdir) / HLO_NAME
        hlo_path.write_bytes(task.hlo)
        output = Path(workdir) / executable_file_name(task.key)
        scope = CancelScope()
        try:
            with within(scope), _dask_cancels(scope, task.key[:8]):
                result = compiler.compile(hlo_path=hlo_path, output_path=output, target=task.target,
                                          compiler_args=list(task.compiler_args), workdir=Path(workdir),
                                          graph_type=task.graph_type, key=task.key, timeout=task.timeout)
        except (NeuronArgsError, CompileCancelled) as exc:
            if scope.cancelled:
                return outcome("cancelled", compiler=info.as_dict(), error=f"{where}: cancelled")
            return outcome("failed", compiler=info.as_dict(), error=f"{where}: {exc}")
        blob = output.read_bytes()
        return outcome("compiled", executable=blob, executable_sha256=hashlib.sha256(blob).hexdigest(),
                       argv=tuple(result.argv), compiler=info.as_dict(), compile_seconds=round(result.seconds, 4))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- caller side

#: Caps on what a worker may send back (a worker is another host: its answer is untrusted input).
MAX_ARGV_BYTES = 1 << 20
MAX_LOG_BYTES = 256 << 20
MAX_ERROR = 1 << 20  # an error message (it may quote a log's tail)
MAX_TEXT = 64 << 10  # an argv item
_STATUSES = ("compiled", "failed", "cancelled")


def _text(value: object, limit: int = MAX_TEXT) -> bool:
    return isinstance(value, str) and len(value) <= limit and "\0" not in value


def outcome_problem(outcome: object, task: CompileTask) -> str | None:
    """Why a worker's answer to ``task`` may not be written, or None: every field checked (an empty ``workdir``
    would make the path rewriting insert the entry's path between every character of a 2 MB argv)."""
    o = outcome
    if not isinstance(o, CompileOutcome):
        return f"it sent a {type(o).__name__}, not a CompileOutcome"
    seconds = (o.compile_seconds, o.worker_seconds)
    checks = (
        (o.key == task.key, f"its key {str(o.key)[:40]!r} is not the task's"),
        (o.status in _STATUSES, f"its status {str(o.status)[:40]!r} is not one of {', '.join(_STATUSES)}"),
        (_text(o.worker, 256), "its worker name is not a short string"),
        (_text(o.workdir, 4096) and os.path.isabs(o.workdir) and len(o.workdir) > 1,
         "its workdir is not an absolute folder path"),
        (o.executable is None or isinstance(o.executable, bytes), "its executable is not bytes"),
        (o.executable_sha256 is None or is_sha256(o.executable_sha256),
         "its executable_sha256 is not 64 hex characters"),
        (isinstance(o.log, bytes) and len(o.log) <= MAX_LOG_BYTES, f"its log is not bytes of at most {MAX_LOG_BYTES}"),
        (isinstance(o.argv, (tuple, list)) and all(_text(a) for a in o.argv)
         and sum(len(a) for a in o.argv) <= MAX_ARGV_BYTES, f"its argv is not strings of at most {MAX_ARGV_BYTES} in all"),
        (isinstance(o.compiler, dict) and len(o.compiler) <= 32
         and all(_text(k, 64) and _text(v, 1024) for k, v in o.compiler.items()), "its compiler record is not short strings"),
        (all(type(t) in (int, float) and 0 <= t < 1e9 for t in seconds), "its timings are not seconds"),
        (o.error is None or _text(o.error, MAX_ERROR), f"its error is not a string of at most {MAX_ERROR}"),
    )
    return next((why for ok, why in checks if not ok), None)


def check_outcome(outcome: object, task: CompileTask) -> None:
    problem = outcome_problem(outcome, task)
    if problem is not None:
        raise CompileError(
            f"graph type {task.graph_type!r}, key {task.key}: the worker's result is invalid ({problem}); nothing "
            "was written and the entry stays pending. fix: run the same neuron-args version on every worker, and "
            "only workers you trust")


def commit_outcome(entry: CacheEntry, metadata: EntryMetadata, task: CompileTask, outcome: CompileOutcome) -> int:
    """Write a checked, compiled outcome into ``entry`` (under the key's lock), marker last; returns its size."""
    check_outcome(outcome, task)
    blob = outcome.executable or b""
    sha = hashlib.sha256(blob).hexdigest()
    if not blob or sha != outcome.executable_sha256:
        raise CompileError(
            f"graph type {task.graph_type!r}, key {task.key}: the executable from worker {outcome.worker} arrived "
            f"{'empty' if not blob else 'corrupted'} ({len(blob)} bytes, sha256 {sha[:16]}..., the worker sent "
            f"{str(outcome.executable_sha256)[:16]}...). The entry stays pending; rerun to build it again.")
    name, version = outcome.compiler.get("name"), outcome.compiler.get("version")
    if (task.compiler != "auto" and name != task.compiler) or (task.compiler_version not in (None, version)):
        raise CompileError(
            f"graph type {task.graph_type!r}, key {task.key}: worker {outcome.worker} says compiler {name!r} version "
            f"{version!r} built the executable, but the key was computed for {task.compiler!r} version "
            f"{task.compiler_version!r}; nothing was written and the entry stays pending. fix: run the capture's "
            "compiler and neuron-args version on every worker, and only workers you trust")
    argv = [a.replace(outcome.workdir, str(entry.path)) for a in outcome.argv]
    write_atomic(entry.executable_path, blob, durable=True)
    write_atomic(entry.log_path, outcome.log)
    write_atomic(entry.command_path, shlex.join(argv) + "\n")
    entry.write_metadata(metadata.compiled(
        compiler_args=task.compiler_args, command=argv, seconds=outcome.compile_seconds,
        compiler=outcome.compiler, executable={"executable_size": len(blob), "executable_sha256": sha},
        compiled_on={"worker": outcome.worker, "seconds": outcome.worker_seconds}))
    entry.mark_complete()
    return len(blob)


def build_on(executor: cf.Executor, entry: CacheEntry, md: EntryMetadata, compiler_args: Sequence[str],
             compiler_name: str | None, timeout: float | None, scope: CancelScope) -> int:
    """Build ``entry`` (its key's lock held) on ``executor``: ship its task, wait, check the worker's outcome and
    write it; the executable's size, else a CompileError. A cancelled ``scope`` lets go of the task."""
    task = prepare_task(entry, md, compiler_args, compiler_name=compiler_name, timeout=timeout)
    inner = executor.submit(run_compile_task, task)
    while not cf.wait([inner], timeout=CANCEL_POLL_SECONDS).done:
        if scope.cancelled:
            inner.cancel()
            raise CompileCancelled()
    where = f"graph type {task.graph_type!r}, key {task.key}"
    if inner.cancelled():
        raise CompileError(f"{where}: its task was cancelled before it finished (Ctrl-C, or the cluster let go of "
                           "it); the entry stays pending, rerun to build it")
    exc = inner.exception()
    if type(exc).__name__ == "KilledWorker":
        raise CompileError(f"{where}: the workers running it died repeatedly ({exc}); killed or out of memory. fix: "
                           "give the workers more memory or fewer threads (one compile per worker), then rerun; the "
                           "entry stays pending")
    if exc is not None:
        raise CompileError(f"{where}: the worker raised {type(exc).__name__}: {exc}; the entry stays pending")
    outcome: CompileOutcome = inner.result()
    check_outcome(outcome, task)
    if outcome.status == "compiled":
        return commit_outcome(entry, md, task, outcome)
    if outcome.log:  # the log, where the error message says it is
        with contextlib.suppress(OSError):
            write_atomic(entry.log_path, outcome.log)
    raise CompileError((outcome.error or outcome.status).replace(outcome.workdir, str(entry.path)))
