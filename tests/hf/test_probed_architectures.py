"""What ``tests/hf/probe_served.py`` found serving architectures end to end, each in a tiny config (fast).

``neuron_args.hf.static_cache`` matches the cache layers a model fills, by index: a decoder whose config
counts more layers than it caches (BART's decoder as a causal LM: its config's layer count is the
encoder's) gets one static layer per decoder layer; state-space layers get their states allocated up front
and restarted by a prompt; a model keeping its state outside transformers' cache layers is refused with the
fix. The decoder graphs give the encoder states as a transformers output (NLLB-MoE reads them by name). A
model computing positions from the cache's filled length (TrOCR, MVP, RoFormer, MPT) reads it as a Python int (a
traced value in the HLO): one graph per bucket. A forward branching on a data-dependent size (LED's global
attention), or sizing a tensor from a tensor's value (``arange(t, t + n)`` of a tensor ``t``: Dynamo's own internal
error), fails the warmup naming the graph type, the line and the fix.
"""
from __future__ import annotations

import re

import pytest
import torch

from neuron_args.graphs import GraphSpec
from neuron_args.hf import StaticCacheError, StaticCausalLM, static_cache
from tests.hf.architectures import VOCAB, token_ids

pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]


def _bart_decoder() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.BartForCausalLM(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=3, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        is_decoder=True)).eval()


def test_a_config_counting_encoder_layers_gets_one_static_layer_per_decoder_layer():
    """BART's config says 3 layers (the encoder's); its causal LM caches 1: the cache has 1, and decodes as eager."""
    model = _bart_decoder()
    cache = static_cache(model, 16)
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(1, 4, 16, 8)]
    lm = StaticCausalLM(model, max_cache_len=16)
    ids = token_ids(1, 7)
    with torch.inference_mode():
        want = model(ids, use_cache=False).logits
        got = [lm(ids[:, :5], torch.tensor(0))] + [lm(ids[:, i:i + 1], torch.tensor(i)) for i in (5, 6)]
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-5, rtol=1e-5)


def test_a_state_space_model_decodes_from_states_allocated_up_front():
    """Mamba takes its cache as ``cache=`` (given ``past_key_values`` it fills one of its own) and keeps recurrent
    states: they are allocated before any call (graph inputs), a prompt starts from zero states and each decode step
    continues them, as the model's own forward over the whole sequence."""
    import transformers

    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2)).eval()
    lm = StaticCausalLM(model, max_cache_len=16)
    layer = lm.cache.layers[0]
    assert [tuple(layer.conv_states[0].shape), tuple(layer.recurrent_states[0].shape)] == [(1, 64, 4), (1, 64, 8)]
    ids = token_ids(1, 7)
    with torch.inference_mode():
        want = model(ids, use_cache=False).logits
        for _ in range(2):  # a second request restarts from zero states
            got = [lm(ids[:, :5], torch.tensor(0))] + [lm(ids[:, i:i + 1], torch.tensor(i)) for i in (5, 6)]
            torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-5, rtol=1e-5)


def test_a_model_with_a_cache_class_of_its_own_is_refused_naming_the_fix():
    import transformers

    torch.manual_seed(0)
    model = transformers.RwkvForCausalLM(transformers.RwkvConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, intermediate_size=64)).eval()
    with pytest.raises(StaticCacheError) as caught:
        static_cache(model, 16)
    message = str(caught.value)
    assert message.startswith("RwkvForCausalLM: a one-token forward filled no cache layer"), message
    assert "fix: serve it without a cache" in message and "use_cache=False" in message


def test_a_branch_on_a_data_dependent_size_is_a_graph_break_naming_the_graph_and_the_fix(tmp_path):
    """Dynamo raises its UserError ("Could not guard on data-dependent expression"); the runner names where and why."""
    from neuron_args.runner import GraphBreakError, NeuronRunner

    class Branches(torch.nn.Module):
        def forward(self, x):
            if x.nonzero().shape[0] == 1:  # LED: `if is_global_attn:` on a count of global tokens
                return x + 1
            return x

        def neuron_graphs(self):
            return [GraphSpec("encoder", self, {"b1": lambda: {"x": torch.ones(4)}})]

    torch._dynamo.reset()
    with pytest.raises(GraphBreakError) as caught:
        NeuronRunner(Branches(), compiler="local", cache_dir=tmp_path).warmup(emit=False)
    message = str(caught.value)
    assert re.search(r"graph break in graph type 'encoder' at .*test_probed_architectures\.py:\d+ \(in forward\):\n"
                     r"    if x\.nonzero\(\)\.shape\[0\] == 1:", message), message
    assert "Could not guard on data-dependent expression" in message and "Fix: " in message
    torch._dynamo.reset()


