"""The plugin on projects users bring: what a user's own layout (ini file, conftest fixtures, own runner) and CI
environment (exported variables, xdist, a broken neuronx-cc on PATH) got wrong.

Each test builds a small project of the kind a user writes and runs pytest on it the way CI does; the model is the
shared tiny one, served from the shared warm cache.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest


_OWN_RUNNER_CONFTEST = '''
import pytest
from neuron_args.runner import NeuronRunner


@pytest.fixture
def neuron_runner(neuron_model):
    """The team's own runner, on the team's own compile cache."""
    return NeuronRunner(neuron_model, compiler_args="-O1", compiler="local", cache_dir={cache!r})
'''

_OWN_RUNNER_TESTS = '''
def test_team_manifest(neuron_manifest):
    neuron_manifest.assert_complete(["prefill", "decode"])
    assert [g["neff_path"] is not None for g in neuron_manifest.graphs] == [True, True]
'''


@pytest.mark.slow
def test_setup_cfg_project_with_its_own_runner_and_cache(neuron_project: pytest.Pytester,
                                                         warm_cache: SimpleNamespace, tmp_path: Path) -> None:
    """A setup.cfg project: its ini key ``neuron_report`` is honoured (it was ignored), and a sub-folder whose
    conftest overrides ``neuron_runner`` with the team's own cache gets a manifest view listing its NEFFs; the
    session manifest (one cache) names that cache instead of calling its graphs 'not built'."""
    team_cache = tmp_path / "team-cache"
    shutil.copytree(warm_cache.path, team_cache)  # loads, no compile
    (neuron_project.path / "tox.ini").unlink()
    neuron_project.makefile(".cfg", setup=(
        "[tool:pytest]\naddopts = -p no:cacheprovider\nneuron_compiler = local\nneuron_compiler_args = -O1\n"
        f"neuron_cache_dir = {warm_cache.path}\nneuron_report = out/neuron-report.json\n"))
    team = neuron_project.mkpydir("team")
    (team / "conftest.py").write_text(_OWN_RUNNER_CONFTEST.format(cache=str(team_cache)))
    (team / "test_team.py").write_text(_OWN_RUNNER_TESTS)
    neuron_project.makepyfile(test_plain="def test_plain(neuron_warmup):\n    assert len(neuron_warmup.graphs) == 2\n")

    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-manifest-dir={tmp_path / 'manifests'}")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    report = neuron_project.path / "out" / "neuron-report.json"
    assert f"report written: {report}" in out
    assert {g["graph_type"] for g in json.loads(report.read_text())["graphs"]} == {"prefill", "decode"}
    # both runners warmed the same two keys (same model, args and compiler): the session cache holds them all
    assert "were built into" not in out and "not built" not in out

    # the team's tests alone, the session on an empty cache: their graphs are only in the team's cache (the old
    # view was emitted against the session cache, so the team's own assertion on neff_path failed)
    shutil.rmtree(tmp_path / "manifests")
    result = neuron_project.runpytest("-p", "no:randomly", "team", f"--neuron-cache-dir={tmp_path / 'empty'}",
                                      f"--neuron-manifest-dir={tmp_path / 'manifests'}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"  2 of its 2 graph(s) were built into {team_cache.resolve()}, the cache of a project's own neuron_runner "
        "(first warmed in team/test_team.py::test_team_manifest), not the session cache *: a manifest names one "
        "cache, so it lists them without their NEFF; build that runner with cache_dir=neuron_cache.root*"])
    assert "not built" not in result.stdout.str()


def test_compiler_and_manifest_folder_from_the_environment_are_start_up_errors(
        neuron_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CI job exporting ``NEURON_ARGS_COMPILER`` or ``VLLM_NEURON_MANIFEST_DIR`` that cannot work here: one usage
    error at start-up naming that variable and the fix (was: every warmup failing with a long traceback, and a
    message blaming --neuron-manifest-dir, which the user never gave)."""
    neuron_project.makepyfile(test_a="def test_a(neuron_runner):\n    pass\n")
    neuron_project.makeini("[pytest]\naddopts = -p no:cacheprovider\n")  # no neuron_compiler: the variable decides
    monkeypatch.setenv("NEURON_ARGS_COMPILER", "xla")
    result = neuron_project.runpytest("--neuron-compiler=local")  # the option wins over the variable
    result.assert_outcomes(passed=1)
    result = neuron_project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: $NEURON_ARGS_COMPILER='xla': use one of auto, local, neuronx-cc (or unset it*"])
    if shutil.which("neuronx-cc") is None:
        monkeypatch.setenv("NEURON_ARGS_COMPILER", "neuronx-cc")
        result = neuron_project.runpytest()
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["ERROR: $NEURON_ARGS_COMPILER neuronx-cc: neuronx-cc is not on PATH.*"
                                     "elsewhere unset it or set it to local (or auto)"])
    monkeypatch.delenv("NEURON_ARGS_COMPILER")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(blocker / "manifests"))
    result = neuron_project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: $VLLM_NEURON_MANIFEST_DIR={blocker / 'manifests'} (the session manifest's "
                                 "folder when no --neuron-manifest-dir or ini neuron_manifest_dir is given) has a parent "
                                 "that is a regular file; *give --neuron-manifest-dir=DIR, or unset it"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.slow
def test_assert_cache_hit_on_a_cold_cache_says_the_warmup_compiled_and_how_to_fail(
        neuron_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CI job exporting NEURON_LIBTORCH_ASSERT_CACHE_HIT=1 on a cold cache expects a failure; the warmup compiles by
    contract (the variable asserts after warmup), so the summary says so, and the test it points to does fail,
    naming each graph and key."""
    monkeypatch.setenv("NEURON_LIBTORCH_ASSERT_CACHE_HIT", "1")
    neuron_project.makepyfile(test_warm="""
        def test_cache_is_warm(neuron_runner, neuron_compile_counter):
            with neuron_compile_counter.expect(compiles=0):
                neuron_runner.warmup()
    """)
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={tmp_path / 'cold'}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*compiles: expected 0, got 2*",
        "*graphs compiled inside the block (2):*",
        "*prefill  key * inputs (4, 8)  args *-O1*",  # (no [...]: a character class to fnmatch)
        "*NEURON_LIBTORCH_ASSERT_CACHE_HIT is set, and the warmups compiled 2 graph(s): a warmup builds what the cache "
        "lacks whatever the variable says (it asserts after warmup, while serving). To fail when the cache lacks a "
        "graph, assert it in a test: with neuron_compile_counter.expect(compiles=0): neuron_runner.warmup()"])
    result = neuron_project.runpytest("-p", "no:randomly")  # the warm cache: nothing compiled, nothing said
    result.assert_outcomes(passed=1)
    assert "NEURON_LIBTORCH_ASSERT_CACHE_HIT is set" not in result.stdout.str()


def test_xdist_workers_that_never_reported_are_named_in_the_summary(pytestconfig: pytest.Config,
                                                                     tmp_path: Path) -> None:
    """Ctrl-C under ``-n 2``: the workers never send their results, so the table read '0 graphs' next to a written
    manifest listing graphs. The summary now names the silent workers and where their work is."""
    from pytest_neuron_args.options import NeuronSettings
    from pytest_neuron_args.report import write_summary
    from pytest_neuron_args.state import WORKEROUTPUT_KEY, NeuronSession

    session = hooks = NeuronSession(pytestconfig, NeuronSettings(cache_dir=tmp_path / "cache"))
    nodes = {w: SimpleNamespace(gateway=SimpleNamespace(id=w), workerinput={}, workeroutput={}) for w in ("gw0", "gw1")}
    for node in nodes.values():
        hooks.pytest_configure_node(node)
    nodes["gw1"].workeroutput[WORKEROUTPUT_KEY] = {"rows": [], "stats": {}}
    hooks.pytest_testnodedown(nodes["gw1"], None)
    session.manifests_written = [str(tmp_path / "m" / "nodev" / "manifest.json")]
    lines: list[str] = []
    reporter = SimpleNamespace(write_sep=lambda sep, title: lines.append(title),
                               write_line=lambda line, **kw: lines.append(line))
    write_summary(reporter, session)
    assert (f"xdist worker(s) gw0 did not report (the session was interrupted, or they crashed): the table and counts "
            f"lack what they compiled or loaded; the cache and any manifest written below hold it (`neuron-args cache "
            f"ls {tmp_path / 'cache'}`)") in lines
    hooks.pytest_testnodedown(nodes["gw0"], None)  # no output: still silent
    nodes["gw0"].workeroutput[WORKEROUTPUT_KEY] = {"rows": []}
    hooks.pytest_testnodedown(nodes["gw0"], None)
    lines.clear()
    write_summary(reporter, session)
    assert not any("did not report" in line for line in lines)


def test_a_neuronx_cc_on_path_that_cannot_start_is_said_in_the_header_and_each_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU CI image with a broken neuronx-cc wrapper on PATH (a missing libnrt): auto picks it, and every graph
    failed with 'fix the graph or its compiler arguments'. The header and the fix now blame the installation."""
    from neuron_args.compilers.process import _hint, describe_exit
    from pytest_neuron_args.report import compiler_description

    fake = tmp_path / "bin" / "neuronx-cc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'neuronx-cc: error while loading shared libraries: libnrt.so.1' >&2\nexit 127\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    assert compiler_description(None) == (
        f"neuronx-cc (auto), version unknown: `{fake} --version` failed, so compiles will likely fail too (fix that "
        "environment, or use --neuron-compiler=local)")
    assert describe_exit(127) == "could not start (a missing program or shared library) (exit status 127)"
    assert _hint(127).startswith("the compiler's installation is broken: run `neuronx-cc --version`")
    assert _hint(126).startswith("the compiler's installation is broken")
