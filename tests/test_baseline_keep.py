"""Baselines of tests that exist are kept: an update run removes only those whose test no longer exists.

A test skipped at collection (``importorskip`` in its conftest), one that did not reach its check
(skipped, a setup error, Ctrl-C) or a ``--collect-only`` run keeps every baseline, and the summary
does not advise removing them.
"""
from __future__ import annotations

import pytest

BASELINE_TEST = """
import pytest

@pytest.mark.graph_type("decode")
def test_a(neuron_manifest, neuron_baseline):
    neuron_baseline.check(neuron_manifest)
"""

REMOVE_HINT = "re-run the whole suite with --neuron-update-baseline to remove"


@pytest.fixture
def project_with_baselines(neuron_project: pytest.Pytester) -> pytest.Pytester:
    """Two sub-folders of tests whose baselines were written by a whole update run."""
    for sub in ("one", "two"):
        neuron_project.mkpydir(sub)
        (neuron_project.path / sub / f"test_{sub}.py").write_text(BASELINE_TEST)
    neuron_project.runpytest("--neuron-update-baseline").assert_outcomes(passed=2)
    assert sorted(p.name for p in (neuron_project.path / ".neuron-baseline").glob("*.json")) == [
        "one_test_one.py__test_a.json", "two_test_two.py__test_a.json"]
    return neuron_project


def test_a_folder_skipped_by_its_conftest_keeps_its_baselines_in_an_update_run(
        project_with_baselines: pytest.Pytester) -> None:
    project = project_with_baselines
    folder = project.path / ".neuron-baseline"
    (project.path / "two" / "conftest.py").write_text(
        "import pytest\npytest.importorskip('not_a_module_anywhere', reason='needs an extra')\n")
    stale = folder / "gone_test_gone.py__test_x.json"  # a test that no longer exists: still removed
    stale.write_text("{}")
    result = project.runpytest("--neuron-update-baseline", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    kept = folder / "two_test_two.py__test_a.json"
    assert kept.exists(), result.stdout.str()
    assert not stale.exists()
    result.stdout.fnmatch_lines([f"baseline removed (its test no longer exists): {stale}",
                                 f"baseline not checked (its test exists but was skipped*): {kept}"])


def test_a_module_skipped_at_import_keeps_its_baselines(project_with_baselines: pytest.Pytester) -> None:
    project = project_with_baselines
    (project.path / "two" / "test_two.py").write_text(
        "import pytest\npytest.importorskip('not_a_module_anywhere')\n" + BASELINE_TEST)
    project.runpytest("--neuron-update-baseline").assert_outcomes(passed=1, skipped=1)
    assert (project.path / ".neuron-baseline" / "two_test_two.py__test_a.json").exists()


def test_a_setup_error_or_collect_only_does_not_advise_removing_baselines(
        project_with_baselines: pytest.Pytester) -> None:
    project = project_with_baselines
    b = project.path / ".neuron-baseline" / "two_test_two.py__test_a.json"
    (project.path / "two" / "conftest.py").write_text(
        "import pytest\n@pytest.fixture(autouse=True)\ndef broken():\n    raise RuntimeError('setup broke')\n")
    errored = project.runpytest()
    errored.assert_outcomes(passed=1, errors=1)
    out = errored.stdout.str()
    assert f"baseline unused: {b}" not in out and REMOVE_HINT not in out, out
    errored.stdout.fnmatch_lines(["baselines: 0 written, 0 updated, 0 unused, 1 not checked, 1 matched",
                                  f"baseline not checked (*): {b}"])
    collected = project.runpytest("--collect-only", "--neuron-update-baseline")
    out = collected.stdout.str()
    assert "not checked" not in out and "baseline unused" not in out and "baseline removed" not in out, out
    assert REMOVE_HINT not in out and b.exists(), out


def test_an_interrupted_update_run_removes_nothing(project_with_baselines: pytest.Pytester) -> None:
    project = project_with_baselines
    folder = project.path / ".neuron-baseline"
    (project.path / "one" / "test_one.py").write_text(
        BASELINE_TEST + "\ndef test_z():\n    pytest.exit('stopped as Ctrl-C would')\n")
    stale = folder / "gone_test_gone.py__test_x.json"
    stale.write_text("{}")
    result = project.runpytest("--neuron-update-baseline", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert stale.exists() and "baseline removed" not in out and REMOVE_HINT not in out, out

