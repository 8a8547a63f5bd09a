"""The runner: the design's load_model wiring, warmup in both flows, serve under the assert, fresh-process serve."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_args import CacheMissError, NeuronArgsError
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, STATS, CompileCache, assert_cache_hit_enabled
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.seams import records

REPO = Path(__file__).resolve().parents[1]


class TwoGraphModel(torch.nn.Module):
    """An MLP entry with a prefill bucket (batch 4) and a decode bucket (batch 1)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8)).eval()

    def compiler_args_for(self, graph_type, example_inputs, base):
        from neuron_args.flags import with_optimization_level

        return with_optimization_level(base, 3) if graph_type == "decode" else list(base)

    def neuron_graphs(self):
        return [GraphSpec("prefill", self.mlp, {"b4": lambda: {"input": torch.ones(4, 8)}}),
                GraphSpec("decode", self.mlp, {"b1": lambda: {"input": torch.ones(1, 8)}})]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv("VLLM_NEURON_MANIFEST_DIR", raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...


def make_runner(cache_dir, **kw):
    return NeuronRunner(TwoGraphModel(), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                        cache_dir=cache_dir, **kw)


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner-cache")
    torch._dynamo.reset()
    make_runner(root).warmup()
    return root


def levels(root):
    return sorted((e.metadata()["graph_type"], e.metadata()["compiler_args"][-1]) for e in CompileCache(root).entries())


def test_load_model_wiring_stamps_base_and_resolves_per_graph(tmp_path):
    runner = make_runner(tmp_path)
    assert runner.model._neuron_base_compiler_args == ["--auto-cast=none", "-O1"]
    assert runner.resolver.resolve_graph_compiler_args("decode") == ["--auto-cast=none", "-O3"]
    assert runner.resolver.resolve_graph_compiler_args("prefill") == ["--auto-cast=none", "-O1"]
    explicit = make_runner(tmp_path, optimization_level=2)
    assert explicit.resolver.resolve_graph_compiler_args("decode") is None
    assert explicit.options["compiler_args"] == ["--auto-cast=none", "-O2"]
    with pytest.raises(NeuronArgsError, match=r"'jf' is not declared .* \['decode', 'prefill'\]"):
        runner.run("jf", {})


def test_a_bad_compile_timeout_fails_where_it_enters(tmp_path):
    from neuron_args.errors import OptionsError

    with pytest.raises(OptionsError, match=r"NeuronRunner compile_timeout=-1 is not a compile timeout"):
        make_runner(tmp_path, compile_timeout=-1)
    assert make_runner(tmp_path, compile_timeout="90").settings.compile_timeout == 90.0


def test_warmup_compiles_each_graph_with_its_args(warm_cache):
    assert levels(warm_cache) == [("decode", "-O3"), ("prefill", "-O1")]


def test_serve_hits_and_asserts_without_touching_the_environment(warm_cache, monkeypatch):
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "0")
    runner = make_runner(warm_cache)
    with runner.serve() as served:
        assert os.environ[ASSERT_CACHE_HIT_ENV] == "0" and assert_cache_hit_enabled()  # passed down, not exported
        out = runner.run("decode", {"input": torch.ones(1, 8)})
        runner.run("prefill", {"input": torch.ones(4, 8)})
    assert os.environ[ASSERT_CACHE_HIT_ENV] == "0" and not assert_cache_hit_enabled()
    assert served.counts.compiles == 0 and served.counts.misses == 0 and served.counts.hits == 2
    assert served.calls == {"decode": 1, "prefill": 1}
    torch.testing.assert_close(out, runner.model.mlp(torch.ones(1, 8)), rtol=1e-5, atol=1e-5)


def test_unwarmed_shape_under_serve_is_a_cache_miss(warm_cache):
    runner = make_runner(warm_cache)
    with runner.serve(), pytest.raises(CacheMissError) as err:
        runner.run("decode", {"input": torch.ones(2, 8)})
    assert "'decode'" in str(err.value) and "float32[1, 8] -> float32[2, 8]" in str(err.value) and "declare the bucket" in str(err.value)


