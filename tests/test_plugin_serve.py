"""Warmup then serve: cache-miss explanations, the compile counter, persistent caches, both flows, xdist."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

SERVE_TESTS = """
import pytest
import torch

from neuron_args.errors import CacheMissError


def test_served_calls_hit(neuron_served, neuron_compile_counter):
    with neuron_compile_counter.expect(compiles=0, misses=0):
        out = neuron_served.run("decode", {"x": torch.ones(1, 8)})
        neuron_served.run("prefill", {"x": torch.ones(4, 8)})
    assert out.shape == (1, 4)


def test_unscoped_call_is_caught(neuron_served):
    # the serve-time bug: a decode call outside runner.scope("decode") resolves the base args
    with pytest.raises(CacheMissError) as caught, torch.inference_mode():
        neuron_served.compiled("decode")(x=torch.ones(1, 8))
    assert "compiler_args: changed -O3 -> -O1" in str(caught.value)


def test_unscoped_call_fails_the_test(neuron_served):
    with torch.inference_mode():
        neuron_served.compiled("decode")(x=torch.ones(1, 8))
"""


def _table_row(stdout: str, graph_type: str, key: str) -> list[str]:
    """The cells of the summary-table row of ``key`` (split on runs of 2+ spaces)."""
    for line in stdout.splitlines():
        if line.startswith(graph_type + " ") and key[:12] in line:
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no summary row for {graph_type} {key[:12]} in:\n{stdout}")


def test_serve_time_miss_names_graph_key_closest_entry_and_flag(neuron_project: pytest.Pytester,
                                                                warm_cache: SimpleNamespace) -> None:
    neuron_project.makepyfile(test_serve=SERVE_TESTS)
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    decode = warm_cache.keys["decode"]
    result.stdout.fnmatch_lines([
        "*test_unscoped_call_fails_the_test*",
        "E *CacheMissError: cache miss for a graph with no graph type (key *) in * while NEURON_LIBTORCH_ASSERT_CACHE_HIT "
        "is set: this graph would compile at serve time.",
        f"E * closest warmed-up entry: {decode} (graph type 'decode'); it differs in:",
        "E * compiler_args: changed -O3 -> -O1",
        "E * fix: run this call inside scoped_compiler_args(resolve_graph_compiler_args(*",
    ])
    assert "torch.__trace" not in result.stdout.str()  # the plugin keeps Dynamo's trace log out of failures
    # the summary table: both graphs loaded from the shared cache, one row each, -O level per graph
    out = result.stdout.str()
    assert "neuron-args: graphs of this session" in out
    row = _table_row(out, "decode", decode)
    assert row[:5] == ["decode", "(1, 8)", "3", decode[:12], "loaded"]
    assert int(row[7]) >= 1  # loaded by the one warmup the three tests share (a Dynamo recompile at serve adds one)
    row = _table_row(out, "prefill", warm_cache.keys["prefill"])
    assert row[:5] == ["prefill", "(4, 8)", "1", warm_cache.keys["prefill"][:12], "loaded"]
    # the unscoped call's key (base -O1, no graph-type label) gets its own row: never built, missed twice
    missed = [line.split() for line in out.splitlines() if line.split()[:4] == ["-", "(1,", "8)", "1"]
              and "missed" in line.split()]
    assert len(missed) == 1 and missed[0][-1] == "0/2", missed
    result.stdout.fnmatch_lines(["3 graphs: 0 compiled, 2 loaded, 0 captured; session cache *; cache activity: * hits, "
                                 "2 misses, 0 compiles, 0 captures; serve: 2 call(s) in 3 serve block(s) "
                                 "(decode 1, prefill 1), 2 miss(es)"])


@pytest.mark.slow
def test_compile_counter_and_a_persistent_cache_reused_with_zero_compiles(neuron_project: pytest.Pytester,
                                                                          tmp_path: Path) -> None:
    cache = tmp_path / "persistent-cache"
    neuron_project.makepyfile(test_counter="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_warmup_compiles_nothing(neuron_runner, neuron_compile_counter):
            with neuron_compile_counter.expect(compiles=0, hits=1) as block:
                neuron_runner.warmup(["decode"])
            assert neuron_compile_counter.counts == block.counts
    """)
    first = neuron_project.runpytest(f"--neuron-cache-dir={cache}")
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines([
        "E * neuron_compile_counter.expect(compiles=0, hits=1): the compile-cache counts inside the block differ",
        "E *   compiles: expected 0, got 1",
        "E *   hits: expected 1, got 0",
        "E *   (all counts in the block: compiles 1, misses 1, hits 0, captures 0)",
        "E * graphs compiled inside the block (1):",
        "E *   decode  key * inputs (1, 8)  args *'-O3'*",
        "E * graphs loaded from the cache inside the block: none",
    ])
    assert [p.name for p in cache.iterdir() if p.is_dir()] != []
    first.stdout.fnmatch_lines(["decode * compiled *", "1 graph: 1 compiled, 0 loaded, 0 captured; session cache *"])

    second = neuron_project.runpytest(f"--neuron-cache-dir={cache}")  # a new session, same directory
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([f"*cache {cache.resolve()}, manifest dir off*", "decode * loaded *",
                                 "1 graph: 0 compiled, 1 loaded, 0 captured; session cache *"])


