"""Python's cyclic garbage collector in a session that warms up models: full collections skip the long-lived heap.

Measured on the examples' warm session (``benchmarks/bench_session.py``): after torch, jax,
transformers and Dynamo's traces the process tracks ~570k objects, and each full (generation 2)
collection walks them all: 8 such collections after collection (during the model import, the
warmups and pytest's own two at the end, for unraisable exceptions), plus the interpreter's at
exit, took about as long as the session's nine Dynamo traces. Three moves, none of which changes
what is collected, only when:

- **after collection** (tests will run and some use the model fixtures): :func:`gc.freeze` the
  heap of imports and collected items, which lives as long as the session anyway;
- **during a warmup**: the collector is paused (:func:`paused`), Dynamo's own collection after each
  graph it compiles too (``run_gc_after_compile``, a generation-1 collection, ~15 ms a graph); the
  trace's cyclic garbage is collected afterwards, by the next automatic collection;
- **at the end of the session**: one :func:`gc.collect` (so pytest still sees every unraisable
  exception of the session's garbage), then :func:`gc.freeze`, so pytest's collections and the
  interpreter's at exit do not walk the heap again.

Only the outermost session of a process freezes (a ``pytester`` run inside another session leaves
its heap alone), and a session unfreezes what an earlier one in the same process froze.
``NEURON_ARGS_GC_FREEZE=0`` turns the freezes off (a test that inspects ``gc.get_objects()``
or waits for the collection of an object alive at a freeze point needs that).
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


def outermost() -> bool:
    return _open[0] == 1


def freeze(collect: bool) -> None:
    """Move every tracked object to the permanent generation (after a full collection when ``collect``)."""
    if not enabled() or not outermost():
        return
    if collect:
        gc.collect()
    gc.freeze()
    _frozen[0] = True


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block (a warmup: Dynamo's trace allocates many short-lived cycles)."""
    from torch._dynamo import config as dynamo_config

    was = gc.isenabled()
    gc.disable()
    try:
        with dynamo_config.patch(run_gc_after_compile=False):
            yield
    finally:
        if was:
            gc.enable()