def test_serve_asserts_where_the_environment_does_not_and_false_leaves_it_to_the_environment(warm_cache, monkeypatch):
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "0")
    runner = make_runner(warm_cache)
    with runner.serve(), pytest.raises(CacheMissError, match="'decode'"):
        runner.run("decode", {"input": torch.ones(2, 8)})
    for env, asserting in (("0", False), ("1", True)):
        monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, env)
        with runner.serve(assert_cache_hit=False):
            assert assert_cache_hit_enabled() is asserting


@pytest.mark.slow
def test_parallel_flow_gives_the_same_keys_as_in_process(warm_cache, tmp_path):
    report = make_runner(tmp_path).warmup(flow="parallel")
    assert {e.key for e in CompileCache(tmp_path).entries()} == {e.key for e in CompileCache(warm_cache).entries()}
    assert report.counts.compiles == 2 and report.compile_report.ok
    assert sorted(r.graph_type for r in records.records()) == ["decode", "prefill"]



@pytest.mark.slow
def test_parallel_flow_counts_hits_of_its_own_graphs_only_when_it_builds_another_pending_entry(tmp_path):
    """parallel_compile builds every pending entry of the cache: another model's compile is a miss of this warmup,
    never a hit taken away from its own graphs (the hits were len(own) - len(built): -1 here)."""
    other = torch.compile(torch.nn.Linear(8, 3).eval(), backend="neuron_libtorch_graph_capture", dynamic=False,
                          options={"cache_dir": str(tmp_path), "compiler": "local"})
    with torch.inference_mode():
        other(torch.ones(5, 8))
    (foreign,) = [e.key for e in CompileCache(tmp_path).entries() if e.status == "pending"]
    torch._dynamo.reset()
    report = make_runner(tmp_path).warmup(flow="parallel")
    assert CompileCache(tmp_path).entry(foreign).is_complete  # built by this warmup's parallel_compile
    assert report.deferred_counts.hits == 0 and report.deferred_counts.misses == 3
    assert report.counts.hits == 0 and report.counts.compiles == 3

@pytest.mark.slow
def test_parallel_flow_traces_each_captured_graph_here_once_built_so_serving_traces_nothing(tmp_path):
    runner = make_runner(tmp_path)
    report = runner.warmup(flow="parallel")
    assert [t.status for t in report.traced] == ["captured", "captured"]  # both traced in children
    # this process traced each graph during the warmup, as its compile finished: hits, but not the warmup's
    assert report.counts.hits == 0 and report.counts.misses == 2 and report.counts.compiles == 2
    assert sorted(runner.fast_path.graphs) == ["decode", "prefill"]
    assert sorted((r.graph_type, r.compiles, r.loads) for r in records.records()) == [
        ("decode", 1, 1), ("prefill", 1, 1)]
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.inference_mode():  # tensors made as serving makes them (what the warmup's examples are)
        one, four = torch.ones(1, 8), torch.ones(4, 8)
    with runner.serve() as served:
        out = runner.run("decode", {"input": one})
        runner.run("prefill", {"input": four})
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames, "serving traced a graph again"
    assert served.counts.misses == 0 and served.counts.compiles == 0
    torch.testing.assert_close(out, runner.model.mlp(torch.ones(1, 8)), rtol=1e-5, atol=1e-5)


def test_warmup_emits_the_manifest_when_enabled(warm_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "m"))
    report = make_runner(warm_cache, manifest_config={"model": "two-graph", "max_model_len": 8}).warmup()
    doc = json.loads(Path(report.manifest_path).read_text())
    assert report.manifest_path == tmp_path / "m" / "nodev" / "manifest.json"
    assert sorted(g["ranks"] for g in doc["graphs"]) == [[0], [0]]
    assert doc["config"]["model"] == "two-graph" and doc["config"]["max_model_len"] == 8
    assert any("-O3" in g["compiler_flags"] for g in doc["graphs"])


