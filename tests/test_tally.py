"""Counts a warmup, a serve or a trace owns (``activity.tally``): context-local blocks instead of swapping and
rolling back process globals; results carried by typed exceptions instead of attributes set on them."""
from __future__ import annotations

import contextvars
import pickle
import threading

import pytest
import torch

from neuron_args import TraceError
from neuron_args.activity import ACTIVITY, CacheStats, commit, count, tally
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, assert_cache_hit_enabled
from neuron_args.graphs import GraphSpec
from neuron_args.runner import GraphBreakError, NeuronRunner



@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    ACTIVITY.reset()  # counted from zero, as in a fresh process
    yield
    torch._dynamo.reset()
    ACTIVITY.reset()


def _in_thread(fn, *, context: contextvars.Context | None = None):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn() if context is None else context.run(fn)))
    thread.start()
    thread.join(60)
    return out[0]


def test_events_count_into_open_blocks_and_the_process_a_held_block_keeps_them():
    with tally() as outer:
        count("hits")
        with tally(held=True) as probe:  # a trace that only probes the cache: a miss here is nobody's
            count("misses")
        assert probe.counts.misses == 1 and outer.counts.misses == 0 and ACTIVITY.stats.misses == 0
        with tally(held=True) as taken:
            count("hits")
        commit(taken.counts)  # taken after all: the warmup's
    assert outer.counts == CacheStats(hits=2) and ACTIVITY.stats == CacheStats(hits=2)


def test_a_block_is_its_contexts_not_another_threads():
    with tally() as mine:
        _in_thread(lambda: count("compiles"))  # another thread's event: the process's only
        _in_thread(lambda: count("captures"), context=contextvars.copy_context())  # started in this block's context
    assert mine.counts == CacheStats(captures=1)
    assert ACTIVITY.stats == CacheStats(compiles=1, captures=1)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Linear(4, 4).eval()

    def neuron_graphs(self):
        return [GraphSpec("decode", self.mlp, {"b1": lambda: {"input": torch.ones(1, 4)}})]


def test_a_warmup_turns_the_hit_assertion_off_for_itself_not_for_the_process(tmp_path, monkeypatch):
    """The in-process warmup set ACTIVITY.assert_hit = False for the whole process while it ran: a thread serving
    meanwhile under NEURON_LIBTORCH_ASSERT_CACHE_HIT=1 would have compiled at serve time without an error."""
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    torch._dynamo.reset()
    seen = []

    def progress(_step):  # runs inside the warmup, on its thread
        seen.append((assert_cache_hit_enabled(), _in_thread(assert_cache_hit_enabled)))

    runner = NeuronRunner(_Model(), compiler_args=["-O1"], compiler="local", cache_dir=tmp_path)
    report = runner.warmup(progress=progress)
    assert seen and set(seen) == {(False, True)}  # the warmup compiles; another thread still asserts
    assert ACTIVITY.assert_hit is None and assert_cache_hit_enabled()
    assert report.counts == CacheStats(misses=1, compiles=1) and report.deferred_counts == CacheStats()
    with runner.serve() as session:
        runner.run("decode", {"input": torch.ones(1, 4)})
    assert session.counts == CacheStats()  # served by the loaded graph: no cache lookup at all
    assert ACTIVITY.stats == CacheStats(misses=1, compiles=1)


def test_failures_carry_their_results_as_typed_fields_through_pickling():
    results = ["captured", "failed"]
    err = pickle.loads(pickle.dumps(TraceError("1 of 2 trace jobs failed", results)))
    assert err.results == results and str(err) == "1 of 2 trace jobs failed"
    brk = pickle.loads(pickle.dumps(GraphBreakError("graph break in graph type 'decode'", "decode")))
    assert brk.graph_type == "decode" and str(brk) == "graph break in graph type 'decode'"
