"""Probe transformers architectures beyond the suite: a tiny random config each (built in code, no download), one fp32
forward lowered and run on XLA:CPU in-process (as ``test_more_architectures.py``), compared with eager (atol = rtol =
1e-4, every tensor of the output).

    .venv/bin/python -m tests.hf.probe_architectures              # every probe
    .venv/bin/python -m tests.hf.probe_architectures sam mllama   # some

One line per architecture: ``PASS (fullgraph)``, ``PASS (graph breaks: why fullgraph=True failed)`` -- Dynamo then
splits the forward and every graph is lowered and run -- or ``FAIL`` with the error. docs/MODEL_COVERAGE.md lists
the outcome of the last run (``PROBED`` in scripts/model_coverage.py). Not a test: the suite keeps only the
architectures that exercise something the others do not.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from tests.xla_run import run_on_xla_cpu

import transformers as T  # noqa: E402 - after torch, as the suite imports them

V = 128
L = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)
B = dict(
    vocab_size=V,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    pad_token_id=0,
)
VIS = dict(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_channels=3,
)
SP = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)
S2S = dict(
    vocab_size=V,
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)

TS = dict(
    prediction_length=4,
    context_length=8,
    lags_sequence=[1, 2],
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    num_time_features=1,
)
PVT = dict(
    num_encoder_blocks=2,
    depths=[1, 1],
    hidden_sizes=[16, 32],
    strides=[4, 2],
    num_attention_heads=[1, 2],
    mlp_ratios=[2, 2],
)


def g(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ids(b: int = 2, n: int = 16, seed: int = 1, hi: int = V) -> torch.Tensor:
    return torch.randint(3, hi, (b, n), generator=g(seed))


def img(b: int = 2, c: int = 3, s: int = 32) -> torch.Tensor:
    return torch.randn(b, c, s, s, generator=g(1))


def wav(b: int = 2, n: int = 400) -> torch.Tensor:
    return torch.randn(b, n, generator=g(1))


def series() -> dict[str, Any]:
    """A time-series model's inputs: 10 past steps (8 of context, 2 lags) and 4 to predict, one time feature."""
    return {
        "past_values": torch.randn(2, 10, generator=g(1)),
        "past_time_features": torch.randn(2, 10, 1, generator=g(2)),
        "past_observed_mask": torch.ones(2, 10),
        "future_values": torch.randn(2, 4, generator=g(3)),
        "future_time_features": torch.randn(2, 4, 1, generator=g(4)),
        "use_cache": False,
    }


