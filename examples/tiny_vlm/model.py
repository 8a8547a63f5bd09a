"""A tiny vision-language decoder shaped like the models neuron-args serves.

It exists to give the runner, the cache and the pytest plugin a realistic multi-graph model that
compiles in seconds on CPU: an image ``encoder`` graph, ``prefill`` and ``decode`` graphs in
static-shape buckets, and a jump-forward (``jf``) graph, all with a ``compiler_args_for`` policy.

Everything on the decoder path is traceable by ``torch.compile(fullgraph=True, dynamic=False)``:
no ``.item()``, no data-dependent Python control flow, no boolean-mask indexing. The KV cache is
a set of registered buffers updated in place, as on a Neuron device, and attention masks by
position over the whole cache, so padding tokens (written at positions past the real ones) are
never read before a real token overwrites them.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from neuron_args.graphs import GraphSpec

__all__ = [
    "GRAPH_TYPES",
    "DecoderLayer",
    "RMSNorm",
    "TextDecoder",
    "TinyVLM",
    "TinyVLMConfig",
    "VisionEncoder",
    "apply_rotary",
    "choose_bucket",
    "merge_image_embeds",
    "pad_to_bucket",
    "rotary_tables",
]

GRAPH_TYPES: tuple[str, ...] = ("encoder", "prefill", "decode", "jf")
# Bucket-name prefixes: prefill by sequence length, decode by batch, jump-forward by tokens.
_BUCKET_PREFIX = {"prefill": "s", "decode": "b", "jf": "k"}


@dataclass(frozen=True)
class TinyVLMConfig:
    """Sizes small enough that every graph compiles in seconds on CPU."""

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    max_seq: int = 64
    max_batch: int = 4
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    image_size: int = 16
    image_channels: int = 3
    patch_size: int = 4
    vision_dim: int = 32
    vision_heads: int = 2
    vision_ffn_dim: int = 64
    vision_layers: int = 1
    image_token_id: int = 255
    pad_token_id: int = 0
    prefill_buckets: tuple[int, ...] = (16, 32)
    decode_buckets: tuple[int, ...] = (1, 4)
    jf_buckets: tuple[int, ...] = (4,)

    def __post_init__(self) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even for rotary embedding")
        if self.image_size % self.patch_size:
            problems.append(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.vision_dim % self.vision_heads:
            problems.append(f"vision_dim={self.vision_dim} is not a multiple of vision_heads={self.vision_heads}")
        for name in ("image_token_id", "pad_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                problems.append(f"{name}={getattr(self, name)} is outside the vocabulary [0, {self.vocab_size})")
        if self.image_token_id == self.pad_token_id:
            problems.append("image_token_id and pad_token_id must differ")
        if self.max_batch < 2:
            problems.append("max_batch must be >= 2 (one slot is the scratch slot for padding rows)")
        for graph_type, limit in (("prefill", self.max_seq), ("decode", self.max_batch),
                                  ("jf", self.max_seq)):
            sizes = self.bucket_sizes(graph_type)
            if not sizes or any(s < 1 or s > limit for s in sizes):
                problems.append(f"{graph_type} buckets {sizes} must be non-empty and within 1..{limit}")
        if problems:
            raise ValueError("invalid TinyVLMConfig: " + "; ".join(problems))

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def scratch_slot(self) -> int:
        """The KV-cache slot padding rows write to; real sequences use slots below it."""
        return self.max_batch - 1

    def bucket_sizes(self, graph_type: str) -> tuple[int, ...]:
        if graph_type not in _BUCKET_PREFIX:
            raise ValueError(f"graph type {graph_type!r} has no size buckets; one of {sorted(_BUCKET_PREFIX)}")
        return tuple(sorted(getattr(self, f"{graph_type}_buckets")))

    def buckets(self, graph_type: str) -> dict[str, int]:
        """Bucket name -> size, e.g. ``{"s16": 16, "s32": 32}`` for prefill."""
        prefix = _BUCKET_PREFIX.get(graph_type)
        return {f"{prefix}{n}": n for n in self.bucket_sizes(graph_type)}


# --------------------------------------------------------------------------- buckets


def choose_bucket(buckets: Mapping[str, int], n: int, *, graph_type: str = "graph") -> tuple[str, int]:
    """The smallest bucket holding ``n`` (static shapes: each bucket is its own compiled graph)."""
    fitting = sorted((size, name) for name, size in buckets.items() if size >= n)
    if n < 1 or not fitting:
        raise ValueError(
            f"no {graph_type} bucket fits {n}: buckets are {dict(buckets)}; "
            f"shorten the input or add a larger bucket to TinyVLMConfig.{graph_type}_buckets"
        )
    size, name = fitting[0]
    return name, size


def pad_to_bucket(values: Sequence[int], size: int, pad_value: int) -> list[int]:
    """``values`` right-padded with ``pad_value`` to exactly ``size`` items."""
    if len(values) > size:
        raise ValueError(f"{len(values)} values do not fit a bucket of size {size}")
    return [*values, *([pad_value] * (size - len(values)))]


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(max_seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[max_seq, head_dim]`` for the rotate-half convention (pairs ``i``, ``i + d/2``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_seq, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, heads, d]`` by per-token ``cos``/``sin`` ``[B, T, 1, d]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def merge_image_embeds(
    input_ids: torch.Tensor, token_embeds: torch.Tensor, image_embeds: torch.Tensor, image_token_id: int
) -> torch.Tensor:
    """Put the k-th image patch embedding at the k-th image placeholder of each row.

    Static-shape by construction (cumsum + gather + where), so one graph serves every prompt.
    """
    is_img = input_ids == image_token_id
    idx = (is_img.cumsum(-1) - 1).clamp(min=0, max=image_embeds.shape[1] - 1)
    gathered = image_embeds.gather(1, idx[..., None].expand(-1, -1, image_embeds.shape[-1]))
    return torch.where(is_img[..., None], gathered.to(token_embeds.dtype), token_embeds)


# --------------------------------------------------------------------------- vision


class VisionBlock(nn.Module):
    def __init__(self, cfg: TinyVLMConfig) -> None:
        super().__init__()
        d = cfg.vision_dim
        self.n_heads = cfg.vision_heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.vision_ffn_dim)
        self.fc2 = nn.Linear(cfg.vision_ffn_dim, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, p, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, p, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(attn.transpose(1, 2).reshape(n, p, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionEncoder(nn.Module):
    """Patch embedding + transformer block(s) + projection to the text width."""

    def __init__(self, cfg: TinyVLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        patch_dim = cfg.image_channels * cfg.patch_size**2
        self.patch_embed = nn.Linear(patch_dim, cfg.vision_dim)
        self.pos_embed = nn.Parameter(torch.zeros(cfg.n_patches, cfg.vision_dim))
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.vision_layers))
        self.final_norm = nn.LayerNorm(cfg.vision_dim)
        self.proj = nn.Linear(cfg.vision_dim, cfg.dim)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``pixel_values [N, C, H, W]`` -> ``image_embeds [N, n_patches, dim]`` (row-major patches)."""
        n, c = pixel_values.shape[:2]
        p = self.cfg.patch_size
        g = self.cfg.image_size // p
        x = pixel_values.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, c * p * p)
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.proj(self.final_norm(x))


