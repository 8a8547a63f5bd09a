"""Failures that blame the right thing: graph breaks, bad base arguments, models that declare nothing usable."""
from __future__ import annotations

import pytest

BREAK_CONFTEST = '''
import pytest
import torch

from neuron_args.graphs import GraphSpec


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.fc1(x)
        torch._dynamo.graph_break()
        return self.fc2(y)

    def neuron_graphs(self):
        return [GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 8)}})]


@pytest.fixture(scope="session")
def neuron_model():
    return Broken()
'''

BREAK_TESTS = """
import pytest
import torch


def test_whole_graphs(neuron_warmup):
    pass


@pytest.mark.neuron_allow_graph_breaks
def test_breaks_allowed(neuron_served, neuron_warmup):
    assert len(neuron_warmup.graphs) == 2  # the break split decode into two graphs
    assert neuron_served.run("decode", {"x": torch.ones(1, 8)}).shape == (1, 4)
"""


def test_a_graph_break_fails_the_warmup_unless_allowed(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeconftest(BREAK_CONFTEST)
    neuron_project.makepyfile(test_break=BREAK_TESTS)
    conftest = neuron_project.path / "conftest.py"
    line = conftest.read_text().splitlines().index("        torch._dynamo.graph_break()") + 1
    result = neuron_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_whole_graphs _*",
        f"E *.GraphBreakError: graph break in graph type 'decode' at {conftest}:{line} (in forward):",
        "E *     torch._dynamo.graph_break()",
        "E *   Dynamo's reason: Call to `torch._dynamo.graph_break()` (Explanation: User-inserted graph break.*",
        "E *   Neuron serves whole graphs: * Fix: remove the break, or allow graph breaks where you want them: *"
        "@pytest.mark.neuron_allow_graph_breaks or --neuron-allow-graph-breaks.",
    ])
    result = neuron_project.runpytest("-p", "no:randomly", "--neuron-allow-graph-breaks")
    result.assert_outcomes(passed=2)


@pytest.mark.slow
def test_a_graph_break_fails_the_parallel_warmup_too(neuron_project: pytest.Pytester) -> None:
    """Under --neuron-flow=parallel the trace children capture without fullgraph, and the break only failed the
    tests that served (a test of the manifest alone passed on a graph type that is not one graph)."""
    neuron_project.makeconftest(BREAK_CONFTEST)
    neuron_project.makepyfile(test_break=BREAK_TESTS)
    result = neuron_project.runpytest("-p", "no:randomly", "--neuron-flow=parallel", "-k", "whole")
    result.assert_outcomes(errors=1, deselected=1)
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_whole_graphs _*",
        f"E *.GraphBreakError: graph break in graph type 'decode' at {neuron_project.path / 'conftest.py'}:*",
        "E *   Neuron serves whole graphs: * Fix: remove the break, or allow graph breaks where you want them: *",
    ])


@pytest.mark.parametrize("where", ["option", "ini", "env"])
def test_a_bad_base_argument_list_is_one_usage_error_naming_its_source(neuron_project: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      where: str) -> None:
    neuron_project.makepyfile(test_args="def test_a(neuron_runner):\n    pass\n\ndef test_b(neuron_runner):\n    pass\n")
    args: list[str] = []
    if where == "option":
        args = ["--neuron-compiler-args=-O1 --optlvl=3"]
        source = "--neuron-compiler-args = '-O1 --optlvl=3'"
    elif where == "ini":
        neuron_project.makeini("[pytest]\nneuron_compiler = local\nneuron_compiler_args = --optlvl=3\n")
        source = f"ini key neuron_compiler_args ({neuron_project.path / 'tox.ini'}) = '--optlvl=3'"
    else:
        neuron_project.makeini("[pytest]\nneuron_compiler = local\n")
        monkeypatch.setenv("NEURON_CC_FLAGS", "--optlvl=3")
        source = "NEURON_CC_FLAGS = '--optlvl=3'"
    result = neuron_project.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {source}: unknown neuronx-cc flag '--optlvl' (token '--optlvl=3'). "
                                 "Did you mean '--optlevel'?*"])
    assert "PolicyError" not in result.stdout.str() + result.stderr.str()


