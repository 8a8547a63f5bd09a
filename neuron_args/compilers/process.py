"""Runs one compiler child and reads how it ended: the subprocess run both drivers share.

The output is renamed into place only on success (never a half-written executable); an exit status
becomes a :class:`CompileError` naming the graph type, the key, the command, the log tail and the fix.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from neuron_args.atomic import open_for_writing, write_atomic
from neuron_args.compilers.lifetime import current_scope, kill_group, supervised_argv
from neuron_args.compilers.supervisor import EXIT_CANNOT_START
from neuron_args.errors import CompileError
from neuron_args.settings import COMPILE_TIMEOUT_ENV
from neuron_args.untrusted import UntrustedFileError, open_regular, read_tail, stream_sha256

#: File names inside the work directory (the cache entry); see docs/ARCHITECTURE.md.
COMMAND_FILE = "command.txt"
LOG_FILE = "log-neuron-cc.txt"

#: How many log lines a :class:`CompileError` quotes.
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class CompileResult:
    """What one successful compile produced; ``argv`` is ``command.txt``'s (naming the final output, so a
    person can rerun it)."""

    argv: list[str]
    seconds: float
    output_path: Path
    log_path: Path
    output_size: int
    output_sha256: str


#: Exit statuses with a known reading: (what happened, what to change). Negative: killed by that
#: signal; neuronx-cc reports a killed or out-of-memory backend as 70.
_OOM_FIX = "compile fewer graphs in parallel or use a host with more memory"
_BUG_FIX = "this is a compiler bug: report it with graph.hlo, command.txt and the log"
EXIT_CODES: dict[int, tuple[str, str]] = {
    -signal.SIGKILL: ("killed or out of memory", _OOM_FIX),
    70: ("killed or out of memory", _OOM_FIX),
    -signal.SIGABRT: ("aborted", _BUG_FIX),
    -signal.SIGSEGV: ("crashed (segmentation fault)", _BUG_FIX),
    # the shell's and the dynamic loader's "could not run it": the installation, not the graph
    126: ("could not be executed", "the compiler's installation is broken: run `neuronx-cc --version` in this "
          "environment and fix what the log names, or use the local compiler"),
    127: ("could not start (a missing program or shared library)", "the compiler's installation is broken: run "
          "`neuronx-cc --version` in this environment and fix what the log names (a missing library: activate the "
          "Neuron environment), or use the local compiler"),
}
_DEFAULT_FIX = "read the log above; fix the graph or its compiler arguments"
#: neuronx-cc's command line is argparse's: a flag this version does not know is a usage error (exit 2)
_ARGPARSE_ERROR = re.compile(r"error: (unrecognized arguments|argument \S+:)")
_REJECTED_ARGS_FIX = ("this compiler version rejects an argument named in the log above: remove it from the compiler "
                      "arguments ($NEURON_CC_FLAGS, options['compiler_args'] or the model's policy), or install the "
                      "compiler version that has it")
_TIMEOUT_FIX = ("raise the compile timeout (options['compile_timeout'] in seconds, "
                f"${COMPILE_TIMEOUT_ENV} or pytest --neuron-compile-timeout), or lower the optimization "
                "level of this graph")


def describe_exit(returncode: int | None, *, brief: bool = False) -> str:
    """A human reading of an exit status (negative = killed by that signal); ``brief``: a Python child's, by
    number only (``killed by signal 9``, ``exit status 1``), without the compiler's table."""
    if returncode is None:
        return "still running"
    if brief:
        return f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    if returncode in EXIT_CODES:
        how = EXIT_CODES[returncode][0]
    elif returncode < 0:
        try:
            how = f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = "failed"
    return f"{how} (exit status {returncode})"


