"""Probe transformers architectures through the whole user path: warmup, serve under the cache-hit assert, fresh process.

    .venv/bin/python -m tests.hf.probe_served                        # every architecture of the auto mappings
    .venv/bin/python -m tests.hf.probe_served causal:llama seq2seq:t5  # some (kind:model_type)
    .venv/bin/python -m tests.hf.probe_served --kind causal --timeout 240 --out results.json

Architectures come from transformers' own auto mappings (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``,
``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``, the sequence classification, masked LM and image
classification mappings), each built from a tiny random config made in code (no download): the config
class's defaults with every size attribute it has shrunk (:func:`tiny_config`), a per-stage list left as it is;
a composite config's causal LM (Llama 4, Qwen 3.5) takes its text sub-config, and ``OVERRIDES`` hand-makes what
the shrink gets wrong (layer types with one layer of each kind, sizes a validator ties together, per-stage
sizes of vision models). Each kind is served as a user serves it:

- ``causal``: :class:`neuron_args.hf.StaticCausalLM`, graph types ``prefill`` (a prompt bucket of 8, base
  -O1) and ``decode`` (one token, -O3); a prompt then 3 decode steps;
- ``seq2seq``: :class:`neuron_args.hf.StaticSeq2SeqLM`, graph types ``encoder`` (-O1), ``prefill`` (base) and
  ``decode`` (-O3); 4 greedy steps;
- ``encoder``: the sequence classifier (else masked LM; text: buckets batch 1 x 8 and 2 x 16 tokens) or
  image classifier (batch 1 and 2) of the architecture, one graph type ``classify``.

Per architecture: :class:`~neuron_args.runner.NeuronRunner` warmup (manifest on), then serving under
``runner.serve()`` (a miss raises), logits and the KV cache equal to the same calls in eager PyTorch
(fp32, atol = rtol = 1e-4), the cache holds exactly one entry per graph (prefill + decode...), the manifest
names every graph; then a *fresh process* (another worker) warms up from the cache with
``NEURON_LIBTORCH_ASSERT_CACHE_HIT=1`` (no compile) and serves the same calls with the same outputs.
On a failure the probe asks whether it is ours: the same calls through Dynamo's own ``eager`` backend
(fullgraph, no lowering) -- if that fails too, transformers' model cannot run as a static graph.

Each architecture runs in a worker process (restarted after a crash or a timeout), so one failure never
ends the sweep. One line per architecture; ``--out`` writes them as JSON, merged into an existing file
(``--skip-passed`` reruns only what did not pass). ``tests/hf/served_architectures.json`` is the last run's,
which ``scripts/model_coverage.py`` (``--served-only``: that section alone) turns into the "served end to
end" table of docs/MODEL_COVERAGE.md. Not a test: run by hand (``nice -n 10``), in parts (``--kind``).
Architectures that need remote code are not in the auto mappings; those whose config or model needs an
extra package, that no tiny config here fits, or that are no model served alone (``NOT_ALONE``: a draft
model reading another model's cache) are reported as skipped with the reason.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
FP32 = {"atol": 1e-4, "rtol": 1e-4}
BASE = ["--auto-cast=none", "-O1"]
V = 128
PROMPT, DECODE_STEPS, MAX_CACHE = 8, 3, 16
S2S_STEPS, ENCODER_LEN = 4, 8

#: every size attribute a tiny config shrinks, when its class has it (defaults are often billions of parameters)
TINY = dict(
    vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, n_positions=64, n_ctx=64,
    d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=1, n_embd=32, n_layer=2, n_head=4,
    n_inner=64, ffn_dim=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=64, max_target_positions=64,
    embedding_size=32, projection_dim=32, intermediate_multiple_size=1, rotary_dim=4,
    vocab_size_per_layer_input=V, hidden_size_per_layer_input=8, global_head_dim=8,
    # mixture of experts and latent attention
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    # sparse attention (DeepSeek V3.2, GLM-5): the indexer's top-k (2048) keeps every key here. With fewer keys
    # than the sequence, ties in its scores (ReLU zeros, repeated greedy tokens) pick keys by torch's and XLA's
    # own tie order, and by the buffer's length: such runs differ without a fault
    index_head_dim=8, index_n_heads=2,
    # windows shorter than the prompt, so the static cache's full-length layers meet the model's sliding mask
    sliding_window=4, attention_window=4,
    # state-space and linear-attention layers
    mamba_d_state=8, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, state_size=8, ssm_state_size=8,
    n_groups=1, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    # BLT's byte-level encoder and decoder feed its global transformer (cross-attention over 2 x 32 wide)
    hidden_size_global=64, encoder_hash_byte_group_vocab=64,
    # vision towers of multimodal configs
    image_size=32, patch_size=8, num_channels=3,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=False,
)
#: the layer counts a config validator may tie to a per-layer list of its defaults
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers", "num_decoder_layers")
ATTENTION = {"full_attention", "sliding_attention", "attention", "hybrid", "indexed_attention"}
INKLING = {"unpadded_vocab_size": V, "eos_token_id": 2, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
           "swa_head_dim": 8, "sliding_window_size": 4, "d_rel": 4, "rel_extent": 16, "log_scaling_n_floor": 16,
           "n_layers_per_attn_res_block": 1, "layer_types": ["hybrid_sliding", "hybrid"]}
PVT = {"num_encoder_blocks": 2, "depths": [1, 1], "hidden_sizes": [16, 32], "strides": [4, 2],
       "num_attention_heads": [1, 2], "mlp_ratios": [2, 2]}
#: per model type: what the generic shrink gets wrong
OVERRIDES: dict[str, dict[str, Any]] = {
    # block-sparse attention needs sequences of many blocks: at 8 or 16 tokens transformers warns (a graph break)
    # and falls back to full attention; probed with full attention
    "big_bird": {"attention_type": "original_full"}, "bigbird_pegasus": {"attention_type": "original_full"},
    # hybrids: one recurrent and one attention layer in two
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "mamba2": {"num_heads": 8, "head_dim": 8},
    "zamba2": {"hybrid_layer_ids": [1]},  # its shared attention block's layer ids: the hybrid layer's
    # input, recurrent (looped) and output sections of one layer each: the defaults (8 + 8 around the rest) leave two
    # layers a recurrent section of -14 that transformers accepts, running each layer twice into one cache layer
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1},
    # hand-made where the shrink cannot build one (a composite's text config is taken from the model class):
    # a chunked layer with rope then a full one without (Llama 4's pattern), chunks shorter than the prompt
    "llama4": {"attention_chunk_size": 4, "no_rope_layers": [1, 0],
               "layer_types": ["chunked_attention", "full_attention"]},
    # DBRX's model reads `attn_config.rope_theta`, which its sub-config class no longer declares
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}},
    # the state-space width must be heads x head size
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_chunk_size": 8},
    # sliding and full layers, the last two reusing the first two's keys and values (KV sharing), the first one
    # with a sparse activation (its Gaussian top-k)
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2, "laurel_rank": 8,
                     "layer_types": ["sliding_attention", "full_attention"] * 2,
                     "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 16,
                         "mamba_chunk_size": 8},
    # one codebook: the probe's token ids are (batch, sequence), Musicgen's (batch x codebooks, sequence)
    "musicgen": {"num_codebooks": 1}, "musicgen_melody": {"num_codebooks": 1},
    # a linear-attention layer, then an indexed one (its block selection: a budget of 4 keys in blocks of 2)
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), {
        "layer_types": ["linear_attention", "indexed_attention"], "indexer_n_heads": 2, "indexer_kv_heads": 1,
        "indexer_head_dim": 8, "indexer_budget": 4, "indexer_compress_ratio": 2}),
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # rope per layer type: a sliding layer with (multimodal) rope, a full one without
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
        "full_attention": None}},
    "zaya": {"num_experts_per_tok": 1},
    # Inkling 2: a sliding and a full hybrid layer (attention + short convolution), its own sliding-attention sizes;
    # the looped variant runs its middle layer twice
    "inkling2_text": INKLING,
    "inkling2_loop_text": {**INKLING, "num_hidden_layers": 3, "loop_layer_index_start": 1, "loop_layer_index_end": 2,
                           "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"], "loop_num_passes": 2,
                           "loop_gate_rank": 4},
    # a local and a hashed (LSH, fixed seed) attention layer; axial positions that multiply to 64 and sum to 32 wide
    "reformer": {"attn_layers": ["local", "lsh"], "axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16],
                 "attention_head_size": 8, "feed_forward_size": 64, "local_attn_chunk_length": 4,
                 "lsh_attn_chunk_length": 4, "num_buckets": 2, "hash_seed": 0},
    # X-MOD's adapters are chosen per language: one, the default
    "xmod": {"languages": ["en_XX"], "default_language": "en_XX"},
    "luke": {"entity_vocab_size": 16, "entity_emb_size": 16},
    # vision classifiers with per-stage sizes (two or three small stages for a 32 x 32 image)
    # a tiny LeViT at the default initializer (0.02) gives logits of 4e-11: 0.2 keeps them near 0.3
    "levit": {"initializer_range": 0.2, "hidden_sizes": [16, 32, 48], "num_attention_heads": [1, 2, 3], "depths": [1, 1, 1],
              "key_dim": [8, 8, 8], "patch_size": 16, "kernel_size": 3, "stride": 2,
              "down_ops": [["Subsample", 8, 1, 4, 2, 2], ["Subsample", 8, 2, 4, 2, 2]]},
    # its default initializer (0.02) fades a random tiny net to logits of 1e-23 (a vacuous comparison); 0.6 keeps
    # them near 0.1
    "efficientnet": {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320, "initializer_range": 0.6},
    **dict.fromkeys(("swin", "swinv2", "donut-swin"), {"patch_size": 4, "embed_dim": 16, "depths": [1, 1],
                                                      "num_heads": [2, 2], "window_size": 4}),
    **dict.fromkeys(("convnext", "convnextv2"), {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2}),
    "focalnet": {"patch_size": 4, "embed_dim": 16, "depths": [1, 1], "focal_levels": [2, 2], "focal_windows": [3, 3]},
    "pvt": {**PVT, "sequence_reduction_ratios": [2, 1], "patch_sizes": [4, 2]},
    "pvt_v2": {**PVT, "sr_ratios": [2, 1], "patch_sizes": [7, 3]},
    "hiera": {"image_size": [32, 32], "patch_size": [3, 3], "patch_stride": [2, 2], "patch_padding": [1, 1],
              "embed_dim": 16, "num_heads": [1, 2], "depths": [1, 1], "query_stride": [2, 2],
              "masked_unit_size": [4, 4], "masked_unit_attention": [True, False], "num_query_pool": 1},
    "bit": {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "bottleneck",
            "global_padding": "SAME", "num_groups": 8},
    "resnet": {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1]},
    # CvT indexes its per-layer drop-path rates by stage: stage i needs i + 1 layers
    "cvt": {"embed_dim": [16, 32, 48], "num_heads": [1, 2, 3], "depth": [1, 2, 3]},
    "esmc": {"num_key_value_heads": 4},  # no grouped-query attention
    "neomme": {"head_dim": 16},  # its multimodal rope turns a quarter of each head, in pairs of two
    "perceiver": {"d_latents": 32, "num_latents": 8, "num_self_attends_per_block": 1, "num_self_attention_heads": 2,
                  "num_cross_attention_heads": 2},
    "mobilevitv2": {"width_multiplier": 0.25},
    # a dense short-convolution layer, then an attention layer with experts
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
}

#: architectures that are no model a user serves alone: why the probe does not build them
NOT_ALONE = {
    "gemma4_assistant": "Gemma 4 Assistant is a draft model: it attends to the target model's keys and values "
                        "(`shared_kv_states`), has no cache of its own and ignores its input ids",
}


@dataclass
class Target:
    """One architecture to serve: ``kind:model_type`` and the transformers class."""

    kind: str  # causal | seq2seq | encoder
    model_type: str
    cls: str
    inputs: str = "text"  # text | image

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.model_type}"


def catalogue() -> list[Target]:
    """Every architecture of the auto mappings, by kind (an encoder once: its classifier, else its masked LM)."""
    from transformers.models.auto import modeling_auto as m

    def first(names: Any) -> str:  # a mapping may name several classes (DeiT: with and without a teacher)
        return names[0] if isinstance(names, (list, tuple)) else names

    out = [Target("causal", t, c) for t, c in m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()]
    out += [Target("seq2seq", t, c) for t, c in m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.items()]
    text = dict(m.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    text.update(m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)
    out += [Target("encoder", t, first(c)) for t, c in sorted(text.items())]
    out += [Target("encoder", t, first(c), "image") for t, c in m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.items()
            if t not in text]
    return out


class Skip(Exception):
    """Not probed: the architecture cannot be built here (remote code, an extra dependency, no tiny config)."""


def _attr(config: Any, name: str) -> Any:
    """``config.name``, or None where the config refuses a global read (NeoMME: a per-layer attribute)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - transformers' AmbiguousGlobalPerLayerAttributeError
        return None