# --------------------------------------------------------------------------- text decoder


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyVLMConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        h = h + self._attention(self.attn_norm(h), cos, sin, mask, k_cache, v_cache, slots, positions)
        x = self.mlp_norm(h)
        return h + self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))

    def _attention(self, x, cos, sin, mask, k_cache, v_cache, slots, positions) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rotary(self.wq(x).view(b, t, self.n_heads, self.head_dim), cos, sin)
        k = apply_rotary(self.wk(x).view(b, t, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim)
        # In-place write at (slot, position): indices on dims 0 and 2 put [B, T] first, so the
        # value layout is [B, T, kv_heads, head_dim], exactly k/v before the head transpose.
        k_cache[slots[:, None], :, positions] = k
        v_cache[slots[:, None], :, positions] = v
        keys, values = self._expand_kv(k_cache[slots]), self._expand_kv(v_cache[slots])
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))

    def _expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """GQA: ``[B, kv_heads, S, d]`` -> ``[B, heads, S, d]``; query head h reads kv head h // rep."""
        b, n_kv, s, d = kv.shape
        rep = self.n_heads // n_kv
        return kv[:, :, None].expand(b, n_kv, rep, s, d).reshape(b, n_kv * rep, s, d)


class TextDecoder(nn.Module):
    """Token embedding, GQA + rotary layers over an in-place KV cache, vocab-parallel lm_head."""

    def __init__(self, cfg: TinyVLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.vocab_start, self.vocab_local = 0, cfg.vocab_size
        cos, sin = rotary_tables(cfg.max_seq, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("key_positions", torch.arange(cfg.max_seq), persistent=False)
        cache_shape = (cfg.max_batch, cfg.n_kv_heads, cfg.max_seq, cfg.head_dim)
        for i in range(cfg.n_layers):
            self.register_buffer(f"k_cache_{i}", torch.zeros(cache_shape), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(cache_shape), persistent=False)
        self._set_suppressed()

    def _set_suppressed(self) -> None:
        # The image placeholder is input-only: never predict it (a generated placeholder would be
        # read as text by decode but as an image patch by a full recompute of the sequence).
        ids = torch.arange(self.vocab_start, self.vocab_start + self.vocab_local)
        self.register_buffer("suppressed", ids == self.cfg.image_token_id, persistent=False)

    def shard_lm_head(self, tp_rank: int, tp_size: int) -> None:
        """Keep rows ``[r*V/tp, (r+1)*V/tp)`` of the full lm_head (vocab-parallel logits)."""
        v = self.cfg.vocab_size
        if tp_size < 1 or v % tp_size or not 0 <= tp_rank < tp_size:
            raise ValueError(
                f"cannot shard a vocabulary of {v} as tp_rank={tp_rank} of tp_size={tp_size}: "
                "tp_size must divide vocab_size and 0 <= tp_rank < tp_size"
            )
        local = v // tp_size
        full = self.lm_head.weight.detach()
        self.lm_head = nn.Linear(self.cfg.dim, local, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(full[tp_rank * local:(tp_rank + 1) * local])
        self.lm_head.weight.requires_grad_(full.requires_grad)
        self.vocab_start, self.vocab_local = tp_rank * local, local
        self._set_suppressed()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        last_index: torch.Tensor,
        image_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``[B, T]`` tokens at ``positions`` in cache ``slots``; logits at ``last_index``.

        Returns ``[B, vocab_local]``: this rank's slice of the vocabulary.
        """
        h = self.embed(input_ids)
        if image_embeds is not None:
            h = merge_image_embeds(input_ids, h, image_embeds, self.cfg.image_token_id)
        cos = self.rope_cos[positions][:, :, None]
        sin = self.rope_sin[positions][:, :, None]
        # Causal by position over the whole cache: a query sees keys at key_pos <= query_pos only.
        mask = self.key_positions[None, None, None, :] <= positions[:, None, :, None]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}"),
                      slots, positions)
        last = h.gather(1, last_index[:, None, None].expand(-1, 1, h.shape[-1]))[:, 0]
        logits = self.lm_head(self.norm(last))
        return logits.masked_fill(self.suppressed, torch.finfo(logits.dtype).min)


# --------------------------------------------------------------------------- the model


def _init_weights(module: nn.Module, generator: torch.Generator) -> None:
    """Seeded init in parameter-definition order (so every TP rank draws the same full model)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):  # norm scales
                p.fill_(1.0)
            elif p.dim() == 1:  # biases
                p.normal_(0.0, 0.02, generator=generator)
            elif name.endswith("embed.weight"):  # token embedding
                p.normal_(0.0, 1.0, generator=generator)
            else:  # Linear [out, in] and the patch position table: unit-variance activations
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=generator)


class TinyVLM(nn.Module):
    """Encoder + decoder, seeded weights, vocab-parallel lm_head, and the per-graph policy."""

    def __init__(self, config: TinyVLMConfig | None = None, tp_rank: int = 0, tp_size: int = 1,
                 seed: int = 0) -> None:
        super().__init__()
        self.config = config if config is not None else TinyVLMConfig()
        self.tp_rank, self.tp_size, self.seed = tp_rank, tp_size, seed
        self.encoder = VisionEncoder(self.config)
        self.decoder = TextDecoder(self.config)
        _init_weights(self, torch.Generator().manual_seed(seed))
        self.decoder.shard_lm_head(tp_rank, tp_size)
        self.requires_grad_(False)  # inference only: keeps in-place cache writes out of autograd
        self.eval()

    # ---- per-graph compiler arguments (seed: model_common.py)

    def compiler_args_for(self, graph_type: str | None, example_inputs: Any, base: Sequence[str] | None
                          ) -> list[str]:
        """Give each graph its own neuronx-cc arguments, derived from the caller's base list.

        ``example_inputs`` is reserved for by-shape conditions; the runner passes ``None``.
        """
        from neuron_args.flags import with_optimization_level

        base = list(base or [])
        if graph_type in ("decode", "encoder"):
            return with_optimization_level(base, 3)
        if graph_type == "jf":
            return with_optimization_level(base, 2)
        return base

    def _scoped_compiler_args(self, graph_type: str) -> contextlib.AbstractContextManager[None]:
        """Scope for an in-process site the model owns (the encoder execute).

        Resolves through :meth:`compiler_args_for` only when the runner stamped base args on the
        model (``_neuron_base_compiler_args``, i.e. the per-graph policy is enabled); otherwise
        the scope carries no override and the base args apply.
        """
        from neuron_args.scope import scoped_compiler_args

        base = getattr(self, "_neuron_base_compiler_args", None)
        args = None if base is None else self.compiler_args_for(graph_type, None, base)
        return scoped_compiler_args(args, graph_type=graph_type)

    # ---- graph declaration

    def neuron_graphs(self) -> list[GraphSpec]:
        """The four graph types, each bucket a static shape with example keyword arguments."""
        cfg = self.config

        def encoder_kwargs() -> dict[str, torch.Tensor]:
            n = cfg.image_channels * cfg.image_size**2
            pixels = torch.linspace(-1.0, 1.0, n).reshape(1, cfg.image_channels, cfg.image_size, cfg.image_size)
            return {"pixel_values": pixels}

        def prefill_kwargs(t: int) -> Callable[[], dict[str, torch.Tensor]]:
            def build() -> dict[str, torch.Tensor]:
                ids = (torch.arange(t) * 7 + 3) % cfg.vocab_size
                ids[1:1 + min(cfg.n_patches, t // 4)] = cfg.image_token_id
                return {
                    "input_ids": ids[None],
                    "positions": torch.arange(t)[None],
                    "slots": torch.tensor([cfg.scratch_slot]),
                    "last_index": torch.tensor([t - 1]),
                    "image_embeds": torch.zeros(1, cfg.n_patches, cfg.dim),
                }
            return build

        def decode_kwargs(b: int) -> Callable[[], dict[str, torch.Tensor]]:
            def build() -> dict[str, torch.Tensor]:
                return {
                    "input_ids": ((torch.arange(b) * 11 + 5) % cfg.vocab_size)[:, None],
                    "positions": (torch.arange(b) + 8)[:, None] % cfg.max_seq,
                    "slots": torch.arange(b) % cfg.max_batch,
                    "last_index": torch.zeros(b, dtype=torch.long),
                }
            return build

        def jf_kwargs(k: int) -> Callable[[], dict[str, torch.Tensor]]:
            def build() -> dict[str, torch.Tensor]:
                return {
                    "input_ids": ((torch.arange(k) * 13 + 1) % cfg.vocab_size)[None],
                    "positions": ((torch.arange(k) + 16) % cfg.max_seq)[None],
                    "slots": torch.tensor([cfg.scratch_slot]),
                    "last_index": torch.tensor([k - 1]),
                }
            return build

        makers = {"prefill": prefill_kwargs, "decode": decode_kwargs, "jf": jf_kwargs}
        specs = [GraphSpec("encoder", self.encoder, {f"img{cfg.image_size}": encoder_kwargs})]
        for graph_type, make in makers.items():
            buckets = {name: make(size) for name, size in cfg.buckets(graph_type).items()}
            specs.append(GraphSpec(graph_type, self.decoder, buckets))
        return specs
