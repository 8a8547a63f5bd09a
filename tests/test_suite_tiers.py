"""The suite's tiers: a test that starts a fresh process is marked ``slow``, so ``bash scripts/test.sh --fast``
(``-m "not slow"``) leaves it out. The rule is read from the source (tests/tiers.py), never from timings."""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests import tiers

SAMPLE = '''
import subprocess
import sys

import pytest


@pytest.fixture
def sessions(pytester):
    return pytester.runpytest_subprocess


def _python(code):
    return subprocess.run([sys.executable, "-c", code], check=True)


def test_argv(tmp_path):
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_through_a_helper():
    _python("pass")


def test_through_a_fixture(sessions):
    sessions()


def test_xdist(pytester):
    pytester.runpytest("-n", "2")


def test_ranks(pytester):
    pytester.runpytest("--neuron-tp=2")


def test_a_refused_rank_count(pytester):
    pytester.runpytest("--neuron-tp=0")


def test_a_fake_compiler_script(tmp_path):
    (tmp_path / "neuronx-cc").write_text(f"#!{sys.executable}\\nprint(1)\\n")


@pytest.mark.slow
def test_marked(pytester):
    pytester.runpytest_subprocess()


class TestGrouped:
    def test_in_a_class(self, sessions):
        sessions()
'''


def test_every_test_that_starts_a_fresh_process_is_marked_slow() -> None:
    files = tiers.test_files()
    assert Path(__file__) in files and len(files) > 50
    problems = tiers.unmarked_fresh_process_tests(files)
    assert not problems, "\n".join(problems)


def test_the_rule_finds_the_suite_s_fresh_processes() -> None:
    """Not vacuous: the suite's own subprocess, pytester and rank-process tests are found (then seen marked)."""
    found = {f"{path.name}::{name}": tiers.fresh_process_use(path, fn) for path in tiers.test_files()
             for name, fn, _ in tiers.tests_of(tiers.parse(path).tree)}
    fresh = {test for test, why in found.items() if why}
    assert len(fresh) > 50, sorted(fresh)
    assert "runpytest_subprocess" in found["test_plugin_session.py::test_the_plugin_works_without_pytest_xdist"]
    assert "'--neuron-tp=2'" in found["test_plugin_tp.py::test_tensor_parallel_warmup_runs_in_rank_processes"]
    assert "sys.executable" in found["test_public_api.py::test_import_loads_neither_torch_nor_jax"]
    assert found["test_suite_tiers.py::test_every_test_that_starts_a_fresh_process_is_marked_slow"] is None


def test_each_kind_of_fresh_process_is_named_with_the_test_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent(SAMPLE))
    problems = {p.split(" starts")[0].split("::", 1)[1]: p for p in tiers.unmarked_fresh_process_tests([path])}
    assert sorted(problems) == ["TestGrouped::test_in_a_class", "test_argv", "test_ranks", "test_through_a_fixture",
                                "test_through_a_helper", "test_xdist"]
    assert problems["test_argv"] == (
        f"{path}::test_argv starts a fresh process (sys.executable (line 18) in {path}::test_argv) but is not marked "
        "slow. fix: add @pytest.mark.slow to it, or `pytestmark = pytest.mark.slow` at the top of its file, so "
        "`bash scripts/test.sh --fast` (-m 'not slow') leaves it out")
    assert f"(runpytest_subprocess (line 10) in {path}::sessions (fixture sessions))" in problems["test_through_a_fixture"]
    assert f"(sys.executable (line 14) in {path}::_python)" in problems["test_through_a_helper"]
    assert "(xdist '-n' (line 30)" in problems["test_xdist"] and "('--neuron-tp=2' (line 34)" in problems["test_ranks"]

    marked = tmp_path / "test_marked_module.py"
    marked.write_text("import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.filterwarnings('ignore')]\n"
                      + textwrap.dedent(SAMPLE))
    assert tiers.unmarked_fresh_process_tests([marked]) == []
