"""Hugging Face ``transformers`` models as static Neuron graphs (optional: needs ``transformers``).

A Neuron graph has fixed shapes and no Python state that changes between calls. :func:`static_cache` gives
every layer a full-length static layer whose filled length is a tensor (transformers' sliding-window layers
keep a Python int: one graph per decode step); :class:`StaticCausalLM` takes the start position as a tensor,
so a prompt padded to its bucket does not move the next token's position.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from neuron_args.errors import NeuronArgsError
from neuron_args.lazy_modules import cache_utils, transformers


class StaticCacheError(NeuronArgsError, ValueError):
    """A model's cache cannot be made static for Neuron graphs (the message names the layer and the fix)."""


def static_cache(model: torch.nn.Module, max_cache_len: int, *, batch_size: int = 1) -> Any:
    """A ``StaticCache`` for ``model``, allocated now so its tensors are graph inputs every graph reads and writes in
    place; shaped by one eager one-token call with a ``DynamicCache`` (configs name the shapes differently)."""
    param = next(model.parameters())
    probe = transformers.DynamicCache(config=model.config)
    try:
        with torch.inference_mode(), torch.compiler.set_stance("force_eager"):  # a compiled forward too: no graph
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=param.device), cache=probe,
                  use_cache=True, cache_position=torch.zeros(1, dtype=torch.long, device=param.device))
    except Exception as exc:  # noqa: BLE001 - a model with a cache class of its own (xLSTM), named with the fix
        raise StaticCacheError(
            f"{type(model).__name__}: a one-token forward with transformers' DynamicCache failed "
            f"({type(exc).__name__}: {exc}); static_cache sizes its layers from that call, so this model's cache "
            "is not one transformers' cache layers hold (it has a cache class of its own). fix: serve it without a "
            "cache (one graph per sequence bucket, use_cache=False), or keep it in eager PyTorch") from exc
    return _positioned_cache(_static_layers_like(type(model).__name__, probe.layers, max_cache_len, batch_size))


def _positioned_cache(layers: list[Any]) -> Any:
    """A StaticCache of ``layers`` (transformers' constructor would build its own from the config first)."""
    cache = positioned_cache_class().__new__(positioned_cache_class())
    cache_utils.Cache.__init__(cache, layers=layers)
    return cache


@functools.cache
def positioned_cache_class() -> type:
    """transformers' ``StaticCache`` with a Python-int filled length (made on first use: transformers is optional)."""
    class PositionedCache(cache_utils.StaticCache):
        """A ``StaticCache`` whose ``get_seq_length()`` is a Python int read once from the filled length: models
        computing ``torch.arange(length, length + n)`` (MVP, RoFormer, MPT) would read the 0-d tensor once per bound
        and break the graph; read once, it stays a traced value (``neuron_args.lowering.scalars``)."""

        def get_seq_length(self, layer_idx: int = 0) -> Any:
            length = super().get_seq_length(layer_idx)
            if not isinstance(length, torch.Tensor):
                return length
            length = length.item()
            torch._check(length >= 0)
            torch._check(length <= max(getattr(layer, "max_cache_len", 0) for layer in self.layers))
            return length

        def get_query_offset(self, layer_idx: int = 0) -> Any:
            # the tensor: transformers' masks take a static cache's offset so and never branch on it
            return super().get_seq_length(layer_idx)

    return PositionedCache


