"""The example TinyVLM, eager: seeded weights, cache/bucket/padding correctness, TP, policy, graphs."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from examples.tiny_vlm.generate import eager_run, generate
from examples.tiny_vlm.model import (
    TinyVLM,
    TinyVLMConfig,
    choose_bucket,
    pad_to_bucket,
)
from neuron_args.graphs import GraphSpec
from neuron_args.scope import current_compiler_args, current_graph_type

REPO = Path(__file__).resolve().parents[1]
CFG = TinyVLMConfig()
IMG = CFG.image_token_id
BASE = ["--target", "trn2", "--auto-cast=none", "-O1"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matmuls gain nothing from threads, and spinning OpenMP threads on a busy 2-core box
    made this file several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> TinyVLM:
    return TinyVLM(seed=0)


def _image(seed: int) -> torch.Tensor:
    return torch.randn(1, 3, CFG.image_size, CFG.image_size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- the naive reference


def reference_logits(model: TinyVLM, tokens: list[int], image_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """Full-vocab logits after ``tokens``: no cache, no padding, own attention and rotary code.

    Written independently of the model's forward (explicit per-head loop with kv head h // rep,
    complex-number rotary, triangular mask) so it checks GQA, rotary and the cache, not itself.
    """
    dec, cfg = model.decoder, model.config
    assert model.tp_size == 1
    n, hd, rep = len(tokens), cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    h = dec.embed.weight[torch.tensor(tokens)].clone()
    if image_embeds is not None:
        patch = 0
        for j, t in enumerate(tokens):
            if t == cfg.image_token_id:
                h[j] = image_embeds[0, patch]
                patch += 1
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None]
    rot = torch.polar(torch.ones_like(angles), angles)[:, None]  # [n, 1, hd/2]

    def rope(x: torch.Tensor) -> torch.Tensor:
        xc = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2:].double()) * rot
        return torch.cat([xc.real, xc.imag], dim=-1).float()

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    for layer in dec.layers:
        x = rms(h, layer.attn_norm.weight)
        q = rope((x @ layer.wq.weight.T).view(n, cfg.n_heads, hd))
        k = rope((x @ layer.wk.weight.T).view(n, cfg.n_kv_heads, hd))
        v = (x @ layer.wv.weight.T).view(n, cfg.n_kv_heads, hd)
        heads = []
        for head in range(cfg.n_heads):
            kv = head // rep
            scores = (q[:, head] @ k[:, kv].T / math.sqrt(hd)).masked_fill(future, float("-inf"))
            heads.append(scores.softmax(-1) @ v[:, kv])
        h = h + torch.cat(heads, dim=-1) @ layer.wo.weight.T
        x = rms(h, layer.mlp_norm.weight)
        h = h + (F.silu(x @ layer.w_gate.weight.T) * (x @ layer.w_up.weight.T)) @ layer.w_down.weight.T
    logits = rms(h[-1], dec.norm.weight) @ dec.lm_head.weight.T
    logits[cfg.image_token_id] = float("-inf")
    return logits


def reference_generate(model, prompts, max_new_tokens, image_embeds=None, forced=None):
    """The generate schedule, recomputing the whole sequence for every chosen token."""
    forced = forced or {}
    out = []
    for i, prompt in enumerate(prompts):
        seq, chosen = list(prompt), 0
        while chosen < max_new_tokens:
            seq.append(int(reference_logits(model, seq, image_embeds).argmax()))
            chosen += 1
            if chosen == 2 and i in forced:  # after the first decode step
                seq.extend(forced[i])
        out.append(seq[len(prompt):])
    return out


def recording_run(model: TinyVLM, log: list):
    base = eager_run(model)

    def run(graph_type, kwargs):
        log.append((graph_type, tuple(kwargs["input_ids"].shape) if "input_ids" in kwargs else None,
                    kwargs.get("slots", torch.tensor([])).tolist()))
        return base(graph_type, kwargs)

    return run


# --------------------------------------------------------------------------- weights and config


def test_weights_are_deterministic_from_seed():
    a, b, c = TinyVLM(seed=0), TinyVLM(seed=0), TinyVLM(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() and len(sa) > 20
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert not torch.equal(sa["decoder.embed.weight"], sc["decoder.embed.weight"])
    assert not torch.equal(sa["encoder.patch_embed.weight"], sc["encoder.patch_embed.weight"])
    assert not any(p.requires_grad for p in a.parameters())
    assert a.decoder.k_cache_1.shape == (CFG.max_batch, CFG.n_kv_heads, CFG.max_seq, CFG.head_dim)


def test_config_rejects_inconsistent_sizes():
    with pytest.raises(ValueError, match="n_heads=3 is not a multiple of n_kv_heads=2"):
        TinyVLMConfig(n_heads=3)
    with pytest.raises(ValueError, match=r"decode buckets \(1, 8\)"):
        TinyVLMConfig(decode_buckets=(1, 8))


def test_bucket_helpers():
    buckets = CFG.buckets("prefill")
    assert buckets == {"s16": 16, "s32": 32}
    assert choose_bucket(buckets, 1) == ("s16", 16)
    assert choose_bucket(buckets, 16) == ("s16", 16)
    assert choose_bucket(buckets, 17) == ("s32", 32)
    with pytest.raises(ValueError, match=r"no prefill bucket fits 33.*prefill_buckets"):
        choose_bucket(buckets, 33, graph_type="prefill")
    assert pad_to_bucket([5, 6], 4, 0) == [5, 6, 0, 0]
    with pytest.raises(ValueError, match="3 values do not fit a bucket of size 2"):
        pad_to_bucket([1, 2, 3], 2, 0)


# --------------------------------------------------------------------------- correctness


def test_prefill_logits_match_cache_free_reference(model):
    image_embeds = model.encoder(_image(1))
    prompt = [IMG, IMG, IMG, 10, 20, 30, 40, 50, 60, 7]
    kwargs = {
        "input_ids": torch.tensor([pad_to_bucket(prompt, 16, CFG.pad_token_id)]),
        "positions": torch.arange(16)[None],
        "slots": torch.tensor([1]),
        "last_index": torch.tensor([len(prompt) - 1]),
        "image_embeds": image_embeds,
    }
    got = eager_run(model)("prefill", kwargs)[0]
    want = reference_logits(model, prompt, image_embeds)
    finite = torch.isfinite(want)
    assert finite.sum() == CFG.vocab_size - 1
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    assert got[IMG] == torch.finfo(got.dtype).min  # the placeholder is never predicted


@pytest.mark.parametrize(
    "prompts, forced, with_image",
    [
        ([[3, 1, 4, 1, 5, 9, 2, 6]], None, False),  # decode bucket b1, no padding rows
        ([[3, 1, 4], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3], [6]], None, False),  # b4 + 1 pad row
        ([[IMG, IMG, 5, 6, 7], [8, 9, 10, 11]], {0: [40, 41, 42], 1: [99]}, True),  # image, jf, 2 pad rows
    ],
    ids=["one-prompt", "three-prompts-s16-s32", "image-and-jump-forward"],
)
def test_generate_matches_naive_reference(model, prompts, forced, with_image):
    image = _image(2) if with_image else None
    # dirty every slot first: stale cache contents from another request must never be read
    generate(model, [[17] * 30, [18] * 20, [19] * 12], max_new_tokens=10)
    log: list = []
    got = generate(model, prompts, image=image, max_new_tokens=7, forced=forced, run=recording_run(model, log))
    image_embeds = model.encoder(image) if with_image else None
    want = reference_generate(model, prompts, 7, image_embeds, forced)
    assert got == want
    for i, out in enumerate(got):
        assert len(out) == 7 + len((forced or {}).get(i, []))
    graph_types = [g for g, _, _ in log]
    assert graph_types.count("prefill") == len(prompts)
    assert graph_types.count("jf") == len(forced or {})
    assert graph_types.count("encoder") == (1 if with_image else 0)
    decode_shapes = {shape for g, shape, _ in log if g == "decode"}
    assert decode_shapes == ({(1, 1)} if len(prompts) == 1 else {(4, 1)})
    for g, shape, slots in log:
        if g == "decode" and shape == (4, 1):
            assert slots[: len(prompts)] == list(range(len(prompts)))
            assert set(slots[len(prompts):]) == {CFG.scratch_slot}


def test_prefill_bucket_padding_does_not_change_tokens(model):
    prompt = [[12, 34, 56, 78, 90, 11, 13, 15, 17, 19, 21]]
    base = eager_run(model)
    seen: list[int] = []

    def repad_to(size: int):
        def run(graph_type, kwargs):
            if graph_type == "prefill":
                kwargs = dict(kwargs)
                pad = size - kwargs["input_ids"].shape[1]
                kwargs["input_ids"] = F.pad(kwargs["input_ids"], (0, pad), value=CFG.pad_token_id)
                kwargs["positions"] = torch.arange(size)[None]
                seen.append(kwargs["input_ids"].shape[1])
            return base(graph_type, kwargs)
        return run

    in_s16 = generate(model, prompt, max_new_tokens=6, run=repad_to(16))
    in_s32 = generate(model, prompt, max_new_tokens=6, run=repad_to(32))
    assert seen == [16, 32]
    assert in_s16 == in_s32 == reference_generate(model, prompt, 6)


def test_image_changes_output_only_through_image_tokens(model):
    with_tokens = [[IMG, IMG, IMG, IMG, 5, 6, 7]]
    a = generate(model, with_tokens, image=_image(3), max_new_tokens=6)
    b = generate(model, with_tokens, image=_image(4), max_new_tokens=6)
    assert a != b
    text_only = [[5, 6, 7, 8]]
    assert generate(model, text_only, image=_image(3), max_new_tokens=6) == generate(
        model, text_only, max_new_tokens=6
    )


@pytest.mark.parametrize(
    "prompts, kwargs, message",
    [
        ([[1]] * 4, {}, r"1\.\.3 prompts"),
        ([[1] * 33], {}, "prompt 0 has 33 tokens"),
        ([[IMG, 1]], {}, "no image was given"),
        ([[IMG] * 17], {"image": torch.zeros(1, 3, 16, 16)}, "only 16 patches"),
        ([[1], [2]], {"forced": {1: [1, 2, 3, 4]}}, r"forced tokens for sequence 1: 4 given.*1\.\.3"),
        ([[1]], {"forced": {0: [IMG]}}, "other than the image placeholder"),
        ([[1]], {"forced": {2: [5]}}, "forced names sequence 2"),
        ([[1] * 30], {"max_new_tokens": 40}, "exceed max_seq=64"),
    ],
)
def test_generate_rejects_bad_requests(model, prompts, kwargs, message):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(model, prompts, **kwargs)


# --------------------------------------------------------------------------- tensor parallel


def test_tp_shards_concatenate_to_tp1_logits(model):
    shards = [TinyVLM(tp_rank=r, tp_size=2, seed=0) for r in range(2)]
    assert [s.decoder.lm_head.weight.shape[0] for s in shards] == [128, 128]
    torch.testing.assert_close(
        torch.cat([s.decoder.lm_head.weight for s in shards]), model.decoder.lm_head.weight, rtol=0, atol=0
    )
    for spec in model.neuron_graphs():
        if spec.graph_type == "encoder":
            continue
        for bucket, make in spec.buckets.items():
            kwargs = make()  # example kwargs read whatever the cache holds: start all from fresh caches
            full = eager_run(TinyVLM(seed=0))(spec.graph_type, kwargs)
            parts = [eager_run(TinyVLM(tp_rank=r, tp_size=2, seed=0))(spec.graph_type, kwargs)
                     for r in range(2)]
            assert parts[0].shape == (full.shape[0], 128), bucket
            torch.testing.assert_close(torch.cat(parts, dim=-1), full, rtol=1e-6, atol=1e-6)
    # the placeholder (id 255) lives in rank 1's slice, local column 127
    assert bool(shards[1].decoder.suppressed[127]) and not shards[0].decoder.suppressed.any()


def test_tp_generate_through_gather_logits_hook(model):
    shards = [TinyVLM(tp_rank=r, tp_size=2) for r in range(2)]
    runs = [eager_run(s) for s in shards]
    other_rank: list[torch.Tensor] = []

    def run(graph_type, kwargs):
        if graph_type != "encoder":
            other_rank.append(runs[1](graph_type, kwargs))
        return runs[0](graph_type, kwargs)

    def gather(local):
        assert local.shape[-1] == 128
        return torch.cat([local, other_rank.pop()], dim=-1)

    prompts, forced = [[IMG, IMG, 3, 4], [9, 8, 7]], {1: [5, 6]}
    got = generate(shards[0], prompts, image=_image(5), max_new_tokens=5, forced=forced, run=run,
                   gather_logits=gather)
    assert got == generate(model, prompts, image=_image(5), max_new_tokens=5, forced=forced)
    assert other_rank == []


def test_rejects_bad_tp_layout():
    with pytest.raises(ValueError, match="tp_rank=2 of tp_size=2"):
        TinyVLM(tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="vocabulary of 256 as tp_rank=0 of tp_size=3"):
        TinyVLM(tp_rank=0, tp_size=3)


_DIST_WORKER = """
import json, sys
import torch.distributed as dist
from examples.tiny_vlm import TinyVLM, dist_gather_logits, generate
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
model = TinyVLM(tp_rank=rank, tp_size=2)
out = generate(model, [[1, 2, 3], [40, 50]], max_new_tokens=5, forced={0: [7]},
               gather_logits=dist_gather_logits)
