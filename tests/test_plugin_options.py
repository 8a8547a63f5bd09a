"""The plugin's options, ini keys, header line, markers and neuron_compiler_args (nothing here compiles)."""
from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

import pytest_neuron_args.markers as plugin_markers

FAKE_NEURONX_CC = Path(__file__).parent / "fakes" / "neuronx_cc.py"


def test_header_shows_target_compiler_cache_and_manifest_dir(neuron_project: pytest.Pytester,
                                                             tmp_path: Path) -> None:
    cache, manifests = tmp_path / "cache", tmp_path / "manifests"
    neuron_project.makepyfile(test_opts=f"""
        import os
        from pathlib import Path

        def test_settings(neuron_target, neuron_cache, neuron_settings):
            assert neuron_target == "trn1"
            assert neuron_cache.root == Path({str(cache)!r}).resolve()
            assert os.environ["VLLM_NEURON_MANIFEST_DIR"] == {str(manifests)!r}
            assert neuron_settings.compiler == "local"
            assert neuron_settings.flow == "parallel"
            assert neuron_settings.optimization_level == 3
    """)
    result = neuron_project.runpytest("--neuron-target", "trn1", "--neuron-cache-dir", str(cache),
                                      "--neuron-manifest-dir", str(manifests), "--neuron-flow", "parallel",
                                      "--neuron-optimization-level", "3")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"neuron-args: target trn1, compiler local local-xla-cpu/*, cache {cache.resolve()}, "
        f"manifest dir {manifests}, flow parallel, explicit -O3 (model policies off)",
    ])
    assert cache.is_dir()
    assert "VLLM_NEURON_MANIFEST_DIR" not in os.environ  # the session's setting was restored


def test_a_split_path_option_naming_an_existing_directory_warns(neuron_project: pytest.Pytester,
                                                                 tmp_path: Path) -> None:
    elsewhere = tmp_path / "existing-cache"
    elsewhere.mkdir()
    neuron_project.makepyfile(test_nothing="def test_nothing(): pass")
    result = neuron_project.runpytest("--neuron-cache-dir", str(elsewhere))
    result.stdout.fnmatch_lines([f"*PytestConfigWarning: write --neuron-cache-dir={elsewhere} (with '='): pytest "
                                 f"looks for its ini file before it knows plugin options*"])
    result = neuron_project.runpytest(f"--neuron-cache-dir={elsewhere}")
    result.assert_outcomes(passed=1)
    assert "PytestConfigWarning" not in result.stdout.str()


def test_a_split_report_path_naming_an_existing_file_warns_too(neuron_project: pytest.Pytester, tmp_path: Path) -> None:
    """``--neuron-report PATH`` (the last run's report exists) is read as a test path while pytest looks for its ini
    file, as the directory options are; only those were warned about."""
    report = tmp_path / "report.json"
    report.write_text("{}")
    neuron_project.makepyfile(test_nothing="def test_nothing(): pass")
    result = neuron_project.runpytest("--neuron-report", str(report))
    result.stdout.fnmatch_lines([f"*PytestConfigWarning: write --neuron-report={report} (with '='): pytest looks for "
                                 "its ini file before it knows plugin options*"])


def test_defaults_give_a_fresh_cache_per_session(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    neuron_project.makepyfile(test_defaults="""
        import os

        def test_defaults(neuron_target, neuron_cache, neuron_settings, tmp_path_factory):
            assert neuron_target == "trn2"
            assert neuron_cache.root == tmp_path_factory.getbasetemp().resolve() / "neuron-cache"
            assert neuron_cache.entries() == []
            assert neuron_settings.compiler is None
            assert neuron_settings.optimization_level is None
            assert neuron_settings.flow == "in-process"
            assert neuron_settings.update_baseline is False
            assert "VLLM_NEURON_MANIFEST_DIR" not in os.environ
    """)
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "neuron-args: target trn2, compiler local * (auto), cache */neuron-cache (fresh per session), "
        "manifest dir off, flow in-process",
    ])


def test_ini_keys_and_command_line_precedence(neuron_project: pytest.Pytester) -> None:
    neuron_project.makeini(
        "[pytest]\naddopts = -p no:cacheprovider\nneuron_target = inf2\nneuron_flow = parallel\n"
        "neuron_cache_dir = rel-cache\nneuron_manifest_dir = rel-manifests\nneuron_baseline = baselines\n"
        "neuron_compiler = local\nneuron_compiler_args = -O2 --auto-cast=none\n")
    root = neuron_project.path
    neuron_project.makepyfile(test_ini=f"""
        from pathlib import Path

        def test_ini(neuron_settings, neuron_cache):
            root = Path({str(root)!r})
            assert neuron_settings.target == "trn3"  # the command line wins over the ini file
            assert neuron_settings.flow == "parallel"
            assert neuron_settings.cache_dir == root / "rel-cache"
            assert neuron_cache.root == (root / "rel-cache").resolve()
            assert neuron_settings.manifest_dir == root / "rel-manifests"
            assert neuron_settings.baseline == root / "baselines"
            assert neuron_settings.compiler_args == "-O2 --auto-cast=none"
    """)
    result = neuron_project.runpytest("--neuron-target", "trn3")
    result.assert_outcomes(passed=1)


