"""A torch.compile'd module called directly: the seam's direct call, and aot_autograd's wrapper where it is needed.

Every case compares with eager PyTorch (outputs, in-place updated buffers, aliasing, gradients)
and checks which call the seam handed to Dynamo: the direct call (``.plan``) for inference graphs
whose only runtime need is copying mutated inputs back, aot_autograd's wrapper for the rest.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.seams import dispatch
from neuron_args.seams.backends import neuron_libtorch
from tests.models import decoder_inputs, make_decoder, make_mlp, mlp_inputs

TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No Dynamo state, no cache-hit assert, direct calls on; one torch thread (eager on a busy machine)."""
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(dispatch.ENV, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("dispatch-cache")


class Compiled:
    """``torch.compile(model)`` on the neuron_libtorch seam, keeping what the seam returned per graph."""

    def __init__(self, model: Callable[..., Any], cache_dir) -> None:
        self.returned: list[Callable[..., Any]] = []
        options = {"cache_dir": str(cache_dir), "compiler": "local", "compiler_args": ["--auto-cast=none", "-O1"],
                   "target": "trn2"}

        def backend(gm, example_inputs):
            fn = neuron_libtorch(gm, example_inputs, options=options)
            self.returned.append(fn)
            return fn

        self.fn = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def direct(self) -> list[bool]:
        """Per compiled graph: True when the seam returned its direct call, False for aot's wrapper."""
        return [getattr(fn, "plan", None) is not None for fn in self.returned]


def decode_steps(call: Callable[..., torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Prefill (T=5) then ``steps`` greedy decode steps of the decoder block; the logits of each call."""
    with torch.inference_mode():
        logits = [call(*decoder_inputs(seq=5))]
        token = logits[-1][:, -1:].argmax(-1)
        for pos in range(5, 5 + steps):
            logits.append(call(token, torch.tensor([pos])))
            token = logits[-1].argmax(-1)
    return logits


@pytest.mark.slow
def test_decode_steps_match_eager_logits_and_kv_cache(cache_dir):
    block = make_decoder()
    reference = copy.deepcopy(block)
    compiled = Compiled(block, cache_dir)
    caches = []

    def step(tokens, pos):
        got, want = compiled(tokens, pos), reference(tokens, pos)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(block.k_cache, reference.k_cache, **TOL)
        torch.testing.assert_close(block.v_cache, reference.v_cache, **TOL)
        caches.append(int(pos[-1]))
        return want

    decode_steps(step, 24)
    assert compiled.direct == [True, True], "prefill and decode are called directly"
    plan = compiled.returned[1].plan
    assert [i for i, _, _ in plan.mutated] and plan.n_mutated == 2, "the two KV caches are copied back"
    assert block.k_cache[:, :, 28].abs().sum() > 0, "the last step wrote its position"


@pytest.mark.slow
def test_direct_call_and_aot_wrapper_give_identical_results(cache_dir, monkeypatch):
    """Same executables either way: bit-identical logits and KV caches over many steps."""
    results = {}
    for direct in ("1", "0"):
        monkeypatch.setenv(dispatch.ENV, direct)
        torch._dynamo.reset()
        block = make_decoder()
        compiled = Compiled(block, cache_dir)
        results[direct] = decode_steps(compiled, 16), block.k_cache.clone(), block.v_cache.clone()
        assert compiled.direct == [direct == "1"] * 2
    (logits_a, k_a, v_a), (logits_b, k_b, v_b) = results["1"], results["0"]
    assert all(torch.equal(a, b) for a, b in zip(logits_a, logits_b))
    assert torch.equal(k_a, k_b) and torch.equal(v_a, v_b)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_hf_static_causal_lm_decode_matches_eager(cache_dir):
    pytest.importorskip("transformers", reason="the Hugging Face case needs transformers (pip install -e '.[hf]')")
    from neuron_args.hf import StaticCausalLM
    from tests.hf.architectures import ARCHITECTURES

    lm = StaticCausalLM(ARCHITECTURES["mistral"].build(), max_cache_len=24)
    reference = copy.deepcopy(lm)
    compiled = Compiled(lm, cache_dir)

    def caches(m: StaticCausalLM) -> list[torch.Tensor]:
        return [t for layer in m.cache.layers for t in (layer.keys, layer.values)]

    with torch.inference_mode():
        ids = torch.zeros(1, 8, dtype=torch.long)
        ids[0, :5] = torch.tensor([5, 17, 42, 8, 99])
        got, want = compiled(ids, torch.tensor(0)), reference(ids, torch.tensor(0))
        torch.testing.assert_close(got, want, **TOL)
        token = int(want[0, 4].argmax())
        for pos in range(5, 17):
            got, want = compiled(torch.tensor([[token]]), torch.tensor(pos)), reference(torch.tensor([[token]]),
                                                                                        torch.tensor(pos))
            torch.testing.assert_close(got, want, **TOL)
            for a, b in zip(caches(lm), caches(reference), strict=True):
                torch.testing.assert_close(a, b, **TOL)
            token = int(want[0, 0].argmax())
    assert compiled.direct == [True, True]


def test_output_viewing_an_input_keeps_aot_wrapper_and_aliases_like_eager(cache_dir):
    def f(x):
        return x[1:], x.sum(0)

    compiled = Compiled(f, cache_dir)
    x = torch.arange(12.0).reshape(3, 4)
    view, total = compiled(x)
    assert compiled.direct == [False]
    torch.testing.assert_close(total, x.sum(0))
    assert view._base is x._base is f(x)[0]._base and torch.equal(view, x[1:])
    x[2, 0] = -1.0  # the returned view sees its input's later writes, as in eager
    assert view[1, 0] == -1.0


def test_returning_the_mutated_input_returns_that_tensor_like_eager(cache_dir):
    def f(x, y):
        x.mul_(2)
        return x, y + 1

    compiled = Compiled(f, cache_dir)
    with torch.inference_mode():
        x, y = torch.arange(6.0), torch.ones(3)
        out_x, out_y = compiled(x, y)
        assert out_x is x and torch.equal(x, torch.arange(6.0) * 2)
        torch.testing.assert_close(out_y, y + 1)
        compiled(x, y)
        assert torch.equal(x, torch.arange(6.0) * 4), "the second call doubles it again"


def test_views_of_one_intermediate_are_returned_as_aot_wrapper_returns_them(cache_dir, monkeypatch):
    """aot_autograd regenerates an intermediate's views only for autograd; here both calls return owned outputs."""
    def f(x):
        y = x * 2
        return y[0], y[1]

    shared = {}
    for direct in ("1", "0"):
        monkeypatch.setenv(dispatch.ENV, direct)
        torch._dynamo.reset()
        compiled = Compiled(f, cache_dir)
        with torch.inference_mode():
            x = torch.randn(2, 5)
            a, b = compiled(x)
        assert compiled.direct == [direct == "1"]
        torch.testing.assert_close(a, x[0] * 2)
        torch.testing.assert_close(b, x[1] * 2)
        shared[direct] = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert shared["1"] == shared["0"]


def test_graph_under_grad_keeps_aot_wrapper_and_gradients_match_eager(cache_dir):
    model = make_mlp()
    reference = copy.deepcopy(model)
    compiled = Compiled(model, cache_dir)
    (x,) = mlp_inputs()
    x_got, x_want = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = compiled(x_got), reference(x_want)
    assert got.requires_grad
    torch.testing.assert_close(got, want, **TOL)
    (got ** 2).sum().backward()
    (want ** 2).sum().backward()
    assert compiled.direct == [False]
    torch.testing.assert_close(x_got.grad, x_want.grad, **TOL)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)


def test_inference_graph_with_grad_mode_on_is_called_directly(cache_dir):
    """Nothing requires grad: an inference graph even with grad mode on; outputs do not require grad."""
    model = make_mlp().requires_grad_(False)
    compiled = Compiled(model, cache_dir)
    (x,) = mlp_inputs()
    got = compiled(x)
    assert torch.is_grad_enabled() and compiled.direct == [True]
    assert not got.requires_grad
    torch.testing.assert_close(got, model(x), **TOL)


def test_batchnorm_running_stats_in_train_mode_match_eager(cache_dir):
    """Buffers mutated by the graph (running mean/var, the int64 batch counter) are copied back each call."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU()).train()
    reference = copy.deepcopy(model)
    compiled = Compiled(model, cache_dir)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(4, 6, generator=g)
            torch.testing.assert_close(compiled(x), reference(x), **TOL)
            bn, ref_bn = model[1], reference[1]
            torch.testing.assert_close(bn.running_mean, ref_bn.running_mean, **TOL)
            torch.testing.assert_close(bn.running_var, ref_bn.running_var, **TOL)
            assert bn.num_batches_tracked.dtype == torch.int64
            assert torch.equal(bn.num_batches_tracked, ref_bn.num_batches_tracked)
    assert int(model[1].num_batches_tracked) == 6
    assert compiled.direct == [True]
    assert compiled.returned[0].plan.n_mutated == 3


def test_int64_inputs_and_outputs_are_exact(cache_dir):
    def f(ids, pos):
        return ids * 3 + pos, (ids % 7).sum(-1)

    compiled = Compiled(f, cache_dir)
    ids, pos = torch.arange(12, dtype=torch.long).reshape(2, 6), torch.tensor([100, 200, 300, 400, 500, 600])
    with torch.inference_mode():
        got, want = compiled(ids, pos), f(ids, pos)
    assert compiled.direct == [True]
    assert all(a.dtype == torch.int64 and torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_leaf_requiring_grad_mutated_under_no_grad_is_copied_back_like_eager(cache_dir):
    """An in-place update of parameters under no_grad (an optimizer-like step): aot copies into ``p.detach()``."""
    model = make_mlp()
    reference = copy.deepcopy(model)

    def step(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = m(x)
        for p in m.parameters():
            p.mul_(0.5).add_(out.mean())
        return out

    compiled = Compiled(lambda x: step(model, x), cache_dir)
    (x,) = mlp_inputs()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), step(reference, x), **TOL)
    assert compiled.direct == [True]
    assert all(leaf for _, _, leaf in compiled.returned[0].plan.mutated)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert p.requires_grad and p.grad_fn is None
        torch.testing.assert_close(p, q, **TOL)


def meta(**over: Any) -> Any:
    """A stand-in for aot_autograd's ViewAndMutationMeta of a one-input graph that mutates its input's data."""
    from types import SimpleNamespace

    info = SimpleNamespace(mutates_data=True, mutates_metadata=False, mutates_storage_metadata=False, is_leaf=False)
    fields = dict(input_info=[info], output_info=[SimpleNamespace(output_type=SimpleNamespace(name="non_alias"))],
                  mutated_inp_runtime_indices=[0], num_intermediate_bases=0, tokens={}, is_rng_op_functionalized=False,
                  num_outputs_rng_offset=0, subclass_inp_meta=[0], subclass_fw_graph_out_meta=[0],
                  grad_enabled_mutation=None, dynamic_outputs=False, mutated_inp_stream_indices=None)
    fields.update(over)
    for key in [k for k in over if k in vars(info)]:
        setattr(info, key, fields.pop(key))
    return SimpleNamespace(**fields)


def test_plan_of_a_plain_data_mutation():
    p = dispatch.plan(meta(), 1)
    assert (p.n_mutated, p.n_outputs, p.mutated, p.kinds) == (1, 1, ((0, 0, False),), ("non_alias",))
    target, new, out = torch.zeros(3), torch.arange(3.0), torch.ones(2)
    assert dispatch.direct_call(lambda args: [new, out], p)(target) == [out]  # the copy-back: aot's epilogue
    assert torch.equal(target, new)


@pytest.mark.parametrize("over, reason", [
    ({"mutates_metadata": True}, "metadata mutation"),
    ({"mutates_storage_metadata": True}, "metadata mutation"),
    ({"mutated_inp_runtime_indices": []}, "kept inside the graph"),
    ({"num_intermediate_bases": 1}, "intermediate bases"),
    ({"tokens": {0: None}}, "effect tokens"),
    ({"grad_enabled_mutation": False}, "grad mode"),
    ({"mutated_inp_stream_indices": [1]}, "user stream"),
    ({"subclass_inp_meta": [object()]}, "tensor subclasses"),
])
def test_plan_refuses_what_aot_wrapper_must_do(over, reason):
    with pytest.raises(dispatch.NotPlain, match=reason):
        dispatch.plan(meta(**over), 1)
    with pytest.raises(dispatch.NotPlain, match="metadata was not recorded"):
        dispatch.plan(None, 1)
    with pytest.raises(dispatch.NotPlain, match="takes 1 arguments"):
        dispatch.plan(meta(), 2)
