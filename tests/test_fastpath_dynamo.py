"""The serve fast path on the code Dynamo generates here, for the project's models.

``fastpath._swapped`` runs the code object of a Dynamo cache entry with its compiled graph's global
swapped for the variant's direct call; it knows only how Dynamo names that global and wraps the
graph. A torch that changes either must fail this file (every example graph learned), and at serve
time the fast path going off for a graph is a warning, never silent.
"""
from __future__ import annotations

import logging
import sys

import pytest
import torch

from neuron_args import fastpath
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.seams.backends import CAPTURE_SEAM
from tests.test_fastpath import BASE, DecoderModel, Scaled, eager, inp, run_x


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(fastpath.ENV, raising=False)


def _tiny_vlm() -> torch.nn.Module:
    from examples.tiny_vlm.model import TinyVLM, TinyVLMConfig

    return TinyVLM(TinyVLMConfig(prefill_buckets=(16,), decode_buckets=(4,)), seed=0)


def _tiny_llama() -> torch.nn.Module:
    from tests.test_fastpath_hf import TinyLlama

    return TinyLlama()


@pytest.mark.parametrize("make, graph_types", [
    (DecoderModel, {"prefill", "decode"}),  # a KV cache written by index_put
    pytest.param(_tiny_vlm, {"encoder", "prefill", "decode", "jf"}, marks=pytest.mark.slow),  # variants, one entry
    pytest.param(_tiny_llama, {"prefill", "decode"}, marks=pytest.mark.slow),  # output capturing's global reset
], ids=["decoder", "tiny_vlm", "hf_llama"])
def test_every_example_graph_runs_dynamos_code_with_its_variant_swapped_in(make, graph_types, tmp_path_factory):
    torch._dynamo.reset()
    runner = NeuronRunner(make(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-dynamo"))
    runner.warmup(emit=False)
    assert runner.fast_path.refused == {}, f"Python {sys.version_info[:2]}, torch {torch.__version__}"
    assert set(runner.fast_path.graphs) == graph_types
    for graph_type, fast_graphs in runner.fast_path.graphs.items():
        for fast in fast_graphs:
            names = fast.code.__code__.co_names
            assert not [n for n in names if n.startswith(fastpath._GRAPH_PREFIX)], graph_type
            (swapped,) = [n for n in names if n.startswith("__neuron_args_fast_")]
            assert fast.code.__globals__[swapped].graph is fast.run, f"{graph_type}: the learned variant is called"


def _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog) -> tuple[NeuronRunner, str]:
    """``Scaled`` warmed on the capture seam (every warning new to this process); the one warning logged."""
    monkeypatch.setattr(ACTIVITY, "said", set())
    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-off"))
    with caplog.at_level(logging.WARNING, logger="neuron_args.fastpath"):
        runner.warmup(emit=False)
    assert runner.fast_path.graphs == {}
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    return runner, warning.getMessage()


def test_dynamo_code_in_a_form_it_does_not_know_is_served_guarded_and_warned(tmp_path_factory, monkeypatch, caplog):
    """Another torch naming its compiled graphs otherwise: the fast path is off for that graph, loudly."""
    monkeypatch.setattr(fastpath, "_GRAPH_PREFIX", "__graph_of_a_future_torch")
    runner, warning = _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog)
    ((_, why),) = runner.fast_path.refused.items()
    assert "otherwise than __graph_of_a_future_torch*" in why and f"torch {torch.__version__}" in why
    assert "graph type 'decode'" in warning and "the serve fast path is off" in warning and "_swapped" in warning
    x = torch.ones(2, 8)
    with torch.inference_mode():
        torch.testing.assert_close(runner.run("decode", {"x": x}), Scaled()(x))


def test_learning_that_raises_on_another_torch_is_warned_too(tmp_path_factory, monkeypatch, caplog):
    """The private Dynamo API the fast path reads (its cache entries) gone: served guarded, and said so."""
    def gone(code):
        raise AttributeError("module 'torch._dynamo.eval_frame' has no attribute '_debug_get_cache_entry_list'")

    monkeypatch.setattr(fastpath, "_cache_entries", gone)
    _, warning = _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog)
    assert "the serve fast path is off" in warning and "_debug_get_cache_entry_list" in warning


class BreakAtTheEnd(torch.nn.Module):
    """A graph break after the last tensor op: one compiled graph, then a resume function with none."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)
        self.after = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        torch._dynamo.graph_break()
        self.after += 1  # the resume function's work: Dynamo's to run (and guard), never replayed eagerly
        return y

    def neuron_graphs(self) -> list[GraphSpec]:
        return [GraphSpec("decode", self, {"b2": lambda: {"x": torch.ones(2, 8)}})]


def test_a_frame_that_resumes_after_a_graph_break_keeps_the_guarded_path(tmp_path_factory):
    torch._dynamo.reset()
    model = BreakAtTheEnd()
    runner = NeuronRunner(model, compiler_args=BASE, backend=CAPTURE_SEAM, fullgraph=False,
                          cache_dir=tmp_path_factory.mktemp("fastpath-resume"))
    runner.warmup(emit=False)
    ((_, why),) = runner.fast_path.refused.items()
    assert "graph break" in why and "of its own" in why  # the break is in the entry's forward, called by
    # the runner's compiled frame; an entry compiled alone would name its resume function instead
    x = inp(2, 8)
    torch.testing.assert_close(run_x(runner, x), eager(BreakAtTheEnd(), x))
    assert runner.fast_path.graphs == {} and model.after == 2


def test_a_graph_whose_seam_keeps_aot_autograds_wrapper_is_served_guarded(tmp_path_factory, monkeypatch):
    """``NEURON_ARGS_DIRECT_CALL=0``: Dynamo calls aot_autograd's runtime wrapper, which the fast path would skip."""
    from neuron_args.seams import dispatch

    monkeypatch.setenv(dispatch.ENV, "0")
    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-aot"))
    runner.warmup(emit=False)
    ((_, why),) = runner.fast_path.refused.items()
    assert "is not the seam's direct call (aot_autograd's runtime wrapper kept)" in why
    x = inp(2, 8)
    torch.testing.assert_close(run_x(runner, x), eager(Scaled(), x))
    assert runner.fast_path.graphs == {}


def test_a_dropped_fast_graph_takes_its_variant_out_of_the_module_globals(tmp_path_factory):
    """The swapped code reads the variant's call from the frame's module globals; it goes with its fast graph
    (else every fast graph ever learned would pin its executable for the life of the process)."""
    import gc

    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-dropped"))
    runner.warmup(emit=False)
    (fast,) = runner.fast_path.graphs["decode"]
    g = fast.code.__globals__
    (name,) = [n for n in fast.code.__code__.co_names if n.startswith("__neuron_args_fast_")]
    assert g[name].graph is fast.run
    del fast
    runner.fast_path.graphs.clear()
    gc.collect()
    assert name not in g
