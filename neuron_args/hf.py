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


def static_cache(model: torch.nn.Module, max_cache_len: int, *, batch_size: int = 1) -> Any:
    """A ``StaticCache`` for ``model`` with a full-length static layer per attention layer, allocated now.

    Allocated eagerly, so its tensors are graph inputs that every graph reads and writes in place
    (not tensors a first compiled call creates). Each layer's heads, head size, dtype and device come
    from one eager one-token call of ``model`` with a ``DynamicCache``: configs name these
    differently (multi-query, per-layer head counts), the cache the model fills does not.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import StaticCache, StaticLayer

    param = next(model.parameters())
    probe = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=param.device), past_key_values=probe,
              use_cache=True)
    filled = [layer for layer in probe.layers if getattr(layer, "keys", None) is not None]
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    if len(filled) != len(cache.layers):
        raise ValueError(f"{type(model).__name__}: {len(cache.layers)} cache layers in its config, {len(filled)} "
                         "filled by a forward; static_cache handles models whose every layer caches keys and values")
    cache.layers = [StaticLayer(max_cache_len=max_cache_len) for _ in cache.layers]
    for layer, seen in zip(cache.layers, filled):
        keys, values = seen.keys, seen.values
        layer.lazy_initialization(
            torch.empty(batch_size, keys.shape[1], 0, keys.shape[-1], dtype=keys.dtype, device=keys.device),
            torch.empty(batch_size, values.shape[1], 0, values.shape[-1], dtype=values.dtype, device=values.device))
    return cache


class StaticCausalLM(torch.nn.Module):
    """A causal LM and its static KV cache as one module: ``forward(input_ids, start) -> logits``.

    ``input_ids`` is ``[batch, length]`` (a prefill bucket, or length 1 for decode); ``start`` is a
    0-d int64 tensor, the position of ``input_ids[:, 0]``. The call writes the keys and values of
    positions ``start .. start + length - 1`` into the cache (in place) and attends to every
    position up to each token's own, so padding after the real tokens is never attended to before
    a later call overwrites it. Returns the logits of every input position.
    """

    def __init__(self, model: torch.nn.Module, *, max_cache_len: int, batch_size: int = 1) -> None:
        super().__init__()
        self.model = model
        self.cache = static_cache(model, max_cache_len, batch_size=batch_size)
        self.max_cache_len = max_cache_len
        # every cache slot may be attended to (causality comes from the positions): passed so models that
        # size a mask from the cache's filled length (OPT) do not read that tensor into a Python int
        self.register_buffer("attention_mask", torch.ones(batch_size, max_cache_len, dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
        for layer in self.cache.layers:  # each layer writes at its own running length: set it
            layer.cumulative_length.copy_(start)
        out = self.model(input_ids=input_ids, position_ids=positions.unsqueeze(0).expand(input_ids.shape[0], -1),
                         cache_position=positions, past_key_values=self.cache, use_cache=True,
                         attention_mask=self.attention_mask[: input_ids.shape[0]])
        return out.logits
