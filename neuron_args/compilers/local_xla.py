"""The embedded local compiler: a neuronx-cc-shaped command line over XLA:CPU.

    python -m neuron_args.compilers.local_xla compile graph.hlo --framework XLA --target trn2 \\
        --output graph_<key>.neff --logfile log-neuron-cc.txt [neuronx-cc options...]

It validates every option against the neuronx-cc table (a typo exits 2 here, on a laptop, not in the
nightly hardware run), maps ``-O<n>`` to XLA's ``xla_backend_optimization_level``, logs the rest as ignored
and writes a serialized XLA:CPU executable. It runs outside the caller's process (a bad XLA option can abort
it), as a warm worker of :mod:`neuron_args.compilers.workers` or a process of its own, without torch or jax:
jaxlib's own client starts in 0.1-0.2 s where ``import jax`` takes 0.6-1 s (a graph calling a custom-call
target only jax registers is compiled again after ``import jax``).
"""
from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from neuron_args import envs, flags
from neuron_args.atomic import open_for_writing
from neuron_args.errors import CompilerArgsError
from neuron_args.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from neuron_args.target import KNOWN_TARGETS, Target, parse_target
from neuron_args.text import first_line
from neuron_args.untrusted import HLO_LIMIT, UntrustedFileError, read_bounded

MODULE = "neuron_args.compilers.local_xla"
PROG = f"python -m {MODULE}"
#: The level used when no -O is given: neuronx-cc's own default is -O1.
DEFAULT_OPT_LEVEL = 1
XLA_OPT_OPTION = "xla_backend_optimization_level"
#: Every op rounds its result to its own dtype, as eager PyTorch does: without this XLA drops the
#: float32 -> bfloat16 -> float32 round trips between fused ops and bf16 graphs drift from eager.
FIDELITY_OPTIONS = (("xla_allow_excess_precision", False),)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compile_ = sub.add_parser(
        "compile",
        allow_abbrev=False,
        help="compile an HloModuleProto; other options are neuronx-cc options",
    )
    compile_.add_argument("hlo", type=Path, help="HloModuleProto bytes (graph.hlo)")
    compile_.add_argument("--framework", default="XLA", choices=["XLA"])
    compile_.add_argument("--target", required=True, type=_target_argument, metavar="{" + ",".join(KNOWN_TARGETS) + "}")
    compile_.add_argument("--output", required=True, type=Path)
    compile_.add_argument("--logfile", type=Path, default=Path("log-neuron-cc.txt"))
    return parser


def _target_argument(value: str) -> Target:
    """``--target`` of the command line, with the target's one message (argparse prints it and exits 2)."""
    try:
        return parse_target(value, f"{PROG} compile --target")
    except CompilerArgsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def preload() -> None:
    """Import what a compile needs (jaxlib, not jax) and queue jaxlib's CPU custom-call targets; starts no thread."""
    envs.environ().setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as `import jax` sets it: XLA's info lines stay out of logs
    from jaxlib import lapack
    from jaxlib import xla_client as xc

    for platform, targets in lapack.registrations().items():  # what jax.lax.linalg registers when jax is imported
        for name, value, api_version in targets:
            xc.register_custom_call_target(name, value, platform=platform, api_version=api_version)


@functools.cache
def compile_client() -> Any:
    """The XLA:CPU client compiles run on: jaxlib's, made as jax makes its own, without importing jax."""
    preload()
    from jaxlib import xla_client as xc

    return xc.make_cpu_client(asynchronous=True)


#: XLA refused a custom call no handler is registered for (jax registers more targets than :func:`preload`)
_UNREGISTERED_TARGET = ("No FFI handler registered", "No registered implementation for custom call")


def _compile(hlo: bytes, overrides: Sequence[tuple[str, Any]], log: TextIO) -> bytes:
    from neuron_args import xla_cpu

    try:
        return xla_cpu.compile_hlo(hlo, overrides, client=compile_client())
    except Exception as exc:
        if "jax" in sys.modules or not any(text in str(exc) for text in _UNREGISTERED_TARGET):
            raise
        print(f"importing jax for its custom-call targets ({first_line(str(exc))})", file=log)
        import jax  # noqa: F401  (registers every custom-call target jax knows)
        import jax._src.lax.linalg  # noqa: F401

        return xla_cpu.compile_hlo(hlo, overrides, client=compile_client())


def _fail(log: TextIO, code: int, message: str) -> int:
    print(f"local-xla: error: {message}", file=sys.stderr)
    print(f"error: {message}", file=log)
    return code


def main(argv: Sequence[str] | None = None, *, worker: str = "") -> int:
    """Run one command line; ``worker`` names the warm worker running it (for the log), if any."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, extra = _parser().parse_known_args(argv)  # argparse exits 2 on a bad fixed part
    # line-buffered: a crash keeps every line before it; a link planted in the entry is replaced, not followed
    with os.fdopen(open_for_writing(ns.logfile), "w", buffering=1) as log:
        print(f"local-xla compile (XLA:CPU, pid {os.getpid()}{', ' + worker if worker else ''})", file=log)
        print(f"argv: {shlex.join([sys.executable, '-m', MODULE, *argv])}", file=log)
        print(f"target: {ns.target} (no effect on XLA:CPU; kept for parity with neuronx-cc)", file=log)
        try:
            parsed = flags.parse_compiler_args(list(extra))
            level = flags.optimization_level(list(extra))
        except CompilerArgsError as exc:
            return _fail(log, EXIT_USAGE, str(exc))
        default = " (default: no -O given)" if level is None else ""
        level = DEFAULT_OPT_LEVEL if level is None else level
        print(f"optimization level: -O{level}{default}", file=log)
        overrides = [(XLA_OPT_OPTION, level), *FIDELITY_OPTIONS]
        print("xla options: " + ", ".join(f"{name}={value}" for name, value in overrides), file=log)
        for flag in parsed:
            if flag.name != flags.OPTLEVEL:
                print(f"ignored on XLA:CPU: {flag.name}{'' if flag.value is None else '=' + flag.value}", file=log)

        try:
            hlo = read_bounded(ns.hlo, HLO_LIMIT)  # the entry's file: a planted FIFO or /dev/zero link fails at once
        except (OSError, UntrustedFileError) as exc:
            return _fail(log, EXIT_FAIL, f"cannot read the HLO module {ns.hlo}: {exc}")

        start = time.perf_counter()
        compile_client()
        print(f"jax startup seconds: {time.perf_counter() - start:.3f}", file=log)
        print(f"xla client: jaxlib's own (jax {'imported' if 'jax' in sys.modules else 'not imported'})", file=log)
        start = time.perf_counter()
        try:
            blob = _compile(hlo, overrides, log)
        except Exception as exc:  # XLA reports bad HLO as a runtime error
            return _fail(log, EXIT_FAIL,
                         f"XLA:CPU could not compile {ns.hlo}: {type(exc).__name__}: {first_line(str(exc))}")
        seconds = time.perf_counter() - start
        # its name is on this command line (world-readable): a link planted there is replaced, not written through
        with os.fdopen(open_for_writing(ns.output), "wb") as out:
            out.write(blob)
        import jaxlib

        print(f"xla version: jaxlib {jaxlib.__version__}", file=log)
        print(f"compile seconds: {seconds:.3f}", file=log)
        print(f"wrote {len(blob)} bytes to {ns.output}", file=log)
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
