"""Dynamo's recompile limit never turns a neuron backend off without a word (neuron_args.eager_fallback)."""
from __future__ import annotations

import inspect

import pytest
import torch

from neuron_args import eager_fallback
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.eager_fallback import MODE_ENV, EagerFallbackError, EagerFallbackWarning
from neuron_args.errors import OptionsError
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(MODE_ENV, raising=False)
    monkeypatch.delenv("VLLM_NEURON_MANIFEST_DIR", raising=False)
    ACTIVITY.eager_fallbacks.clear()
    torch._dynamo.reset()


def _compiled(tmp_path):
    def double(x):
        return x * 2

    return double, torch.compile(double, backend="neuron_libtorch", dynamic=False,
                                 options={"cache_dir": str(tmp_path), "compiler": "local"})


def test_past_the_limit_a_neuron_frame_is_an_error_under_the_plugin(tmp_path):
    fn, compiled = _compiled(tmp_path)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
        with pytest.raises(EagerFallbackError) as info:
            compiled(torch.ones(3))
    text = str(info.value)
    assert "torch.compile(backend='neuron_libtorch'): Dynamo's recompile limit (1) was reached for 'double'" in text
    assert f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}" in text
    assert "torch._dynamo.reset() between models" in text and "recompile_limit" in text and "bucket" in text
    assert list(ACTIVITY.eager_fallbacks.values()) == ["error"]


def test_warn_mode_runs_eager_and_says_so_once(tmp_path, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "warn")
    _, compiled = _compiled(tmp_path)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        compiled(torch.ones(2))
        with pytest.warns(EagerFallbackWarning, match=r"recompile limit \(1\) was reached for 'double'"):
            out = compiled(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 2.0))
    [(frame, how)] = ACTIVITY.eager_fallbacks.items()
    assert how == "warn" and frame.startswith("'double' (") and frame.endswith("(neuron_libtorch, recompile_limit 1)")


def test_mode_error_under_the_plugin_assert_cache_hit_or_a_runner_call_else_warn(monkeypatch):
    assert eager_fallback.mode() == "error"  # this session runs under the plugin
    previous = eager_fallback.error_by_default(False)
    try:
        assert eager_fallback.mode() == "warn"
        with eager_fallback.runner_call():
            assert eager_fallback.mode() == "error"
        monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
        assert eager_fallback.mode() == "error"
        monkeypatch.setenv(MODE_ENV, "warn")
        assert eager_fallback.mode() == "warn"
        monkeypatch.setenv(MODE_ENV, "sometimes")
        with pytest.raises(OptionsError, match=f"{MODE_ENV}='sometimes' is not one of error, warn"):
            eager_fallback.mode()
    finally:
        eager_fallback.error_by_default(previous)


def two_shapes_past_a_limit_of_one(backend="neuron_libtorch"):
    def double(x):
        return x * 2

    compiled = torch.compile(double, backend=backend, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        compiled(torch.ones(2))
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))


def test_another_backend_past_the_limit_is_left_to_dynamo():
    two_shapes_past_a_limit_of_one("eager")
    assert ACTIVITY.eager_fallbacks == {}


class ManyBuckets(torch.nn.Module):
    """One graph type with 12 buckets: more shapes of one frame than Dynamo's default limit of 8."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU()).eval()

    def neuron_graphs(self):
        return [GraphSpec("decode", self.mlp, {f"b{n}": (lambda n=n: {"input": torch.ones(n, 8)}) for n in range(1, 13)})]


def test_a_runner_warms_and_serves_twelve_buckets_of_one_graph_type(tmp_path):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=8):  # a fresh process's default
        runner = NeuronRunner(ManyBuckets(), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                              cache_dir=tmp_path)
        report = runner.warmup(emit=False)
        assert len(report.graphs) == 12
        with runner.serve():
            for n in range(1, 13):
                assert runner.run("decode", {"input": torch.ones(n, 8)}).shape == (n, 8)
    assert ACTIVITY.eager_fallbacks == {}


def test_a_session_of_many_models_is_not_stopped_by_the_accumulated_limit(tmp_path):
    """Dynamo counts compiles of one code object per process, freed models included (256 by default): a runner's
    calls run under its raised limits (``NeuronRunner.run`` applies them, ``tests/test_runner.py`` checks that)."""
    backend_calls = []

    def counting(gm, example_inputs):
        backend_calls.append(len(example_inputs))
        return gm.forward

    def add(x):
        return x + 1

    compiled = torch.compile(add, backend=counting, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1000):  # the per-frame limit out of the way
        with eager_fallback.runner_call():
            for n in range(1, 301):
                compiled(torch.ones(n))
    assert len(backend_calls) == 300


SHAPES_TEST = ("import torch\n\n\n" + inspect.getsource(two_shapes_past_a_limit_of_one)
               + "\n\ndef test_two_shapes_past_a_limit_of_one():\n    two_shapes_past_a_limit_of_one()\n")


def test_the_plugin_fails_the_test_by_default_and_its_summary_counts_fallbacks(neuron_project, monkeypatch):
    neuron_project.makepyfile(test_shapes=SHAPES_TEST)
    failed = neuron_project.runpytest("-p", "no:randomly")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*EagerFallbackError*recompile limit (1) was reached for 'double'*",
                                 "eager fallbacks: 0 frame(s) ran in eager PyTorch and 1 failed past Dynamo's "
                                 "recompile limit: 'double' (*test_shapes.py:*) (neuron_libtorch, recompile_limit 1)*"])
    ACTIVITY.eager_fallbacks.clear()
    torch._dynamo.reset()
    monkeypatch.setenv(MODE_ENV, "warn")
    warned = neuron_project.runpytest("-p", "no:randomly")
    warned.assert_outcomes(passed=1, warnings=1)
    warned.stdout.fnmatch_lines(["eager fallbacks: 1 frame(s) ran in eager PyTorch and 0 failed*"])
