"""The serve fast path for a transformers decoder: a Llama over a static KV cache, served through ``NeuronRunner``.

transformers' graphs reach the fast path through two things plain modules do not have: the KV
cache's tensors are read through attribute chains and list items (``self.cache.layers[0].keys``),
and Dynamo's bytecode resets transformers' output-capturing global after every call. Proven here:
prefill and decode replay with logits and every cache tensor equal to eager over many steps; the
reset still happens; a call that does not match (dtype, shape, another cache object, a module
attribute the graph specialized on) takes the guarded path and is still right; a caller's tensors made
outside inference mode are served without a new trace.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.fastpath import ENV, MISS
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner

pytest.importorskip("transformers", reason="the transformers fast path needs transformers (pip install -e '.[hf]')")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

from neuron_args.hf import StaticCausalLM, static_cache  # noqa: E402

BASE = ["--auto-cast=none", "-O1"]
PROMPT = [[5, 17, 42, 8]]  # no pad token (id 0: a zero embedding writes zero keys, proving nothing)
CACHE_LEN = 16


class TinyLlama(StaticCausalLM):
    """A one-layer random Llama and its static cache: ``prefill`` (4 tokens) and ``decode`` (1 token)."""

    def __init__(self) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
        super().__init__(LlamaForCausalLM(config).eval(), max_cache_len=CACHE_LEN)

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("prefill", self, {"s4": lambda: step(PROMPT, 0)}),
                GraphSpec("decode", self, {"b1": lambda: step([[3]], 4)})]


def step(tokens: list[list[int]], start: int, dtype: torch.dtype = torch.long) -> dict[str, torch.Tensor]:
    with torch.inference_mode():  # as serving makes them
        return {"input_ids": torch.tensor(tokens, dtype=dtype), "start": torch.tensor(start)}


def cache_tensors(lm: StaticCausalLM) -> list[torch.Tensor]:
    return [t for layer in lm.cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)]


def reset(*lms: StaticCausalLM) -> None:
    with torch.inference_mode():
        for lm in lms:
            for t in cache_tensors(lm):
                t.zero_()


def fast_calls(runner: NeuronRunner, graph_type: str) -> int:
    return sum(f.calls for f in runner.fast_path.graphs.get(graph_type, ()))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NeuronRunner, TinyLlama]]:
    """The runner (warmed: both graphs compiled and learned) and an eager twin with its own cache."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
        mp.delenv(ENV, raising=False)
        runner = NeuronRunner(TinyLlama(), compiler_args=BASE, compiler="local",
                              cache_dir=tmp_path_factory.mktemp("fastpath-hf"))
        runner.warmup(emit=False)
        yield runner, TinyLlama()
    torch._dynamo.reset()
    torch.set_num_threads(before)


