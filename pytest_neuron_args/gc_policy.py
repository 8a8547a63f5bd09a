"""Python's cyclic garbage collector in a session that warms up models: full collections skip the long-lived heap.

A warm session tracks ~570k objects (torch, jax, transformers, Dynamo's traces), and each full
collection walks them all (``benchmarks/bench_session.py``). What is collected never changes, only when:
after collection (when tests use the model fixtures) the heap is :func:`gc.freeze`-d; a warmup pauses
the collector (:func:`paused`, Dynamo's ``run_gc_after_compile`` too) and, for a runner the session shares,
collects once and freezes what the warmup left (the traces live as long as the runner: otherwise the
collector walks them three more times, as they age through its generations and at the session's end; the
few hundred of its objects that a later runner's ``torch._dynamo.reset()`` drops wait for the process's exit); the
session's end collects once (pytest still sees every unraisable exception) and freezes again. Only the
outermost session of a process freezes, and a session unfreezes what an earlier one froze.
``NEURON_ARGS_GC_FREEZE=0`` turns the freezes off (for a test that inspects ``gc.get_objects()`` or waits
for an object alive at a freeze point).
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
    """The collector off for the block (a warmup: Dynamo's trace allocates many short-lived cycles).

    ``keep``: what the block leaves alive lives as long as the session (a shared runner's warmup): collected and
    frozen after it, before the collector is back on. A per-test runner's traces die with its test: not frozen."""
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
