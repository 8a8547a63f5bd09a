"""Torch's structured trace log during a warmup: no handler on it unless ``TORCH_TRACE`` asks for the trace.

torch builds a structured record of each Dynamo trace step whenever its trace log (``torch.__trace``)
has a handler, and pytest attaches one to every non-propagating logger while the plugin drops all its
records (``plugin.pytest_configure``): ~4 % of a warm session's trace CPU for records nobody reads. During a
warmup :func:`detached` takes those handlers off (all of them when ``TORCH_TRACE`` is unset, else only
the root logger's, so the trace file is still written) and puts them back after. It also skips two
costs that only feed debug output: Dynamo's guard-latency measurement (``profile_guard_manager``, kept
when ``TORCH_TRACE`` is set or ``TORCH_LOGS=guards``) and the function names of traced lines
(``get_funcname``, kept while ``TORCH_LOGS=trace_call,trace_source`` is at DEBUG).
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
        if any(log.isEnabledFor(logging.DEBUG) for log in logs):
            return named(filename, lineno)
        return None

    return mock.patch.object(symbolic_convert, "get_funcname", funcname)
