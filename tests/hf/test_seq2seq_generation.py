"""Encoder-decoders generating through the runner: an encoder graph, a decoder prefill and decode steps with the cache.

Whisper (T5 and BART too in ``sweep_generation.py``), tiny random configs, served as three graph types
with their own arguments (encoder -O1, prefill the base -O2, decode -O3) on the embedded local
compiler: greedy tokens and every step's logits equal transformers' own ``generate`` (fp32), the
manifest names each graph with its level, and serving compiles nothing. ``sweep_generation.py`` also
checks ``model.generate()`` of a model whose forward and encoder are compiled (eager's tokens), the
parallel flow, and a prefill shape outside the buckets.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from neuron_args.cache import CacheMissError
from neuron_args.flags import optimization_level
from neuron_args.runner import NeuronRunner
from tests.hf.cells import FP32, compile_options
from tests.hf.generation_models import BASE, LEVELS, NEW_TOKENS, SEQ2SEQ, ServedSeq2Seq, eager_generate

pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]

#: the suite's encoder-decoders (each costs ~4 s a graph on 2 busy cores); the sweep runs every one
SUITE = ["whisper"]


def serve_seq2seq(name: str, hf_cache: Path, manifests: Path) -> Iterator[dict]:
    """Warm up one encoder-decoder's three graph types (manifest on), then generate through the served graphs.

    Served as a serving loop runs, under ``inference_mode`` (the runner warms up with inference
    tensors; the serve fast path also takes ordinary tensors, which the guarded path would trace
    again, from the cache).
    """
    spec = SEQ2SEQ[name]
    torch._dynamo.reset()
    lm = ServedSeq2Seq(spec)
    runner = NeuronRunner(lm, compiler_args=BASE, compiler="local", cache_dir=hf_cache,
                          manifest_config={"model": f"hf-{name}"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_NEURON_MANIFEST_DIR", str(manifests))
        mp.delenv("NEURON_LIBTORCH_ASSERT_CACHE_HIT", raising=False)
        report = runner.warmup()
    with runner.serve() as session, torch.inference_mode():
        tokens, logits = lm.greedy(runner.run)
    want_tokens, want_logits = eager_generate(lm.model, spec.encoder_inputs())
    yield {"spec": spec, "runner": runner, "report": report, "session": session, "tokens": tokens,
           "logits": logits, "want_tokens": want_tokens, "want_logits": want_logits}
    torch._dynamo.reset()


@pytest.fixture(scope="module", params=SUITE)
def served(request: pytest.FixtureRequest, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from serve_seq2seq(request.param, hf_cache, tmp_path_factory.mktemp(f"manifest-{request.param}"))


def assert_same_generation(tokens: list[int], logits: list[torch.Tensor], want_tokens: list[int],
                           want_logits: list[torch.Tensor]) -> None:
    assert tokens == want_tokens
    assert len(set(tokens)) > 1, "a repeated token would not show a decode step reading the wrong state"
    for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
        torch.testing.assert_close(got, want, **FP32, msg=lambda m, step=step: f"step {step}: {m}")


def test_tokens_and_logits_equal_transformers_generate(served):
    assert_same_generation(served["tokens"], served["logits"], served["want_tokens"], served["want_logits"])


def test_a_second_request_reads_its_own_encoder_states(served, hf_cache):
    """The cross-attention cache is rewritten by each request's prefill (transformers' own flags would keep the first)."""
    runner, lm, spec = served["runner"], served["runner"].model, served["spec"]
    with runner.serve() as session, torch.inference_mode():
        other = spec.encoder_inputs(seed=2)
        tokens, logits = lm.greedy(runner.run, inputs=other)
    assert_same_generation(tokens, logits, *eager_generate(lm.model, other))
    assert any(not torch.allclose(a, b) for a, b in zip(logits, served["logits"])), "the first request's states"
    assert (session.counts.compiles, session.counts.misses, session.counts.hits) == (0, 0, 0)


def test_each_graph_has_its_own_arguments_and_serving_compiles_nothing(served):
    graphs = {g.graph_type: g for g in served["report"].graphs}
    assert {t: optimization_level(g.compiler_args) for t, g in graphs.items()} == LEVELS
    assert len({g.key for g in graphs.values()}) == 3
    session = served["session"]
    assert session.calls == {"encoder": 1, "prefill": 1, "decode": NEW_TOKENS - 1}
    assert (session.counts.compiles, session.counts.misses, session.counts.hits) == (0, 0, 0)


def test_the_manifest_names_each_graph_with_its_level(served):
    doc = json.loads(Path(served["report"].manifest_path).read_text())
    assert doc["config"]["model"] == f"hf-{served['spec'].name}"
    keys = {g.key: g.graph_type for g in served["report"].graphs}
    named = doc["config"]["neuron_config"]["graph_types"]
    assert {k: named.get(k) for k in keys} == keys
    flags = {keys[g["graph_hash"]]: g["compiler_flags"] for g in doc["graphs"] if g["graph_hash"] in keys}
    assert {t: optimization_level(f) for t, f in flags.items()} == LEVELS


def check_prefill_miss(served: dict) -> None:
    """Two decoder tokens are no declared bucket: serving refuses to compile, saying which graph and what to do.

    (Run by the sweep; the suite checks this message on the served encoders.)"""
    runner, lm = served["runner"], served["runner"].model
    states = torch.zeros(1, lm.encoder_len, lm.hidden)
    with runner.serve(), torch.inference_mode(), pytest.raises(CacheMissError) as caught:
        runner.run("prefill", {"decoder_input_ids": torch.zeros(1, 2, dtype=torch.long),
                               "encoder_hidden_states": states, "start": torch.tensor(0)})
    message = str(caught.value)
    assert "graph type 'prefill'" in message and "fix:" in message


def check_compiled_generate(name: str, hf_cache: Path) -> None:
    """``generate()`` with a static cache, the model's forward and its encoder compiled: eager's tokens and logits."""
    spec = SEQ2SEQ[name]
    model = spec.build()
    want_tokens, want_logits = eager_generate(model, spec.encoder_inputs(), cache_implementation="static")
    torch._dynamo.reset()
    encoder = model.get_encoder()
    for module in (model, encoder):
        module.forward = torch.compile(module.forward, backend="neuron_libtorch", options=compile_options(hf_cache),
                                       dynamic=False, fullgraph=True)
    from neuron_args.seams import records

    before = {r.key: r.compiles + r.loads for r in records.records()}
    tokens, logits = eager_generate(model, spec.encoder_inputs(), cache_implementation="static")
    assert_same_generation(tokens, logits, want_tokens, want_logits)
    # the encoder, the first decoder step (computes cross-attention) and every later step: three graphs
    assert len([r for r in records.records() if r.compiles + r.loads > before.get(r.key, 0)]) == 3
    torch._dynamo.reset()


def check_parallel_flow(name: str, cache_dir: Path) -> None:
    """The deferred flow (trace children, parallel_compile) warms the three graph types; serving generates the same."""
    spec = SEQ2SEQ[name]
    torch._dynamo.reset()
    lm = ServedSeq2Seq(spec)
    runner = NeuronRunner(lm, compiler_args=BASE, compiler="local", cache_dir=cache_dir)
    report = runner.warmup(flow="parallel")
    assert {g.graph_type: optimization_level(g.compiler_args) for g in report.graphs} == LEVELS
    with runner.serve() as session, torch.inference_mode():
        tokens, logits = lm.greedy(runner.run)
    assert_same_generation(tokens, logits, *eager_generate(lm.model, spec.encoder_inputs()))
    assert session.counts.compiles == 0
    torch._dynamo.reset()


#: the encoder-decoders with text prompts (Whisper's features have no padding); the suite runs T5, the sweep all
TEXT_SEQ2SEQ = [name for name in SEQ2SEQ if name != "whisper"]


@pytest.mark.parametrize("name", ["t5"])
def test_a_padded_batch_with_its_encoder_mask_generates_like_transformers(name):
    check_padded_batch(name)


def check_padded_batch(name: str) -> None:
    """Batch 2, the second prompt padded to the bucket: the encoder mask goes to the encoder and every decoder step.

    Eager (the wrapper's plumbing; the graphs are the ones compiled above): each row's tokens equal
    ``generate`` with the same mask."""
    from neuron_args.hf import StaticSeq2SeqLM

    spec = SEQ2SEQ[name]
    model = spec.build()
    lm = StaticSeq2SeqLM(model, max_cache_len=16, encoder_len=8, batch_size=2)
    ids = torch.cat([spec.encoder_inputs(seed=1)["input_ids"], spec.encoder_inputs(seed=2)["input_ids"]])
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = model.config.pad_token_id, 0
    with torch.inference_mode():
        want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=None)[:, -NEW_TOKENS:]
        states = lm.encoder(input_ids=ids, attention_mask=mask)
        tokens = torch.full((2, 1), model.config.decoder_start_token_id)
        for i in range(NEW_TOKENS):
            step = lm.prefill if i == 0 else lm.decode
            logits = step(tokens[:, -1:], states, torch.tensor(i), encoder_attention_mask=mask)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert tokens[:, 1:].tolist() == want.tolist()
