"""Training a transformers Llama and a small CNN through ``neuron_libtorch``, and the backward graph's scope.

Five optimizer steps each, parameters and gradients equal to eager at 1e-4; the models' inputs need
no gradient while their parameters do (the backward graph returns ``None`` for them). The backward
graph is compiled with the compiler arguments of the scope its forward ran in, even when
``loss.backward()`` runs outside that scope, and is keyed and recorded in the manifest as its own
graph of type ``<graph type>.backward``.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from neuron_args import scoped_compiler_args
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.manifest.emit import emit_manifest
from neuron_args.manifest.engine import get_server_prefix
from neuron_args.manifest.ledger import ledger_dir, read_ledger

TOL = {"atol": 1e-4, "rtol": 1e-4}


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def llama_loss(model: Callable[..., Any], step: int) -> torch.Tensor:
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(step))
    return model(input_ids=ids, labels=ids).loss


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    # no conv bias before a norm: its true gradient is 0, and Adam would turn rounding noise into steps
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 4),
    )


def cnn_loss(model: Callable[..., Any], step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def compiled(model: torch.nn.Module, cache_dir: Path, args: list[str] | None = None) -> Callable[..., Any]:
    torch._dynamo.reset()
    options = {"cache_dir": str(cache_dir), "compiler": "local", "compiler_args": args or ["-O1"], "target": "trn2"}
    return torch.compile(model, backend="neuron_libtorch", options=options, dynamic=False, fullgraph=True)


def train(model: torch.nn.Module, call: Callable[..., Any], loss_of: Callable[..., torch.Tensor],
          steps: int = 5) -> list[dict[str, torch.Tensor]]:
    """``steps`` AdamW steps; every parameter's gradient at each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grads = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_of(call, step).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return grads


@pytest.fixture
def fresh_dynamo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("make, loss_of", [(tiny_llama, llama_loss), (small_cnn, cnn_loss)], ids=["llama", "cnn"])
def test_five_training_steps_equal_eager(make, loss_of, tmp_path, fresh_dynamo):
    want_model = make()
    got_model = copy.deepcopy(want_model)
    want = train(want_model, want_model, loss_of)
    got = train(got_model, compiled(got_model, tmp_path), loss_of)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys()
        for name in w:
            torch.testing.assert_close(g[name], w[name], **TOL, msg=lambda m, n=name, s=step: f"step {s} {n}: {m}")
    for (name, p), (_, q) in zip(got_model.named_parameters(), want_model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    for (name, b), (_, c) in zip(got_model.named_buffers(), want_model.named_buffers(), strict=True):
        torch.testing.assert_close(b, c, **TOL, msg=lambda m, n=name: f"buffer {n}: {m}")  # batchnorm's running stats
    metadata = [e.metadata() for e in CompileCache(tmp_path).entries()]
    # compiled once each, outside a scope: the backward labelled as such
    assert sorted(str(md["graph_type"]) for md in metadata) == ["None", "backward"]


def test_backward_outside_the_scope_is_compiled_with_its_forward_scope(tmp_path, fresh_dynamo, monkeypatch):
    manifests = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(manifests))
    cache_dir = tmp_path / "cache"
    model = small_cnn()
    call = compiled(model, cache_dir, ["-O1"])
    for level, graph_type in (("-O3", "train"), ("-O2", "finetune")):
        with scoped_compiler_args([level], graph_type=graph_type):
            loss = cnn_loss(call, 0)
        with scoped_compiler_args(["-O1"], graph_type="other"):  # not the forward's scope: ignored by backward
            loss.backward()
    by_type = {md["graph_type"]: md for md in (e.metadata() for e in CompileCache(cache_dir).entries())}
    assert set(by_type) == {"train", "train.backward", "finetune", "finetune.backward"}
    for graph_type, level in (("train", "-O3"), ("finetune", "-O2")):
        forward, backward = by_type[graph_type], by_type[f"{graph_type}.backward"]
        assert forward["compiler_args"] == backward["compiler_args"] == [level]
        assert level in backward["compiler_flags"]
        assert backward["key"] != forward["key"]
    assert by_type["train.backward"]["key"] != by_type["finetune.backward"]["key"]  # the key holds the arguments
    ledger = read_ledger(ledger_dir(manifests, get_server_prefix()))
    assert {k: g.graph_type for k, g in ledger.graphs.items()} == {md["key"]: t for t, md in by_type.items()}
    path = emit_manifest(cache_dir=cache_dir)
    assert path is not None
    graphs = {g["graph_hash"]: g for g in json.loads(path.read_text())["graphs"]}
    assert set(graphs) == {md["key"] for md in by_type.values()}  # the backward graphs are graphs of their own
    for graph_type, level in (("train.backward", "-O3"), ("finetune.backward", "-O2")):
        assert level in graphs[by_type[graph_type]["key"]]["compiler_flags"]


def test_each_backward_gets_the_scope_its_own_forward_ran_under(tmp_path, fresh_dynamo, monkeypatch):
    """Two forwards of one graph under two scopes, then each loss.backward() outside any scope: each backward is
    keyed, compiled and recorded with its own forward's arguments, not the latest forward's."""
    manifests = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(manifests))
    cache_dir = tmp_path / "cache"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    call = compiled(model, cache_dir, ["-O2"])
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with scoped_compiler_args(["-O1"], graph_type="first"):
        loss_first = call(x).square().sum()
    with scoped_compiler_args(["-O3"], graph_type="second"):
        loss_second = call(x).sum()
    loss_first.backward()  # outside any scope, after a forward under another one
    by_type = {md["graph_type"]: md for md in (e.metadata() for e in CompileCache(cache_dir).entries())}
    assert set(by_type) == {"first", "second", "first.backward"}
    assert by_type["first.backward"]["compiler_args"] == ["-O1"]
    loss_second.backward()
    by_type = {md["graph_type"]: md for md in (e.metadata() for e in CompileCache(cache_dir).entries())}
    assert by_type["second.backward"]["compiler_args"] == ["-O3"]
    assert by_type["first.backward"]["key"] != by_type["second.backward"]["key"]
    ledger = read_ledger(ledger_dir(manifests, get_server_prefix()))
    assert {g.graph_type: k for k, g in ledger.graphs.items()} == {t: md["key"] for t, md in by_type.items()}