def assert_same(got: torch.Tensor, want: torch.Tensor, lm: StaticCausalLM, reference: StaticCausalLM) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(cache_tensors(lm), cache_tensors(reference), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def prefill(runner: NeuronRunner, lm: StaticCausalLM, reference: StaticCausalLM) -> int:
    """Both caches emptied and filled by the prompt; returns the greedy next token."""
    reset(lm, reference)
    with torch.inference_mode():
        got, want = runner.run("prefill", step(PROMPT, 0)), reference(**step(PROMPT, 0))
    assert_same(got, want, lm, reference)
    return int(want[0, -1].argmax())


@pytest.mark.slow
def test_prefill_and_decode_replay_with_logits_and_kv_cache_equal_to_eager(served):
    runner, reference = served
    lm = runner.model
    assert runner.fast_path.refused == {}, "the transformers graphs are learned"
    steps = 10
    with runner.serve() as session:
        before = fast_calls(runner, "prefill"), fast_calls(runner, "decode")
        token = prefill(runner, lm, reference)
        for pos in range(len(PROMPT[0]), len(PROMPT[0]) + steps):
            with torch.inference_mode():
                got, want = runner.run("decode", step([[token]], pos)), reference(**step([[token]], pos))
            assert_same(got, want, lm, reference)
            assert lm.cache.layers[0].keys[0, :, pos].abs().sum() > 0, "the step wrote its position into the cache"
            token = int(want[0, -1].argmax())
    assert (fast_calls(runner, "prefill") - before[0], fast_calls(runner, "decode") - before[1]) == (1, steps)
    assert session.calls == {"prefill": 1, "decode": steps}
    assert (session.counts.misses, session.counts.compiles) == (0, 0)


def test_the_output_capturing_reset_is_replayed(served):
    """Dynamo's bytecode writes ``_active_collector.global_var = None``, ``.compiling = False`` after the graph;
    the fast path writes them too, so transformers' eager output capturing works after a served call."""
    import transformers.utils.output_capturing as capturing

    runner, reference = served
    lm = runner.model
    collector = capturing._active_collector
    token = prefill(runner, lm, reference)
    collector.global_var, collector.compiling = {"hidden_states": ["stale"]}, True  # as a compiling call left them
    before = fast_calls(runner, "decode")
    with torch.inference_mode():
        got = runner.run("decode", step([[token]], 4))
        assert (collector.global_var, collector.compiling) == (None, False)
        want = reference(**step([[token]], 4))  # (an eager call resets a compiling collector itself)
    assert fast_calls(runner, "decode") == before + 1, "served by the fast path"
    assert_same(got, want, lm, reference)
    with torch.inference_mode():
        hidden = reference.model.model(input_ids=torch.tensor(PROMPT), output_hidden_states=True).hidden_states
    assert len(hidden) == 2 and all(h.shape == (1, 4, 32) for h in hidden), "eager capture reads its own collector"


def copy_of_cache(lm: StaticCausalLM, inference: bool) -> object:
    """A new cache object holding ``lm``'s cache contents; its tensors inference tensors or not (as warmup's)."""
    with torch.inference_mode(inference):
        fresh = static_cache(lm.model, CACHE_LEN)
    with torch.inference_mode():
        for new, old in zip(fresh.layers, lm.cache.layers, strict=True):
            for name in ("keys", "values", "cumulative_length"):
                getattr(new, name).copy_(getattr(old, name))
    return fresh


@pytest.mark.slow
def test_calls_that_do_not_match_take_the_guarded_path_and_stay_right(served):
    """Each changes what the graph was traced for: no fast graph learned so far serves it; the guarded call
    (a new Dynamo entry, then learned) gives eager's logits and cache. A cache object Dynamo's guards accept
    (the same kind of tensors) is served fast, and its own tensors are the ones read and written."""
    runner, reference = served
    lm = runner.model
    attention = lm.model.model.layers[0].self_attn
    scaling, cache = attention.scaling, lm.cache

    def call(kwargs: dict[str, torch.Tensor], what: str, fast: bool = False) -> None:
        known = [(f, f.calls) for f in runner.fast_path.graphs["decode"]]
        if not fast:
            assert all(f(kwargs) is MISS for f, _ in known), f"{what}: a learned fast graph would serve it"
        with torch.inference_mode():
            got, want = runner.run("decode", kwargs), reference(**kwargs)
        assert_same(got, want, lm, reference)
        served_fast = sum(f.calls for f, _ in known) - sum(n for _, n in known)
        assert served_fast == int(fast), f"{what}: served by a fast graph {served_fast} times"

    try:
        token = prefill(runner, lm, reference)
        call(step([[token]], 4, torch.int32), "another dtype")
        call(step([[token, 9]], 5), "another shape")
        lm.cache = same_kind = copy_of_cache(lm, inference=False)
        call(step([[token]], 7), "another cache object of the same kind", fast=True)
        lm.cache = other_kind = copy_of_cache(lm, inference=True)
        call(step([[token]], 8), "another cache object of inference tensors")
        written = [c.layers[0].keys[0, :, pos].abs().sum() > 0 for c in (cache, same_kind, other_kind) for pos in (7, 8)]
        assert written == [False, False, True, False, True, True], "each call wrote the cache it was given"
        attention.scaling = reference.model.model.layers[0].self_attn.scaling = scaling / 2
        call(step([[token]], 9), "a module attribute the graph specialized on")
    finally:
        attention.scaling = reference.model.model.layers[0].self_attn.scaling = scaling
        lm.cache = cache


def dynamo_entries(runner: NeuronRunner) -> int:
    """How many graphs Dynamo traced for the entry's frame (each trace adds a cache entry)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    forward = runner.model.__dict__["forward"]  # the runner's ServedForward: Dynamo compiled its __call__
    return len(_debug_get_cache_entry_list(type(forward).__call__.__code__))


def test_tensors_made_outside_inference_mode_are_served_without_a_new_trace(served):
    """Warmup traced with inference tensors; a caller's ordinary tensors (a tokenizer's) are served as inference
    tensors on the same memory: no new trace, fast or guarded."""
    runner, reference = served
    lm = runner.model
    token = prefill(runner, lm, reference)
    traced, before = dynamo_entries(runner), fast_calls(runner, "decode")
    ids, start = torch.tensor([[token]]), torch.tensor(4)
    assert not ids.is_inference()
    got = runner.run("decode", {"input_ids": ids, "start": start})
    with torch.inference_mode():
        want = reference(**step([[token]], 4))
    assert_same(got, want, lm, reference)
    assert fast_calls(runner, "decode") == before + 1, "served by the fast path"
    saved, runner.fast_path.graphs = runner.fast_path.graphs, {}
    try:  # the guarded path: Dynamo's own guards accept the call too
        got = runner.run("decode", {"input_ids": torch.tensor([[token]]), "start": torch.tensor(5)})
        with torch.inference_mode():
            want = reference(**step([[token]], 5))
        assert_same(got, want, lm, reference)
    finally:
        runner.fast_path.graphs = saved
    assert dynamo_entries(runner) == traced, "no graph was traced again"
    assert (ids._version, start._version) == (0, 0), "inputs the graph only reads are left alone"
