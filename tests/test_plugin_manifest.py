"""The manifest fixture's checks (completeness, ranks), the manifest dir option, and baselines."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_neuron_args.assertions import ManifestView
from tests.conftest import MODEL_CONFTEST
from pytest_neuron_args.baseline import Baseline, normalize


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


def _literal(text: object) -> str:
    """``text`` as an fnmatch pattern matching itself (brackets escaped)."""
    return str(text).replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")


BASELINE_TEST = """
import pytest

@pytest.mark.graph_type("decode")
def test_decode_baseline(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
"""


@pytest.mark.slow
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

    # the model's policy changes: decode now compiles at -O2, and the same settings' baseline fails
    neuron_project.makeconftest(MODEL_CONFTEST.replace("with_optimization_level(base, 3)", "with_optimization_level(base, 2)"))
    changed = neuron_project.runpytest()
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines([
        f"E * the manifest differs from its baseline {baseline}:",
        f"E *  - graph {warm_cache.keys['decode'][:12]} (decode)  inputs (1, 8)  flags --framework XLA --target trn2 -O3",
        "E *  + graph * (decode)  inputs (1, 8)  flags --framework XLA --target trn2 -O2",
        f"E *  ~ graph {warm_cache.keys['decode'][:12]} (decode) -> * (same input shapes): compiler_flags -O3 -> -O2",
        "E * If the change is intended, update the baseline with:",
        "E *     pytest test_base.py::test_decode_baseline --neuron-update-baseline",
    ])
    neuron_project.runpytest("--neuron-update-baseline").assert_outcomes(passed=1)
    neuron_project.runpytest().assert_outcomes(passed=1)
    neuron_project.makeconftest(MODEL_CONFTEST)
    neuron_project.runpytest().assert_outcomes(failed=1)  # and back: -O3 is now the difference


@pytest.mark.slow
def test_baselines_are_kept_per_setting_that_changes_the_compiled_set(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_base=BASELINE_TEST)
    folder = neuron_project.path / ".neuron-baseline"
    neuron_project.runpytest("--neuron-update-baseline").assert_outcomes(passed=1)
    o2 = folder / "test_base.py__test_decode_baseline[O2].json"
    missing = neuron_project.runpytest("--neuron-optimization-level=2")  # -O2 everywhere: another compiled set
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines([f"E * no manifest baseline for test_base.py::test_decode_baseline at {_literal(o2)}.",
                                  "E *     pytest test_base.py::test_decode_baseline --neuron-optimization-level=2 "
                                  "--neuron-update-baseline"])
    neuron_project.runpytest("--neuron-optimization-level=2", "--neuron-update-baseline").assert_outcomes(passed=1)
    neuron_project.runpytest("--neuron-optimization-level=2").assert_outcomes(passed=1)
    neuron_project.runpytest().assert_outcomes(passed=1)  # the default settings keep their own baseline
    args = neuron_project.runpytest("--neuron-compiler-args=-O1 --auto-cast=none", "--neuron-update-baseline")
    args.assert_outcomes(passed=1)
    assert sorted(p.name for p in folder.iterdir()) == [
        "test_base.py__test_decode_baseline.json", "test_base.py__test_decode_baseline[O2].json",
        f"test_base.py__test_decode_baseline[args-{hashlib.sha256(b'-O1 --auto-cast=none').hexdigest()[:8]}].json"]
    assert json.loads(o2.read_text())["graphs"][0]["compiler_flags"].endswith("-O2")


def test_baselines_stay_by_the_ini_file_when_a_split_option_moves_the_rootdir(
        neuron_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # a workspace with its own ini file, holding the project (its ini, conftest and tests) and a cache folder
    workspace = neuron_project.path
    project = workspace / "project"
    project.mkdir()
    (project / "tox.ini").write_text((workspace / "tox.ini").read_text())
    (workspace / "conftest.py").rename(project / "conftest.py")
    (project / "test_base.py").write_text(BASELINE_TEST)
    cache = workspace / "cache"
    cache.mkdir()
    monkeypatch.chdir(project)
    # "--neuron-cache-dir PATH" with a space: pytest takes PATH for a test path, and its rootdir moves to the workspace
    result = neuron_project.runpytest("test_base.py", "--neuron-cache-dir", str(cache), "--neuron-update-baseline")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"rootdir: {workspace}"])
    written = project / ".neuron-baseline" / "test_base.py__test_decode_baseline.json"
    result.stdout.fnmatch_lines([f"baseline written: {written}"])  # the baseline stays by the project's ini file
    assert not (workspace / ".neuron-baseline").exists()
    neuron_project.runpytest("test_base.py", f"--neuron-cache-dir={cache}").assert_outcomes(passed=1)


def test_examples_pass_under_an_explicit_optimization_level(pytester: pytest.Pytester) -> None:
    repo = Path(__file__).resolve().parents[1]
    result = pytester.runpytest(str(repo / "examples" / "test_tiny_vlm.py"), "-k", "policy_levels or prefill_keeps",
                                "-p", "no:cacheprovider", f"--rootdir={repo}", "-c", str(repo / "pyproject.toml"),
                                "--neuron-optimization-level=2", "--neuron-compiler=local")
    result.assert_outcomes(passed=5)


def test_readme_writes_path_options_with_equals() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    split = re.findall(r"--neuron-[a-z-]+ [^-\s`][^\s`]*", readme)
    assert split == [], split


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


def test_manifest_diff_of_two_runs_of_one_build_is_empty(neuron_project: pytest.Pytester, warm_cache: SimpleNamespace,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from neuron_args.cli import main

    neuron_project.makepyfile(test_base=BASELINE_TEST)
    other_cache = tmp_path / "other-cache"
    shutil.copytree(warm_cache.path, other_cache)
    neuron_project.runpytest(f"--neuron-manifest-dir={tmp_path / 'm1'}", "--neuron-update-baseline").assert_outcomes(
        passed=1)
    neuron_project.runpytest(f"--neuron-manifest-dir={tmp_path / 'm2'}",
                             f"--neuron-cache-dir={other_cache}").assert_outcomes(passed=1)
    first, second = tmp_path / "m1" / "nodev", tmp_path / "m2" / "nodev"
    assert json.loads((first / "manifest.json").read_text())["config"]["neuron_config"]["cache_dir"] != \
        json.loads((second / "manifest.json").read_text())["config"]["neuron_config"]["cache_dir"]
    baseline = neuron_project.path / ".neuron-baseline" / "test_base.py__test_decode_baseline.json"
    assert main(["manifest", "diff", str(first), str(second)]) == 0  # another cache dir is not another build
    assert main(["manifest", "diff", str(baseline), str(second)]) == 0  # nor is the baseline's placeholder
    capsys.readouterr()
    assert main(["manifest", "show", str(baseline)]) == 0  # a baseline names its graph types itself
    assert re.search(rf"^decode +{warm_cache.keys['decode'][:12]} ", capsys.readouterr().out, re.M)


def test_manifest_view_reads_the_config_of_an_untrusted_manifest(tmp_path: Path) -> None:
    graph = {"graph_hash": "a" * 32, "input_shapes": ["4, 8"], "compiler_flags": "-O1", "ranks": [0]}
    odd = ManifestView({"config": ["not", "a", "block"], "graphs": [graph]}, tmp_path / "manifest.json")
    assert odd.cache_dir is None and odd.graph_types == {"a" * 32: None}
    baseline = ManifestView({"config": {"neuron_config": {"cache_dir": "<cache_dir>", "graph_types": {"a" * 32: "decode"}}},
                             "graphs": [graph]})
    assert baseline.cache_dir is None and baseline.graph_types == {"a" * 32: "decode"}
    baseline.assert_complete(["decode"])


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"', "{not json"])
def test_a_baseline_file_that_is_not_a_json_object_is_unreadable_naming_the_fix(tmp_path: Path, content: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    checks: list[dict] = []
    baseline = Baseline(path, nodeid="t.py::test_a", update=False, update_hint="pytest t.py --neuron-update-baseline",
                        on_check=checks.append)
    with pytest.raises(AssertionError, match=r"manifest baseline .*t\.json is unreadable .*\n    pytest t\.py --neuron-"):
        baseline.check({"manifest_version": 1, "graphs": []})
    assert [c["status"] for c in checks] == ["unreadable"]
