"""A Hugging Face ``transformers`` Llama served as Neuron graphs (tiny random config, no download).

What a model developer writes to bring their own ``transformers`` decoder to neuron-args:

- the model and its static KV cache as one module (:class:`neuron_args.hf.StaticCausalLM`):
  ``forward(input_ids, start)`` writes the cache at ``start`` and returns logits;
- ``neuron_graphs()``: a prefill graph per prompt bucket and one decode graph, each bucket a
  zero-argument factory returning the keyword arguments of one call;
- ``compiler_args_for``: the per-graph policy (``-O3`` for decode, the base arguments for prefill).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from neuron_args.graphs import GraphSpec
from neuron_args.hf import StaticCausalLM

VOCAB = 128


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """``LlamaForCausalLM`` from a tiny random config: 2 layers, grouped-query attention, rotary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


class HFLlama(StaticCausalLM):
    """Batch-1 generation over two graph types: ``prefill`` (buckets ``s16``, ``s32``) and ``decode``."""

    def __init__(self, seed: int = 0, max_cache_len: int = 64, prefill_buckets: Sequence[int] = (16, 32)) -> None:
        super().__init__(tiny_llama(seed), max_cache_len=max_cache_len)
        self.prefill_buckets = tuple(sorted(prefill_buckets))
        if self.prefill_buckets[-1] >= max_cache_len:
            raise ValueError(f"the largest prefill bucket ({self.prefill_buckets[-1]}) must leave room in the "
                             f"cache for decoding (max_cache_len={max_cache_len})")

    @property
    def eos_token_id(self) -> int | None:
        return self.model.config.eos_token_id

    def compiler_args_for(self, graph_type: str | None, example_inputs: Any, base: Sequence[str] | None) -> list[str]:
        """``-O3`` for decode (IO-bound, runs every step); prefill keeps the caller's base arguments."""
        from neuron_args.flags import with_optimization_level

        base = list(base or [])
        if graph_type == "decode":
            return with_optimization_level(base, 3)
        return base

    def neuron_graphs(self) -> list[GraphSpec]:
        def prefill(size: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.zeros(1, size, dtype=torch.long), "start": torch.tensor(0)}

        def decode() -> dict[str, torch.Tensor]:
            return {"input_ids": torch.zeros(1, 1, dtype=torch.long), "start": torch.tensor(self.prefill_buckets[-1])}

        return [
            GraphSpec("prefill", self, {f"s{n}": (lambda n=n: prefill(n)) for n in self.prefill_buckets}),
            GraphSpec("decode", self, {"b1": decode}),
        ]