@pytest.mark.slow
def test_parallel_flow_gives_the_keys_of_the_in_process_flow(neuron_project: pytest.Pytester,
                                                             warm_cache: SimpleNamespace) -> None:
    neuron_project.makeini("[pytest]\naddopts = -p no:cacheprovider\nneuron_compiler = local\n"
                           "neuron_compiler_args = -O1\n")  # a fresh cache: the parallel flow compiles it
    neuron_project.makepyfile(test_parallel="""
        import json
        from pathlib import Path

        import torch

        def test_parallel(neuron_served, neuron_cache, neuron_warmup):
            assert neuron_warmup.flow == "parallel"
            assert [g.status for g in neuron_warmup.compile_report.graphs] == ["compiled", "compiled"]
            neuron_served.run("decode", {"x": torch.ones(1, 8)})
            neuron_served.run("prefill", {"x": torch.ones(4, 8)})
            in_process = json.loads(Path("keys.json").read_text())
            assert {e.metadata()["graph_type"]: e.key for e in neuron_cache.entries()} == in_process

        def test_nothing_but_the_warmup(neuron_warmup):
            assert neuron_warmup.flow == "parallel"
    """)
    # a subprocess: the trace children fork, which is only safe in a process without a jax client
    cache = neuron_project.path / "parallel-cache"
    result = neuron_project.runpytest_subprocess("--neuron-flow=parallel", f"--neuron-cache-dir={cache}", "-v")
    result.assert_outcomes(passed=2)
    # the compiles the parallel-flow workers did are counted, and a warm cache shows its graphs as loaded
    result.stdout.fnmatch_lines(["2 graphs: 2 compiled, 0 loaded, 0 captured; *; cache activity: * hits, 2 misses, "
                                 "2 compiles, 2 captures; *"])
    again = neuron_project.runpytest_subprocess("--neuron-flow=parallel", f"--neuron-cache-dir={cache}", "-k",
                                                "nothing_but_the_warmup", "-p", "no:randomly")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["2 graphs: 0 compiled, 2 loaded, 0 captured; *"])
    # the keys stream in from the trace children: the first graph may finish before the second is
    # captured ([1/1+], "more graphs arriving") or after ([1/2])
    result.stdout.fnmatch_lines([
        "neuron-args parallel compile [[]1/[12]*[]] * compiled in *s (elapsed *",
        "neuron-args parallel compile [[]2/2*[]] * compiled in *s (elapsed *",
    ])
    for graph_type, key in warm_cache.keys.items():
        row = _table_row(result.stdout.str(), graph_type, key)
        assert row[4] == "compiled" and row[5].endswith("s") and row[6].endswith("KiB"), row


