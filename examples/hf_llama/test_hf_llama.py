"""Plugin tests a developer writes for a transformers model: ``pytest examples/hf_llama``.

Warmup compiles the prefill buckets and the decode graph; serve generates with no cache miss and
the tokens equal ``transformers``' own ``generate``; the manifest lists every graph.
"""
from __future__ import annotations

import pytest
import torch

from examples.hf_llama.generate import generate, reference
from examples.hf_llama.model import HFLlama
from neuron_args.flags import optimization_level

PROMPTS = [[5, 17, 42, 8, 99, 3], list(range(3, 23))]


@pytest.mark.graph_type("decode")
def test_decode_compiles_at_O3(neuron_compiler_args, neuron_settings):
    # an explicit --neuron-optimization-level turns the policy off: every graph gets that level
    explicit = neuron_settings.optimization_level
    assert optimization_level(neuron_compiler_args) == (explicit if explicit is not None else 3)


@pytest.mark.graph_type("prefill")
def test_prefill_keeps_the_base_arguments(neuron_compiler_args, neuron_runner):
    assert neuron_compiler_args == neuron_runner.resolver.base_args


@pytest.mark.slow
def test_serve_generates_the_tokens_of_transformers_generate(neuron_served, neuron_compile_counter):
    with neuron_compile_counter.expect(compiles=0, misses=0), torch.inference_mode():
        tokens = [generate(neuron_served.model, p, max_new_tokens=8, run=neuron_served.run) for p in PROMPTS]
    eager = HFLlama(seed=0)  # a fresh copy: transformers' generate keeps its own cache, so one serves every prompt
    assert tokens == [reference(eager, p, max_new_tokens=8) for p in PROMPTS]


def test_manifest_lists_the_prefill_buckets_and_the_decode_graph(neuron_manifest):
    neuron_manifest.assert_complete(["prefill", "decode"])
    neuron_manifest.assert_ranks(1)
    assert neuron_manifest.validate() == []
    assert sorted(g["input_shapes"][0] for g in neuron_manifest.graphs) == ["1, 1", "1, 16", "1, 32"]


def test_manifest_matches_the_committed_baseline(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
