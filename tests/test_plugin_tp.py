"""``--neuron-tp N``: the warmup runs in N rank processes (gloo), and the manifest lists every rank.

Serving tests run in the rank processes too (tests/test_plugin_tp_serve.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.mark.slow
def test_tensor_parallel_warmup_runs_in_rank_processes(neuron_project: pytest.Pytester, warm_cache: SimpleNamespace,
                                                       tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    neuron_project.makepyfile(test_tp="""
        import os

        import pytest
        import torch.distributed as dist


        def test_ranks(neuron_manifest, neuron_settings, neuron_warmup):
            assert neuron_settings.tp == 2
            assert not dist.is_initialized()  # this process is no rank: the ranks are their own processes
            neuron_manifest.assert_complete(["prefill", "decode"])
            neuron_manifest.assert_ranks(2, replicated=True)  # this model ignores its rank: every rank is whole
            assert neuron_manifest.path.parent.name == "dev0_1"
            assert neuron_manifest.doc["config"]["topology"]["tensor_parallel_size"] == 2


        @pytest.mark.graph_type("decode")
        def test_warmed_once(neuron_warmup):
            assert neuron_warmup.reused == ["decode"]  # the ranks are not launched again


        def test_serve(neuron_served):
            assert dist.get_world_size() == 2  # the test runs in the rank processes


        def test_rank_side_effects_stay_in_the_ranks(neuron_model):
            assert "RANK" not in os.environ
    """)
    result = neuron_project.runpytest("-p", "no:randomly", "--neuron-tp=2", f"--neuron-manifest-dir={manifests}", "-rs")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["--neuron-tp 2 served in the rank processes: test_tp.py::test_serve: rank 0 passed "
                                 "(0 calls, 0 misses); rank 1 passed (0 calls, 0 misses)"])
    doc = json.loads((manifests / "dev0_1" / "manifest.json").read_text())
    assert sorted(g["graph_hash"] for g in doc["graphs"]) == sorted(warm_cache.keys.values())
    assert [g["ranks"] for g in doc["graphs"]] == [[0, 1], [0, 1]]
    # 2 ranks warmed up, then 2 ranks ran test_serve (loading what the warmup built)
    result.stdout.fnmatch_lines(["2 graphs: 0 compiled, 2 loaded, 0 captured; *serve: 0 call(s) in 2 serve block(s), "
                                 "0 miss(es); with 4 --neuron-tp rank process report(s)"])


@pytest.mark.slow
def test_a_failing_rank_fails_the_test_with_its_error(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeconftest('''
        import os

        import pytest
        import torch

        from neuron_args.graphs import GraphSpec


        class RankTwoFails(torch.nn.Module):
            def forward(self, x):
                return x * 2

            def neuron_graphs(self):
                return [GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 8)}})]


        @pytest.fixture(scope="session")
        def neuron_model():
            if os.environ.get("RANK") == "1":
                raise RuntimeError("rank 1 cannot build its shard")
            return RankTwoFails()
    ''')
    neuron_project.makepyfile(test_tp="def test_ranks(neuron_manifest):\n    pass\n")
    result = neuron_project.runpytest("--neuron-tp=2")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["--neuron-tp 2: the warmup of [[]'decode'[]] failed in the rank processes (exit status 1)",
                                 "rank 1:", "*RuntimeError: rank 1 cannot build its shard*"])
    # what rank 0 built is in the session's table all the same (it listed nothing)
    result.stdout.fnmatch_lines(["decode * (1, 8) *", "1 graph: *; with 1 --neuron-tp rank process report(s)"])


@pytest.mark.slow
def test_rank_processes_load_the_plugin_where_autoload_is_disabled(neuron_project: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """CI jobs often set PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 and load plugins with -p: the rank processes inherit the
    variable, and failed with "unrecognized arguments: --neuron-rank-worker=..." before they loaded the plugin."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    neuron_project.makepyfile(test_tp="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_warmup):
            pass
    """)
    result = neuron_project.runpytest("-p", "neuron_args", "-p", "no:randomly", "--neuron-tp=2")
    result.assert_outcomes(passed=1)
    assert "unrecognized arguments" not in result.stdout.str() + result.stderr.str()


def test_an_xdist_worker_s_rank_reports_reach_the_controller(pytestconfig: pytest.Config) -> None:
    """`-n 2 --neuron-tp=2`: the graphs the workers' rank processes built were left out of the controller's summary
    ("0 graphs: 0 compiled") and JSON report: a worker handed over its own rows, not its ranks'."""
    from neuron_args.activity import ACTIVITY
    from pytest_neuron_args.options import NeuronSettings
    from pytest_neuron_args.state import NeuronSession

    def session() -> NeuronSession:
        s = NeuronSession(pytestconfig, NeuronSettings.from_config(pytestconfig))
        s._records_before, s._stats_before = dict(ACTIVITY.records), ACTIVITY.stats.snapshot()  # as start() takes it
        return s

    row = {"key": "ab" * 16, "graph_type": "decode", "input_shapes": ["1, 8"], "optimization_level": 3,
           "compiler_args": ["-O3"], "compiled": True, "captured": False, "compile_seconds": 0.5,
           "executable_size": 100, "loads": 1, "serve_hits": None, "serve_misses": None}
    worker = session()
    worker.rank_parts = [{"rows": [dict(row)], "stats": {"compiles": 1, "misses": 1}} for _ in range(2)]
    controller = session()
    controller.workers = {"gw0": worker.export()}  # what xdist's workeroutput carries
    merged = controller.merged()
    assert [r["key"] for r in merged["rows"]] == [row["key"]] and merged["rows"][0]["compiled"]
    assert merged["rank_processes"] == 2 and merged["stats"]["compiles"] == 2