def tiny_config(config_cls: type, extra: dict[str, Any] | None = None) -> Any:
    """``config_cls``'s defaults with every size attribute it has shrunk to ``TINY`` (sub-configs too)."""
    default = config_cls()
    known = set(default.to_dict()) | set(getattr(config_cls, "attribute_map", {}))
    # a per-stage list (Swin's heads, PVT's sizes) keeps its default rather than become one number
    kw = {k: v for k, v in TINY.items() if k in known and (k.endswith("_token_id") or k == "image_size"
                                                           or not isinstance(_attr(default, k), (list, tuple)))}
    if isinstance(_attr(default, "sliding_window"), int) is False:
        kw.pop("sliding_window", None)  # None or a flag: the model has no window of its own
    for attr in getattr(config_cls, "sub_configs", None) or {}:
        sub = getattr(default, attr, None)
        if hasattr(sub, "to_dict"):  # the default's own sub-config class (an AutoConfig slot names none)
            try:
                kw[attr] = tiny_config(type(sub)).to_dict()
            except Exception:  # noqa: BLE001 - the parent's default stays
                pass
    if "kv_lora_rank" in kw:  # latent attention: every head has its own keys
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    types = getattr(default, "layer_types", None)
    n = kw.get("num_hidden_layers")
    name = getattr(config_cls, "attribute_map", {}).get("layer_types", "layer_types")
    settable = not isinstance(getattr(config_cls, name, None), property)  # RecurrentGemma derives its types
    if settable and isinstance(types, list) and n and len(types) > n and not ATTENTION & set(types[:n]) \
            and ATTENTION & set(types):
        # a hybrid whose first layers are all recurrent: keep one of each kind
        kw["layer_types"] = [types[0], next(t for t in types if t in ATTENTION)]
    kw.update(extra or {})
    try:
        return config_cls(**kw)
    except Exception:  # noqa: BLE001 - a validator ties the layer count to a per-layer list: keep the default count
        for key in LAYER_COUNTS:
            kw.pop(key, None)
        return config_cls(**kw)


