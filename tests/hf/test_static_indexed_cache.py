"""Sparse-attention (indexed) cache layers in ``neuron_args.hf.static_cache``: DeepSeek V3.2 / GLM-5 style models.

Their ``DynamicIndexedLayer`` (keys, values and the indexer's keys) becomes transformers' ``StaticIndexedLayer``,
full length, so a decode step is one static graph; Qwen4-Exp, which keeps every token's positions in its cache
layer (grown by concatenation), is refused naming the layer and the fix.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="static_cache wraps transformers models")

from neuron_args.hf import StaticCacheError, StaticCausalLM  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0)


def test_indexed_layer_is_static_and_the_wrapper_equals_the_no_cache_forward() -> None:
    from transformers.cache_utils import StaticIndexedLayer

    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(
        **TINY, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
        first_k_dense_replace=0, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, index_topk=4, index_head_dim=8, index_n_heads=2)
    model = transformers.DeepseekV32ForCausalLM(config).eval()
    lm = StaticCausalLM(model, max_cache_len=16)
    layer = lm.cache.layers[0]
    assert type(layer) is StaticIndexedLayer
    assert tuple(layer.indexer_keys.shape) == (1, 16, 8) and layer.keys.shape[2] == 16  # full length

    ids = torch.randint(3, 64, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        whole = model(input_ids=ids, use_cache=False).logits
        steps = [lm(ids[:, :8], torch.tensor(0))] + [lm(ids[:, i:i + 1], torch.tensor(i)) for i in range(8, 11)]
    # the indexer keeps 4 of up to 11 keys: the static buffer's unwritten slots are never picked
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert int(layer.indexer_cumulative_length) == 11
    assert layer.indexer_keys[0, 11:].abs().sum() == 0 and layer.indexer_keys[0, :11].abs().sum() > 0


def test_an_indexed_layer_that_grows_its_positions_is_refused_with_the_fix() -> None:
    torch.manual_seed(0)
    config = transformers.Qwen4ExpTextConfig(
        **{**TINY, "num_hidden_layers": 2, "num_key_value_heads": 2}, head_dim=8,
        layer_types=["linear_attention", "indexed_attention"], linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2)
    model = transformers.Qwen4ExpForCausalLM(config).eval()
    with pytest.raises(StaticCacheError) as err:
        StaticCausalLM(model, max_cache_len=16)
    message = str(err.value)
    assert "Qwen4ExpForCausalLM: cache layer 1 (DynamicIndexedLayer)" in message
    assert "indexer_position_ids" in message and "fix: serve this architecture without a cache" in message