def _static_layers_like(model_name: str, seen_layers: list[Any], max_cache_len: int, batch_size: int) -> list[Any]:
    """A static layer for each layer a probe call filled, by index (an empty one: a ``DummyLayer``; those past the
    last filled: dropped): full-length key/value layers, recurrent states allocated as zeros in the probe's shapes."""
    from transformers.cache_utils import (DummyLayer, DynamicIndexedLayer, DynamicLayer, DynamicSlidingWindowLayer,
                                          LinearAttentionAndStaticFullAttentionLayer, LinearAttentionLayer)

    def filled(seen: Any) -> bool:
        return getattr(seen, "keys", None) is not None or any(
            getattr(seen, "is_conv_states_initialized", {}).values()) or any(
            getattr(seen, "is_recurrent_states_initialized", {}).values())

    last = max((i for i, seen in enumerate(seen_layers) if filled(seen)), default=-1)
    if last < 0:
        kinds = sorted({type(seen).__name__ for seen in seen_layers}) or ["none"]
        raise StaticCacheError(
            f"{model_name}: a one-token forward filled no cache layer (its cache layers: {', '.join(kinds)}); "
            "static_cache and StaticCausalLM hold the keys and values or recurrent states of transformers' cache "
            "layers, and this model writes none (it caches nothing, or keeps a cache of its own): fix: serve it "
            "without a cache (one graph per sequence bucket, use_cache=False), or keep it in eager PyTorch")
    layers = []
    for i, seen in enumerate(seen_layers[: last + 1]):
        kind = type(seen)
        if isinstance(seen, DummyLayer) or not filled(seen):  # a layer no forward writes (a feed-forward block's)
            layers.append(seen if isinstance(seen, DummyLayer) else DummyLayer())
        elif kind in (DynamicLayer, DynamicSlidingWindowLayer) and seen.keys is not None:
            layers.append(_allocate_keys_values(cache_utils.StaticLayer(max_cache_len=max_cache_len), seen, batch_size))
        elif kind is DynamicIndexedLayer and seen.keys is not None:
            layers.append(_static_indexed_layer(model_name, i, seen, max_cache_len, batch_size))
        elif kind is LinearAttentionLayer:
            layers.append(_allocate_recurrent(LinearAttentionLayer(number_of_states=seen.number_of_states), seen,
                                              batch_size))
        elif isinstance(seen, LinearAttentionLayer) and isinstance(seen, DynamicLayer) and seen.keys is not None:
            # both kinds of state (full or sliding attention): a full-length hybrid
            layer = LinearAttentionAndStaticFullAttentionLayer(max_cache_len, number_of_states=seen.number_of_states)
            layers.append(_allocate_recurrent(_allocate_keys_values(layer, seen, batch_size), seen, batch_size))
        else:
            raise StaticCacheError(
                f"{model_name}: cache layer {i} ({kind.__name__}) is of a kind static_cache does not hold; "
                "static_cache and StaticCausalLM hold key/value layers (full length), recurrent-state layers "
                "(LinearAttentionLayer, alone or with attention) and DummyLayers. fix: serve this architecture "
                "without a cache (use_cache=False, one graph per sequence bucket), or build its transformers "
                "StaticCache yourself and check that one decode step is one graph (StaticCausalLM's cache attribute)")
    return layers


def _static_indexed_layer(model_name: str, i: int, seen: Any, max_cache_len: int, batch_size: int) -> Any:
    """transformers' ``StaticIndexedLayer`` for a sparse-attention layer (DeepSeek V3.2, GLM-5: keys, values and the
    indexer's keys, full length), allocated in the probe's shapes."""
    if seen.indexer_position_ids is not None:  # Qwen4-Exp: a Python attribute the forward grows by concatenation
        raise StaticCacheError(
            f"{model_name}: cache layer {i} (DynamicIndexedLayer) keeps the position of every token so far "
            "(`indexer_position_ids`, concatenated on each call), so each decode step would be a graph of its own "
            "shape; static_cache holds fixed-size states only. fix: serve this architecture without a cache "
            "(use_cache=False, one graph per sequence bucket), or keep it in eager PyTorch")
    layer = _allocate_keys_values(cache_utils.StaticIndexedLayer(max_cache_len=max_cache_len), seen, batch_size)
    if seen.is_indexer_initialized:
        keys = seen.indexer_keys
        layer.lazy_initialization_indexer(keys.new_empty(batch_size, 0, keys.shape[-1]))
    return layer


def _allocate_keys_values(layer: Any, seen: Any, batch_size: int) -> Any:
    """``layer`` (of full length) with its keys and values allocated in the heads and dtype of the probe's ``seen``."""
    layer.lazy_initialization(*(t.new_empty(batch_size, t.shape[1], 0, t.shape[-1]) for t in (seen.keys, seen.values)))
    return layer


