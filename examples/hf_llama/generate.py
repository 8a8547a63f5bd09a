"""Greedy generation over the prefill and decode graphs, and the eager ``generate`` it must equal.

Every call goes through ``run(graph_type, kwargs)``, so one loop drives the eager module (the
default) and a runner's compiled graphs (``run=runner.run``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from examples.hf_llama.model import HFLlama

Run = Callable[[str, Mapping[str, Any]], torch.Tensor]


def eager_run(model: HFLlama) -> Run:
    def run(graph_type: str, kwargs: Mapping[str, Any]) -> torch.Tensor:
        with torch.inference_mode():
            return model(**kwargs)

    return run


def generate(model: HFLlama, prompt: list[int], *, max_new_tokens: int, run: Run | None = None) -> list[int]:
    """Prefill the prompt padded to its bucket, then decode one token at a time until EOS or the limit."""
    run = run or eager_run(model)
    fits = [n for n in model.prefill_buckets if n >= len(prompt)]
    if not prompt or not fits:
        raise ValueError(f"prompt of {len(prompt)} tokens: prefill buckets hold 1..{model.prefill_buckets[-1]}")
    if len(prompt) + max_new_tokens > model.max_cache_len:
        raise ValueError(f"{len(prompt)} prompt + {max_new_tokens} new tokens exceed the cache "
                         f"({model.max_cache_len} positions)")
    ids = torch.zeros(1, fits[0], dtype=torch.long)
    ids[0, : len(prompt)] = torch.tensor(prompt)
    logits = run("prefill", {"input_ids": ids, "start": torch.tensor(0)})
    token = int(logits[0, len(prompt) - 1].argmax())
    out = [token]
    while len(out) < max_new_tokens and token != model.eos_token_id:
        position = len(prompt) + len(out) - 1
        logits = run("decode", {"input_ids": torch.tensor([[token]]), "start": torch.tensor(position)})
        token = int(logits[0, 0].argmax())
        out.append(token)
    return out


def reference(model: HFLlama, prompt: list[int], *, max_new_tokens: int) -> list[int]:
    """The same continuation from ``transformers``' own greedy ``generate`` (its own cache)."""
    with torch.inference_mode():
        ids = model.model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=model.model.config.pad_token_id)
    return ids[0, len(prompt):].tolist()
