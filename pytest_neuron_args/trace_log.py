"""Torch's structured trace log during a warmup: no handler on it unless ``TORCH_TRACE`` asks for the trace.

torch builds a structured record for each step of a Dynamo trace (the graph's readable code,
the guards' text, compile metrics) whenever its trace log (``torch.__trace``, always at DEBUG,
meant for ``TORCH_TRACE`` files read by tlparse) has any handler. It has: pytest attaches its
log-capture handlers to every logger that does not propagate, and torch's own handler, which
removes itself on its first record when ``TORCH_TRACE`` is unset, never gets one, because the
plugin drops every record of that logger then (``plugin._DropAll``). So each trace built records
nobody reads: ~4 % of the CPU of a warm session's traces (``benchmarks/README.md``).

During a warmup :func:`detached` takes the handlers off that logger and puts them back after:
all of them when ``TORCH_TRACE`` is unset (none could receive a record), else only those the
root logger also holds (pytest's), so the trace file is still written.

It also skips Dynamo's guard-latency measurement, which only feeds that trace and the guards' debug
log: after building each graph's guards Dynamo flushes the CPU caches and times one evaluation
(``profile_guard_manager``, ~16 ms a graph, ~0.15 s of a warm examples session). It still runs when
``TORCH_TRACE`` is set or the guards log is at DEBUG (``TORCH_LOGS=guards``).

And the function names of traced lines: for each call it puts in a graph Dynamo names the function
of the line (``get_funcname``, which tokenizes every source file a trace goes through, once a
process: ~0.13 s of CPU in a warm examples session) for the headers of two debug logs only
(``TORCH_LOGS=trace_call,trace_source``); while neither is at DEBUG the name is left out.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from neuron_args import envs

#: torch's structured trace log (``torch._logging._internal.trace_log``), by name: no torch import here
TRACE_LOG = "torch.__trace"


@contextlib.contextmanager
def detached() -> Iterator[list[logging.Handler]]:
    """For the block, the trace log has no handler that would only drop its records (yields those taken off)."""
    trace_log = logging.getLogger(TRACE_LOG)
    root = logging.getLogger().handlers
    wanted = envs.is_set("TORCH_TRACE")
    taken = [h for h in trace_log.handlers if not wanted or h in root]
    for h in taken:
        trace_log.removeHandler(h)
    try:
        with _guard_latency_unmeasured(wanted), _funcnames_unread():
            yield taken
    finally:
        for h in taken:
            if h not in trace_log.handlers:
                trace_log.addHandler(h)  # pytest's own end of the phase removes its handlers again


@contextlib.contextmanager
def _guard_latency_unmeasured(wanted: bool) -> Iterator[None]:
    from torch._dynamo import guards

    profile = guards.profile_guard_manager
    if wanted or guards.guards_log.isEnabledFor(logging.DEBUG):
        yield
        return
    guards.profile_guard_manager = _unmeasured
    try:
        yield
    finally:
        guards.profile_guard_manager = profile


def _unmeasured(*args: object) -> float:
    return 0.0


@contextlib.contextmanager
def _funcnames_unread() -> Iterator[None]:
    from torch._dynamo import output_graph, symbolic_convert

    named = symbolic_convert.get_funcname
    logs = (symbolic_convert.trace_call_log, symbolic_convert.trace_source_log, output_graph.trace_call_log)

    def funcname(filename: str, lineno: int) -> str | None:
        if any(log.isEnabledFor(logging.DEBUG) for log in logs):
            return named(filename, lineno)
        return None

    symbolic_convert.get_funcname = funcname
    try:
        yield
    finally:
        symbolic_convert.get_funcname = named