def _allocate_recurrent(layer: Any, seen: Any, batch_size: int) -> Any:
    """``layer``'s conv and recurrent states, zero, shaped as the probe's ``seen`` ones (batch ``batch_size``)."""
    for idx in range(seen.number_of_states):
        conv, recurrent = seen.conv_states.get(idx), seen.recurrent_states.get(idx)
        if conv is not None:
            layer.lazy_initialization(conv_states=conv.new_zeros(batch_size, *conv.shape[1:]), state_idx=idx,
                                      conv_kernel_size=seen.conv_kernel_size[idx])
        if recurrent is not None:
            layer.lazy_initialization(recurrent_states=recurrent.new_zeros(batch_size, *recurrent.shape[1:]),
                                      state_idx=idx)
    return layer


class StaticCausalLM(torch.nn.Module):
    """A causal LM and its static KV cache as one module: ``forward(input_ids, start) -> logits``.

    ``start`` is a 0-d int64 tensor, the position of ``input_ids[:, 0]``; the call writes the cache at
    ``start ..`` in place and attends up to each token's own position, so padding after the real tokens is
    never attended to before a later call overwrites it.
    """

    def __init__(self, model: torch.nn.Module, *, max_cache_len: int, batch_size: int = 1) -> None:
        super().__init__()
        self.model = model
        self.cache = static_cache(model, max_cache_len, batch_size=batch_size)
        self.max_cache_len = max_cache_len
        # every cache slot may be attended to (causality comes from the positions): passed so models that
        # size a mask from the cache's filled length (OPT) do not read that tensor into a Python int. Not to
        # models with recurrent layers, which read the mask as the input's padding (one entry per input token)
        self.recurrent = any(hasattr(layer, "has_previous_state") for layer in self.cache.layers)
        self.register_buffer("attention_mask", torch.ones(batch_size, max_cache_len, dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = start + torch.arange(input_ids.shape[1], device=input_ids.device)
        for layer in self.cache.layers:
            if hasattr(layer, "cumulative_length"):  # each layer writes at its own running length: set it
                layer.cumulative_length.copy_(start)
            if getattr(layer, "indexer_cumulative_length", None) is not None:  # a sparse-attention indexer's too
                layer.indexer_cumulative_length.copy_(start)
            if hasattr(layer, "has_previous_state"):
                _continue_or_restart(layer, start, one_token=input_ids.shape[1] == 1)
        out = self.model(input_ids=input_ids, position_ids=positions.unsqueeze(0).expand(input_ids.shape[0], -1),
                         cache_position=positions, cache=self.cache, use_cache=True,
                         attention_mask=None if self.recurrent else self.attention_mask[: input_ids.shape[0]])
        return out.logits


def _continue_or_restart(layer: Any, start: torch.Tensor, *, one_token: bool) -> None:
    """A recurrent layer's path for this graph (transformers' Python flag, set here by the graph's shape: a prompt
    or a decode step), its states zeroed in the graph when ``start`` is 0."""
    keep = (start > 0).to(layer.dtype or torch.float32)
    for idx in range(layer.number_of_states):
        layer.has_previous_state[idx] = one_token
        for states in (layer.conv_states, layer.recurrent_states):
            if states.get(idx) is not None:
                states[idx].mul_(keep.to(states[idx].dtype))


# -- encoder-decoders -------------------------------------------------------------------------------------------


class CrossAttentionFlags:
    """``EncoderDecoderCache.is_updated`` fixed for one graph: the cross-attention keys/values are computed
    (prefill) or read (decode); transformers' writes, which would make the next call another graph and a second
    request read the last one's encoder states, are ignored."""

    def __init__(self, updated: bool) -> None:
        self.updated = updated

    def get(self, layer_idx: int, default: Any = None) -> bool:
        return self.updated

    __getitem__ = get

    def __setitem__(self, layer_idx: int, value: bool) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(())


def encoder_width(model: torch.nn.Module) -> int:
    """The width of an encoder-decoder's encoder states: ``d_model`` or ``hidden_size`` of its config, or of the
    encoder's own config (T5Gemma nests one per side)."""
    for config in (model.config, getattr(model.config, "encoder", None), getattr(model.get_encoder(), "config", None)):
        width = getattr(config, "d_model", None) or getattr(config, "hidden_size", None)
        if width:
            return int(width)
    raise StaticCacheError(f"{type(model).__name__}: no d_model or hidden_size in its config or its encoder's; "
                           "fix: pass encoder states of the width its decoder's cross-attention takes")


def _encoder_outputs(states: torch.Tensor) -> Any:
    """The encoder states as a transformers output: models read them by index, or by name (NLLB-MoE), with the
    expert routing fields a mixture-of-experts encoder's output has (``None``: the decoder graph does not use them)."""
    from transformers.modeling_outputs import MoEModelOutput  # a plain import: Dynamo traces this call

    return MoEModelOutput(last_hidden_state=states)


def static_encoder_decoder_cache(model: torch.nn.Module, max_cache_len: int, encoder_len: int, *,
                                 batch_size: int = 1) -> Any:
    """An ``EncoderDecoderCache`` of static layers for ``model``: self-attention ``max_cache_len`` long, cross-attention
    ``encoder_len`` long, shaped by one eager decoder call as in :func:`static_cache`."""
    param = next(model.parameters())
    hidden = encoder_width(model)
    probe = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
    with torch.inference_mode(), torch.compiler.set_stance("force_eager"):
        states = torch.zeros(1, encoder_len, hidden, dtype=param.dtype, device=param.device)
        model(encoder_outputs=_encoder_outputs(states),
              decoder_input_ids=torch.zeros(1, 1, dtype=torch.long, device=param.device), cache=probe, use_cache=True)
    name = type(model).__name__
    self_layers = _static_layers_like(name, probe.self_attention_cache.layers, max_cache_len, batch_size)
    cross_layers = _static_layers_like(name, probe.cross_attention_cache.layers, encoder_len, batch_size)
    # the self-attention cache's filled length gives positions (see positioned_cache_class)
    return transformers.EncoderDecoderCache(_positioned_cache(self_layers), cache_utils.Cache(layers=cross_layers))


class Seq2SeqEncoder(torch.nn.Module):
    """An encoder-decoder's encoder as an entry module: ``forward(**inputs) -> last_hidden_state``."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.encoder(**inputs).last_hidden_state


class Seq2SeqDecoderStep(torch.nn.Module):
    """One decoder graph of an encoder-decoder: ``forward(decoder_input_ids, encoder_hidden_states, start) -> logits``;
    ``computes_cross``: it writes the cross-attention cache from the encoder states (prefill), else reads it."""

    def __init__(self, model: torch.nn.Module, cache: Any, *, computes_cross: bool) -> None:
        super().__init__()
        self.model = model
        self.computes_cross = computes_cross
        # its own view of the shared caches: the flags are this graph's, the tensors everyone's
        self.cache = transformers.EncoderDecoderCache(cache.self_attention_cache, cache.cross_attention_cache)
        self.cache.is_updated = CrossAttentionFlags(not computes_cross)
        keys = cache.self_attention_cache.layers[0].keys  # (batch, heads, cache length, head dim)
        self.register_buffer("attention_mask", torch.ones_like(keys[:, 0, :, 0], dtype=torch.long), persistent=False)

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor, start: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.cache.self_attention_cache.layers:
            layer.cumulative_length.copy_(start)
        if self.computes_cross:
            for layer in self.cache.cross_attention_cache.layers:
                layer.cumulative_length.zero_()
        out = self.model(encoder_outputs=_encoder_outputs(encoder_hidden_states), attention_mask=encoder_attention_mask,
                         decoder_input_ids=decoder_input_ids,
                         decoder_attention_mask=self.attention_mask[: decoder_input_ids.shape[0]],
                         cache=self.cache, use_cache=True)
        return out.logits


class StaticSeq2SeqLM(torch.nn.Module):
    """An encoder-decoder and its static caches as three entry modules sharing the weights and one
    :func:`static_encoder_decoder_cache`: ``encoder``, ``prefill`` (writes the cross-attention cache) and ``decode``."""

    def __init__(self, model: torch.nn.Module, *, max_cache_len: int, encoder_len: int, batch_size: int = 1) -> None:
        super().__init__()
        self.model = model
        self.cache = static_encoder_decoder_cache(model, max_cache_len, encoder_len, batch_size=batch_size)
        self.max_cache_len, self.encoder_len = max_cache_len, encoder_len
        self.encoder = Seq2SeqEncoder(model.get_encoder())
        self.prefill = Seq2SeqDecoderStep(model, self.cache, computes_cross=True)
        self.decode = Seq2SeqDecoderStep(model, self.cache, computes_cross=False)
