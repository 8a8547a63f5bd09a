"""Greedy generation over the model's graphs: encoder, per-prompt prefill, batched decode, jump-forward.

Every model call goes through ``run(graph_type, kwargs)`` with bucket-shaped inputs, so the same
loop drives the eager model (the default) and, later, a runner's compiled graphs. Tensor-parallel
ranks return their vocabulary slice; ``gather_logits`` joins the slices before the argmax.

Scheduling (what a caller can rely on):

* each prompt is prefilled alone in slot ``i`` (padded to its ``s`` bucket) -> first token;
* then all unfinished sequences decode together (padded to a ``b`` bucket with rows in the scratch
  slot ``max_batch - 1``, so at most ``max_batch - 1`` prompts);
* right after the first decode step, a sequence with ``forced`` tokens runs one ``jf`` call on its
  pending token plus the forced tokens (padded to a ``k`` bucket) and takes its next token from
  that call's logits.

``max_new_tokens`` counts the tokens the model chooses; the forced tokens come on top. The result
of each prompt is everything appended after it, forced tokens included, in order.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from examples.tiny_vlm.model import TinyVLM, choose_bucket, pad_to_bucket

__all__ = ["Run", "dist_gather_logits", "eager_run", "generate"]

Run = Callable[[str, Mapping[str, Any]], torch.Tensor]


def _identity(local: torch.Tensor) -> torch.Tensor:
    return local


def dist_gather_logits(local: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-gather each rank's ``[B, V/tp]`` logits into ``[B, V]`` (rank order = vocab order)."""
    import torch.distributed as dist

    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)


def eager_run(model: TinyVLM) -> Run:
    """``run`` that calls each graph type's entry module from ``model.neuron_graphs()`` eagerly."""
    entries = {spec.graph_type: spec.entry for spec in model.neuron_graphs()}

    def run(graph_type: str, kwargs: Mapping[str, Any]) -> torch.Tensor:
        if graph_type not in entries:
            raise KeyError(f"graph type {graph_type!r} is not declared; declared: {sorted(entries)}")
        with torch.inference_mode():
            return entries[graph_type](**kwargs)

    return run


