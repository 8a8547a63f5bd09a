"""Torch's structured trace log during a warmup: no handler on it unless ``TORCH_TRACE`` asks for the trace.

torch builds a record of each Dynamo trace step whenever ``torch.__trace`` has a handler, and pytest attaches one
that the plugin's filter then drops (~4 % of a warm session's trace CPU). :func:`detached` takes those handlers off
for a warmup, and skips two costs that only feed debug output: Dynamo's guard-latency measurement and the function
names of traced lines (each kept while ``TORCH_TRACE`` or the matching ``TORCH_LOGS`` asks for it).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any
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


def _guard_latency_unmeasured(wanted: bool) -> contextlib.AbstractContextManager[Any]:
    from unittest import mock

    from torch._dynamo import guards

    if wanted or guards.guards_log.isEnabledFor(logging.DEBUG):
        return contextlib.nullcontext()
    return mock.patch.object(guards, "profile_guard_manager", lambda *args: 0.0)


def _funcnames_unread() -> contextlib.AbstractContextManager[Any]:
    from unittest import mock

    from torch._dynamo import output_graph, symbolic_convert

    named = symbolic_convert.get_funcname
    logs = (symbolic_convert.trace_call_log, symbolic_convert.trace_source_log, output_graph.trace_call_log)

    def funcname(filename: str, lineno: int) -> str | None:
        return named(filename, lineno) if any(log.isEnabledFor(logging.DEBUG) for log in logs) else None

    return mock.patch.object(symbolic_convert, "get_funcname", funcname)
