"""The manifest fixture's checks (completeness, ranks), the manifest dir option, and baselines."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_neuron_args.assertions import ManifestView
from pytest_neuron_args.baseline import normalize


def test_manifest_checks_pass_and_fail_with_explanations(neuron_project: pytest.Pytester,
                                                         warm_cache: SimpleNamespace) -> None:
    decode, prefill = warm_cache.keys["decode"], warm_cache.keys["prefill"]
    neuron_project.makepyfile(test_manifest=f"""
        import pytest

        def test_complete(neuron_manifest):
            neuron_manifest.assert_valid()
            neuron_manifest.assert_complete()  # every warmed graph type, every bucket
            neuron_manifest.assert_complete(["prefill", "decode", {decode[:10]!r}])
            neuron_manifest.assert_ranks(1)
            neuron_manifest.assert_ranks(ranks=[0])
            assert sorted(neuron_manifest.keys) == sorted([{decode!r}, {prefill!r}])
            assert neuron_manifest.graph_types == {{{decode!r}: "decode", {prefill!r}: "prefill"}}

        @pytest.mark.graph_type("decode")
        def test_missing_graph(neuron_manifest):
            neuron_manifest.assert_complete(["decode", "prefill", "0123456789abcdef"])

        def test_rank_gap(neuron_manifest):
            neuron_manifest.assert_ranks(2)
    """)
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_missing_graph _*",
        "E * manifest */test_missing_graph0/neuron-manifest/nodev/manifest.json is incomplete:",
        "E *  graph type 'prefill': expected at least 1 graph, found 0",
        "E *  key 0123456789abcdef: no graph with this hash",
        "E * expected: [[]'decode', 'prefill', '0123456789abcdef'[]]",
        "E * the manifest holds 1 graph(s):",
        f"E *  decode  {decode[:12]}  inputs (1, 8)  flags --framework XLA --target trn2 -O3  ranks [[]0[]]",
        "*_ test_rank_gap _*",
        "E * manifest *: rank gap in 2 of 2 graph(s); expected every graph on ranks [[]0, 1[]]:",
        f"E *  decode  {decode[:12]}  inputs (1, 8): ranks [[]0[]], missing ranks [[]1[]]",
        f"E *  prefill  {prefill[:12]}  inputs (4, 8): ranks [[]0[]], missing ranks [[]1[]]",
    ])


def test_manifest_view_checks_ranks_of_a_multi_rank_manifest(tmp_path: Path) -> None:
    graph = {"graph_hash": "a" * 32, "input_shapes": ["4, 8"], "compiler_flags": "-O1", "ranks": [0, 1, 3]}
    view = ManifestView({"graphs": [graph, {**graph, "graph_hash": "b" * 32, "ranks": [0, 1, 2, 3]}]},
                        tmp_path / "manifest.json")
    with pytest.raises(AssertionError) as gap:
        view.assert_ranks(4)
    assert str(gap.value).splitlines()[1:] == [f"  ?  {'a' * 12}  inputs (4, 8): ranks [0, 1, 3], missing ranks [2]"]
    with pytest.raises(AssertionError, match=r"unexpected ranks \[2\]"):
        view.assert_ranks(ranks=[0, 1, 3])
    with pytest.raises(TypeError):
        view.assert_ranks()


def test_manifest_dir_option_puts_each_tests_manifest_in_its_own_folder(neuron_project: pytest.Pytester,
                                                                       tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    neuron_project.makepyfile(test_dir="""
        import os
        import pytest

        @pytest.mark.graph_type("prefill")
        def test_prefill(neuron_manifest):
            assert neuron_manifest.path.parent.parent.name == "test_dir.py__test_prefill"
            assert len(neuron_manifest.graphs) == 1
            neuron_manifest.assert_complete()

        def test_env():
            assert os.environ["VLLM_NEURON_MANIFEST_DIR"].endswith("manifests")
    """)
    result = neuron_project.runpytest(f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=2)
    path = manifests / "test_dir.py__test_prefill" / "nodev" / "manifest.json"
    doc = json.loads(path.read_text())
    assert [g["input_shapes"] for g in doc["graphs"]] == [["4, 8"]]
    assert "VLLM_NEURON_MANIFEST_DIR" not in os.environ


BASELINE_TEST = """
import pytest

