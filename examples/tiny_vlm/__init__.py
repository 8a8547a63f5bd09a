"""A tiny vision-language decoder (encoder, prefill, decode, jump-forward graphs) for neuron-args."""
from __future__ import annotations

from examples.tiny_vlm.generate import dist_gather_logits, eager_run, generate
from examples.tiny_vlm.model import TinyVLM, TinyVLMConfig

__all__ = ["TinyVLM", "TinyVLMConfig", "dist_gather_logits", "eager_run", "generate"]