def test_models_that_declare_nothing_usable_say_what_to_return(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeconftest('''
        import pytest
        import torch

        from neuron_args.graphs import GraphSpec

        class NoGraphs(torch.nn.Module):
            def forward(self, x):
                return x

        class TensorBucket(torch.nn.Module):
            def forward(self, x):
                return x * 2

            def neuron_graphs(self):
                return [GraphSpec("decode", self, {"b1": lambda: torch.ones(1, 8)})]

        @pytest.fixture(params=["no-graphs", "tensor-bucket"])
        def neuron_model(request):
            return NoGraphs() if request.param == "no-graphs" else TensorBucket()
    ''')
    neuron_project.makepyfile(test_models="def test_warm(neuron_warmup):\n    pass\n")
    result = neuron_project.runpytest()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([
        "*neuron_model (NoGraphs): NoGraphs has no neuron_graphs() method, so there are no graphs to warm up: define "
        "neuron_graphs(self) returning a list of neuron_args.graphs.GraphSpec(graph_type, entry_module, *",
        "*graph type 'decode', bucket 'b1': the bucket factory returned Tensor (tensor(*)); it must return a dict of "
        "keyword arguments for the entry module's forward, e.g. lambda: {'x': torch.ones(1, 8)}*",
    ])


def test_markers_need_a_model_only_for_the_fixtures_that_use_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nomodel="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_documented_only():
            pass

        @pytest.mark.graph_type("decode")
        def test_needs_model(neuron_runner):
            pass

        @pytest.mark.graph_type("decode")
        def test_settings_only(neuron_settings, neuron_target):
            assert neuron_target == "trn2"
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_needs_model*",
                                 "neuron_runner (with @pytest.mark.graph_type('decode')) needs a `neuron_model` "
                                 "fixture: define one in your conftest.py*"])


