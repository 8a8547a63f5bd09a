"""``assert_ranks(N)`` tells a model that ignores its rank from one that shards (in-process: no rank processes)."""
from __future__ import annotations

import pytest

from examples.tiny_vlm.model import TinyVLM
from pytest_neuron_args.assertions import ManifestView
from pytest_neuron_args.ranks import serve_problems, weights_digest

DOC = {"graphs": [{"graph_hash": "k" * 32, "input_shapes": ["1, 8"], "ranks": [0, 1]}]}


def test_the_tiny_vlm_s_shards_differ_from_its_unsharded_model_and_from_each_other() -> None:
    whole = weights_digest(TinyVLM(seed=0))
    shards = {r: weights_digest(TinyVLM(tp_rank=r, tp_size=2, seed=0)) for r in (0, 1)}
    assert shards[0]["layout"] == shards[1]["layout"] != whole["layout"]  # the vocabulary slice's shape
    assert shards[0]["values"] != shards[1]["values"]
    ManifestView(DOC, rank_weights=shards, single_rank_layout=whole["layout"]).assert_ranks(2)


def test_a_model_that_ignores_its_rank_fails_assert_ranks_unless_replicated() -> None:
    whole = weights_digest(TinyVLM(seed=0))
    same = {0: whole, 1: dict(whole)}
    view = ManifestView(DOC, rank_weights=same, single_rank_layout=whole["layout"])
    with pytest.raises(AssertionError, match=r"ranks \[0, 1\] built their 1 graph\(s\) from no shard: every rank "
                                             r"holds weights of the same names and shapes as the model built outside"):
        view.assert_ranks(2)
    view.assert_ranks(2, replicated=True)
    # the unsharded layout unknown: byte-identical weights on every rank still tell it
    with pytest.raises(AssertionError, match="every rank holds byte-identical weights"):
        ManifestView(DOC, rank_weights=same).assert_ranks(2)
    ManifestView(DOC, rank_weights=same).assert_ranks(ranks=[0, 1], replicated=True)


def test_a_serving_test_fails_for_a_rank_that_failed_missed_or_reported_nothing() -> None:
    ok = {"rank": 0, "outcome": "passed", "error": None, "serve_calls": 2, "serve_misses": 0}
    assert serve_problems([ok, {**ok, "rank": 1}]) == []
    missed = serve_problems([ok, {**ok, "rank": 1, "serve_misses": 1}])
    assert missed == ["rank 1 passed (2 calls, 1 misses): a served call missed the cache (the test caught the "
                      "CacheMissError)"]
    silent = serve_problems([ok, {**ok, "rank": 1, "outcome": None}])
    assert silent == ["rank 1 reported nothing (2 calls, 0 misses): its output is in the captured stdout"]