def _check_request(model: TinyVLM, prompts: Sequence[Sequence[int]], image: torch.Tensor | None,
                   max_new_tokens: int, forced: Mapping[int, Sequence[int]]) -> None:
    cfg = model.config
    max_prompts = cfg.max_batch - 1
    if not 1 <= len(prompts) <= max_prompts:
        raise ValueError(f"generate takes 1..{max_prompts} prompts (max_batch - 1; the last slot is "
                         f"the padding scratch slot), got {len(prompts)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    max_prompt = max(cfg.bucket_sizes("prefill"))
    max_forced = max(cfg.bucket_sizes("jf")) - 1  # the jf call also carries the pending token
    for i, prompt in enumerate(prompts):
        if not 1 <= len(prompt) <= max_prompt:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens; prefill buckets hold 1..{max_prompt}")
        bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside [0, {cfg.vocab_size}): {bad}")
        n_img = sum(t == cfg.image_token_id for t in prompt)
        if n_img and image is None:
            raise ValueError(f"prompt {i} has {n_img} image placeholders (id {cfg.image_token_id}) "
                             "but no image was given")
        if n_img > cfg.n_patches:
            raise ValueError(f"prompt {i} has {n_img} image placeholders; the image has only "
                             f"{cfg.n_patches} patches")
        extra = len(forced.get(i, ()))
        if len(prompt) + max_new_tokens + extra > cfg.max_seq:
            raise ValueError(f"prompt {i}: {len(prompt)} prompt + {max_new_tokens} new + {extra} forced "
                             f"tokens exceed max_seq={cfg.max_seq}")
    for i, tokens in forced.items():
        if not 0 <= i < len(prompts):
            raise ValueError(f"forced names sequence {i}; there are {len(prompts)} prompts")
        if not 1 <= len(tokens) <= max_forced:
            raise ValueError(f"forced tokens for sequence {i}: {len(tokens)} given, the jf bucket holds "
                             f"1..{max_forced} (plus the pending token)")
        if any(not 0 <= t < cfg.vocab_size or t == cfg.image_token_id for t in tokens):
            raise ValueError(f"forced tokens for sequence {i} must be text ids in [0, {cfg.vocab_size}) "
                             f"other than the image placeholder {cfg.image_token_id}: {list(tokens)}")
        if max_new_tokens < 3:
            raise ValueError("forced tokens need max_new_tokens >= 3 (prefill, first decode step, then "
                             f"the jump-forward token), got {max_new_tokens}")


def generate(
    model: TinyVLM,
    prompts: list[list[int]],
    *,
    image: torch.Tensor | None = None,
    max_new_tokens: int,
    forced: Mapping[int, list[int]] | None = None,
    run: Run | None = None,
    gather_logits: Callable[[torch.Tensor], torch.Tensor] = _identity,
) -> list[list[int]]:
    """Greedy continuation of each prompt (see the module docstring for the schedule)."""
    cfg = model.config
    forced = {int(i): [int(t) for t in toks] for i, toks in (forced or {}).items() if toks}
    _check_request(model, prompts, image, max_new_tokens, forced)
    run = run if run is not None else eager_run(model)
    last_pos = cfg.max_seq - 1

    def next_tokens(graph_type: str, kwargs: Mapping[str, Any]) -> list[int]:
        logits = gather_logits(run(graph_type, kwargs))
        return logits.argmax(dim=-1).tolist()

    if image is not None:
        pixel_values = image if image.dim() == 4 else image.unsqueeze(0)
        with model._scoped_compiler_args("encoder"):
            image_embeds = run("encoder", {"pixel_values": pixel_values})
    else:
        image_embeds = torch.zeros(1, cfg.n_patches, cfg.dim)

    seqs = [list(p) for p in prompts]  # full token lists; the last token is pending (not cached)
    chosen = [0] * len(prompts)  # model-chosen tokens so far

    # 1. prefill each prompt alone in its own slot
    prefill_buckets = cfg.buckets("prefill")
    for i, prompt in enumerate(prompts):
        _, size = choose_bucket(prefill_buckets, len(prompt), graph_type="prefill")
        kwargs = {
            "input_ids": torch.tensor([pad_to_bucket(prompt, size, cfg.pad_token_id)]),
            "positions": torch.arange(size)[None],
            "slots": torch.tensor([i]),
            "last_index": torch.tensor([len(prompt) - 1]),
            "image_embeds": image_embeds,
        }
        seqs[i].append(next_tokens("prefill", kwargs)[0])
        chosen[i] = 1

    # 2. batched decode; 3. jump-forward after the first decode step
    decode_buckets = cfg.buckets("decode")
    jf_buckets = cfg.buckets("jf")
    first_step = True
    while True:
        active = [i for i in range(len(prompts)) if chosen[i] < max_new_tokens]
        if not active:
            break
        _, size = choose_bucket(decode_buckets, len(active), graph_type="decode")
        n_pad = size - len(active)
        kwargs = {
            "input_ids": torch.tensor([[seqs[i][-1]] for i in active] + [[cfg.pad_token_id]] * n_pad),
            "positions": torch.tensor([[len(seqs[i]) - 1] for i in active] + [[0]] * n_pad),
            "slots": torch.tensor(active + [cfg.scratch_slot] * n_pad),
            "last_index": torch.zeros(size, dtype=torch.long),
        }
        for i, token in zip(active, next_tokens("decode", kwargs)):
            seqs[i].append(token)
            chosen[i] += 1
        if first_step:
            first_step = False
            for i in sorted(forced):
                tokens = [seqs[i][-1], *forced[i]]
                _, k = choose_bucket(jf_buckets, len(tokens), graph_type="jf")
                start = len(seqs[i]) - 1
                kwargs = {
                    "input_ids": torch.tensor([pad_to_bucket(tokens, k, cfg.pad_token_id)]),
                    # padding continues past the real positions (never read before overwritten)
                    "positions": torch.tensor([[min(start + j, last_pos) for j in range(k)]]),
                    "slots": torch.tensor([i]),
                    "last_index": torch.tensor([len(tokens) - 1]),
                }
                token = next_tokens("jf", kwargs)[0]
                seqs[i].extend([*forced[i], token])
                chosen[i] += 1

    return [seq[len(prompt):] for seq, prompt in zip(seqs, prompts)]