def test_a_failed_first_warmup_lets_the_manifest_folder_go_at_once(warm_cache, tmp_path, monkeypatch):
    from neuron_args.manifest.folder_lock import held_here

    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "m"))
    runner = make_runner(warm_cache)

    def broken(*args, **kwargs):
        assert held_here(tmp_path / "m" / "nodev")  # held while the warmup runs
        raise RuntimeError("the model's warmup failed")

    runner._warmup_in_process = broken
    with pytest.raises(RuntimeError, match="the model's warmup failed"):
        runner.warmup()
    assert not held_here(tmp_path / "m" / "nodev")  # not held until the runner is collected: another job goes on
    del runner._warmup_in_process
    report = runner.warmup()  # a retry holds it again and emits
    assert report.manifest_path == tmp_path / "m" / "nodev" / "manifest.json" and not held_here(tmp_path / "m")


FRESH = textwrap.dedent("""
    import sys, json, torch
    sys.path.insert(0, sys.argv[2])
    from tests.test_runner import make_runner
    runner = make_runner(sys.argv[1])
    with runner.serve() as served:
        for graph_type, spec in runner.graphs.items():
            for make in spec.buckets.values():
                runner.run(graph_type, make())
    print(json.dumps({"hits": served.counts.hits, "misses": served.counts.misses, "compiles": served.counts.compiles}))
""")


@pytest.mark.slow
def test_serving_from_the_cache_in_a_fresh_process_hits_every_graph(warm_cache):
    run = subprocess.run([sys.executable, "-c", FRESH, str(warm_cache), str(REPO)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"hits": 2, "misses": 0, "compiles": 0}


def test_recompile_limit_is_reported_instead_of_a_silent_eager_fallback(warm_cache, monkeypatch):
    monkeypatch.setattr("neuron_args.eager_fallback.RECOMPILE_LIMIT", 1)  # a runner call raises the limit to it
    runner = make_runner(warm_cache)
    with torch._dynamo.config.patch(recompile_limit=1):
        runner.run("prefill", {"input": torch.ones(4, 8)})
        with pytest.raises(NeuronArgsError, match=r"graph type 'decode': Dynamo's recompile limit \(1\)"):
            runner.run("decode", {"input": torch.ones(1, 8)})


def test_dynamo_limits_are_raised_in_the_runner_calls_only(warm_cache):
    config = torch._dynamo.config
    limits = []

    def record(*args, **kwargs):
        limits.append((config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit))
        return real(*args, **kwargs)

    with config.patch(recompile_limit=8, accumulated_recompile_limit=256, fail_on_recompile_limit_hit=False):
        runner = make_runner(warm_cache)
        real, runner.fast_path.record = runner.fast_path.record, record
        runner.run("decode", {"input": torch.ones(1, 8)})
        assert limits == [(256, 1 << 16, False)]  # the runner's guarded call (a hit fails: eager_fallback.runner_call)
        assert (config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit) == (
            8, 256, False)  # the process's other torch.compile calls keep Dynamo's


def test_a_second_warmup_traces_nothing_and_replays_the_first(warm_cache):
    from neuron_args.runner import REUSED

    runner = make_runner(warm_cache)
    runner.origin = "first"
    first = runner.warmup(["decode"], emit=False)
    assert [(g.graph_type, g.bucket, g.how, g.origin) for g in first.graphs] == [("decode", "b1", "loaded", "first")]
    assert first.counts.hits == 1 and first.reused == []
    runner.origin = "second"
    n, before = len(REUSED), STATS.snapshot()
    second = runner.warmup(emit=False)  # decode again, prefill for the first time
    assert second.reused == ["decode"]
    assert [g.key for g in REUSED[n:]] == [first.graphs[0].key]
    assert STATS.hits - before["hits"] == 1  # only prefill was resolved
    assert {g.graph_type: g.origin for g in second.graphs} == {"decode": "first", "prefill": "second"}


@pytest.mark.slow
def test_a_graph_break_is_an_error_naming_the_line_unless_allowed(tmp_path):
    from neuron_args.runner import GraphBreakError

    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc(x)
            torch._dynamo.graph_break()
            return y.relu()

        def neuron_graphs(self):
            return [GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 8)}})]

    with pytest.raises(GraphBreakError, match=r"graph break in graph type 'decode' at .*test_runner\.py:\d+ \(in "
                                              r"forward\):\n    torch\._dynamo\.graph_break\(\)"):
        NeuronRunner(Breaks(), compiler="local", cache_dir=tmp_path).warmup(emit=False)
    torch._dynamo.reset()
    report = NeuronRunner(Breaks(), compiler="local", cache_dir=tmp_path, fullgraph=False).warmup(emit=False)
    assert len(report.graphs) == 2