def build(target: Target) -> torch.nn.Module:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_cls = CONFIG_MAPPING[target.model_type]
        model_cls = getattr(transformers, target.cls)
        # a composite config's causal LM (Llama 4, Qwen 3.5, Emu3, Musicgen) takes its text sub-config
        own = getattr(model_cls, "config_class", None)
        if own in (getattr(config_cls, "sub_configs", None) or {}).values():
            config_cls = own
    except (KeyError, AttributeError, ImportError) as e:
        raise Skip(f"not importable here: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    if target.model_type in NOT_ALONE:
        raise Skip(NOT_ALONE[target.model_type])
    try:
        config = tiny_config(config_cls, OVERRIDES.get(target.model_type))
        if target.kind == "encoder" and "SequenceClassification" in target.cls:
            config.num_labels = 3
        if target.kind == "causal" and hasattr(config, "is_decoder"):
            config.is_decoder = True  # BERT-like LM heads attend both ways unless told they decode
        with torch.device("meta"):  # counted before it is allocated: an unshrunk default may not fit in memory
            n = sum(p.numel() for p in model_cls(config).parameters())
        if n > 20_000_000:
            raise Skip(f"tiny config still has {n / 1e6:.0f}M parameters (a size attribute the shrink does not know)")
        torch.manual_seed(0)
        model = model_cls(config).eval()
        with torch.no_grad():  # a zero-initialised router ties every expert, and torch's top-k breaks ties its own way
            for param in model.parameters():
                if param.dim() >= 2 and not param.any():
                    param.normal_(0, 0.5, generator=torch.Generator().manual_seed(param.numel()))
    except Skip:
        raise
    except ImportError as e:
        raise Skip(f"needs an extra dependency: {str(e).splitlines()[0][:200]}") from None
    except Exception as e:  # noqa: BLE001 - reported as a skip with its reason
        raise Skip(f"no tiny config: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    return model


# -- the served forms -----------------------------------------------------------------------------------------------


def _policy(levels: dict[str, int]):
    from neuron_args.flags import with_optimization_level

    def compiler_args_for(graph_type: str | None, example_inputs: Any, base: Any) -> list[str]:
        base = list(base or [])
        return with_optimization_level(base, levels[graph_type]) if graph_type in levels else base

    return compiler_args_for


def served_causal(model: torch.nn.Module) -> torch.nn.Module:
    from neuron_args.graphs import GraphSpec
    from neuron_args.hf import StaticCausalLM

    lm = StaticCausalLM(model, max_cache_len=MAX_CACHE)
    lm.compiler_args_for = _policy({"decode": 3})
    lm.neuron_graphs = lambda: [
        GraphSpec("prefill", lm, {"s8": lambda: {"input_ids": torch.zeros(1, PROMPT, dtype=torch.long),
                                                 "start": torch.tensor(0)}}),
        GraphSpec("decode", lm, {"b1": lambda: {"input_ids": torch.zeros(1, 1, dtype=torch.long),
                                                "start": torch.tensor(PROMPT)}})]
    return lm


def causal_calls(run: Any) -> list[torch.Tensor]:
    """A prompt then greedy decode steps through ``run(graph_type, kwargs)``: each call's logits."""
    ids = torch.randint(3, V, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    out = [run("prefill", {"input_ids": ids, "start": torch.tensor(0)})]
    for i in range(DECODE_STEPS):
        nxt = out[-1][:, -1:].argmax(-1)
        out.append(run("decode", {"input_ids": nxt, "start": torch.tensor(PROMPT + i)}))
    return out


def served_seq2seq(model: torch.nn.Module) -> torch.nn.Module:
    from neuron_args.graphs import GraphSpec
    from neuron_args.hf import StaticSeq2SeqLM, encoder_width

    lm = StaticSeq2SeqLM(model, max_cache_len=MAX_CACHE, encoder_len=ENCODER_LEN)
    hidden = encoder_width(model)

    def step(start: int) -> dict[str, torch.Tensor]:
        return {"decoder_input_ids": torch.zeros(1, 1, dtype=torch.long),
                "encoder_hidden_states": torch.zeros(1, ENCODER_LEN, hidden), "start": torch.tensor(start)}

    lm.compiler_args_for = _policy({"encoder": 1, "decode": 3})
    lm.neuron_graphs = lambda: [
        GraphSpec("encoder", lm.encoder, {"e8": lambda: {"input_ids": torch.full((1, ENCODER_LEN), 3)}}),
        GraphSpec("prefill", lm.prefill, {"p1": lambda: step(0)}),
        GraphSpec("decode", lm.decode, {"b1": lambda: step(1)})]
    return lm


def seq2seq_calls(run: Any, start_token: int) -> list[torch.Tensor]:
    ids = torch.randint(3, V, (1, ENCODER_LEN), generator=torch.Generator().manual_seed(1))
    states = run("encoder", {"input_ids": ids})
    out, token = [states], start_token
    for i in range(S2S_STEPS):
        logits = run("prefill" if i == 0 else "decode",
                     {"decoder_input_ids": torch.tensor([[token]]), "encoder_hidden_states": states,
                      "start": torch.tensor(i)})
        out.append(logits)
        token = int(logits[0, -1].argmax())
    return out


class ServedEncoder(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, inputs: str) -> None:
        super().__init__()
        self.model = model
        self.inputs = inputs

    def forward(self, **kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(**kwargs).logits

    def buckets(self) -> dict[str, dict[str, torch.Tensor]]:
        if self.inputs == "image":
            return {f"b{b}": {"pixel_values": torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(b))}
                    for b in (1, 2)}
        eos = getattr(self.model.config, "eos_token_id", None)  # encoder-decoders pool at the end-of-sequence token
        eos = eos[0] if isinstance(eos, list) else eos if eos is not None else 2
        return {f"b{b}s{s}": {"input_ids": torch.cat([torch.randint(3, V, (b, s - 1), generator=torch.Generator()
                                                                    .manual_seed(b)), torch.full((b, 1), eos)], 1),
                              "attention_mask": torch.ones(b, s, dtype=torch.long)} for b, s in ((1, 8), (2, 16))}


def served_encoder(model: torch.nn.Module, inputs: str) -> torch.nn.Module:
    from neuron_args.graphs import GraphSpec

    enc = ServedEncoder(model, inputs)
    enc.compiler_args_for = _policy({"classify": 2})
    enc.neuron_graphs = lambda: [GraphSpec("classify", enc, {b: (lambda kw=kw: kw)
                                                             for b, kw in enc.buckets().items()})]
    return enc


def served(target: Target, model: torch.nn.Module) -> torch.nn.Module:
    if target.kind == "causal":
        return served_causal(model)
    if target.kind == "seq2seq":
        return served_seq2seq(model)
    return served_encoder(model, target.inputs)


def calls(target: Target, lm: torch.nn.Module, run: Any) -> list[torch.Tensor]:
    if target.kind == "causal":
        return causal_calls(run)
    if target.kind == "seq2seq":
        start = getattr(lm.model.config, "decoder_start_token_id", None)
        start = start if start is not None else getattr(lm.model.generation_config, "decoder_start_token_id", None)
        return seq2seq_calls(run, start or 0)
    return [run("classify", kw) for kw in lm.buckets().values()]


def cache_tensors(target: Target, lm: torch.nn.Module) -> list[torch.Tensor]:
    if target.kind == "causal":
        layers = lm.cache.layers
    elif target.kind == "seq2seq":
        layers = lm.cache.self_attention_cache.layers + lm.cache.cross_attention_cache.layers
    else:
        return []
    out = []
    for layer in layers:  # keys and values, and a recurrent layer's states
        out += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None]
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            out += [t for t in states.values() if t is not None]
    return out


def eager_run(lm: torch.nn.Module, target: Target):
    """``run(graph_type, kwargs)`` calling the graph's entry module eagerly (the reference)."""
    entries = {g.graph_type: g.entry for g in lm.neuron_graphs()}

    def run(graph_type: str, kwargs: dict[str, Any]) -> torch.Tensor:
        with torch.inference_mode():
            return entries[graph_type](**kwargs)

    return run


def first_line(e: BaseException) -> str:
    while e.__cause__ is not None and not str(e).strip():
        e = e.__cause__
    text = " | ".join(t.strip() for t in str(e).strip().splitlines() if t.strip())
    return f"{type(e).__name__}: {text[:600]}"


def compare(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> float:
    assert len(got) == len(want), f"{what}: {len(got)} compiled, {len(want)} eager"
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"{what} {i}: shape {tuple(a.shape)} compiled, {tuple(b.shape)} eager"
        worst = max(worst, (a.float() - b.float()).abs().max().item() if a.numel() else 0.0)
        torch.testing.assert_close(a, b, **FP32, msg=lambda m, i=i: f"{what} {i}: {m}")
    return worst


def dynamo_alone(target: Target, model: torch.nn.Module) -> str:
    """The same calls through Dynamo's ``eager`` backend (fullgraph, no lowering): '' when they run."""
    torch._dynamo.reset()
    lm = served(target, copy.deepcopy(model))
    entries = {g.graph_type: torch.compile(g.entry, backend="eager", fullgraph=True, dynamic=False)
               for g in lm.neuron_graphs()}
    try:
        calls(target, lm, lambda g, kw: entries[g](**kw))
    except Exception as e:  # noqa: BLE001 - the verdict
        return first_line(e)
    finally:
        torch._dynamo.reset()
    return ""


def serve_once(target: Target, cache_dir: Path, manifests: Path, fresh: bool) -> dict[str, Any]:
    """Warm up (or, ``fresh``, load under the hit assert), serve, compare with eager; a result record."""
    from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
    from neuron_args.runner import NeuronRunner

    stage, result = "build", {}
    try:
        model = build(target)
    except Skip as e:
        return {"result": "skip", "stage": "build", "cause": str(e)}
    reference = copy.deepcopy(model)
    try:
        stage = "eager"
        ref_lm = served(target, reference)
        want = calls(target, ref_lm, eager_run(ref_lm, target))
        want_cache = cache_tensors(target, ref_lm)
        if target.kind == "causal":  # the wrapper itself: its calls' logits are the model's over the whole sequence
            stage = "wrapper"
            tokens = torch.cat([torch.randint(3, V, (1, PROMPT), generator=torch.Generator().manual_seed(1))]
                               + [step[:, -1:].argmax(-1) for step in want[:-1]], dim=1)
            with torch.inference_mode():
                whole = copy.deepcopy(model)(input_ids=tokens, use_cache=False).logits
            compare([torch.cat(want, dim=1)], [whole], "eager wrapper against the model's own no-cache forward:")
        stage = "wrap"
        torch._dynamo.reset()
        lm = served(target, model)
        runner = NeuronRunner(lm, compiler_args=BASE, compiler="local", cache_dir=cache_dir,
                              manifest_config={"model": target.name})
        os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(manifests)
        if fresh:
            os.environ[ASSERT_CACHE_HIT_ENV] = "1"
        stage = "warmup"
        report = runner.warmup()
        result["warmup"] = {g.graph_type + "/" + g.bucket: g.how for g in report.graphs}
        if fresh and report.counts.compiles:
            raise AssertionError(f"a fresh process compiled {report.counts.compiles} graph(s) in its warmup")
        stage = "serve"
        with runner.serve() as session, torch.inference_mode():
            got = calls(target, lm, runner.run)
        if session.counts.misses or session.counts.compiles:
            raise AssertionError(f"serving: {session.counts}")
        stage = "compare"
        result["max_diff"] = compare(got, want, "output")
        if want_cache:
            result["max_cache_diff"] = compare(cache_tensors(target, lm), want_cache, "cache tensor")
        stage = "cache"
        entries = CompileCache(cache_dir).entries()
        expected = len(report.graphs)
        if len(entries) != expected or len(set(report.keys)) != expected:
            raise AssertionError(f"{len(entries)} cache entries for {expected} graphs "
                                 f"({sorted(result['warmup'])}, keys {report.keys})")
        if not fresh:
            stage = "manifest"
            doc = json.loads(Path(report.manifest_path).read_text())
            named = doc["config"]["neuron_config"]["graph_types"]
            missing = [k for k in report.keys if k not in named]
            if missing:
                raise AssertionError(f"manifest {report.manifest_path} does not name {missing}")
        result.update(result="pass", entries=len(entries))
    except Exception as e:  # noqa: BLE001 - a probe reports every failure with its stage
        result.update(result="fail", stage=stage, cause=first_line(e), trace=traceback.format_exc()[-3000:])
        if stage in ("warmup", "serve", "compare", "cache") and not fresh:
            result["dynamo_alone"] = dynamo_alone(target, reference) or "runs"
    finally:
        os.environ.pop(ASSERT_CACHE_HIT_ENV if fresh else "NEURON_ARGS_PROBE_UNSET", None)
        torch._dynamo.reset()
    return result


def worker() -> int:
    """Read ``{"target": ..., "cache": ..., "fresh": ...}`` lines; answer each with one JSON line."""
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    for line in sys.stdin:
        job = json.loads(line)
        target = Target(**job["target"])
        t0 = time.time()
        result = serve_once(target, Path(job["cache"]), Path(job["manifests"]), job["fresh"])
        result["seconds"] = round(time.time() - t0, 1)
        sys.stdout.write("@@" + json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


class Worker:
    """A worker process; restarted after a crash or a timeout."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def ask(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.hf.probe_served", "--worker"], cwd=REPO,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True, bufsize=1)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        deadline = time.time() + timeout
        while time.time() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.time()))
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:  # the worker died
                code = self.proc.wait()
                self.proc = None
                return {"result": "fail", "stage": "crash", "cause": f"the worker process died (exit {code})"}
            if line.startswith("@@"):
                return json.loads(line[2:])
        self.kill()
        return {"result": "fail", "stage": "timeout", "cause": f"no result within {timeout:.0f} s"}

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="kind:model_type (default: every architecture of --kind)")
    p.add_argument("--kind", action="append", choices=["causal", "seq2seq", "encoder"])
    p.add_argument("--timeout", type=float, default=300, help="seconds per architecture and phase")
    p.add_argument("--out", type=Path, help="JSON file of results (merged into when it exists)")
    p.add_argument("--no-fresh", action="store_true", help="skip the fresh-process phase")
    p.add_argument("--skip-passed", action="store_true", help="leave out architectures --out records as passing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker()
    targets = {t.name: t for t in catalogue()}
    chosen = [targets[n] for n in args.names] if args.names else [
        t for t in targets.values() if not args.kind or t.kind in args.kind]
    results = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    if args.skip_passed:
        chosen = [t for t in chosen if results.get(t.name, {}).get("result") != "pass"]
    warm, fresh = Worker(), Worker()
    try:
        for target in chosen:
            with tempfile.TemporaryDirectory(prefix="probe-served-") as tmp:
                job = {"target": asdict(target), "cache": f"{tmp}/cache", "manifests": f"{tmp}/manifests"}
                result = warm.ask({**job, "fresh": False}, args.timeout)
                if result["result"] == "pass" and not args.no_fresh:
                    again = fresh.ask({**job, "fresh": True}, args.timeout)
                    if again["result"] != "pass":
                        result = {**again, "stage": f"fresh process: {again.get('stage')}"}
                    result["fresh"] = again.get("seconds")
            result["cls"] = target.cls
            results[target.name] = result
            cause = f" [{result['stage']}] {result.get('cause', '')}" if result["result"] != "pass" else \
                f" diff {result.get('max_diff', 0):.1e}, {result.get('entries')} entries"
            alone = f" (dynamo alone: {result['dynamo_alone']})" if "dynamo_alone" in result else ""
            print(f"{target.name} {target.cls}: {result['result'].upper()}{cause}{alone} "
                  f"{result.get('seconds', '?')}s", flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    finally:
        warm.kill()
        fresh.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
