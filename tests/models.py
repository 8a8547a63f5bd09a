"""Small deterministic models shared by the project's tests.

``MLP`` has one graph and one output. ``TinyDecoderBlock`` is the shape of a real decoder step:
embedding, RMSNorm, rotary embedding, linear projections, SDPA with a causal mask over a KV cache
held in registered buffers that the forward updates in place (``index_put`` via slice
assignment), SwiGLU, int64 token ids and positions. A prefill (``T > 1``) and a decode step
(``T == 1``) are two static graphs; the cache carries over between calls.

Weights come from a ``torch.Generator`` seeded by the caller, so two models built with the same
seed are identical and the global RNG is left alone.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 16) -> None:
        super().__init__()
        self.d_in = d_in
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TinyDecoderBlock(nn.Module):
    """Embedding -> RMSNorm -> attention (RoPE, in-place KV cache, causal SDPA) -> SwiGLU -> logits.

    ``forward(tokens [B, T] int64, input_pos [T] int64) -> logits [B, T, vocab]``; writes the
    step's keys/values into ``k_cache`` / ``v_cache`` ``[B, heads, max_seq, head_dim]`` at
    ``input_pos`` and attends to every cache slot ``<=`` the query position.
    """

    def __init__(
        self, vocab: int = 128, dim: int = 64, n_heads: int = 4, max_seq: int = 32, batch: int = 2
    ) -> None:
        super().__init__()
        self.vocab, self.batch, self.max_seq = vocab, batch, max_seq
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.norm2 = RMSNorm(dim)
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w3 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        cache_shape = (batch, n_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape))
        self.register_buffer("v_cache", torch.zeros(cache_shape))

    def reset_cache(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        h = self.embed(tokens)
        x = self.norm1(h)
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        cos = self.cos[input_pos][None, None]
        sin = self.sin[input_pos][None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache[:, :, input_pos] = k  # index_put_ into the persistent buffer
        self.v_cache[:, :, input_pos] = v
        kpos = torch.arange(self.max_seq, device=tokens.device)
        mask = kpos[None, :] <= input_pos[:, None]  # [T, max_seq], causal over the whole cache
        attn = F.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask[None, None]
        )
        attn = attn.transpose(1, 2).reshape(B, T, -1)
        h = h + self.wo(attn)
        x = self.norm2(h)
        h = h + self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.lm_head(h)


def _init_weights(model: nn.Module, seed: int) -> None:
    """Overwrite every parameter from a private generator: same seed, same model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2 and not name.startswith("embed"):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 1.0))


def make_mlp(
    seed: int = 0, *, d_in: int = 32, d_hidden: int = 64, d_out: int = 16,
    dtype: torch.dtype = torch.float32,
) -> MLP:
    """An ``MLP`` in eval mode with weights drawn from ``seed``."""
    m = MLP(d_in, d_hidden, d_out)
    _init_weights(m, seed)
    return m.to(dtype).eval()


def mlp_inputs(
    batch: int = 4, seed: int = 0, *, d_in: int = 32, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1000)
    return (torch.randn(batch, d_in, generator=g).to(dtype),)


def make_decoder(
    seed: int = 0, *, batch: int = 2, max_seq: int = 32, vocab: int = 128, dim: int = 64,
    n_heads: int = 4, dtype: torch.dtype = torch.float32,
) -> TinyDecoderBlock:
    """A ``TinyDecoderBlock`` in eval mode with weights drawn from ``seed`` and an empty cache."""
    m = TinyDecoderBlock(vocab=vocab, dim=dim, n_heads=n_heads, max_seq=max_seq, batch=batch)
    _init_weights(m, seed)
    return m.to(dtype).eval()


def decoder_inputs(
    batch: int = 2, seq: int = 5, *, start: int = 0, seed: int = 0, vocab: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [batch, seq] int64, input_pos [seq] int64 = start .. start+seq-1)``."""
    g = torch.Generator().manual_seed(seed + 2000 + start)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g)
    return tokens, torch.arange(start, start + seq)
