"""Python's cyclic collector in a session that warms up models: full collections skip the long-lived heap.

A warm session tracks ~570k objects (torch, jax, Dynamo's traces) that every full collection walks
(``benchmarks/bench_session.py``); what is collected never changes, only when. The heap is frozen after
collection, after a shared runner's warmup (its traces live as long as the runner) and at the session's end,
by the outermost session of a process only; warmups run with the collector paused. ``NEURON_ARGS_GC_FREEZE=0``
turns the freezes off (a test that inspects ``gc.get_objects()``).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from neuron_args import envs

#: set to 0 to leave the collector alone (no freezes; warmups still pause it)
ENV = "NEURON_ARGS_GC_FREEZE"

# sessions open in this process (process state on purpose: the collector is the process's)
_open = [0]
_frozen = [False]


def enabled() -> bool:
    return envs.flag(ENV)


def session_started() -> None:
    if _open[0] == 0 and _frozen[0]:  # a previous session of this process froze its heap: collectable again
        gc.unfreeze()
        _frozen[0] = False
    _open[0] += 1


def session_stopped() -> None:
    _open[0] = max(0, _open[0] - 1)


def freeze(collect: bool) -> None:
    """Move every tracked object to the permanent generation (after a full collection when ``collect``)."""
    if not enabled() or _open[0] != 1:  # only the outermost session of the process
        return
    if collect:
        gc.collect()
    gc.freeze()
    _frozen[0] = True


@contextlib.contextmanager
def paused(keep: bool = False) -> Iterator[None]:
    """The collector off for the block (Dynamo's trace allocates many short-lived cycles); ``keep``: what the
    block leaves lives as long as the session (a shared runner's warmup), so it is collected and frozen after."""
    from torch._dynamo import config as dynamo_config

    was = gc.isenabled()
    gc.disable()
    try:
        with dynamo_config.patch(run_gc_after_compile=False):
            yield
    finally:
        if was:
            if keep:
                freeze(collect=True)
            gc.enable()