def build(cfg_name: str, model_name: str, **kw: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = getattr(T, cfg_name)(**kw)
    return getattr(T, model_name)(cfg).eval()


dec = lambda c, m, **kw: (lambda: build(c, m, **{**L, **kw}), lambda: {"input_ids": ids(), "use_cache": False})
txt = lambda c, m, **kw: (
    lambda: build(c, m, **{**B, **kw}),
    lambda: {"input_ids": ids(), "attention_mask": torch.ones(2, 16, dtype=torch.long)},
)
vis = lambda c, m, **kw: (lambda: build(c, m, **kw), lambda: {"pixel_values": img()})
speech = lambda c, m, **kw: (lambda: build(c, m, **{**SP, **kw}), lambda: {"input_values": wav()})
s2s = lambda c, m, **kw: (
    lambda: build(c, m, **{**S2S, **kw}),
    lambda: {"input_ids": ids(), "labels": ids(2, 6, seed=2), "use_cache": False},
)

P = {
    # decoders
    "deepseek_v3-mla": dec(
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        head_dim=8,
        num_key_value_heads=4,
    ),
    "deepseek_v2": dec(
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        num_key_value_heads=4,
    ),
    "olmoe": dec("OlmoeConfig", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2),
    "granite": dec(
        "GraniteConfig",
        "GraniteForCausalLM",
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        logits_scaling=2.0,
        attention_multiplier=0.3,
    ),
    "granitemoe": dec("GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "granitemoehybrid": dec(
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        layer_types=["mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
    ),
    "phimoe": dec("PhimoeConfig", "PhimoeForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "dbrx": (
        lambda: build(
            "DbrxConfig",
            "DbrxForCausalLM",
            d_model=32,
            n_heads=4,
            n_layers=1,
            max_seq_len=64,
            vocab_size=V,
            ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "nemotron": dec("NemotronConfig", "NemotronForCausalLM", partial_rotary_factor=0.5),
    "glm": dec("GlmConfig", "GlmForCausalLM", head_dim=8, pad_token_id=0),
    "glm4": dec("Glm4Config", "Glm4ForCausalLM", head_dim=8),
    "glm4_moe": dec(
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
    ),
    "helium": dec("HeliumConfig", "HeliumForCausalLM", head_dim=8),
    "recurrent_gemma": dec(
        "RecurrentGemmaConfig",
        "RecurrentGemmaForCausalLM",
        num_hidden_layers=3,
        lru_width=32,
        attention_window_size=8,
        block_types=["recurrent", "recurrent", "attention"],
        num_key_value_heads=1,
        conv1d_width=4,
    ),
    "rwkv": (
        lambda: build(
            "RwkvConfig",
            "RwkvForCausalLM",
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            attention_hidden_size=32,
            intermediate_size=64,
            context_length=64,
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "mamba2": (
        lambda: build(
            "Mamba2Config",
            "Mamba2ForCausalLM",
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=1,
            num_heads=4,
            head_dim=16,
            state_size=8,
            n_groups=1,
            chunk_size=8,
            expand=2,
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "zamba2": dec(
        "Zamba2Config",
        "Zamba2ForCausalLM",
        num_hidden_layers=2,
        layers_block_type=["mamba", "hybrid"],
        mamba_d_state=8,
        mamba_headdim=8,
        n_mamba_heads=8,
        mamba_ngroups=1,
        chunk_size=8,
        hybrid_layer_ids=[1],
        use_mem_rope=True,
    ),
    "bamba": dec(
        "BambaConfig",
        "BambaForCausalLM",
        num_hidden_layers=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
    ),
    "falcon_h1": dec(
        "FalconH1Config",
        "FalconH1ForCausalLM",
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_chunk_size=8,
        head_dim=8,
        mamba_d_ssm=64,
    ),
    "llama4-text": dec(
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=1,
        intermediate_size_mlp=64,
        interleave_moe_layer_step=1,
        no_rope_layers=[1],
        attention_chunk_size=8,
    ),
    "qwen3_next": dec(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        head_dim=8,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        decoder_sparse_step=1,
    ),
    "lfm2": dec(
        "Lfm2Config",
        "Lfm2ForCausalLM",
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        conv_L_cache=3,
        block_ff_dim=64,
    ),
    "smollm3": dec("SmolLM3Config", "SmolLM3ForCausalLM"),
    "ernie4_5_moe": dec(
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        moe_num_experts=4,
        moe_k=2,
        moe_intermediate_size=16,
        moe_layer_start_index=0,
    ),
    "minimax-lightning": dec(
        "MiniMaxConfig",
        "MiniMaxForCausalLM",
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        block_size=8,
    ),
    "exaone4": dec("Exaone4Config", "Exaone4ForCausalLM", head_dim=8, sliding_window=8),
    "cohere2": dec(
        "Cohere2Config",
        "Cohere2ForCausalLM",
        head_dim=8,
        sliding_window=8,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "mpt": (
        lambda: build("MptConfig", "MptForCausalLM", vocab_size=V, d_model=32, n_heads=4, n_layers=1, max_seq_len=64),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "codegen": (
        lambda: build(
            "CodeGenConfig",
            "CodeGenForCausalLM",
            vocab_size=V,
            n_embd=32,
            n_layer=1,
            n_head=4,
            n_positions=64,
            rotary_dim=4,
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "biogpt": dec("BioGptConfig", "BioGptForCausalLM"),
    "persimmon": dec("PersimmonConfig", "PersimmonForCausalLM"),
    "xglm": (
        lambda: build(
            "XGLMConfig",
            "XGLMForCausalLM",
            vocab_size=V,
            d_model=32,
            ffn_dim=64,
            num_layers=1,
            attention_heads=4,
            max_position_embeddings=64,
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "ctrl": (
        lambda: build(
            "CTRLConfig", "CTRLLMHeadModel", vocab_size=V, n_embd=32, dff=64, n_layer=1, n_head=4, n_positions=64
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "openai-gpt": (
        lambda: build(
            "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", vocab_size=V, n_embd=32, n_layer=1, n_head=4, n_positions=64
        ),
        lambda: {"input_ids": ids()},
    ),
    "diffllama": dec("DiffLlamaConfig", "DiffLlamaForCausalLM"),
    "jetmoe": (
        lambda: build(
            "JetMoeConfig",
            "JetMoeForCausalLM",
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=1,
            num_key_value_heads=2,
            kv_channels=8,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=64,
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    "doge": dec("DogeConfig", "DogeForCausalLM", num_experts=16, num_experts_per_tok=2, is_moe=False),
    "olmo3": dec("Olmo3Config", "Olmo3ForCausalLM", sliding_window=8),
    "apertus": dec("ApertusConfig", "ApertusForCausalLM"),
    "seed_oss": dec("SeedOssConfig", "SeedOssForCausalLM", head_dim=8),
    "vaultgemma": dec("VaultGemmaConfig", "VaultGemmaForCausalLM", head_dim=8, sliding_window=8),
    "bitnet": dec("BitNetConfig", "BitNetForCausalLM"),
    "flex_olmo": dec("FlexOlmoConfig", "FlexOlmoForCausalLM", num_experts=4, num_experts_per_tok=2),
    "hunyuan_dense": dec("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", head_dim=8),
    "minimax_m2": dec(
        "MiniMaxM2Config", "MiniMaxM2ForCausalLM", head_dim=8, num_local_experts=4, num_experts_per_tok=2
    ),
    "lfm2_moe": dec(
        "Lfm2MoeConfig",
        "Lfm2MoeForCausalLM",
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        num_dense_layers=0,
    ),
    "arcee": dec("ArceeConfig", "ArceeForCausalLM"),
    "xlstm": (
        lambda: build(
            "xLSTMConfig",
            "xLSTMForCausalLM",
            vocab_size=V,
            hidden_size=32,
            embedding_dim=32,
            num_heads=2,
            num_blocks=1,
            qk_dim_factor=0.5,
            v_dim_factor=1.0,
            chunk_size=8,
            mode="train",
        ),
        lambda: {"input_ids": ids(), "use_cache": False},
    ),
    # text encoders
    "xlnet": (
        lambda: build("XLNetConfig", "XLNetModel", vocab_size=V, d_model=32, n_layer=1, n_head=2, d_inner=64),
        lambda: {"input_ids": ids(), "attention_mask": torch.ones(2, 16, dtype=torch.long), "use_mems": False},
    ),
    "funnel": (
        lambda: build(
            "FunnelConfig",
            "FunnelModel",
            vocab_size=V,
            d_model=32,
            n_head=2,
            d_head=16,
            d_inner=64,
            block_sizes=[1, 1],
            num_decoder_layers=1,
        ),
        lambda: {"input_ids": ids(), "attention_mask": torch.ones(2, 16, dtype=torch.long)},
    ),
    "electra": txt("ElectraConfig", "ElectraModel", embedding_size=16),
    "big_bird-block-sparse": (
        lambda: build(
            "BigBirdConfig",
            "BigBirdModel",
            **{**B, "max_position_embeddings": 128},
            attention_type="block_sparse",
            block_size=4,
            num_random_blocks=1,
        ),
        lambda: {"input_ids": ids(2, 64), "attention_mask": torch.ones(2, 64, dtype=torch.long)},
    ),
    "reformer-lsh": (
        lambda: build(
            "ReformerConfig",
            "ReformerModel",
            vocab_size=V,
            hidden_size=32,
            num_attention_heads=2,
            attention_head_size=16,
            attn_layers=["local", "lsh"],
            feed_forward_size=64,
            axial_pos_embds=True,
            axial_pos_shape=[4, 4],
            axial_pos_embds_dim=[16, 16],
            max_position_embeddings=16,
            lsh_attn_chunk_length=4,
            local_attn_chunk_length=4,
            num_buckets=4,
            num_hashes=1,
            hash_seed=0,
            is_decoder=False,
        ),
        lambda: {"input_ids": ids()},
    ),
    "modernbert": txt(
        "ModernBertConfig", "ModernBertModel", global_attn_every_n_layers=1, local_attention=8, num_hidden_layers=2
    ),
    "roformer": txt("RoFormerConfig", "RoFormerModel"),
    "canine": (
        lambda: build(
            "CanineConfig",
            "CanineModel",
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            num_hash_buckets=64,
            downsampling_rate=4,
            local_transformer_stride=4,
        ),
        lambda: {"input_ids": ids(2, 16, hi=1000), "attention_mask": torch.ones(2, 16, dtype=torch.long)},
    ),
    "convbert": txt("ConvBertConfig", "ConvBertModel", embedding_size=32),
    "nystromformer": txt(
        "NystromformerConfig",
        "NystromformerModel",
        num_landmarks=4,
        segment_means_seq_len=16,
        max_position_embeddings=64,
    ),
    "yoso": txt("YosoConfig", "YosoModel", use_expectation=True, max_position_embeddings=64),
    "mra": txt("MraConfig", "MraModel", block_per_row=2, approx_mode="full", max_position_embeddings=64),
    "squeezebert": txt(
        "SqueezeBertConfig",
        "SqueezeBertModel",
        embedding_size=32,
        q_groups=2,
        k_groups=2,
        v_groups=2,
        post_attention_groups=2,
        intermediate_groups=2,
        output_groups=2,
    ),
    "megatron-bert": txt("MegatronBertConfig", "MegatronBertModel"),
    "ibert": txt("IBertConfig", "IBertModel"),
    "ernie": txt("ErnieConfig", "ErnieModel"),
    "rembert": txt("RemBertConfig", "RemBertModel", input_embedding_size=16, output_embedding_size=16),
    "fnet": (
        lambda: build(
            "FNetConfig",
            "FNetModel",
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=1,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        lambda: {"input_ids": ids()},
    ),
    "mobilebert": txt(
        "MobileBertConfig",
        "MobileBertModel",
        embedding_size=16,
        intra_bottleneck_size=16,
        true_hidden_size=16,
        num_feedforward_networks=2,
    ),
    "xlm": (
        lambda: build(
            "XLMConfig", "XLMModel", vocab_size=V, emb_dim=32, n_layers=1, n_heads=2, max_position_embeddings=64
        ),
        lambda: {"input_ids": ids(), "attention_mask": torch.ones(2, 16, dtype=torch.long)},
    ),
    "luke": txt("LukeConfig", "LukeModel", entity_vocab_size=16, entity_emb_size=16),
    "xmod": txt("XmodConfig", "XmodModel", languages=["en_XX"], default_language="en_XX"),
    "layoutlm": (
        lambda: build("LayoutLMConfig", "LayoutLMModel", **B),
        lambda: {"input_ids": ids(), "bbox": torch.randint(0, 500, (2, 16, 4), generator=g(3)).sort(-1)[0]},
    ),
    "tapas": (
        lambda: build("TapasConfig", "TapasModel", **B),
        lambda: {"input_ids": ids(), "token_type_ids": torch.zeros(2, 16, 7, dtype=torch.long)},
    ),
    # speech / audio
    "hubert": speech("HubertConfig", "HubertModel"),
    "wavlm": speech("WavLMConfig", "WavLMModel", num_buckets=32, max_bucket_distance=64),
    "data2vec-audio": speech(
        "Data2VecAudioConfig", "Data2VecAudioModel", conv_pos_kernel_size=4, num_conv_pos_embeddings=4
    ),
    "sew": speech("SEWConfig", "SEWModel", squeeze_factor=2),
    "unispeech": speech("UniSpeechConfig", "UniSpeechModel"),
    "unispeech-sat": speech("UniSpeechSatConfig", "UniSpeechSatModel"),
    "wav2vec2-conformer-rel": speech(
        "Wav2Vec2ConformerConfig",
        "Wav2Vec2ConformerModel",
        position_embeddings_type="relative",
        conv_depthwise_kernel_size=3,
    ),
    "wav2vec2-conformer-rotary": speech(
        "Wav2Vec2ConformerConfig",
        "Wav2Vec2ConformerModel",
        position_embeddings_type="rotary",
        conv_depthwise_kernel_size=3,
    ),
    "wav2vec2-bert": (
        lambda: build(
            "Wav2Vec2BertConfig",
            "Wav2Vec2BertModel",
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            feature_projection_input_dim=16,
            conv_depthwise_kernel_size=3,
            position_embeddings_type="relative_key",
            left_max_position_embeddings=8,
            right_max_position_embeddings=8,
        ),
        lambda: {"input_features": torch.randn(2, 20, 16, generator=g(1))},
    ),
    "ast": (
        lambda: build(
            "ASTConfig",
            "ASTModel",
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            patch_size=8,
            max_length=32,
            num_mel_bins=16,
            frequency_stride=8,
            time_stride=8,
        ),
        lambda: {"input_values": torch.randn(2, 32, 16, generator=g(1))},
    ),
    "moonshine": (
        lambda: build(
            "MoonshineConfig",
            "MoonshineModel",
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            encoder_num_hidden_layers=1,
            decoder_num_hidden_layers=1,
            encoder_num_attention_heads=2,
            decoder_num_attention_heads=2,
            encoder_num_key_value_heads=2,
            decoder_num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        lambda: {"input_values": wav(2, 1000), "decoder_input_ids": ids(2, 4), "use_cache": False},
    ),
    # vision
    "vit-mae": (
        lambda: build("ViTMAEConfig", "ViTMAEModel", **VIS, mask_ratio=0.5),
        lambda: {"pixel_values": img(), "noise": torch.rand(2, 16, generator=g(4))},
    ),
    "deit": vis("DeiTConfig", "DeiTModel", **VIS),
    "levit": vis(
        "LevitConfig",
        "LevitModel",
        image_size=32,
        hidden_sizes=[16, 32, 48],
        num_attention_heads=[1, 2, 3],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
        patch_size=16,
        kernel_size=3,
        stride=2,
        down_ops=[["Subsample", 8, 1, 4, 2, 2], ["Subsample", 8, 2, 4, 2, 2]],
    ),
    "regnet": vis("RegNetConfig", "RegNetModel", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
    "efficientnet": vis(
        "EfficientNetConfig",
        "EfficientNetModel",
        image_size=32,
        width_coefficient=0.25,
        depth_coefficient=0.25,
        hidden_dim=320,
    ),
    "mobilenet_v2": vis("MobileNetV2Config", "MobileNetV2Model", image_size=32, depth_multiplier=0.25),
    "mobilenet_v1": vis("MobileNetV1Config", "MobileNetV1Model", image_size=32, depth_multiplier=0.25),
    "mobilevitv2": vis("MobileViTV2Config", "MobileViTV2Model", image_size=32, width_multiplier=0.25),
    "swinv2": vis(
        "Swinv2Config",
        "Swinv2Model",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    "poolformer": vis(
        "PoolFormerConfig",
        "PoolFormerModel",
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_encoder_blocks=2,
        patch_sizes=[7, 3],
        strides=[4, 2],
        padding=[2, 1],
    ),
    "convnextv2": vis("ConvNextV2Config", "ConvNextV2Model", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
    "focalnet": vis(
        "FocalNetConfig",
        "FocalNetModel",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        focal_levels=[2, 2],
        focal_windows=[3, 3],
    ),
    "pvt": vis("PvtConfig", "PvtModel", image_size=32, **PVT, sequence_reduction_ratios=[2, 1], patch_sizes=[4, 2]),
    "pvt_v2": vis("PvtV2Config", "PvtV2Model", **PVT, sr_ratios=[2, 1], patch_sizes=[7, 3]),
    "hiera": vis(
        "HieraConfig",
        "HieraModel",
        image_size=[32, 32],
        patch_size=[3, 3],
        patch_stride=[2, 2],
        patch_padding=[1, 1],
        embed_dim=16,
        num_heads=[1, 2],
        depths=[1, 1],
        query_stride=[2, 2],
        masked_unit_size=[4, 4],
        masked_unit_attention=[True, False],
        num_query_pool=1,
    ),
    "bit": vis(
        "BitConfig",
        "BitModel",
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
        global_padding="SAME",
        num_groups=8,
    ),
    "dinov2-registers": vis("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", **VIS, num_register_tokens=2),
    "ijepa": vis("IJepaConfig", "IJepaModel", **VIS),
    "vitdet": vis(
        "VitDetConfig",
        "VitDetModel",
        **{k: v for k, v in VIS.items() if k != "intermediate_size"},
        window_size=2,
        window_block_indices=[0],
        use_relative_position_embeddings=True,
        pretrain_image_size=32,
    ),
    "yolos": vis("YolosConfig", "YolosModel", **{**VIS, "image_size": [32, 32]}, num_detection_tokens=4),
    "dinov3-vit": vis(
        "DINOv3ViTConfig",
        "DINOv3ViTModel",
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_register_tokens=2,
    ),
    "dinov3-convnext": vis("DINOv3ConvNextConfig", "DINOv3ConvNextModel", hidden_sizes=[16, 32], depths=[1, 1]),
    "aimv2-vision": vis("Aimv2VisionConfig", "Aimv2VisionModel", **VIS),
    "siglip2-vision": (
        lambda: build(
            "Siglip2VisionConfig",
            "Siglip2VisionModel",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_patches=16,
            patch_size=8,
        ),
        lambda: {
            "pixel_values": torch.randn(2, 16, 192, generator=g(1)),
            "pixel_attention_mask": torch.ones(2, 16, dtype=torch.long),
            "spatial_shapes": torch.tensor([[4, 4], [4, 4]]),
        },
    ),
    # time series / RL
    "patchtst": (
        lambda: build(
            "PatchTSTConfig",
            "PatchTSTModel",
            num_input_channels=3,
            context_length=32,
            patch_length=8,
            patch_stride=8,
            d_model=16,
            num_attention_heads=2,
            num_hidden_layers=1,
            ffn_dim=32,
        ),
        lambda: {"past_values": torch.randn(2, 32, 3, generator=g(1))},
    ),
    "decision_transformer": (
        lambda: build(
            "DecisionTransformerConfig",
            "DecisionTransformerModel",
            state_dim=4,
            act_dim=2,
            hidden_size=32,
            n_layer=1,
            n_head=2,
            max_ep_len=64,
            n_positions=64,
        ),
        lambda: {
            "states": torch.randn(2, 8, 4, generator=g(1)),
            "actions": torch.randn(2, 8, 2, generator=g(2)),
            "rewards": torch.randn(2, 8, 1, generator=g(3)),
            "returns_to_go": torch.randn(2, 8, 1, generator=g(4)),
            "timesteps": torch.arange(8).repeat(2, 1),
            "attention_mask": torch.ones(2, 8, dtype=torch.long),
        },
    ),
    "time_series_transformer": (
        lambda: build("TimeSeriesTransformerConfig", "TimeSeriesTransformerModel", **TS),
        series,
    ),
    "informer": (lambda: build("InformerConfig", "InformerModel", **TS, attention_type="full"), series),
    # seq2seq
    "pegasus": s2s("PegasusConfig", "PegasusForConditionalGeneration"),
    "marian": s2s("MarianConfig", "MarianMTModel"),
    "mbart": s2s("MBartConfig", "MBartForConditionalGeneration"),
    "led": s2s(
        "LEDConfig",
        "LEDForConditionalGeneration",
        max_encoder_position_embeddings=64,
        max_decoder_position_embeddings=64,
        attention_window=[4],
    ),
    "blenderbot": s2s("BlenderbotConfig", "BlenderbotForConditionalGeneration"),
    "plbart": s2s("PLBartConfig", "PLBartForConditionalGeneration"),
    "fsmt": (
        lambda: build(
            "FSMTConfig",
            "FSMTForConditionalGeneration",
            langs=["en", "de"],
            src_vocab_size=V,
            tgt_vocab_size=V,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        ),
        lambda: {"input_ids": ids(), "labels": ids(2, 6, seed=2), "use_cache": False},
    ),
    "umt5": (
        lambda: build(
            "UMT5Config",
            "UMT5ForConditionalGeneration",
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=4,
            decoder_start_token_id=0,
        ),
        lambda: {"input_ids": ids(), "labels": ids(2, 6, seed=2), "use_cache": False},
    ),
    "switch_transformers": (
        lambda: build(
            "SwitchTransformersConfig",
            "SwitchTransformersForConditionalGeneration",
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            num_experts=4,
            encoder_sparse_step=2,
            decoder_sparse_step=2,
            decoder_start_token_id=0,
        ),
        lambda: {"input_ids": ids(), "labels": ids(2, 6, seed=2), "use_cache": False},
    ),
    "nllb_moe": s2s(
        "NllbMoeConfig",
        "NllbMoeForConditionalGeneration",
        num_experts=4,
        expert_capacity=8,
        encoder_sparse_step=1,
        decoder_sparse_step=1,
        router_dtype="float32",
    ),
    "prophetnet": (
        lambda: build(
            "ProphetNetConfig",
            "ProphetNetForConditionalGeneration",
            vocab_size=V,
            hidden_size=32,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_encoder_attention_heads=2,
            num_decoder_attention_heads=2,
            max_position_embeddings=64,
            ngram=2,
            num_buckets=8,
            relative_max_distance=16,
            decoder_start_token_id=0,
        ),
        lambda: {"input_ids": ids(), "labels": ids(2, 6, seed=2), "use_cache": False},
    ),
}


def _speecht5():
    torch.manual_seed(0)
    cfg = T.SpeechT5Config(
        vocab_size=V,
        hidden_size=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_max_relative_position=16,
    )
    return T.SpeechT5ForSpeechToText(cfg).eval()


P["speecht5"] = (_speecht5, lambda: {"input_values": wav(2, 800), "labels": ids(2, 6, seed=2), "use_cache": False})


TXT = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _qwen2vl(cls_cfg="Qwen2VLConfig", cls="Qwen2VLForConditionalGeneration", vision=None):
    torch.manual_seed(0)
    cfg = getattr(T, cls_cfg)(
        text_config=dict(TXT, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]}, head_dim=8),
        vision_config=vision
        or dict(
            depth=1,
            embed_dim=32,
            hidden_size=32,
            num_heads=2,
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
            mlp_ratio=2,
        ),
        image_token_id=V - 1,
        video_token_id=V - 2,
        vision_start_token_id=V - 3,
    )
    return getattr(T, cls)(cfg).eval()


def _qwen2vl_inputs():
    x = ids(1, 12, hi=V - 3)
    x[0, 2] = V - 3
    x[0, 3:7] = V - 1  # 16 patches merged 2x2 -> 4 tokens
    return {
        "input_ids": x,
        "pixel_values": torch.randn(16, 3 * 2 * 4 * 4, generator=g(2)),
        "image_grid_thw": torch.tensor([[1, 4, 4]]),
        "mm_token_type_ids": (x == V - 1).int(),
        "use_cache": False,
    }


ATTN = "eager"


def _paligemma():
    torch.manual_seed(0)
    cfg = T.PaliGemmaConfig(
        text_config=dict(TXT, model_type="gemma", head_dim=8, num_key_value_heads=1, attn_implementation=ATTN),
        vision_config=dict(VIS, model_type="siglip_vision_model", projection_dim=32),
        image_token_index=V - 1,
        vocab_size=V,
        projection_dim=32,
        hidden_size=32,
    )
    model = T.PaliGemmaForConditionalGeneration(cfg).eval()
    model.config.text_config._attn_implementation = ATTN
    return model


def _paligemma_inputs():
    x = ids(1, 20, hi=V - 1)
    x[0, :16] = V - 1
    return {"input_ids": x, "pixel_values": img(1), "use_cache": False}


def _blip():
    torch.manual_seed(0)
    cfg = T.BlipConfig(
        text_config=dict(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=64,
            encoder_hidden_size=32,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=16,
    )
    return T.BlipModel(cfg).eval()


def _sam():
    torch.manual_seed(0)
    cfg = T.SamConfig(
        vision_config=dict(
            hidden_size=32,
            output_channels=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=64,
            patch_size=16,
            mlp_dim=64,
            window_size=2,
            global_attn_indexes=[0],
            num_pos_feats=8,
        ),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=16, mask_input_channels=4),
        mask_decoder_config=dict(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, mlp_dim=32, iou_head_hidden_dim=16
        ),
    )
    return T.SamModel(cfg).eval()


def _idefics3():
    torch.manual_seed(0)
    cfg = T.Idefics3Config(
        text_config=dict(TXT, model_type="llama"),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        scale_factor=2,
        image_token_id=V - 1,
        vocab_size=V,
    )
    return T.Idefics3ForConditionalGeneration(cfg).eval()


def _idefics3_inputs():
    x = ids(1, 12, hi=V - 1)
    x[0, 2:6] = V - 1  # 16 patches / scale_factor^2 = 4 tokens
    return {"input_ids": x, "pixel_values": torch.randn(1, 1, 3, 32, 32, generator=g(1)), "use_cache": False}


def _mllama():
    torch.manual_seed(0)
    cfg = T.MllamaConfig(
        text_config=dict(TXT, cross_attention_layers=[0], num_hidden_layers=2, pad_token_id=0),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_global_layers=1,
            attention_heads=2,
            image_size=32,
            patch_size=8,
            max_num_tiles=1,
            intermediate_layers_indices=[0],
            vision_output_dim=64,
            supported_aspect_ratios=[[1, 1]],
        ),
        image_token_index=V - 1,
    )
    return T.MllamaForConditionalGeneration(cfg).eval()


def _mllama_inputs():
    x = ids(1, 12, hi=V - 1)
    x[0, 1] = V - 1
    return {
        "input_ids": x,
        "pixel_values": torch.randn(1, 1, 1, 3, 32, 32, generator=g(1)),
        "aspect_ratio_ids": torch.tensor([[1]]),
        "aspect_ratio_mask": torch.ones(1, 1, 1, dtype=torch.long),
        "cross_attention_mask": torch.ones(1, 12, 1, 1, dtype=torch.long),
        "use_cache": False,
    }


P.update(
    {
        "qwen2-vl-mrope": (_qwen2vl, _qwen2vl_inputs),
        "paligemma": (_paligemma, _paligemma_inputs),
        "blip": (_blip, lambda: {"input_ids": ids(2, 8), "pixel_values": img()}),
        "sam": (
            _sam,
            lambda: {"pixel_values": img(1, 3, 64), "input_points": torch.rand(1, 1, 2, 2, generator=g(2)) * 64},
        ),
        "idefics3": (_idefics3, _idefics3_inputs),
        "mllama": (_mllama, _mllama_inputs),
        "clip": (
            lambda: build(
                "CLIPConfig",
                "CLIPModel",
                text_config=dict(
                    vocab_size=V,
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    max_position_embeddings=64,
                ),
                vision_config=dict(VIS),
                projection_dim=16,
            ),
            lambda: {"input_ids": ids(2, 8), "pixel_values": img()},
        ),
    }
)


def tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (a ModelOutput, tuple or tensor), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    res = []
    for v in (out if isinstance(out, (tuple, list)) else [out]):
        if isinstance(v, torch.Tensor):
            res.append(v)
        elif isinstance(v, (tuple, list)):
            res += tensors(v)
    return res


#: models that call ``torch.from_numpy`` in their forward: under ``inference_mode`` Dynamo's guard on that tensor
#: fails on the frame that made it ("Guard failed on the same frame it was created", a Dynamo bug), so they run under
#: ``no_grad``
NO_GRAD = {"big_bird-block-sparse", "reformer-lsh"}


def probe(name: str) -> str:
    """One architecture's forward: fullgraph first, then with graph breaks; the outcome line."""
    build_fn, inp = P[name]
    t0 = time.time()
    model = build_fn()
    kwargs = inp()
    with torch.no_grad() if name in NO_GRAD else torch.inference_mode():
        want = model(**kwargs)
    for fullgraph in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(
            model, backend=aot_autograd(fw_compiler=run_on_xla_cpu), dynamic=False, fullgraph=fullgraph
        )
        try:
            with torch.no_grad() if name in NO_GRAD else torch.inference_mode():
                got = compiled(**kwargs)
        except Exception as e:
            if fullgraph:
                first = [l for l in str(e).strip().splitlines() if l.strip() and "raised:" not in l][0][:300]
                note = f"fullgraph failed: {type(e).__name__}: {first}"
                continue
            raise
        g, w = tensors(got), tensors(want)
        assert len(g) == len(w), f"{len(g)} outputs compiled, {len(w)} eager"
        worst = max(((a.float() - b.float()).abs().max().item() for a, b in zip(g, w) if a.numel()), default=0)
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, equal_nan=True)
        return f"PASS ({'fullgraph' if fullgraph else note}) {len(g)} outputs, max diff {worst:.2e}, {time.time() - t0:.1f}s"


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    failed = 0
    for name in argv or list(P):
        try:
            line = probe(name)
        except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
            lines = [t for t in str(e).strip().splitlines() if t.strip()]
            line, failed = f"FAIL {type(e).__name__}: {' | '.join(lines[:4])[:700]}", failed + 1
        print(f"{name}: {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