def test_serve_routes_direct_calls_of_entry_modules(warm_cache):
    from neuron_args.runner import UndeclaredGraphError

    runner = make_runner(warm_cache)
    runner.warmup(emit=False)
    mlp = runner.model.mlp
    with torch.inference_mode():
        eager = mlp(torch.ones(1, 8))  # outside serve: eager
        with runner.serve() as served:
            assert torch.allclose(mlp(torch.ones(1, 8)), eager, atol=1e-5)
            mlp(input=torch.ones(4, 8))
            with pytest.raises(UndeclaredGraphError, match=r"Sequential called while serving with input=\[2, 8\]"):
                mlp(torch.ones(2, 8))
    assert served.calls == {"decode": 1, "prefill": 1} and served.counts.misses == 0
    assert len(served.undeclared) == 1
    import pickle

    assert isinstance(pickle.loads(pickle.dumps(runner.model)), TwoGraphModel)


def test_models_that_declare_nothing_usable_are_told_what_to_return(tmp_path):
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(NeuronArgsError, match=r"Plain has no neuron_graphs\(\) method.*GraphSpec\(graph_type, "):
        NeuronRunner(Plain(), compiler="local", cache_dir=tmp_path)
    plain = Plain()
    plain.neuron_graphs = lambda: [GraphSpec("decode", plain, {"b1": lambda: (torch.ones(1, 8),)})]
    with pytest.raises(NeuronArgsError, match=r"bucket 'b1': the bucket factory returned tuple .*must return a dict"):
        NeuronRunner(plain, compiler="local", cache_dir=tmp_path).warmup(emit=False)


def test_a_warmup_bucket_reads_only_the_records_it_touched(warm_cache, monkeypatch):
    # each bucket of a warmup scanned every record of the process before and after it: N buckets, N x N
    for i in range(50):
        records.record(GraphOutcome(key=f"{i:032x}", seam="other", graph_type="other", input_shapes=[],
                                           compiler_args=[], optimization_level=None, target="trn2", loads=1))
    scans = []
    real = records.records
    monkeypatch.setattr(records, "records", lambda: scans.append(1) or real())
    try:
        report = make_runner(warm_cache).warmup(emit=False)
    finally:
        for i in range(50):  # not the session's graphs (its table lists this process's records)
            records.RECORDS.pop(f"{i:032x}", None)
    assert sorted((g.graph_type, g.how, g.input_shapes) for g in report.graphs) == [
        ("decode", "loaded", ["1, 8"]), ("prefill", "loaded", ["4, 8"])]
    assert scans == []


def test_errors_with_a_field_of_their_own_pickle_with_it():
    """A trace child or a rank process hands its error back pickled: the field travels (BaseException's own reduce)."""
    import pickle

    from neuron_args.errors import TraceError
    from neuron_args.runner import GraphBreakError

    again = pickle.loads(pickle.dumps(GraphBreakError("graph break in graph type 'decode'", graph_type="decode")))
    assert (type(again), str(again), again.graph_type) == (GraphBreakError, "graph break in graph type 'decode'", "decode")
    again = pickle.loads(pickle.dumps(TraceError("child died", results=["r0", "r1"])))
    assert (type(again), str(again), again.results) == (TraceError, "child died", ["r0", "r1"])