@pytest.mark.slow
def test_xdist_workers_merge_into_one_summary(neuron_project: pytest.Pytester, warm_cache: SimpleNamespace,
                                              tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    manifests = tmp_path / "manifests"
    neuron_project.makepyfile(test_dist="""
        import pytest
        import torch

        @pytest.mark.graph_type("prefill")
        def test_prefill(neuron_served, neuron_manifest):
            neuron_served.run("prefill", {"x": torch.ones(4, 8)})
            neuron_manifest.assert_complete()

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_served, neuron_manifest):
            neuron_served.run("decode", {"x": torch.ones(1, 8)})
            neuron_manifest.assert_complete()
    """)
    result = neuron_project.runpytest_subprocess("-n", "2", f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    # the workers' warmup progress, printed by the controller
    result.stdout.fnmatch_lines(["[[]gw?[]] neuron-args: loaded * (1/1) from the cache"])  # a warm cache
    for graph_type, key in warm_cache.keys.items():
        row = _table_row(out, graph_type, key)
        assert row[4] == "loaded" and int(row[7]) >= 1, row
    result.stdout.fnmatch_lines(["2 graphs: 0 compiled, 2 loaded, 0 captured; session cache *; cache activity: * hits, "
                                 "0 misses, 0 compiles, 0 captures; serve: 2 call(s) in 2 serve block(s) "
                                 "(decode 1, prefill 1), 0 miss(es); merged from 2 xdist workers"])
    # one session manifest per engine: the controller merged both workers' graphs into it
    assert sorted(p.relative_to(manifests).as_posix() for p in manifests.rglob("manifest.json")) == ["nodev/manifest.json"]
    doc = json.loads((manifests / "nodev" / "manifest.json").read_text())
    assert sorted(g["graph_hash"] for g in doc["graphs"]) == sorted(warm_cache.keys.values())
    assert all(g["ranks"] == [0] for g in doc["graphs"])
    assert not (manifests / "ledger").exists()  # consumed by the emit


@pytest.mark.slow
def test_calls_of_the_model_are_served_and_undeclared_shapes_reported(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_direct="""
        import pytest
        import torch

        from neuron_args.runner import UndeclaredGraphError


        def test_direct_calls_are_served(neuron_served, neuron_model, neuron_compile_counter):
            with neuron_compile_counter.expect(compiles=0, misses=0), torch.inference_mode():
                out = neuron_model(torch.ones(1, 8))  # positional, through the model: the decode graph
                neuron_model(x=torch.ones(4, 8))
            assert out.shape == (1, 4)
            assert neuron_served.serving.calls == {"decode": 1, "prefill": 1}


        def test_undeclared_shape_raises(neuron_served, neuron_model):
            with pytest.raises(UndeclaredGraphError) as caught:
                neuron_model(torch.ones(3, 8))
            assert "TinyTwoGraph called while serving with x=[3, 8]: the call matches no declared bucket" in str(caught.value)
            assert "Declared buckets of this entry: prefill b4: x=[4, 8]; decode b1: x=[1, 8]" in str(caught.value)


        def test_undeclared_call_fails_the_test(neuron_served, neuron_model):
            neuron_model(torch.ones(2, 8))


        def test_outside_serve_the_model_runs_eagerly(neuron_runner, neuron_model):
            assert neuron_model(torch.ones(3, 8)).shape == (3, 4)
    """)
    result = neuron_project.runpytest("-p", "no:randomly")
    # the caught UndeclaredGraphError still fails its test at teardown: it would have run eagerly
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*_ ERROR at teardown of test_undeclared_shape_raises _*",
        "while serving, 1 call(s) matched no declared graph (the test caught the UndeclaredGraphError):",
        "*_ test_undeclared_call_fails_the_test _*",
        "E *.UndeclaredGraphError: TinyTwoGraph called while serving with x=[[]2, 8[]]: the call matches no declared "
        "bucket, so it would run eagerly *",
    ])
    result.stdout.fnmatch_lines(["*serve: 2 call(s) in 3 serve block(s) (decode 1, prefill 1), 0 miss(es)"])


def test_a_test_may_expect_an_undeclared_call_on_purpose(neuron_project: pytest.Pytester) -> None:
    """A test asserting that an undeclared shape is refused failed at teardown with no way to say it meant it."""
    neuron_project.makepyfile(test_refused="""
        import pytest
        import torch

        from neuron_args.runner import UndeclaredGraphError


        def test_caught_and_forgotten(neuron_served, neuron_model):
            with pytest.raises(UndeclaredGraphError):
                neuron_model(torch.ones(3, 8))


        def test_expected(neuron_served, neuron_model):
            with pytest.raises(UndeclaredGraphError):
                neuron_model(torch.ones(3, 8))
            neuron_served.serving.undeclared.clear()
    """)
    result = neuron_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*_ ERROR at teardown of test_caught_and_forgotten _*",
                                 "(a test that expects the error on purpose: call neuron_served.serving.undeclared.clear() "
                                 "after catching it)"])
