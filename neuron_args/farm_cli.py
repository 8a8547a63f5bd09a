"""``neuron-args compile CACHE_DIR``: build every pending entry, in a local pool or on a Dask cluster.

Workers need the project and the entries' compiler at the same version, not the cache folder
(:mod:`neuron_args.deferred.farm`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from neuron_args import envs, remote_cache
from neuron_args.cache import CompileCache, cache_root
from neuron_args.errors import CompilerArgsError, OptionsError
from neuron_args.exit_codes import EXIT_FAIL, EXIT_OK
from neuron_args.flags import CompilerArgs

DEFAULT_CONNECT_TIMEOUT = 20.0
DEFAULT_RETRIES = 1  # of a task that raised on its worker (a dead worker's task is rescheduled regardless)


class FarmUsage(OptionsError):
    """A usage or environment error (an unreachable scheduler): the CLI prints it, exit status 2."""


def _seconds(text: str) -> float:
    value = envs.as_seconds(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _compiler_args(text: str) -> CompilerArgs:
    """The base list, parsed and validated where it enters (argparse prints the error and the usage)."""
    try:
        return CompilerArgs.parse(text)
    except CompilerArgsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def add_compile_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compile", help="build every pending (captured) entry, locally or on a Dask cluster",
        description="Build every pending entry of a compile cache with its recorded compiler arguments. "
                    "Exit 0 when all built, 1 when a graph failed (each is listed), 2 on a usage error or "
                    "an unreachable scheduler, 130 when interrupted.")
    p.add_argument("cache_dir", metavar="CACHE_DIR", help="the compile cache the capture wrote into")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive_int, metavar="N",
                       help="compiles at once in a local pool (default: $NEURON_ARGS_COMPILE_WORKERS, else CPUs)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="compile on the workers of this Dask scheduler (tcp://host:8786); they need not "
                            "see CACHE_DIR")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="seconds one graph's compile may take")
    p.add_argument("--connect-timeout", type=_seconds, default=DEFAULT_CONNECT_TIMEOUT, metavar="S",
                   help=f"seconds to reach the scheduler and see a worker (default {DEFAULT_CONNECT_TIMEOUT:g})")
    p.add_argument("--retries", type=int, default=DEFAULT_RETRIES, metavar="N",
                   help=f"Dask retries of a task that raised on its worker (default {DEFAULT_RETRIES})")
    p.add_argument("--compiler", choices=("local", "neuronx-cc"),
                   help="the compiler (default: the one each entry was captured for)")
    p.add_argument("--base-compiler-args", metavar="ARGS", type=_compiler_args,
                   help="arguments for old entries that recorded none (a quoted string)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(run=run_compile_command)


def connect(address: str, timeout: float) -> Any:
    """A Dask client of ``address`` with at least one worker, or :class:`FarmUsage` within ``timeout``."""
    try:
        from distributed import Client
    except ImportError:
        raise FarmUsage("--scheduler needs Dask's distributed: pip install 'neuron-args[farm]'") from None
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise FarmUsage(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({type(exc).__name__}: {exc}). "
            "fix: start one (`dask scheduler`, then `dask worker ADDRESS` on each compile host) and pass the "
            "address it prints, e.g. tcp://10.0.0.5:8786; check the host, port and firewall") from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        client.close()
        raise FarmUsage(
            f"the Dask scheduler at {address} has no worker after {timeout:g} s ({type(exc).__name__}). "
            f"fix: start workers with `dask worker {address}` on the compile hosts") from None
    return client


class _Progress:
    """A bar on a terminal (tqdm), one plain line per graph otherwise; both on stderr."""

    def __init__(self, total: int) -> None:
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="graph", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def __call__(self, event: Any) -> None:
        g = event.graph
        if self.bar is None:
            print(event.line(), file=sys.stderr, flush=True)
            return
        if g.status == "failed":
            self.bar.write(f"failed: {g.graph_type or '-'} {g.key[:12]}", file=sys.stderr)
        self.bar.set_postfix_str(f"{g.graph_type or '-'} {g.status}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_compile_command(args: argparse.Namespace) -> int:
    root = cache_root(args.cache_dir)  # an s3:// cache: its local copy
    if not root.is_dir():
        raise FarmUsage(f"no compile cache at {root}; pass the cache_dir the capture wrote into")
    store = remote_cache.store_for(root)
    if store is None:
        return _compile(args, root)
    with store.reachable():  # the builds are for the remote: one it cannot reach (first or midway) exits 3
        store.probe()
        return _compile(args, root)


def _compile(args: argparse.Namespace, root: Path) -> int:
    from neuron_args.deferred.parallel_compile import CompileReport, default_workers, parallel_compile, pending_keys

    pending = pending_keys(root)
    where = args.scheduler or f"a local pool of {args.workers or default_workers(len(pending))} workers"
    if not pending:
        return _finish(args, root, where, CompileReport())
    client = executor = None
    if args.scheduler:
        client = connect(args.scheduler, args.connect_timeout)
        executor = client.get_executor(retries=max(0, args.retries), pure=False)
        where = f"Dask scheduler {args.scheduler} ({len(client.scheduler_info()['workers'])} workers)"
    print(f"compiling {len(pending)} pending graphs of {root} on {where}", file=sys.stderr, flush=True)
    progress = _Progress(len(pending))
    try:
        report = parallel_compile(root, base_compiler_args=args.base_compiler_args, compiler=args.compiler,
                                  executor=executor, workers=args.workers, progress=progress, quiet=True,
                                  raise_on_error=False, compile_timeout=args.timeout)
    except KeyboardInterrupt:
        progress.close()
        if executor is not None:
            executor.shutdown(wait=False)  # cancels the remote tasks; their workers kill the compilers
        # entries not built: still pending, or still locked by a build the interrupt cut short
        cache = CompileCache(root)
        left = sum(not cache.entry(key).is_complete for key in pending)
        print(f"neuron-args compile: interrupted; {left} entries stay pending (rerun to build them)",
              file=sys.stderr)
        raise  # cli.main exits 130, also past a remote that went down meanwhile (store.reachable)
    finally:
        progress.close()
        lost = client is not None and client.status != "running"
        if client is not None:
            client.close()
    if lost:
        print(f"neuron-args compile: lost the Dask scheduler at {args.scheduler} during the run; the graphs it had "
              "not returned stay pending. fix: restart the scheduler (and its workers) and rerun", file=sys.stderr)
    return _finish(args, root, where, report)


def _finish(args: argparse.Namespace, root: Path, where: str, report: Any) -> int:
    failed = report.failed
    counts = {s: sum(g.status == s for g in report.graphs) for s in ("compiled", "already-complete", "failed")}
    if args.json:
        print(json.dumps({"cache_dir": str(root), "where": where, "ok": not failed, **counts, **report.as_dict()},
                         indent=2))
    else:
        print(f"{root}: {counts['compiled']} compiled, {counts['already-complete']} already complete, "
              f"{counts['failed']} failed in {report.seconds:.1f} s" if report.graphs else f"{root}: no pending entries")
    for g in failed:
        print(f"FAILED {g.graph_type!r} {g.key}: {g.error}", file=sys.stderr)
    return EXIT_FAIL if failed else EXIT_OK