def _hint(returncode: int, log_path: Path | None = None) -> str:
    """The fix for a failed compile: what the log names first (a full disk, a damaged graph), then the exit code."""
    tail = log_tail(log_path, 200) if log_path is not None else ""  # no log: nothing below matches it
    if "No space left on device" in tail or "Disk quota exceeded" in tail:
        return f"free space on the file system of {log_path.parent} or point the compile cache elsewhere"
    if "File too large" in tail:  # EFBIG: a file-size limit (RLIMIT_FSIZE), not the graph
        return (f"the compiler hit a file-size limit writing into {log_path.parent}: raise the job's limit "
                "(`ulimit -f`) or point the compile cache to a file system that takes files this large")
    if "Failed to deserialize HloModuleProto" in tail:  # XLA: not the graph, its file
        return (f"{log_path.parent / 'graph.hlo'} is damaged (a capture cut short): capture it again (rerun the "
                "warmup or parallel_trace), or remove that entry's folder")
    if returncode == 2 and _ARGPARSE_ERROR.search(tail):
        return _REJECTED_ARGS_FIX
    return EXIT_CODES.get(returncode, ("", _DEFAULT_FIX))[1]


#: how much of a log's end is read for its tail (a compiler's log can be gigabytes at verbose levels)
TAIL_BYTES = 256 * 1024


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        data, cut = read_tail(path, TAIL_BYTES)  # the log sits in a cache entry others may write: a FIFO never blocks
    except OSError:
        return "(no log)"
    except UntrustedFileError as exc:  # a FIFO or a device planted as the log
        return f"(log not read: {exc})"
    text = data.decode(errors="replace")
    if cut:
        text = text.partition("\n")[2]  # the first line read is a part of one
    tail = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join("  " + line for line in tail) if tail else "(log is empty)"


def _own_output(path: Path, writer_uid: int) -> tuple[int, str] | str | None:
    """The compiler's output's size and sha256, read through one descriptor that followed no link and is a regular
    file of the user this process writes as: its name is on a command line anyone can read, so what another cache
    user swaps in there is refused, never recorded (or signed). None: no output; a str: why it is refused."""
    try:
        fd, st = open_regular(path, follow_links=False)
    except FileNotFoundError:
        return None
    except (UntrustedFileError, OSError) as exc:
        return f"cannot be opened as a regular file without following a link ({exc})"
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != writer_uid:
            return f"belongs to uid {st.st_uid}, not to uid {writer_uid} this process writes as"
        return None if st.st_size == 0 else (st.st_size, stream_sha256(f))