def test_an_encoder_decoder_reading_its_encoder_output_by_name_decodes_as_transformers():
    """NLLB-MoE reads ``encoder_outputs.last_hidden_state`` and ``.router_logits`` (BART reads ``[0]``): the decoder
    graphs pass the encoder states as a transformers output, and decode as the model's own forward does."""
    import transformers

    from neuron_args.hf import StaticSeq2SeqLM

    torch.manual_seed(0)
    model = transformers.NllbMoeForConditionalGeneration(transformers.NllbMoeConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4, expert_capacity=64,
        max_position_embeddings=64, encoder_sparse_step=1, decoder_sparse_step=2)).eval()
    lm = StaticSeq2SeqLM(model, max_cache_len=8, encoder_len=6)
    ids, decoder_ids = token_ids(1, 6), token_ids(1, 3, seed=2)
    with torch.inference_mode():
        want = model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits
        states = lm.encoder(input_ids=ids)
        got = [lm.prefill(decoder_ids[:, :1], states, torch.tensor(0))]
        got += [lm.decode(decoder_ids[:, i:i + 1], states, torch.tensor(i)) for i in (1, 2)]
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-5, rtol=1e-5)


def test_a_size_read_from_a_tensor_names_the_graph_the_line_and_the_fix(tmp_path):
    """TrOCR, MPT, RoFormer: positions ``arange(cache_length, ...)`` from the cache's filled length, a tensor. Dynamo
    itself fails (an internal error); the runner says which graph, where, and what to do instead."""
    from neuron_args.runner import GraphBreakError, NeuronRunner

    class Positions(torch.nn.Module):
        def forward(self, x, start):
            return x + torch.arange(start, start + x.shape[0])

        def neuron_graphs(self):
            return [GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(4), "start": torch.tensor(3)}})]

    torch._dynamo.reset()
    with pytest.raises(GraphBreakError) as caught:
        NeuronRunner(Positions(), compiler="local", cache_dir=tmp_path).warmup(emit=False)
    message = str(caught.value)
    assert re.search(r"graph type 'decode' cannot be traced as one graph: Dynamo failed at .*test_probed_architectures"
                     r"\.py:\d+ \(in forward\):\n    return x \+ torch\.arange\(start, start \+ x\.shape\[0\]\)",
                     message)
    assert "PendingUnbackedSymbolNotFound" in message and "Fix: compute sizes from shapes" in message
    torch._dynamo.reset()


def test_positions_from_the_caches_filled_length_are_one_graph_per_bucket(compiled, graph_keys):
    """TrOCR computes its positions as ``arange(cache.get_seq_length(), ... + n)``: the static cache gives its filled
    length as one Python int, so prefill and every decode step are two graphs, and decode as the model's own forward."""
    import transformers

    torch.manual_seed(0)
    model = transformers.TrOCRForCausalLM(transformers.TrOCRConfig(
        vocab_size=VOCAB, d_model=32, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
        max_position_embeddings=64, use_learned_position_embeddings=True)).eval()
    lm = compiled(StaticCausalLM(model, max_cache_len=16))
    ids = token_ids(1, 8)
    with torch.inference_mode():
        want = model(ids, use_cache=False).logits
        got = [lm(ids[:, :6], torch.tensor(0))] + [lm(ids[:, i:i + 1], torch.tensor(i)) for i in (6, 7)]
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-5, rtol=1e-5)
    assert len(graph_keys()) == 2


def test_a_boolean_mask_selection_names_the_op_the_line_and_a_selection_by_index(compiled):
    """BART-family sequence classifiers pick the last eos token by a boolean mask (``hidden[eos_mask, :]``), a size
    from tensor values: refused naming the op, the line and a static selection the user can write instead."""
    from neuron_args.errors import LoweringError

    def last_eos(hidden, ids):  # BartForSequenceClassification's selection
        return hidden[ids.eq(2), :].view(hidden.size(0), -1, hidden.size(-1))[:, -1, :]

    with pytest.raises(LoweringError) as caught, torch.inference_mode(), \
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled(last_eos)(torch.randn(1, 4, 3), torch.tensor([[5, 2, 7, 2]]))
    message = str(caught.value)
    assert "cannot lower op aten.index.Tensor" in message and "hidden[ids.eq(2), :]" in message
    assert "last = torch.where(mask, torch.arange(mask.shape[-1]), -1).argmax(-1)" in message
    assert "compile the part before the selection (its base model)" in message


def test_a_hybrid_of_linear_and_sliding_attention_layers_decodes_as_transformers():
    """Inkling's layers hold a recurrent state and (sliding-window) keys and values each: full-length hybrids."""
    from tests.hf.probe_served import Target, build

    model = build(Target("causal", "inkling_text", "InklingForCausalLM"))  # the probe's tiny config
    lm = StaticCausalLM(model, max_cache_len=16)
    assert [type(layer).__name__ for layer in lm.cache.layers] == ["LinearAttentionAndStaticFullAttentionLayer"] * 2
    assert model.config.layer_types == ["hybrid_sliding", "hybrid"] and model.config.sliding_window < 5
    ids = token_ids(1, 7)
    with torch.inference_mode():
        want = model(ids, use_cache=False).logits
        got = [lm(ids[:, :5], torch.tensor(0))] + [lm(ids[:, i:i + 1], torch.tensor(i)) for i in (5, 6)]
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-4, rtol=1e-4)
