"""Tiny encoder-decoders for generation (T5, BART, Marian, Whisper) and their served form, shared by the tests and the sweep.

Random configs whose greedy tokens vary from step to step (transformers' default initialization makes
a tiny T5 emit its pad token forever, and a tiny BART or Whisper repeat one token): a repeated token
would not show a decode step reading the wrong position or cross-attention state.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_args.flags import with_optimization_level
from neuron_args.graphs import GraphSpec
from neuron_args.hf import StaticSeq2SeqLM
from tests.hf.architectures import VOCAB, audio_features, token_ids

#: the runner's base arguments; the policy gives the encoder -O1 and decode -O3 (prefill keeps -O2)
BASE = ["--auto-cast=none", "-O2"]
LEVELS = {"encoder": 1, "prefill": 2, "decode": 3}
NEW_TOKENS = 6


@dataclass(frozen=True)
class Seq2Seq:
    name: str
    build: Callable[[], torch.nn.Module] = field(repr=False)
    #: the encoder bucket's inputs (batch 1; ``seed`` picks them) and the length of its output
    encoder_inputs: Callable[..., dict[str, torch.Tensor]] = field(repr=False)
    encoder_len: int


def _t5() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    with torch.no_grad():  # T5's own initialization makes a tiny model emit token 0 forever
        for name, param in model.named_parameters():
            if "layer_norm" not in name:
                param.normal_(0, 0.5)
    return model


def _bart() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        tie_word_embeddings=False, forced_eos_token_id=None)).eval()


def _marian() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0,
        decoder_start_token_id=0, eos_token_id=1, forced_eos_token_id=None, tie_word_embeddings=False)).eval()


def _whisper() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        init_std=1.0, begin_suppress_tokens=None, suppress_tokens=None)).eval()


SEQ2SEQ = {s.name: s for s in [
    Seq2Seq("t5", _t5, lambda seed=1: {"input_ids": token_ids(1, 8, seed) % (VOCAB - 3) + 3}, 8),
    Seq2Seq("bart", _bart, lambda seed=1: {"input_ids": token_ids(1, 8, seed) % (VOCAB - 3) + 3}, 8),
    Seq2Seq("marian", _marian, lambda seed=1: {"input_ids": token_ids(1, 8, seed) % (VOCAB - 3) + 3}, 8),
    Seq2Seq("whisper", _whisper, lambda seed=1: {"input_features": audio_features(1, seed)}, 16),  # 32 frames: 16 states
]}


class ServedSeq2Seq(StaticSeq2SeqLM):
    """An encoder-decoder as three graph types with their own arguments: encoder -O1, prefill (base), decode -O3."""

    def __init__(self, spec: Seq2Seq, max_cache_len: int = 16) -> None:
        super().__init__(spec.build(), max_cache_len=max_cache_len, encoder_len=spec.encoder_len)
        self.spec = spec
        self.hidden = self.model.config.d_model

    def compiler_args_for(self, graph_type: str | None, example_inputs: Any, base: Any) -> list[str]:
        base = list(base or [])
        return with_optimization_level(base, LEVELS[graph_type]) if graph_type in ("encoder", "decode") else base

    def neuron_graphs(self) -> list[GraphSpec]:
        def step(start: int) -> dict[str, torch.Tensor]:
            return {"decoder_input_ids": torch.zeros(1, 1, dtype=torch.long),
                    "encoder_hidden_states": torch.zeros(1, self.encoder_len, self.hidden), "start": torch.tensor(start)}

        return [GraphSpec("encoder", self.encoder, {"e1": self.spec.encoder_inputs}),
                GraphSpec("prefill", self.prefill, {"p1": lambda: step(0)}),
                GraphSpec("decode", self.decode, {"b1": lambda: step(1)})]

    def greedy(self, run: Callable[[str, dict[str, Any]], torch.Tensor], new_tokens: int = NEW_TOKENS,
               inputs: dict[str, torch.Tensor] | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy tokens after the decoder start token and each step's last-position logits, through ``run``."""
        states = run("encoder", inputs if inputs is not None else self.spec.encoder_inputs())
        tokens = [self.model.config.decoder_start_token_id]
        logits = []
        for i in range(new_tokens):
            graph = "prefill" if i == 0 else "decode"
            out = run(graph, {"decoder_input_ids": torch.tensor([[tokens[-1]]]), "encoder_hidden_states": states,
                              "start": torch.tensor(i)})
            logits.append(out[0, -1])
            tokens.append(int(out[0, -1].argmax()))
        return tokens[1:], logits


def eager_generate(model: torch.nn.Module, inputs: dict[str, torch.Tensor], new_tokens: int = NEW_TOKENS,
                   **kwargs: Any) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' own greedy ``generate``: the new tokens and each step's raw logits."""
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                             return_dict_in_generate=True, output_logits=True, **kwargs)
    return out.sequences[0, -new_tokens:].tolist(), [step[0] for step in out.logits]
