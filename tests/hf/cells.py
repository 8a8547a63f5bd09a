"""The calls each cell of the model matrix makes, shared by the tests and the fresh-process check."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.hf.architectures import Architecture, audio_features, image_prompt, pixel_values, token_ids, waveform

BASE_ARGS = ["--auto-cast=none", "-O1"]
FP32 = {"atol": 1e-4, "rtol": 1e-4}
BF16 = {"atol": 2e-2, "rtol": 2e-2}


def output(arch: Architecture, result: object) -> torch.Tensor:
    return result.logits if arch.kind in ("decoder", "seq2seq", "vision-language") else result.last_hidden_state


def inputs(arch: Architecture, size: int) -> dict[str, torch.Tensor]:
    """Token ids of length ``size`` (batch 2; with labels of length 6 for seq2seq), or ``size`` images, audio clips or
    image prompts."""
    if arch.kind == "decoder":
        return {"input_ids": token_ids(2, size), "use_cache": False}
    if arch.kind == "seq2seq":
        return {"input_ids": token_ids(2, size), "labels": token_ids(2, 6, seed=2), "use_cache": False}
    if arch.kind == "text-encoder":
        return {"input_ids": token_ids(2, size), "attention_mask": torch.ones(2, size, dtype=torch.long)}
    if arch.kind == "vision-language":  # a prompt with one image's tokens, and the image
        return {"input_ids": image_prompt(size), "pixel_values": pixel_values(size)}
    if arch.kind == "audio":
        return {"input_features": audio_features(size)}
    if arch.kind == "speech":
        return {"input_values": waveform(size)}
    return {"pixel_values": pixel_values(size)}


#: the two shapes of the no-cache forward: two sequence lengths, or two batch sizes
SIZES = {"decoder": (8, 16), "seq2seq": (8, 16), "text-encoder": (8, 16), "vision": (1, 2), "audio": (1, 2),
         "speech": (1, 2), "vision-language": (1, 2)}


def first_forward(arch: Architecture, compiled: torch.nn.Module, model: torch.nn.Module
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first no-cache call (its graph is the one the fresh-process check must find built)."""
    kwargs = inputs(arch, SIZES[arch.kind][0])
    with torch.inference_mode():
        return output(arch, compiled(**kwargs)), output(arch, model(**kwargs))


def compile_options(cache_dir: Path) -> dict[str, Any]:
    return {"cache_dir": str(cache_dir), "compiler": "local", "compiler_args": list(BASE_ARGS), "target": "trn2"}
