"""Hugging Face ``transformers`` models as static Neuron graphs (optional: needs ``transformers``).

A Neuron graph has fixed shapes and no Python state that changes between calls. Two things in a
``transformers`` decoder break that unless the caller takes care:

- the KV cache: a :class:`transformers.StaticCache` preallocates it, but for sliding-window
  layers (Mistral, Gemma 2/3...) it keeps the filled length in a Python ``int``, so Dynamo
  specialises on it and every decode step becomes a new graph and cache entry.
  :func:`static_cache` gives every layer a full-length static layer instead, whose length is a
  tensor; the model's sliding-window *mask* still applies, from absolute positions.
- positions: padding a prompt to its bucket must not move the next token's position.
  :class:`StaticCausalLM` takes the start position as a tensor and writes the cache there, so a
  padded prefill is followed by a decode at the real prompt length.
"""
from __future__ import annotations

from typing import Any

import torch


def static_cache(config: Any, max_cache_len: int, *, batch_size: int = 1,
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> Any:
    """A ``StaticCache`` for ``config`` with a full-length static layer per attention layer, allocated now.

    Allocated eagerly (``early_initialization``) so its tensors are graph inputs that every graph
    reads and writes in place, rather than tensors a first compiled call creates.
    """
    from transformers.cache_utils import StaticCache, StaticLayer

    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    cache.layers = [StaticLayer(max_cache_len=max_cache_len) for _ in cache.layers]
    text = config.get_text_config(decoder=True)
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = dtype or getattr(text, "dtype", None) or torch.get_default_dtype()
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    cache.early_initialization(batch_size, heads, head_dim, dtype, device)
    return cache


class StaticCausalLM(torch.nn.Module):
    """A causal LM and its static KV cache as one module: ``forward(input_ids, start) -> logits``.

    ``input_ids`` is ``[batch, length]`` (a prefill bucket, or length 1 for decode); ``start`` is a
    0-d int64 tensor, the position of ``input_ids[:, 0]``. The call writes the keys and values of
    positions ``start .. start + length - 1`` into the cache (in place) and attends to every
    position up to each token's own, so padding after the real tokens is never attended to before
    a later call overwrites it. Returns the logits of every input position.
    """

    def __init__(self, model: torch.nn.Module, *, max_cache_len: int, batch_size: int = 1,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        param = next(model.parameters())
        self.cache = static_cache(model.config, max_cache_len, batch_size=batch_size,
                                  dtype=dtype or param.dtype, device=param.device)
        self.max_cache_len = max_cache_len

    def forward(self, input_ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
        for layer in self.cache.layers:  # each layer writes at its own running length: set it
            layer.cumulative_length.copy_(start)
        out = self.model(input_ids=input_ids, position_ids=positions.unsqueeze(0).expand(input_ids.shape[0], -1),
                         cache_position=positions, past_key_values=self.cache, use_cache=True)
        return out.logits
