"""Tiny random configurations of the Hugging Face architectures the model matrix runs.

No download: every model is built from a config with random weights (seeded). Sizes are the
smallest that keep each architecture's distinctive parts (grouped-query attention, sliding
windows, soft-capping, fused projections, learned positions, patch embeddings).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

VOCAB = 128


@dataclass(frozen=True)
class Architecture:
    """One architecture of the matrix: how to build it and what kind of inputs it takes."""

    name: str
    # "decoder" or "seq2seq" (token ids in, logits out), "vision-language" (a prompt with image tokens and the image
    # in, logits out), "vision", "text-encoder", "audio" (mel features) or "speech" (raw waveform): hidden states out
    kind: str
    build: Callable[[], torch.nn.Module] = field(repr=False)
    supports_static_cache: bool = True
    #: the forward reads a tensor's value into a Python branch, so Dynamo splits it into several graphs
    #: (torch.compile without fullgraph=True); each graph is lowered and run
    graph_breaks: bool = False


def _decoder(config_cls: str, model_cls: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg).eval()

    return build


_LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

DECODERS = [
    Architecture("llama-sdpa", "decoder", _decoder("LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE,
                                                    attn_implementation="sdpa")),
    Architecture("llama-eager", "decoder", _decoder("LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE,
                                                     attn_implementation="eager")),
    Architecture("qwen3", "decoder", _decoder("Qwen3Config", "Qwen3ForCausalLM", **_LLAMA_LIKE, head_dim=16,
                                              attn_implementation="sdpa")),
    Architecture("mistral", "decoder", _decoder("MistralConfig", "MistralForCausalLM", **_LLAMA_LIKE,
                                                sliding_window=16, attn_implementation="sdpa")),
    Architecture("gemma2", "decoder", _decoder("Gemma2Config", "Gemma2ForCausalLM", **_LLAMA_LIKE, head_dim=16,
                                               sliding_window=16, query_pre_attn_scalar=16,
                                               attn_implementation="eager")),
    Architecture("phi3", "decoder", _decoder("Phi3Config", "Phi3ForCausalLM", **_LLAMA_LIKE, pad_token_id=0,
                                             attn_implementation="sdpa")),
    Architecture("gpt2", "decoder", _decoder("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=64,
                                             n_layer=2, n_head=4, n_positions=64, attn_implementation="sdpa")),
]

_VISION = dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_channels=3)

ENCODERS = [
    Architecture("vit", "vision", _decoder("ViTConfig", "ViTModel", **_VISION, attn_implementation="sdpa"),
                 supports_static_cache=False),
    Architecture("clip-vision", "vision", _decoder("CLIPVisionConfig", "CLIPVisionModel", **_VISION,
                                                   attn_implementation="sdpa"), supports_static_cache=False),
    Architecture("siglip-vision", "vision", _decoder("SiglipVisionConfig", "SiglipVisionModel", **_VISION,
                                                     attn_implementation="sdpa"), supports_static_cache=False),
]

def _whisper_encoder() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return transformers.WhisperModel(cfg).get_encoder().eval()


_BERT_LIKE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  max_position_embeddings=64)
_SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
               conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64)

# one layer, hidden 32: the architectures added last pay for breadth, not depth
_SMALL_LLAMA = dict(_LLAMA_LIKE, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
_SMALL_BERT = dict(_BERT_LIKE, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
_SMALL_VISION = dict(_VISION, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1)
_SEQ2SEQ_SMALL = dict(_SEQ2SEQ, d_model=32, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64)

IMAGE_TOKEN = VOCAB - 1


def _llava() -> torch.nn.Module:
    """LLaVA: a CLIP vision tower projected into a Llama's embeddings at the prompt's image tokens. Called once
    eagerly: transformers installs its output-capturing hooks on the first call under a lock Dynamo cannot enter."""
    import transformers

    torch.manual_seed(0)
    vision = transformers.CLIPVisionConfig(**_SMALL_VISION)
    text = transformers.LlamaConfig(**_SMALL_LLAMA)
    model = transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)).eval()
    with torch.inference_mode():
        model(input_ids=image_prompt(1), pixel_values=pixel_values(1))
    return model


#: beyond the matrix: one fp32 forward each (other attention kinds, MoE, alibi, encoders, convolutions)
MORE = [
    Architecture("qwen2", "decoder", _decoder("Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE)),
    Architecture("mixtral-moe", "decoder", _decoder("MixtralConfig", "MixtralForCausalLM", **_LLAMA_LIKE,
                                                    num_local_experts=4, num_experts_per_tok=2)),
    Architecture("falcon-mqa", "decoder", _decoder("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB,
                                                   hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    Architecture("bloom-alibi", "decoder", _decoder("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB,
                                                    hidden_size=64, n_layer=2, n_head=4)),
    Architecture("gpt-neox", "decoder", _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", vocab_size=VOCAB,
                                                 hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, max_position_embeddings=64)),
    Architecture("gemma3", "decoder", _decoder("Gemma3TextConfig", "Gemma3ForCausalLM", **_LLAMA_LIKE, head_dim=16,
                                               sliding_window=16)),
    Architecture("bert", "text-encoder", _decoder("BertConfig", "BertModel", vocab_size=VOCAB, hidden_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                                  max_position_embeddings=64), supports_static_cache=False),
    Architecture("t5-encoder", "text-encoder", _decoder("T5Config", "T5EncoderModel", vocab_size=VOCAB, d_model=64,
                                                        d_kv=16, d_ff=128, num_layers=2, num_heads=4),
                 supports_static_cache=False),
    Architecture("whisper-encoder", "audio", _whisper_encoder, supports_static_cache=False),
    Architecture("dinov2", "vision", _decoder("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8,
                                              hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
                 supports_static_cache=False),
    Architecture("resnet", "vision", _decoder("ResNetConfig", "ResNetModel", embedding_size=16, hidden_sizes=[16, 32],
                                              depths=[1, 1], layer_type="basic"), supports_static_cache=False),
    Architecture("swin", "vision", _decoder("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16,
                                            depths=[1, 1], num_heads=[2, 2], window_size=4),
                 supports_static_cache=False),
    # decoders: learned positions, partial rotary, parallel blocks, QK norms, local attention, state spaces
    Architecture("opt", "decoder", _decoder("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=64, ffn_dim=128,
                                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                                            word_embed_proj_dim=64)),
    Architecture("gptj", "decoder", _decoder("GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_embd=64, n_layer=2,
                                             n_head=4, n_positions=64, rotary_dim=8)),
    Architecture("phi", "decoder", _decoder("PhiConfig", "PhiForCausalLM", **_LLAMA_LIKE)),
    Architecture("stablelm", "decoder", _decoder("StableLmConfig", "StableLmForCausalLM", **_LLAMA_LIKE)),
    Architecture("starcoder2", "decoder", _decoder("Starcoder2Config", "Starcoder2ForCausalLM", **_LLAMA_LIKE)),
    Architecture("olmo2", "decoder", _decoder("Olmo2Config", "Olmo2ForCausalLM", **_LLAMA_LIKE)),
    Architecture("gpt-bigcode-mqa", "decoder", _decoder("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB,
                                                        n_embd=64, n_layer=2, n_head=4, n_positions=64)),
    Architecture("gpt-neo-local", "decoder", _decoder("GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB,
                                                      hidden_size=64, num_layers=2, num_heads=4,
                                                      max_position_embeddings=64,
                                                      attention_types=[[["global", "local"], 1]], window_size=4)),
    Architecture("qwen2-moe", "decoder", _decoder("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **_LLAMA_LIKE, num_experts=4,
                                                  num_experts_per_tok=2, moe_intermediate_size=32,
                                                  shared_expert_intermediate_size=32)),
    Architecture("mamba", "decoder", _decoder("MambaConfig", "MambaForCausalLM", vocab_size=VOCAB, hidden_size=32,
                                              state_size=8, num_hidden_layers=2, intermediate_size=64, conv_kernel=4,
                                              time_step_rank=4), supports_static_cache=False),
    Architecture("jamba-hybrid", "decoder", _decoder("JambaConfig", "JambaForCausalLM", **_LLAMA_LIKE, num_experts=2,
                                                     num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
                                                     expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8,
                                                     mamba_dt_rank=4, mamba_expand=2, use_mamba_kernels=False),
                 supports_static_cache=False),
    # text encoders
    Architecture("roberta", "text-encoder", _decoder("RobertaConfig", "RobertaModel", **_BERT_LIKE),
                 supports_static_cache=False),
    Architecture("distilbert", "text-encoder", _decoder("DistilBertConfig", "DistilBertModel", vocab_size=VOCAB, dim=64,
                                                        n_layers=2, n_heads=4, hidden_dim=128,
                                                        max_position_embeddings=64), supports_static_cache=False),
    Architecture("albert", "text-encoder", _decoder("AlbertConfig", "AlbertModel", **_BERT_LIKE, embedding_size=32),
                 supports_static_cache=False),
    Architecture("deberta-v2", "text-encoder", _decoder("DebertaV2Config", "DebertaV2Model", **_BERT_LIKE),
                 supports_static_cache=False),
    # speech, vision and encoder-decoder models
    Architecture("wav2vec2", "speech", _decoder("Wav2Vec2Config", "Wav2Vec2Model", **_SPEECH), supports_static_cache=False),
    Architecture("convnext", "vision", _decoder("ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32], depths=[1, 1],
                                                num_stages=2), supports_static_cache=False),
    Architecture("mobilevit", "vision", _decoder("MobileViTConfig", "MobileViTModel", image_size=32,
                                                 hidden_sizes=[32, 32, 32], neck_hidden_sizes=[8, 8, 16, 16, 16, 32, 64],
                                                 num_attention_heads=2), supports_static_cache=False),
    Architecture("segformer", "vision", _decoder("SegformerConfig", "SegformerModel", num_encoder_blocks=2, depths=[1, 1],
                                                 sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                 patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
                 supports_static_cache=False),
    Architecture("bart", "seq2seq", _decoder("BartConfig", "BartForConditionalGeneration", **_SEQ2SEQ),
                 supports_static_cache=False),
    Architecture("t5", "seq2seq", _decoder("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB, d_model=64, d_kv=16,
                                           d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0),
                 supports_static_cache=False),
    # decoders: GeGLU and scaled embeddings, parallel blocks with logit scale, MoE with QK norms
    Architecture("gemma", "decoder", _decoder("GemmaConfig", "GemmaForCausalLM", **_SMALL_LLAMA, head_dim=8)),
    Architecture("cohere", "decoder", _decoder("CohereConfig", "CohereForCausalLM", **_SMALL_LLAMA)),
    Architecture("qwen3-moe", "decoder", _decoder("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **_SMALL_LLAMA, head_dim=8,
                                                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
    # text encoders: sliding-window chunks (as_strided over transposed memory), relative positions, rotary
    # positions, a causal text tower pooled at its end-of-text token
    Architecture("longformer", "text-encoder", _decoder("LongformerConfig", "LongformerModel", **_SMALL_BERT,
                                                        attention_window=4), supports_static_cache=False,
                 graph_breaks=True),
    Architecture("mpnet", "text-encoder", _decoder("MPNetConfig", "MPNetModel", **_SMALL_BERT),
                 supports_static_cache=False),
    Architecture("esm", "text-encoder", _decoder("EsmConfig", "EsmModel", **_SMALL_BERT, pad_token_id=1),
                 supports_static_cache=False),
    Architecture("clip-text", "text-encoder", _decoder("CLIPTextConfig", "CLIPTextModel", vocab_size=VOCAB, hidden_size=32,
                                                       intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                       max_position_embeddings=64), supports_static_cache=False),
    # vision: relative position bias, a dense-prediction neck (reassemble, fusion, interpolation);
    # seq2seq: sinusoidal positions
    Architecture("beit", "vision", _decoder("BeitConfig", "BeitModel", **_SMALL_VISION, use_relative_position_bias=True),
                 supports_static_cache=False),
    Architecture("dpt", "vision", _decoder("DPTConfig", "DPTModel", **{**_SMALL_VISION, "num_hidden_layers": 2},
                                           backbone_out_indices=[0, 1]), supports_static_cache=False),
    Architecture("m2m100", "seq2seq", _decoder("M2M100Config", "M2M100ForConditionalGeneration", **_SEQ2SEQ_SMALL,
                                               decoder_start_token_id=2), supports_static_cache=False),
    # vision-language: image features scattered into the prompt's embeddings (its token-count check left out)
    Architecture("llava", "vision-language", _llava, supports_static_cache=False),
    # decoders: multi-head latent attention (low-rank q/kv, split rope/nope heads) with sigmoid group-routed experts;
    # gated delta-rule linear attention (a chunked recurrence) beside full attention
    Architecture("deepseek-v3-mla", "decoder", _decoder(
        "DeepseekV3Config", "DeepseekV3ForCausalLM", **_SMALL_LLAMA | dict(num_key_value_heads=4), q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0, n_group=1, topk_group=1)),
    Architecture("qwen3-next", "decoder", _decoder(
        "Qwen3NextConfig", "Qwen3NextForCausalLM", **_SMALL_LLAMA | dict(num_hidden_layers=2), head_dim=8,
        layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16), supports_static_cache=False),
]

#: every architecture by name (the matrix runs DECODERS and ENCODERS; MORE has one fp32 forward each)
ARCHITECTURES = {a.name: a for a in DECODERS + ENCODERS + MORE}


def token_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def audio_features(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 16, 32, generator=torch.Generator().manual_seed(seed))


def waveform(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 400, generator=torch.Generator().manual_seed(seed))


def image_prompt(batch: int, seed: int = 1) -> torch.Tensor:
    """Token ids with one image's 16 patch tokens (32x32 pixels, 8x8 patches) after two text tokens."""
    ids = token_ids(batch, 24, seed) % IMAGE_TOKEN
    ids[:, 2:18] = IMAGE_TOKEN
    return ids


def pixel_values(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