@pytest.mark.graph_type("decode")
def test_decode_baseline(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
"""


def test_baseline_create_pass_change_fail_update(neuron_project: pytest.Pytester,
                                                 warm_cache: SimpleNamespace) -> None:
    neuron_project.makepyfile(test_base=BASELINE_TEST)
    baseline = neuron_project.path / ".neuron-baseline" / "test_base.py__test_decode_baseline.json"

    missing = neuron_project.runpytest()
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines([
        f"E * no manifest baseline for test_base.py::test_decode_baseline at {baseline}.",
        "E * Create it (then review and commit it) with:",
        "E *     pytest test_base.py::test_decode_baseline --neuron-update-baseline",
    ])
    assert not baseline.exists()

    created = neuron_project.runpytest("--neuron-update-baseline")
    created.assert_outcomes(passed=1)
    created.stdout.fnmatch_lines([f"baseline written: {baseline}"])
    stored = json.loads(baseline.read_text())
    assert "environment" not in stored
    assert [g["graph_hash"] for g in stored["graphs"]] == [warm_cache.keys["decode"]]
    assert stored["config"]["neuron_config"]["graph_types"] == {warm_cache.keys["decode"]: "decode"}

    neuron_project.runpytest().assert_outcomes(passed=1)  # same build: timestamps, sizes, paths ignored

    changed = neuron_project.runpytest("--neuron-optimization-level", "2")  # compiles decode at -O2
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines([
        f"E * the manifest differs from its baseline {baseline}:",
        f"E *  - graph {warm_cache.keys['decode'][:12]}  inputs (1, 8)  flags --framework XLA --target trn2 -O3",
        "E *  + graph *  inputs (1, 8)  flags --framework XLA --target trn2 -O2",
        f"E *  ~ graph {warm_cache.keys['decode'][:12]} -> * (same input shapes): compiler_flags -O3 -> -O2",
        "E *  ~ config.neuron_config.compiler_args[[]0[]]: \"-O1\" -> \"-O2\"",
        "E *  ~ config.neuron_config.explicit_optimization_level: null -> 2",
        "E * If the change is intended, update the baseline with:",
        "E *     pytest test_base.py::test_decode_baseline --neuron-optimization-level 2 --neuron-update-baseline",
    ])

    neuron_project.runpytest("--neuron-optimization-level", "2", "--neuron-update-baseline").assert_outcomes(passed=1)
    neuron_project.runpytest("--neuron-optimization-level", "2").assert_outcomes(passed=1)
    neuron_project.runpytest().assert_outcomes(failed=1)  # and back: -O3 is now the difference


def test_baseline_option_names_a_file_or_a_directory(neuron_project: pytest.Pytester, tmp_path: Path) -> None:
    neuron_project.makepyfile(test_base=BASELINE_TEST)
    target = tmp_path / "decode-baseline.json"
    neuron_project.runpytest(f"--neuron-baseline={target}", "--neuron-update-baseline").assert_outcomes(passed=1)
    assert json.loads(target.read_text())["manifest_version"] == "1"
    neuron_project.runpytest(f"--neuron-baseline={target}").assert_outcomes(passed=1)

    folder = tmp_path / "baselines"
    result = neuron_project.runpytest(f"--neuron-baseline={folder}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E *     pytest test_base.py::test_decode_baseline --neuron-baseline={folder} "
                                 "--neuron-update-baseline"])
    neuron_project.runpytest(f"--neuron-baseline={folder}", "--neuron-update-baseline").assert_outcomes(passed=1)
    assert (folder / "test_base.py__test_decode_baseline.json").is_file()


def test_normalize_keeps_what_identifies_a_build() -> None:
    doc = {
        "manifest_version": "1", "environment": {"torch": "2.13.0"},
        "config": {"neuron_config": {"cache_dir": "/tmp/a", "graph_types": {"k1": "decode", "k0": "prefill"}}},
        "graphs": [{"graph_hash": "k1", "neff_size": 10, "created_timestamp": "t", "hlo_path": "k1/graph.hlo",
                    "neff_path": "k1/graph_k1.neff", "compiler_flags": "-O3", "ranks": [0], "input_shapes": ["1, 8"]}],
    }
    assert normalize(doc) == {
        "manifest_version": "1",
        "config": {"neuron_config": {"cache_dir": "<cache_dir>", "graph_types": {"k1": "decode"}}},
        "graphs": [{"graph_hash": "k1", "compiler_flags": "-O3", "ranks": [0], "input_shapes": ["1, 8"]}],
    }
    assert doc["environment"] == {"torch": "2.13.0"}  # the input is left alone
