"""The tests a model developer writes with the plugin: ``pytest examples --neuron-target trn2``.

On a laptop or in CPU CI they compile on the embedded local compiler; on a trn2 host with
neuronx-cc on PATH the same tests compile NEFFs (``--neuron-compiler auto`` picks it).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from examples.tiny_vlm.generate import dist_gather_logits, generate
from examples.tiny_vlm.model import TinyVLM
from neuron_args.flags import optimization_level

PROMPTS = [[5, 17, 42, 8, 99, 3], [255] * 4 + [7, 21, 64]]


def image() -> torch.Tensor:
    return torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("graph_type, level", [("decode", 3), ("encoder", 3), ("jf", 2), ("prefill", None)])
def test_policy_levels(request, neuron_settings, graph_type, level):
    request.applymarker(pytest.mark.graph_type(graph_type))
    args = request.getfixturevalue("neuron_compiler_args")
    # an explicit --neuron-optimization-level turns the policy off: every graph gets that level
    explicit = neuron_settings.optimization_level
    assert optimization_level(args) == (explicit if explicit is not None else level)


@pytest.mark.graph_type("prefill")
def test_prefill_keeps_the_base_arguments(neuron_compiler_args, neuron_runner):
    assert neuron_compiler_args == neuron_runner.resolver.base_args


@pytest.mark.slow
def test_warmup_then_serve_generates_eager_tokens_without_a_cache_miss(neuron_served, neuron_compile_counter):
    # under --neuron-tp N this runs in each rank process: its logits are its vocabulary slice, gathered before argmax
    gather = dist_gather_logits if dist.is_available() and dist.is_initialized() else (lambda t: t)
    with neuron_compile_counter.expect(compiles=0, misses=0), torch.inference_mode():
        tokens = generate(neuron_served.model, PROMPTS, image=image(), max_new_tokens=4, forced={0: [30, 31]},
                          run=neuron_served.run, gather_logits=gather)
    assert tokens == generate(TinyVLM(seed=0), PROMPTS, image=image(), max_new_tokens=4, forced={0: [30, 31]})


def test_manifest_lists_every_graph_with_its_ranks(neuron_manifest, neuron_settings):
    neuron_manifest.assert_complete(["encoder", "prefill", "decode", "jf"])
    neuron_manifest.assert_ranks(neuron_settings.tp)
    assert neuron_manifest.validate() == []


def test_manifest_matches_the_committed_baseline(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)


@pytest.mark.neuron_hardware
def test_neffs_exist_on_a_neuron_host(neuron_manifest):
    assert all(g["neff_size"] > 0 for g in neuron_manifest.graphs)
