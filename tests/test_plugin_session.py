"""The session as a whole: one manifest per engine, runners warmed once, and a summary whose numbers add up."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest


def test_manifest_dir_holds_one_manifest_per_engine_for_the_session(neuron_project: pytest.Pytester,
                                                                     warm_cache: SimpleNamespace, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    manifests = tmp_path / "manifests"
    (manifests / "ledger" / "nodev").mkdir(parents=True)  # a crashed earlier session's ledger: not this session's
    (manifests / "ledger" / "nodev" / "999.jsonl").write_text(
        json.dumps({"key": "f" * 32, "rank": 0, "input_shapes": ["9,"], "compiler_flags": "-O1"}) + "\n")
    neuron_project.makepyfile(test_dir=f"""
        import os
        import pytest

        @pytest.mark.graph_type("prefill")
        def test_prefill(neuron_manifest, tmp_path):
            # the fixture's view: this test's graphs only, in the test's own tmp folder
            assert neuron_manifest.path == tmp_path / "neuron-manifest" / "nodev" / "manifest.json"
            assert [g["input_shapes"] for g in neuron_manifest.graphs] == [["4, 8"]]
            neuron_manifest.assert_complete()

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_warmup):
            assert neuron_warmup.keys == [{warm_cache.keys["decode"]!r}]

        def test_env():
            assert os.environ["VLLM_NEURON_MANIFEST_DIR"] == {str(manifests)!r}
    """)
    result = neuron_project.runpytest(f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"manifest written: {manifests}/nodev/manifest.json"])
    written = sorted(p.relative_to(manifests).as_posix() for p in manifests.rglob("*") if p.is_file())
    assert written == ["nodev/manifest.json"]  # no per-test folders, and the ledger was consumed
    doc = json.loads((manifests / "nodev" / "manifest.json").read_text())
    assert sorted(g["graph_hash"] for g in doc["graphs"]) == sorted(warm_cache.keys.values())
    assert doc["config"]["neuron_config"]["graph_types"] == {k: t for t, k in warm_cache.keys.items()}

    from neuron_args.cli import main

    assert main(["manifest", "show", str(manifests)]) == 0
    shown = capsys.readouterr().out
    assert "2 graphs" in shown and warm_cache.keys["decode"][:12] in shown and warm_cache.keys["prefill"][:12] in shown


SHARED = """
import pytest
import torch

RUNNERS = []


def test_first(neuron_served, neuron_warmup):
    RUNNERS.append(neuron_served)
    assert neuron_warmup.reused == []
    neuron_served.run("decode", {"x": torch.ones(1, 8)})


def test_second(neuron_served, neuron_warmup, neuron_manifest):
    assert neuron_served is RUNNERS[0]  # the same runner: nothing traced again
    assert neuron_warmup.reused == ["prefill", "decode"]
    assert {g.origin for g in neuron_warmup.graphs} == {"test_shared.py::test_first"}
    neuron_manifest.assert_complete()


@pytest.mark.graph_type("decode")
def test_rewarm(neuron_runner, neuron_compile_counter):
    with neuron_compile_counter.expect(compiles=0, hits=1):
        neuron_runner.warmup(["decode"])