def start_process(argv: Sequence[str], *, cwd: Path, stdout: IO[bytes]) -> subprocess.Popen:
    """One compiler process under the supervisor, leading its own process group (a timeout kills all of it)."""
    return subprocess.Popen(supervised_argv(list(argv), reap=True), cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_child(proc: Any, timeout: float | None) -> int:
    """``proc.wait(timeout)``, woken by a pidfd at the child's exit (``Popen.wait`` polls every 50 ms)."""
    if timeout is None or not isinstance(proc, subprocess.Popen) or not hasattr(os, "pidfd_open"):
        return proc.wait(timeout=timeout)
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # reaped already, or a kernel without pidfds
        return proc.wait(timeout=timeout)
    try:
        poller = select.poll()  # not select(): a descriptor past 1023 is fine
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while not poller.poll(int(min(max(0.0, deadline - time.monotonic()), 3600.0) * 1000)):  # ms, a C int
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def run_compiler(
    *,
    compiler: str,
    argv: Sequence[str],
    recorded_argv: Sequence[str],
    tmp_output: Path,
    output_path: Path,
    workdir: Path,
    log_path: Path,
    graph_type: str | None,
    key: str | None,
    timeout: float | None,
    start_child: Callable[..., Any] = start_process,
) -> CompileResult:
    """Run one compile child in ``workdir`` and move its output onto ``output_path``; its stdout/stderr is
    appended to the log a :class:`CompileError` quotes. ``start_child`` returns a ``Popen`` or a look-alike
    (a warm worker)."""
    scope = current_scope()
    scope.check()
    workdir.mkdir(parents=True, exist_ok=True)
    for pattern in (".compiler-output.*.tmp", ".*.partial-*"):  # left by a driver killed mid-compile (kill -9)
        for path in workdir.glob(pattern):
            path.unlink(missing_ok=True)
    write_atomic(workdir / COMMAND_FILE, shlex.join(recorded_argv) + "\n")  # never through a link planted there
    output_path.unlink(missing_ok=True)  # a failed rebuild must not leave the old result behind
    log_path.unlink(missing_ok=True)
    captured = workdir / f".compiler-output.{uuid.uuid4().hex}.tmp"
    start = time.perf_counter()
    returncode: int | None = None

    def fail(status: str, hint: str) -> CompileError:
        return CompileError(
            f"{compiler} failed for graph type {graph_type!r}, key {key or '(none)'}: {status}\n"
            f"command: {shlex.join(recorded_argv)}\n"
            f"log {log_path} (last {LOG_TAIL_LINES} lines):\n{log_tail(log_path)}\n"
            f"fix: {hint}"
        )

    try:
        # read back through this descriptor (x: never through a link): the name can be swapped in a shared entry
        with open(captured, "x+b") as out:
            writer_uid = os.fstat(out.fileno()).st_uid  # who files this process writes here belong to
            try:
                proc = start_child(argv, cwd=workdir, stdout=out)
            except OSError as exc:
                raise fail(f"could not start ({exc})", f"check that {argv[0]} is installed and executable") from exc
            scope.add(proc)
            try:
                returncode = wait_child(proc, timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
            except BaseException:  # KeyboardInterrupt: leave no orphan compiler behind
                kill_group(proc)
                raise
            finally:
                scope.discard(proc)
            seconds = time.perf_counter() - start
            with contextlib.suppress(OSError):  # a full disk must not hide the compiler's own failure
                _append_output(out, log_path)

        scope.check()
        if returncode is None:
            raise fail(f"timed out after {timeout:g} s (its process group was killed)", _TIMEOUT_FIX)
        if returncode == EXIT_CANNOT_START and "neuron-args supervisor: cannot start" in log_tail(log_path, 200):
            raise fail("could not start", f"check that {argv[0]} is installed and executable")
        if returncode != 0:
            raise fail(describe_exit(returncode), _hint(returncode, log_path))
        output = _own_output(tmp_output, writer_uid)
        if output is None:
            raise fail(
                f"exited 0 but wrote no executable (expected {tmp_output})",
                "check the log; the compiler did not honour --output",
            )
        if isinstance(output, str):
            raise fail(f"exited 0, but its output {tmp_output} {output}",
                       "another user of this cache folder may be tampering with it: keep the cache where only you "
                       "write (or sign it: $NEURON_ARGS_CACHE_SIGNING_KEY), then compile again")
        os.replace(tmp_output, output_path)  # beside it: one file system
        return CompileResult(list(recorded_argv), seconds, output_path, log_path, *output)  # output: size, sha256
    finally:
        tmp_output.unlink(missing_ok=True)
        captured.unlink(missing_ok=True)


def _append_output(out: IO[bytes], log_path: Path) -> None:
    """Append the child's stdout/stderr (``out``, the file it wrote) to the log, after what the compiler logged."""
    out.flush()
    size = os.fstat(out.fileno()).st_size
    out.seek(0)
    head = out.read(4096)
    # the entry's folder may be others': a link planted at the log is replaced, never written through
    if size <= len(head) and not head.strip():
        os.close(open_for_writing(log_path, append=True))
        return
    with os.fdopen(open_for_writing(log_path, append=True), "ab") as log:  # streamed: may be gigabytes
        log.write(b"---- compiler stdout/stderr ----\n")
        log.write(head)
        shutil.copyfileobj(out, log, 1 << 20)
        out.seek(max(0, size - 1))
        if out.read(1) != b"\n":
            log.write(b"\n")


def temp_output_path(output_path: Path) -> Path:
    """A unique temporary name beside the output (renamed onto it, never across file systems), its suffix kept."""
    return output_path.parent / f".{output_path.stem}.partial-{uuid.uuid4().hex[:12]}{output_path.suffix}"