def test_bad_values_are_usage_errors(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_nothing="def test_nothing(): pass")
    result = neuron_project.runpytest("--neuron-optimization-level", "7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--neuron-optimization-level 7: use one of 1, 2, 3*"])

    result = neuron_project.runpytest("--neuron-target", "trn9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown compile target 'trn9' (from --neuron-target); the known targets are *"])

    neuron_project.makeini("[pytest]\nneuron_flow = sideways\n")
    result = neuron_project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini option neuron_flow = 'sideways': use one of in-process, parallel*"])


def test_neuronx_cc_compiler_option(neuron_project: pytest.Pytester, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_nothing="def test_nothing(): pass")
    if shutil.which("neuronx-cc") is None:
        result = neuron_project.runpytest("--neuron-compiler", "neuronx-cc")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--neuron-compiler neuronx-cc: neuronx-cc is not on PATH*"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "neuronx-cc"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_NEURONX_CC.read_text())
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    result = neuron_project.runpytest("--neuron-compiler", "neuronx-cc")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["neuron-args: target trn2, compiler neuronx-cc 2.21.33363.0+82d8b54d, cache *"])


def test_markers_are_registered_and_hardware_tests_skip_without_a_device(
        neuron_project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_marks="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_compiler_args):
            assert neuron_compiler_args == ["-O3"]

        @pytest.mark.neuron_hardware
        def test_on_device():
            pass
    """)
    monkeypatch.setattr(plugin_markers, "DEVICE_GLOB", str(tmp_path / "no-such-neuron*"))
    result = neuron_project.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_marks.py:7: needs a Neuron device (no /dev/neuron* visible)"])

    (tmp_path / "neuron0").touch()  # a visible device: the test runs
    monkeypatch.setattr(plugin_markers, "DEVICE_GLOB", str(tmp_path / "neuron*"))
    result = neuron_project.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(passed=2)

    result = neuron_project.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.graph_type(*graph_types): *", "@pytest.mark.neuron_hardware: *"])


def test_graph_type_marker_must_name_declared_types(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_types="""
        import pytest

        @pytest.mark.graph_type("decode", "encoder")
        def test_unknown(neuron_runner):
            pass

        @pytest.mark.graph_type()
        def test_empty():
            pass

        @pytest.mark.graph_type("prefill")
        def test_known():
            pass
    """)
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*test_unknown: @pytest.mark.graph_type('encoder'): TinyTwoGraph does not declare graph type "
        "'encoder'; declared graph types: 'prefill', 'decode'",
        "*test_empty: @pytest.mark.graph_type() needs at least one graph type*",
    ])


def test_neuron_compiler_args_resolves_the_marked_graph_types(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_args="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_compiler_args):
            assert neuron_compiler_args == ["-O3"]

        @pytest.mark.graph_type("prefill")
        def test_prefill(neuron_compiler_args):
            assert neuron_compiler_args == ["-O1"]

        @pytest.mark.graph_type("prefill")
        @pytest.mark.graph_type("decode")
        def test_both(neuron_compiler_args):
            assert neuron_compiler_args == {"decode": ["-O3"], "prefill": ["-O1"]}

        def test_unmarked(neuron_compiler_args):
            pass
    """)
    result = neuron_project.runpytest()
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*neuron_compiler_args resolves the graph type(s) of the test's marker: add "
                                 "@pytest.mark.graph_type('decode')*"])


def test_explicit_optimization_level_overrides_the_model_policy(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_explicit="""
        import pytest

        @pytest.mark.graph_type("decode", "prefill")
        def test_levels(neuron_compiler_args, neuron_runner):
            assert neuron_compiler_args == {"decode": ["-O2"], "prefill": ["-O2"]}
            assert neuron_runner.resolver.per_graph is False
            # no per-graph override: the base list applies
            assert neuron_runner.resolver.resolve_graph_compiler_args("decode") is None
    """)
    result = neuron_project.runpytest("--neuron-optimization-level", "2")
    result.assert_outcomes(passed=1)
    result = neuron_project.runpytest()  # the policy again: decode -O3
    result.assert_outcomes(failed=1)
    assert "{'decode': ['-O3']} != {'decode': ['-O2']}" in result.stdout.str()


def test_compile_timeout_and_tp_options_reach_the_runner(neuron_project: pytest.Pytester) -> None:
    neuron_project.makepyfile(test_timeout="""
        def test_options(neuron_runner, neuron_settings):
            assert neuron_runner.options["compile_timeout"] == 12.5
            assert neuron_settings.compile_timeout == 12.5
            assert neuron_settings.allow_graph_breaks is True
            assert neuron_runner.fullgraph is False
    """)
    neuron_project.runpytest("--neuron-compile-timeout=12.5", "--neuron-allow-graph-breaks").assert_outcomes(passed=1)
    with open(neuron_project.path / "tox.ini", "a") as ini:
        ini.write("\nneuron_compile_timeout = 12.5\nneuron_allow_graph_breaks = true\n")
    neuron_project.runpytest().assert_outcomes(passed=1)
    result = neuron_project.runpytest("--neuron-compile-timeout=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--neuron-compile-timeout 0.0: give a number of seconds above 0*"])
    result = neuron_project.runpytest("--neuron-tp=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--neuron-tp 0: give the number of tensor-parallel ranks, 1 or more*"])


