"""Training through the seams: the backward graph lowers, compiles and runs, and gradients equal eager's.

A backward graph returns ``None`` for every input that needs no gradient (the model's input, a
frozen parameter). Those outputs stay out of the HLO and the runtime call puts them back, so
aot_autograd gets ``None`` where eager autograd has none. Every seam is covered, and the deferred
flow: capture (runs eagerly), ``parallel_compile``, then the same training step served from the
cache under the cache-hit assert.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from neuron_args import parallel_compile
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.lowering import hlo

SEAMS = ["neuron_libtorch", "neuron_native_lite", "neuron_libtorch_graph_capture"]


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.hidden = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(torch.tanh(self.embed(x)))))


def mlp(frozen: bool = False) -> MLP:
    torch.manual_seed(0)
    model = MLP()
    if frozen:
        model.embed.requires_grad_(False)
    return model


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def sgd_steps(model: torch.nn.Module, call: Any, steps: int = 3) -> list[dict[str, torch.Tensor | None]]:
    """``steps`` SGD steps (momentum, eager optimizer) on an MSE loss; the gradients of each step."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    grads = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(call(x), y).backward()
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return grads


def assert_same_training(got: MLP, want: MLP, got_grads: list, want_grads: list) -> None:
    for g_step, w_step in zip(got_grads, want_grads, strict=True):
        assert {n for n, g in g_step.items() if g is None} == {n for n, g in w_step.items() if g is None}
        for name, w in w_step.items():
            if w is not None:
                torch.testing.assert_close(g_step[name], w, msg=lambda m, name=name: f"{name}: {m}")
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        torch.testing.assert_close(p, q, msg=lambda m, name=name: f"{name}: {m}")


def compile_(model: torch.nn.Module, seam: str, cache_dir: Path) -> torch.nn.Module:
    torch._dynamo.reset()
    options = {"cache_dir": str(cache_dir), "compiler": "local", "compiler_args": ["-O1"], "target": "trn2"}
    return torch.compile(model, backend=seam, options=options, dynamic=False, fullgraph=True)


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[hlo.LoweredGraph]:
    """Every graph the seams lower in this test, forward then backward."""
    seen: list[hlo.LoweredGraph] = []
    real = hlo.lower_fx_graph

    def spy(gm: torch.fx.GraphModule, example_inputs: Any) -> hlo.LoweredGraph:
        seen.append(real(gm, example_inputs))
        return seen[-1]

    monkeypatch.setattr(hlo, "lower_fx_graph", spy)
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    yield seen
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def eager_runs() -> dict[bool, tuple[MLP, list]]:
    """Eager training of the MLP, all parameters trained (False) or the first layer frozen (True)."""
    runs = {}
    for frozen in (False, True):
        model = mlp(frozen)
        runs[frozen] = (model, sgd_steps(model, model))
    return runs


@pytest.mark.parametrize("seam", SEAMS)
def test_input_without_grad_trains_like_eager_on_every_seam(seam, tmp_path, lowered, eager_runs):
    """The input needs no gradient: the backward graph's gradient of it is None, returned as None."""
    model = mlp()
    grads = sgd_steps(model, compile_(model, seam, tmp_path))
    assert_same_training(model, *eager_runs[False][:1], grads, eager_runs[False][1])
    forward, backward = lowered
    assert [i for i, v in backward.constant_outputs] and all(v is None for _, v in backward.constant_outputs)
    assert len(backward.output_specs) == 6  # weight and bias gradients of the three layers
    assert forward.constant_outputs == ()
    cache = CompileCache(tmp_path)
    keys = {e.key for e in cache.entries()}
    assert len(keys) == 2  # forward and backward
    if seam == "neuron_libtorch_graph_capture":  # the deferred flow: build, then serve under the cache-hit assert
        assert [cache.entry(k).status for k in keys] == ["pending", "pending"]
        report = parallel_compile(tmp_path, workers=1, quiet=True)
        assert sorted(g.key for g in report.graphs) == sorted(keys)
        served = mlp()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ASSERT_CACHE_HIT_ENV, "1")
            grads = sgd_steps(served, compile_(served, "neuron_libtorch", tmp_path))
        assert_same_training(served, eager_runs[False][0], grads, eager_runs[False][1])
    assert all(cache.entry(k).is_complete for k in keys)


def test_frozen_submodule_gives_several_none_gradients(tmp_path, lowered, eager_runs):
    """A frozen layer's weight and bias, and the input, need no gradient: three None outputs, in place."""
    model = mlp(frozen=True)
    grads = sgd_steps(model, compile_(model, "neuron_libtorch", tmp_path))
    want_model, want_grads = eager_runs[True]
    assert_same_training(model, want_model, grads, want_grads)
    assert grads[0]["embed.weight"] is None and grads[0]["hidden.weight"] is not None
    _, backward = lowered
    assert len(backward.constant_outputs) >= 3 and len(backward.output_specs) == 4


def test_lowered_graph_keeps_none_and_constant_outputs_out_of_the_hlo():
    """Graph outputs that are not tensors are recorded by position, not lowered; the runtime call re-inserts them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tests.xla_run import executable_runner

    x = torch.randn(3, 4)
    gm = make_fx(lambda x: (None, x * 2, 7, x.sum()))(x)
    lowered = hlo.lower_fx_graph(gm, [x])
    assert lowered.constant_outputs == ((0, None), (2, 7))
    assert [s.shape for s in lowered.output_specs] == [(3, 4), ()]
    assert lowered.result_shapes == ("3, 4", "")
    none, doubled, seven, total = executable_runner(lowered)(x)
    assert none is None and seven == 7
    torch.testing.assert_close(doubled, x * 2)
    torch.testing.assert_close(total, x.sum())


class Dropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x * self.scale, p=0.5, training=True)


@pytest.mark.slow
def test_dropout_draws_a_new_mask_each_call_and_backward_uses_it(tmp_path, lowered):
    """A seeded graph takes a random key the runtime draws from torch's generator: masks differ per call,
    repeat under torch.manual_seed, and the backward graph scales by the forward's own mask."""
    model = Dropout()
    compiled = compile_(model, "neuron_libtorch", tmp_path)
    x = torch.rand(256, generator=torch.Generator().manual_seed(1)) + 1.0
    y = compiled(x)
    y.sum().backward()
    mask = y != 0
    assert 0.3 < mask.float().mean() < 0.7
    torch.testing.assert_close(model.scale.grad, mask * x / 0.5)
    with torch.no_grad():
        again = compiled(x)
        torch.manual_seed(5)
        first = compiled(x)
        torch.manual_seed(5)
        second = compiled(x)
    assert not torch.equal(again != 0, mask) and torch.equal(first, second)
    forward, backward = lowered[:2]
    assert forward.seeded and not backward.seeded
    assert forward.input_specs[-1] == hlo.SEED_SPEC and forward.graph_input_specs == forward.input_specs[:-1]
    # the training forward and the no_grad graph draw random numbers; the manifest lists the caller's input only
    seeded = [e.metadata() for e in CompileCache(tmp_path).entries()
              if e.metadata()["input_specs"][-1] == {"shape": [2], "dtype": "int32"}]
    assert [md["input_shapes"] for md in seeded] == [["256,"], ["256,"]]
