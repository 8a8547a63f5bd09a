"""What CI reads from a plugin session: JUnit properties per test, the GitHub step summary, baseline bookkeeping."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_neuron_args.report import summary_markdown, warmup_properties

TESTS = """
import pytest
import torch

@pytest.mark.graph_type("decode")
def test_served(neuron_served):
    neuron_served.run("decode", {"x": torch.ones(1, 8)})

def test_both_warmed(neuron_warmup):
    assert sorted(neuron_warmup.graph_types) == ["decode", "prefill"]

def test_plain():
    pass
"""

BASELINE_TEST = """
import pytest

@pytest.mark.graph_type("decode")
def test_decode_baseline(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
"""


def _properties(junit: Path) -> dict[str, list[tuple[str, str]]]:
    root = ET.parse(junit).getroot()
    return {case.get("name"): [(p.get("name"), p.get("value")) for p in case.iter("property")]
            for case in root.iter("testcase")}


def test_warmup_properties_name_keys_levels_and_types():
    graphs = [{"graph_type": "decode", "key": "d" * 32, "input_shapes": ["1, 8"], "compiler_args": ["--x", "-O3"],
               "optimization_level": 3, "how": "loaded"},
              {"graph_type": "prefill", "key": "p" * 32, "input_shapes": ["1, 16"], "compiler_args": ["-O1"],
               "optimization_level": 1, "how": "compiled"}]
    assert warmup_properties(graphs) == [
        ("neuron_graph", f"graph_type=decode inputs=(1, 8) key={'d' * 32} level=-O3 how=loaded"),
        ("neuron_graph", f"graph_type=prefill inputs=(1, 16) key={'p' * 32} level=-O1 how=compiled"),
        ("neuron_warmed_graph_types", "decode prefill"),
        ("neuron_graph_keys", f"{'d' * 32} {'p' * 32}"),
        ("neuron_optimization_levels", "decode=-O3 prefill=-O1"),
    ]


def test_junit_xml_carries_graph_properties_and_the_step_summary_is_appended(
        neuron_project: pytest.Pytester, warm_cache: SimpleNamespace, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_ci=TESTS)
    junit = tmp_path / "junit.xml"
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = neuron_project.runpytest(f"--junitxml={junit}")
    result.assert_outcomes(passed=3)

    props = _properties(junit)
    decode, prefill = warm_cache.keys["decode"], warm_cache.keys["prefill"]
    served = dict(props["test_served"])
    assert served["neuron_warmed_graph_types"] == "decode"
    assert served["neuron_graph_keys"] == decode
    assert served["neuron_optimization_levels"] == "decode=-O3"
    assert served["neuron_served_graph_types"] == "decode=1" and served["neuron_serve_misses"] == "0"
    assert [v for n, v in props["test_served"] if n == "neuron_graph"] == [
        f"graph_type=decode inputs=(1, 8) key={decode} level=-O3 how=loaded"]
    both = dict(props["test_both_warmed"])
    assert both["neuron_warmed_graph_types"] == "decode prefill"
    assert both["neuron_graph_keys"].split() == sorted([decode, prefill])
    assert both["neuron_optimization_levels"] == "decode=-O3 prefill=-O1"
    assert "neuron_served_graph_types" not in both
    assert props["test_plain"] == []

    text = summary.read_text()
    assert text.startswith("earlier step\n## neuron-args: graphs of this session\n")  # appended, not replaced
    assert "| graph type | inputs | -O | key | how |" in text
    assert f"| decode | (1, 8) | 3 | {decode[:12]} | loaded |" in text
    assert f"| prefill | (4, 8) | 1 | {prefill[:12]} | loaded |" in text
    assert "### Cache misses while serving\n\nnone (1 serve block(s))" in text
    assert "### Manifest baselines" not in text  # no baseline check ran


def test_no_step_summary_without_the_variable(neuron_project: pytest.Pytester, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    neuron_project.makepyfile(test_ci=TESTS)
    neuron_project.runpytest().assert_outcomes(passed=3)
    assert not list(neuron_project.path.rglob("*.md"))


def test_a_session_without_neuron_fixtures_adds_no_step_summary(pytester: pytest.Pytester, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not summary.exists()


def test_step_summary_shows_the_baseline_diff_and_the_misses():
    data = {"rows": [{"key": "k" * 32, "graph_type": "decode", "input_shapes": ["1, 8"], "optimization_level": 3,
                      "compiled": False, "loads": 1, "serve_hits": 1, "serve_misses": 2}],
            "serve_calls": {"decode": 3}, "serve_misses": 2, "serve_sessions": 1}
    checks = [{"nodeid": "t.py::test_b", "path": "/b/t.json", "status": "differs",
               "lines": ["- graph a | (decode)", "+ graph b (decode)"]}]
    text = summary_markdown({**data, "baseline_checks": checks}, "neuron-args: target trn2", "1 graph")
    assert f"- `decode` (1, 8) key `{'k' * 32}`: 2 miss(es)" in text
    assert "- 2 miss(es) in 1 serve block(s)" in text
    assert "- `t.py::test_b` (`/b/t.json`): **differs**" in text
    assert "  ```diff\n  - graph a | (decode)\n  + graph b (decode)\n  ```" in text
    assert "| decode | (1, 8) | 3 | kkkkkkkkkkkk | missed |" not in text  # loaded beats missed in "how"
    assert "| decode | (1, 8) | 3 | kkkkkkkkkkkk | loaded | - | - | 1 | 1/2 |" in text


def test_step_summary_of_a_baseline_check_and_baseline_counts(neuron_project: pytest.Pytester, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_base=BASELINE_TEST)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    created = neuron_project.runpytest("--neuron-update-baseline")
    created.assert_outcomes(passed=1)
    created.stdout.fnmatch_lines(["baselines: 1 written, 0 updated, 0 unused"])
    again = neuron_project.runpytest("--neuron-update-baseline")
    again.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 0 unused, 1 unchanged"])
    summary.write_text("")
    neuron_project.makeconftest(neuron_project.path.joinpath("conftest.py").read_text().replace(
        "with_optimization_level(base, 3)", "with_optimization_level(base, 2)"))
    changed = neuron_project.runpytest()
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 0 unused, 1 differs"])
    text = summary.read_text()
    assert "### Manifest baselines" in text
    assert "- `test_base.py::test_decode_baseline`" in text and "**differs**" in text
    assert "```diff" in text and "compiler_flags -O3 -> -O2" in text


@pytest.mark.slow
def test_xdist_junit_properties_and_one_merged_step_summary(neuron_project: pytest.Pytester, tmp_path: Path,
                                                            warm_cache: SimpleNamespace,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_ci=TESTS, test_base=BASELINE_TEST)
    stale = neuron_project.path / ".neuron-baseline" / "test_gone.py__test_x.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = neuron_project.runpytest_subprocess("-n", "2", f"--junitxml={junit}", "--neuron-update-baseline")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["baselines: 1 written, 0 updated, 0 unused, 1 removed",
                                 f"baseline removed (its test no longer exists): {stale}"])
    assert not stale.exists() and stale.with_name("test_base.py__test_decode_baseline.json").exists()
    props = {name: dict(p) for name, p in _properties(junit).items()}
    assert props["test_served"]["neuron_graph_keys"] == warm_cache.keys["decode"]
    assert props["test_both_warmed"]["neuron_warmed_graph_types"] == "decode prefill"
    text = summary.read_text()
    assert text.count("## neuron-args: graphs of this session") == 1  # the controller's only
    assert "merged from 2 xdist workers" in text
    assert f"| decode | (1, 8) | 3 | {warm_cache.keys['decode'][:12]} |" in text
    assert f"| prefill | (4, 8) | 1 | {warm_cache.keys['prefill'][:12]} |" in text
    assert "1 written, 0 updated, 0 unused, 1 removed" in text
    assert "- `test_base.py::test_decode_baseline`" in text and "**written**" in text


TWO_BASELINE_TESTS = """
import pytest

@pytest.mark.graph_type("decode")
def test_a(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)

@pytest.mark.graph_type("prefill")
def test_b(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
"""


@pytest.mark.slow
def test_baselines_of_tests_that_no_longer_exist_are_removed_only_by_a_whole_update_run(
        neuron_project: pytest.Pytester) -> None:
    folder = neuron_project.path / ".neuron-baseline"
    a, b = folder / "test_base.py__test_a.json", folder / "test_base.py__test_b.json"
    neuron_project.makepyfile(test_base=TWO_BASELINE_TESTS)
    first = neuron_project.runpytest("--neuron-update-baseline")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["baselines: 2 written, 0 updated, 0 unused"])
    o2 = folder / "test_base.py__test_a[O2].json"  # another settings variant of a test that still exists
    o2.write_text(a.read_text())
    stray = folder / "notes.txt"
    stray.write_text("not a baseline")

    without_b = TWO_BASELINE_TESTS.split('@pytest.mark.graph_type("prefill")')[0]
    neuron_project.makepyfile(test_base=without_b)  # test_b deleted
    checked = neuron_project.runpytest()
    checked.assert_outcomes(passed=1)
    checked.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 1 unused, 1 matched",
                                  f"baseline unused: {b}",
                                  "(re-run the whole suite with --neuron-update-baseline to remove *)"])
    assert b.exists()

    for partial in (["-k", "test_a"], ["test_base.py::test_a"], ["--deselect", "test_base.py::test_a"]):
        run = neuron_project.runpytest("--neuron-update-baseline", *partial)
        assert "baseline removed" not in run.stdout.str() and "baseline unused" not in run.stdout.str(), partial
        assert b.exists(), partial

    whole = neuron_project.runpytest("--neuron-update-baseline")
    whole.assert_outcomes(passed=1)
    whole.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 0 unused, 1 removed, 1 unchanged",
                                f"baseline removed (its test no longer exists): {b}"])
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", a.name, o2.name]


def test_a_collected_test_that_did_not_check_leaves_its_baseline_not_checked_never_removed(
        neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_base=TWO_BASELINE_TESTS)
    neuron_project.runpytest("--neuron-update-baseline").assert_outcomes(passed=2)
    neuron_project.makepyfile(test_base=TWO_BASELINE_TESTS.replace(
        "def test_b(", "@pytest.mark.skip(reason='later')\ndef test_b("))
    result = neuron_project.runpytest("--neuron-update-baseline")
    result.assert_outcomes(passed=1, skipped=1)
    b = neuron_project.path / ".neuron-baseline" / "test_base.py__test_b.json"
    result.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 0 unused, 1 not checked, 1 unchanged",
                                 f"baseline not checked (*): {b}"])
    assert b.exists()


def test_a_module_that_fails_to_import_keeps_its_baselines(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_base=TWO_BASELINE_TESTS)
    neuron_project.runpytest("--neuron-update-baseline").assert_outcomes(passed=2)
    neuron_project.makepyfile(test_base="import not_a_module_anywhere\n" + TWO_BASELINE_TESTS)
    result = neuron_project.runpytest("--neuron-update-baseline", "--continue-on-collection-errors")
    result.assert_outcomes(errors=1)
    assert len(list((neuron_project.path / ".neuron-baseline").glob("*.json"))) == 2


@pytest.mark.slow
def test_the_ini_testpaths_count_as_the_whole_suite_a_sub_folder_does_not(neuron_project: pytest.Pytester) -> None:
    sub = neuron_project.mkpydir("suite")
    (sub / "test_base.py").write_text(BASELINE_TEST)
    ini = neuron_project.path / "tox.ini"
    ini.write_text(ini.read_text() + "testpaths = suite\n")
    stale = neuron_project.path / ".neuron-baseline" / "suite_test_gone.py__test_x.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    deeper = neuron_project.runpytest("suite", "--neuron-update-baseline")  # a folder below the anchor
    deeper.assert_outcomes(passed=1)
    assert stale.exists() and "baseline removed" not in deeper.stdout.str()
    whole = neuron_project.runpytest("--neuron-update-baseline")  # no arguments: the testpaths
    whole.assert_outcomes(passed=1)
    whole.stdout.fnmatch_lines([f"baseline removed (its test no longer exists): {stale}"])
    assert not stale.exists()


def test_a_compiler_that_fails_without_a_message_is_named_in_the_header_and_the_report(
        neuron_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import neuron_args.compilers  # imported by warm_cache already: an in-process run drops what it imports

    def broken(name: object = None) -> object:
        raise RuntimeError()

    monkeypatch.setattr(neuron_args.compilers, "select_compiler", broken)
    neuron_project.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = neuron_project.runpytest("--neuron-report=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["neuron-args: *compiler local (unavailable: RuntimeError)*"])
    report = json.loads((neuron_project.path / "report.json").read_text())
    assert report["settings"]["compiler"] == {"name": "local", "version": None, "error": "RuntimeError"}


def test_a_step_summary_that_cannot_be_written_fails_the_session_saying_why(
        neuron_project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(blocker / "summary.md"))
    neuron_project.makepyfile(test_ci="def test_warm(neuron_warmup):\n    pass\n")
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"NOT written (the session fails): $GITHUB_STEP_SUMMARY {blocker / 'summary.md'}: *"])