def test_the_graph_type_marker_checks_the_model_as_the_runner_does() -> None:
    """The marker's check and the runner share one check of ``neuron_graphs()``: the same message and fix."""
    class NoGraphs:
        """A model that declares no graph types (no ``neuron_graphs()``)."""

    class StrGraphs:
        def neuron_graphs(self) -> list[str]:
            return ["decode"]

    with pytest.raises(pytest.fail.Exception, match=r"neuron_model \(NoGraphs\): NoGraphs has no neuron_graphs\(\) "
                                                    r"method.*GraphSpec\(graph_type, entry_module"):
        plugin_markers.check_graph_types("t.py::test", NoGraphs(), ["decode"])
    with pytest.raises(pytest.fail.Exception, match=r"StrGraphs.neuron_graphs\(\) returned a str \('decode'\) among"):
        plugin_markers.check_graph_types("t.py::test", StrGraphs(), ["decode"])


def test_the_resolved_settings_hold_checked_base_arguments(pytester: pytest.Pytester) -> None:
    """``NeuronSettings.from_config`` checks the base list where it enters, so a session set up late (the plugin
    loaded after ``pytest_configure``) cannot carry a list that was never checked."""
    from pytest_neuron_args.options import NeuronSettings

    with pytest.raises(pytest.UsageError) as excinfo:
        NeuronSettings.from_config(pytester.parseconfig("--neuron-compiler-args=-O9"))
    assert str(excinfo.value).startswith("--neuron-compiler-args = '-O9': bad optimization level '9'")
    settings = NeuronSettings.from_config(pytester.parseconfig("--neuron-compiler-args=-O2 --auto-cast=none"))
    assert settings.base_args == ("-O2", "--auto-cast=none") and settings.base_args.canonical == (
        "--auto-cast=none", "-O2")


def test_both_switch_ini_keys_take_the_one_boolean_spelling(pytester: pytest.Pytester) -> None:
    """``neuron_allow_graph_breaks = maybe`` was silently off, while ``neuron_allow_eager_outputs`` was pytest's own
    bool ini key (``t``, ``y`` too): both now read envs' spelling, which takes pytest's words too, and anything else
    is a usage error naming it."""
    from pytest_neuron_args.options import NeuronSettings

    pytester.makeini("[pytest]\nneuron_allow_graph_breaks = on\nneuron_allow_eager_outputs = Off\n")
    settings = NeuronSettings.from_config(pytester.parseconfig())
    assert (settings.allow_graph_breaks, settings.allow_eager_outputs) == (True, False)
    assert NeuronSettings.from_config(pytester.parseconfig("--neuron-allow-eager-outputs")).allow_eager_outputs
    pytester.makeini("[pytest]\nneuron_allow_graph_breaks = t\nneuron_allow_eager_outputs = Y\n")
    settings = NeuronSettings.from_config(pytester.parseconfig())
    assert (settings.allow_graph_breaks, settings.allow_eager_outputs) == (True, True)
    for key in ("neuron_allow_graph_breaks", "neuron_allow_eager_outputs"):
        pytester.makeini(f"[pytest]\n{key} = maybe\n")
        with pytest.raises(pytest.UsageError) as excinfo:
            NeuronSettings.from_config(pytester.parseconfig())
        assert str(excinfo.value) == (f"ini key {key} ({pytester.path / 'tox.ini'}) = 'maybe': give one of 1, true, "
                                      "yes, on, y, t (true) or 0, false, no, off, n, f (false)")


@pytest.mark.parametrize("given", ["inf", "nan"])
def test_compile_timeout_option_takes_finite_seconds_only(neuron_project: pytest.Pytester, given: str) -> None:
    result = neuron_project.runpytest(f"--neuron-compile-timeout={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--neuron-compile-timeout {given}: give a number of seconds above 0*"])


def test_the_baseline_update_hint_takes_no_value_after_an_option_that_has_none() -> None:
    """The copy-paste ``--neuron-update-baseline`` hint took the argument after every ``--neuron-*`` option but
    ``--neuron-allow-graph-breaks`` as its value: after ``--neuron-allow-eager-outputs`` a test path (or ``-x``)
    joined the hint, and the update run took in another module's tests."""
    from types import SimpleNamespace

    from pytest_neuron_args.fixtures import _neuron_args

    given = ("--neuron-allow-eager-outputs", "tests/test_other.py", "--neuron-target", "trn1",
             "--neuron-allow-graph-breaks", "-x", "--neuron-flow=parallel", "--neuron-update-baseline", "tests/more.py")
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=given))
    assert _neuron_args(config) == ["--neuron-allow-eager-outputs", "--neuron-target", "trn1",
                                    "--neuron-allow-graph-breaks", "--neuron-flow=parallel"]