@pytest.mark.parametrize("option", ["--neuron-cache-dir", "--neuron-manifest-dir"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_unusable_cache_or_manifest_folder_is_one_usage_error(neuron_project: pytest.Pytester, option: str,
                                                                 where: str) -> None:
    blocker = neuron_project.path / "not-a-dir"
    blocker.write_text("a file")
    folder = blocker if where == "a file" else blocker / "sub"
    neuron_project.makepyfile(test_dirs="def test_a(neuron_runner):\n    pass\n")
    result = neuron_project.runpytest(f"{option}={folder}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    problem = "exists and is not a directory" if where == "a file" else "has a parent that is a regular file"
    ini = option.removeprefix("--").replace("-", "_")
    result.stderr.fnmatch_lines([f"ERROR: {option} (ini {ini}*) {folder} {problem}; give *directory*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_target_in_the_base_arguments_must_agree_with_the_session_target(neuron_project: pytest.Pytester,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_target="def test_a(neuron_runner):\n    pass\n")
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 --target=trn1")
    neuron_project.makeini("[pytest]\naddopts = -p no:cacheprovider\nneuron_compiler = local\n")
    result = neuron_project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: NEURON_CC_FLAGS = '-O1 --target=trn1': --target trn1 disagrees with the session's compile target "
        "'trn2' (--neuron-target, *); remove --target from the base arguments * or run with --neuron-target=trn1"])


def test_a_session_under_the_serving_environment_warms_up_and_writes_its_manifest(neuron_project: pytest.Pytester,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path) -> None:
    """A CI job (or conftest) exporting the serving variables: the warmup still compiles (the variable
    asserts *after* warmup), serving asserts, and the ledger lines end in a manifest in that folder."""
    manifests = tmp_path / "manifests"
    monkeypatch.setenv("NEURON_LIBTORCH_ASSERT_CACHE_HIT", "1")
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(manifests))
    neuron_project.makepyfile(test_env="import torch\n\ndef test_served(neuron_served):\n"
                                       "    neuron_served.run('decode', {'x': torch.ones(1, 8)})\n")
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={tmp_path / 'cold-cache'}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*2 compiles*serve: 1 call(s)*0 miss(es)*"])
    assert sorted(p.relative_to(manifests).as_posix() for p in manifests.rglob("*") if p.is_file()) == [
        "nodev/manifest.json"]


def test_a_base_option_given_twice_is_one_warning_naming_its_source(neuron_project: pytest.Pytester) -> None:
    """``-O3 -O1`` in the ini key: the session runs at -O1 (last wins: the warm cache's keys, all hits) and
    the start-up says so once, although the list passes the runner, the policy and the seam too."""
    neuron_project.makeini(neuron_project.path.joinpath("tox.ini").read_text().replace(
        "neuron_compiler_args = -O1", "neuron_compiler_args = -O3 -O1"))
    neuron_project.makepyfile(test_twice="import torch\n\ndef test_served(neuron_served):\n"
                                         "    neuron_served.run('decode', {'x': torch.ones(1, 8)})\n")
    result = neuron_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert out.count("gives --optlevel 2 times") == 1, out
    result.stdout.fnmatch_lines(["*CompilerArgsWarning: ini key neuron_compiler_args (*tox.ini) gives --optlevel 2 "
                                 "times with different values ('-O3', '-O1'); neuronx-cc keeps the last, so '-O1' "
                                 "is what compiles * Fix: give --optlevel once in ini key neuron_compiler_args * "
                                 "(remove '-O3')."])


@pytest.mark.parametrize("how", ["conftest pytest_plugins", "-p by module path"])
def test_naming_the_plugin_by_its_module_while_autoloaded_is_a_no_op(neuron_project: pytest.Pytester,
                                                                      how: str) -> None:
    """The spellings used where PYTEST_DISABLE_PLUGIN_AUTOLOAD is set, in a project that also runs with autoload:
    pluggy's "Plugin already registered under a different name" was an INTERNALERROR/crash before any test."""
    if how == "conftest pytest_plugins":
        conftest = neuron_project.path / "conftest.py"
        conftest.write_text('pytest_plugins = ["pytest_neuron_args.plugin"]\n' + conftest.read_text())
    neuron_project.makepyfile(test_named="def test_settings(neuron_settings):\n    assert neuron_settings.tp == 1\n")
    result = neuron_project.runpytest(*(["-p", "pytest_neuron_args.plugin"] if how.startswith("-p") else []))
    result.assert_outcomes(passed=1)
    assert "already registered" not in result.stdout.str() + result.stderr.str()


def test_a_start_up_warning_under_w_error_is_a_usage_error(neuron_project: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """CI suites often run with ``-W error`` / ``filterwarnings = error``: the plugin's start-up warnings were an
    INTERNALERROR traceback there; now one usage error with the warning's text."""
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 -O3")
    neuron_project.makeini(neuron_project.path.joinpath("tox.ini").read_text().replace(
        "neuron_compiler_args = -O1\n", ""))
    neuron_project.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = neuron_project.runpytest("-W", "error")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: CompilerArgsWarning (an error under your warning filters): NEURON_CC_FLAGS "
                                 "gives --optlevel 2 times * Fix: give --optlevel once in NEURON_CC_FLAGS *"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


FAILS_DECODE_CONFTEST = '''
import pytest
import torch


class FailsDecode(TinyTwoGraph):
    def forward(self, x):
        if x.shape[0] == 1:
            raise ValueError("this head cannot decode one row")
        return super().forward(x)


@pytest.fixture(scope="session")
def neuron_model():
    return FailsDecode()
'''


def test_a_failed_warmup_is_not_retried_by_each_test_and_its_manifest_keeps_the_model(
        neuron_project: pytest.Pytester) -> None:
    """A graph type whose warmup failed (a compile failing only under -O3, a model raising for one bucket) was
    warmed up again by every later test: the same error each time, an hour each with neuronx-cc. And the
    session manifest of a failed warmup had no model, target or graph types."""
    import json

    conftest = neuron_project.path / "conftest.py"
    conftest.write_text(conftest.read_text() + FAILS_DECODE_CONFTEST)
    neuron_project.makepyfile(test_three="""
        import pytest

        def test_first(neuron_served):
            pass

        def test_second(neuron_warmup):
            pass

        @pytest.mark.graph_type("prefill")
        def test_prefill_alone(neuron_warmup):
            assert neuron_warmup.graph_types == ["prefill"]

        def test_third(neuron_served):
            pass
    """)
    manifests = neuron_project.path / "manifests"
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=1, errors=3)
    out = result.stdout.str()
    assert "neuron-args: compiling decode b1" not in out, out  # its trace failed: no compile started
    assert "this head cannot decode one row" in out
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_second _*",
        "graph type 'decode' failed its warmup in test_three.py::test_first, so it is not warmed up again in this "
        "session: GraphBreakError: graph type 'decode': the model raised while it was traced, at *",
        "  fix: what that test's error names (it shows the whole error and its fix), then rerun: the next session "
        "builds the failed graph again",
    ])
    doc = json.loads((manifests / "nodev" / "manifest.json").read_text())
    assert doc["config"]["model"] == "FailsDecode" and doc["config"]["target"] == "trn2"
    assert list(doc["config"]["neuron_config"]["graph_types"].values()) == ["prefill"]
