"""``neuron_args.hf.static_cache`` matches the cache layers a model fills, by index (eager, tiny configs: fast).

Found by ``tests/hf/probe_served.py``: a decoder whose config counts more layers than it caches (BART's
decoder as a causal LM: its config's layer count is the encoder's), and recurrent models, whose cache
holds no keys and values, which must be refused with the fix rather than a bare mismatch.
"""
from __future__ import annotations

import pytest
import torch

from neuron_args.hf import StaticCacheError, StaticCausalLM, static_cache
from tests.hf.architectures import VOCAB, token_ids

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


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


def test_a_model_without_key_value_layers_is_refused_naming_the_fix():
    import transformers

    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2)).eval()
    with pytest.raises(StaticCacheError) as caught:
        static_cache(model, 16)
    message = str(caught.value)
    assert message.startswith("MambaForCausalLM: a forward filled no key/value cache layer")
    assert "fix: serve it without a cache" in message and "use_cache=False" in message