dist.destroy_process_group()
with open(sys.argv[3] + str(rank), "w") as f:
    json.dump(out, f)
"""


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without distributed")
def test_dist_gather_logits_across_two_processes(model, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"
    procs = [
        subprocess.Popen([sys.executable, "-c", _DIST_WORKER, str(r), str(tmp_path / "store"),
                          str(tmp_path / "out")], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    outs = [json.loads((tmp_path / f"out{r}").read_text()) for r in range(2)]
    want = generate(model, [[1, 2, 3], [40, 50]], max_new_tokens=5, forced={0: [7]})
    assert outs == [want, want]


# --------------------------------------------------------------------------- per-graph policy


@pytest.mark.parametrize(
    "graph_type, expected",
    [
        ("decode", ["--target", "trn2", "--auto-cast=none", "-O3"]),
        ("encoder", ["--target", "trn2", "--auto-cast=none", "-O3"]),
        ("jf", ["--target", "trn2", "--auto-cast=none", "-O2"]),
        ("prefill", BASE),
        ("spec_verify", BASE),
        (None, BASE),
    ],
)
def test_compiler_args_for(model, graph_type, expected):
    base = list(BASE)
    got = model.compiler_args_for(graph_type, None, base)
    assert got == expected
    assert base == BASE  # the caller's list is never mutated
    got.append("--mutated")
    assert model.compiler_args_for(graph_type, None, base) == expected  # a fresh list every call


def test_compiler_args_for_without_base_or_level(model):
    assert model.compiler_args_for("prefill", None, None) == []
    assert model.compiler_args_for("decode", None, None) == ["-O3"]
    assert model.compiler_args_for("jf", None, ["--target", "trn2"]) == ["--target", "trn2", "-O2"]


def test_scoped_compiler_args_reads_the_stamped_base():
    vlm = TinyVLM()
    with vlm._scoped_compiler_args("encoder"):  # nothing stamped: no override, but labelled
        assert current_compiler_args() is None
        assert current_graph_type() == "encoder"
    vlm._neuron_base_compiler_args = list(BASE)
    with vlm._scoped_compiler_args("encoder"):
        assert current_compiler_args() == ("--target", "trn2", "--auto-cast=none", "-O3")
        assert current_graph_type() == "encoder"
    with vlm._scoped_compiler_args("prefill"):
        assert current_compiler_args() == tuple(BASE)
    assert current_compiler_args() is None and current_graph_type() is None


def test_generate_runs_the_encoder_inside_the_model_scope():
    vlm = TinyVLM()
    vlm._neuron_base_compiler_args = list(BASE)
    base, seen = eager_run(vlm), {}

    def run(graph_type, kwargs):
        seen.setdefault(graph_type, (current_compiler_args(), current_graph_type()))
        return base(graph_type, kwargs)

    generate(vlm, [[IMG, 4, 5]], image=_image(6), max_new_tokens=3, forced={0: [9]}, run=run)
    assert seen["encoder"] == (("--target", "trn2", "--auto-cast=none", "-O3"), "encoder")
    # the other graphs are scoped by the runner's own run function, not by generate
    assert seen["prefill"] == seen["decode"] == seen["jf"] == (None, None)


# --------------------------------------------------------------------------- graph declaration


def test_neuron_graphs_declares_four_graph_types_and_bucket_shapes(model):
    specs = model.neuron_graphs()
    assert all(isinstance(s, GraphSpec) for s in specs)
    by_type = {s.graph_type: s for s in specs}
    assert list(by_type) == ["encoder", "prefill", "decode", "jf"]
    assert by_type["encoder"].entry is model.encoder
    assert all(by_type[g].entry is model.decoder for g in ("prefill", "decode", "jf"))
    shapes = {
        (s.graph_type, name): {k: tuple(v.shape) for k, v in make().items()}
        for s in specs for name, make in s.buckets.items()
    }
    assert shapes == {
        ("encoder", "img16"): {"pixel_values": (1, 3, 16, 16)},
        ("prefill", "s16"): {"input_ids": (1, 16), "positions": (1, 16), "slots": (1,), "last_index": (1,),
                             "image_embeds": (1, 16, 64)},
        ("prefill", "s32"): {"input_ids": (1, 32), "positions": (1, 32), "slots": (1,), "last_index": (1,),
                             "image_embeds": (1, 16, 64)},
        ("decode", "b1"): {"input_ids": (1, 1), "positions": (1, 1), "slots": (1,), "last_index": (1,)},
        ("decode", "b4"): {"input_ids": (4, 1), "positions": (4, 1), "slots": (4,), "last_index": (4,)},
        ("jf", "k4"): {"input_ids": (1, 4), "positions": (1, 4), "slots": (1,), "last_index": (1,)},
    }
    for s in specs:
        for make in s.buckets.values():
            kwargs = make()
            for name in ("input_ids", "positions", "slots", "last_index"):
                if name in kwargs:
                    assert kwargs[name].dtype == torch.int64, name
            if "positions" in kwargs:
                assert 0 <= int(kwargs["positions"].min()) and int(kwargs["positions"].max()) < CFG.max_seq
                assert 0 <= int(kwargs["slots"].min()) and int(kwargs["slots"].max()) < CFG.max_batch
                assert int(kwargs["last_index"].max()) < kwargs["input_ids"].shape[1]


def test_every_bucket_runs_eagerly(model):
    for spec in model.neuron_graphs():
        for name, make in spec.buckets.items():
            kwargs = make()
            with torch.inference_mode():
                out = spec.entry(**kwargs)
            lead = kwargs["pixel_values" if spec.graph_type == "encoder" else "input_ids"].shape[0]
            want = (lead, CFG.n_patches, CFG.dim) if spec.graph_type == "encoder" else (lead, CFG.vocab_size)
            assert tuple(out.shape) == want, (spec.graph_type, name)
            assert out.dtype == torch.float32 and not torch.isnan(out).any()


@pytest.mark.slow
def test_every_bucket_traces_fullgraph_without_breaks():
    torch._dynamo.reset()
    compiled_model, eager_model = TinyVLM(seed=0), TinyVLM(seed=0)
    compiled = {
        id(compiled_model.encoder): torch.compile(compiled_model.encoder, backend="eager", fullgraph=True,
                                                  dynamic=False),
        id(compiled_model.decoder): torch.compile(compiled_model.decoder, backend="eager", fullgraph=True,
                                                  dynamic=False),
    }
    eager_specs = {s.graph_type: s for s in eager_model.neuron_graphs()}
    n = 0
    for spec in compiled_model.neuron_graphs():
        for name, make in spec.buckets.items():
            with torch.no_grad():
                got = compiled[id(spec.entry)](**make())
                want = eager_specs[spec.graph_type].entry(**make())
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{spec.graph_type}/{name}")
            n += 1
    assert n == 6
    # the in-place KV-cache writes happened inside the compiled graphs too
    for i in range(CFG.n_layers):
        for kind in ("k", "v"):
            got = getattr(compiled_model.decoder, f"{kind}_cache_{i}")
            assert got.abs().sum() > 0
            torch.testing.assert_close(got, getattr(eager_model.decoder, f"{kind}_cache_{i}"),
                                       rtol=1e-5, atol=1e-5)