"""


def test_tests_sharing_the_model_share_one_warmup(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_shared=SHARED)
    result = neuron_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    # in-process progress, once per graph for the whole session (the cache is warm: loaded, not compiled)
    assert out.count("neuron-args: loaded prefill b4 (1/2) from the cache") == 1, out
    assert out.count("neuron-args: loaded decode b1 (2/2) from the cache") == 1, out
    assert "decode b1 (1/1)" not in out and "compiling" not in out  # test_rewarm did not trace decode again


@pytest.mark.slow
def test_compile_counts_do_not_depend_on_test_order(neuron_project: pytest.Pytester, tmp_path: Path) -> None:
    neuron_project.makepyfile(test_shared=SHARED)
    alone = neuron_project.runpytest("-p", "no:randomly", "-k", "rewarm")
    alone.assert_outcomes(passed=1)  # warm cache: one hit, alone as after the others
    # a cold cache: the re-warmup fails the same way in the file as alone, and says how decode was warmed
    in_file = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={tmp_path / 'cold-1'}")
    in_file.assert_outcomes(passed=2, failed=1)
    in_file.stdout.fnmatch_lines([
        "E * neuron_compile_counter.expect(compiles=0, hits=1): the compile-cache counts inside the block differ",
        "E *   compiles: expected 0, got 1",
        "E *   hits: expected 1, got 0",
        "E * graphs warmed earlier in this session, not traced again inside the block (1); counted as their first "
        "warmup:",
        "E *   decode b1  key *  inputs (1, 8): compiled when first warmed (by test_shared.py::test_first)",
    ])
    alone = neuron_project.runpytest("-p", "no:randomly", "-k", "rewarm", f"--neuron-cache-dir={tmp_path / 'cold-2'}")
    alone.assert_outcomes(failed=1)
    alone.stdout.fnmatch_lines([
        "E *   compiles: expected 0, got 1",
        "E *   hits: expected 1, got 0",
        "E * graphs compiled inside the block (1):",
        "E * every graph the block warmed up was warmed for the first time in this session",
    ])


BUCKETS_CONFTEST = '''
import pytest
import torch

from neuron_args.graphs import GraphSpec


class Buckets(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, k0, k1, k2, k3, k4, k5):
        return self.fc(x) + (k0 + k1 + k2 + k3 + k4 + k5).sum()

    def neuron_graphs(self):
        def make(b):
            return lambda: {"x": torch.ones(b, 8), **{f"k{i}": torch.zeros(2, 3) for i in range(6)}}
        return [GraphSpec("decode", self, {f"b{b}": make(b) for b in (16, 2, 4)})]


@pytest.fixture(scope="session")
def neuron_model():
    return Buckets()
'''


@pytest.mark.slow
def test_summary_sorts_shapes_as_numbers_and_abbreviates_long_input_lists(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeconftest(BUCKETS_CONFTEST)
    neuron_project.makeini("[pytest]\naddopts = -p no:cacheprovider\nneuron_compiler = local\n"
                           "neuron_compiler_args = -O1\n")
    neuron_project.makepyfile(test_buckets="def test_warm(neuron_warmup):\n    assert len(neuron_warmup.graphs) == 3\n")
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "neuron-args: compiling decode b16 (1/3)\u2026",
        "neuron-args: compiling decode b2 (2/3)\u2026",
        "neuron-args: compiling decode b4 (3/3)\u2026",
    ])
    rows = [line for line in result.stdout.str().splitlines() if line.startswith("decode ")]
    assert [re.split(r"\s{2,}", r)[1] for r in rows] == ["(2, 8) (2, 3)x6", "(4, 8) (2, 3)x6", "(16, 8) (2, 3)x6"]
    result.stdout.fnmatch_lines(["3 graphs: 3 compiled, 0 loaded, 0 captured; *; cache activity: 0 hits, 3 misses, "
                                 "3 compiles, 0 captures"])


def test_shapes_text_and_row_order() -> None:
    from neuron_args.graph_outcome import GraphOutcome
    from neuron_args.seams.records import shapes_text

    assert shapes_text(["1, 8", "2, 64", "2, 64", "2, 64", "2, 64"]) == "(1, 8) (2, 64)x4"
    assert shapes_text(["1,", "1,"]) == "(1,) (1,)"
    assert shapes_text([f"{i}," for i in range(7)]) == "(0,) (1,) (2,) +4 more"
    assert shapes_text([]) == "()" and shapes_text(None) == "-"
    rows = [{"key": k, "graph_type": t, "input_shapes": s} for k, t, s in
            [("a", "prefill", ["1, 128"]), ("b", "decode", ["16, 1"]), ("c", "decode", ["2, 1"]), ("d", None, ["1,"]),
             ("e", "prefill", ["1, 16"])]]
    assert [r["key"] for r in sorted(rows, key=lambda r: GraphOutcome.of(r).sort_key)] == ["c", "b", "e", "a", "d"]


@pytest.mark.slow
def test_the_plugin_works_without_pytest_xdist(neuron_project: pytest.Pytester, warm_cache: SimpleNamespace,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist is an extra: with no other plugin loaded the plugin loads, warms and summarises."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    neuron_project.makepyfile(test_alone="""
        import sys
        import pytest

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_warmup):
            assert "xdist" not in sys.modules
            assert neuron_warmup.keys == [{key!r}]
    """.format(key=warm_cache.keys["decode"]))
    result = neuron_project.runpytest_subprocess("-p", "pytest_neuron_args.plugin")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["neuron-args: target trn2, compiler local *", "*neuron-args: graphs of this session*"])
