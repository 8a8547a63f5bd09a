"""The compile target: one bad value, whatever route it enters by, is one message naming that route.

Every route is checked in this process (no subprocess): the plugin's option and ini key through
``NeuronSettings.from_config`` of a parsed config, the compile command line through its ``main``.
"""
from __future__ import annotations

import pickle

import pytest

from neuron_args.errors import CompilerArgsError
from neuron_args.settings import CompileSettings
from neuron_args.target import DEFAULT_TARGET, KNOWN_TARGETS, TARGET_ENV, Target, parse_target

KNOWN = "the known targets are inf2, trn1, trn1n, trn2, trn3"


def one_message(source: str) -> str:
    return f"unknown compile target 'trn9' (from {source}); {KNOWN}"


def test_a_target_is_a_plain_name_wherever_it_goes():
    target = parse_target("trn1", "test")
    assert isinstance(target, Target) and target == "trn1" and repr(target) == "'trn1'"
    assert pickle.loads(pickle.dumps(target)) == "trn1" and isinstance(pickle.loads(pickle.dumps(target)), Target)
    assert parse_target(target, "elsewhere") is target  # a checked value is not checked again
    assert DEFAULT_TARGET == "trn2" and isinstance(DEFAULT_TARGET, Target) and "trn2" in KNOWN_TARGETS
    with pytest.raises(CompilerArgsError) as excinfo:
        parse_target(2, "options['target']")
    assert str(excinfo.value) == f"unknown compile target 2 (from options['target']); {KNOWN}"


def test_the_torch_compile_option_and_the_settings(monkeypatch):
    monkeypatch.delenv(TARGET_ENV, raising=False)
    with pytest.raises(CompilerArgsError) as excinfo:
        CompileSettings.from_options({"target": "trn9"}, "neuron_libtorch")
    assert str(excinfo.value) == one_message("options['target']")
    with pytest.raises(CompilerArgsError) as excinfo:
        CompileSettings(target="trn9")
    assert str(excinfo.value) == one_message("CompileSettings(target=...)")
    settings = CompileSettings.from_options({"target": "inf2"}, "neuron_libtorch")
    assert isinstance(settings.target, Target) and settings.as_options() == {"target": "inf2"}


def test_the_runner_argument_fails_at_construction():
    from neuron_args.runner import NeuronRunner

    with pytest.raises(CompilerArgsError) as excinfo:
        NeuronRunner(object(), graphs=[], target="trn9")
    assert str(excinfo.value) == one_message("NeuronRunner(target=...)")


def test_the_environment_and_a_target_inside_the_compiler_args(monkeypatch):
    from neuron_args.settings import apply_platform_compiler_args

    monkeypatch.setenv(TARGET_ENV, "trn9")
    with pytest.raises(CompilerArgsError) as excinfo:
        apply_platform_compiler_args(CompileSettings(compiler_args=[]), graph_type="decode")
    assert str(excinfo.value) == one_message(f"${TARGET_ENV}")
    # a target given before the environment in precedence leaves the environment unread
    request = apply_platform_compiler_args(CompileSettings(compiler_args=[], target="trn1"))
    assert request.target == "trn1" and isinstance(request.target, Target)
    monkeypatch.delenv(TARGET_ENV)
    with pytest.raises(CompilerArgsError) as excinfo:
        apply_platform_compiler_args(CompileSettings(compiler_args=["--target", "trn9"]), graph_type="decode")
    assert one_message("'--target' in the compiler args") in str(excinfo.value)
    assert "graph type 'decode'" in str(excinfo.value) and "options['compiler_args']" in str(excinfo.value)


def test_a_compile_request_with_a_plain_string(tmp_path):
    """A target read from a cache entry's metadata reaches the compiler as a plain string: it is checked there."""
    from neuron_args.compilers.local import LocalCompiler

    hlo = tmp_path / "graph.hlo"
    hlo.write_bytes(b"not run")
    with pytest.raises(CompilerArgsError) as excinfo:
        LocalCompiler().compile(hlo_path=hlo, output_path=tmp_path / "out", target="trn9", compiler_args=[],
                                workdir=tmp_path, graph_type="decode", key="k123")
    assert str(excinfo.value) == one_message("the target of graph type 'decode', key k123")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.hlo"]  # nothing started


def test_the_compile_command_line(capsys):
    from neuron_args.compilers import local_xla

    with pytest.raises(SystemExit) as excinfo:
        local_xla.main(["compile", "graph.hlo", "--target", "trn9", "--output", "out"])
    assert excinfo.value.code == 2
    assert f"argument --target: {one_message(f'{local_xla.PROG} compile --target')}" in capsys.readouterr().err


@pytest.mark.parametrize("route", ["option", "ini"])
def test_the_plugin_option_and_its_ini_key(pytester: pytest.Pytester, route: str):
    from pytest_neuron_args.options import NeuronSettings

    if route == "option":
        config = pytester.parseconfig("--neuron-target=trn9")
        source = "--neuron-target"
    else:
        ini = pytester.makeini("[pytest]\nneuron_target = trn9\n")
        config = pytester.parseconfig()
        source = f"ini key neuron_target ({ini})"
    with pytest.raises(pytest.UsageError) as excinfo:
        NeuronSettings.from_config(config)
    assert str(excinfo.value) == one_message(source)
    assert NeuronSettings.from_config(pytester.parseconfig("--neuron-target=trn1")).target == "trn1"


def test_the_environment_is_the_default_of_the_runner_and_the_plugin(pytester: pytest.Pytester, monkeypatch):
    """``$NEURON_ARGS_TARGET`` applies wherever no target is given: a runner and a plugin session included."""
    from neuron_args.runner import NeuronRunner
    from pytest_neuron_args.options import NeuronSettings

    monkeypatch.setenv(TARGET_ENV, "trn1")
    assert NeuronRunner(object(), graphs=[]).settings.target == "trn1"
    assert NeuronRunner(object(), graphs=[], target="inf2").settings.target == "inf2"
    assert NeuronSettings.from_config(pytester.parseconfig()).target == "trn1"
    assert NeuronSettings.from_config(pytester.parseconfig("--neuron-target=trn3")).target == "trn3"
    monkeypatch.setenv(TARGET_ENV, "trn9")
    with pytest.raises(pytest.UsageError) as excinfo:
        NeuronSettings.from_config(pytester.parseconfig())
    assert str(excinfo.value) == one_message(f"${TARGET_ENV}")
    with pytest.raises(CompilerArgsError) as excinfo:
        NeuronRunner(object(), graphs=[])
    assert str(excinfo.value) == one_message(f"${TARGET_ENV}")
    monkeypatch.delenv(TARGET_ENV)
    assert NeuronRunner(object(), graphs=[]).settings.target == DEFAULT_TARGET
