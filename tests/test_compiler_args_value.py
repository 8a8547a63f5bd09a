"""CompilerArgs: a compiler-argument list parsed and validated once where it enters, read as a value behind."""
from __future__ import annotations

import pickle
import sys

import pytest

from neuron_args import flags
from neuron_args.cache_key import create_cache_hash
from neuron_args.cli import main as cli_main
from neuron_args.compilers.base import prepare_compiler_args
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CompilerArgsError, CorruptEntryError
from neuron_args.flags import CompilerArgs, canonical_compiler_args
from neuron_args.scope import CompilerArgsResolver, resolve_request, scoped_compiler_args
from neuron_args.settings import CompileSettings
from pytest_neuron_args.options import NeuronSettings

KEY = "0123456789abcdef0123456789abcdef"


def test_the_value_holds_the_argv_key_manifest_and_level_forms():
    args = CompilerArgs("--lnc 2 -O 3 --workdir /tmp/w '--tensorizer-options=--a --b'")
    assert args == ["--lnc", "2", "-O", "3", "--workdir", "/tmp/w", "--tensorizer-options=--a --b"]
    assert args.argv == list(args) and isinstance(args.argv, list)
    assert args.canonical == ("--logical-nc-config=2", "-O3", "--tensorizer-options=--a --b")
    assert list(args.canonical) == canonical_compiler_args(list(args))
    assert args.manifest == "--lnc 2 -O 3 '--tensorizer-options=--a --b'"
    assert args.level == 3 and args.with_level(1).level == 1 and args.with_level(1)[2] == "-O1"
    assert args.value("--logical-nc-config") == "2" and args.without(["--lnc", "--workdir"]) == ["-O", "3",
                                                                                                 "--tensorizer-options=--a --b"]
    assert CompilerArgs.of(args) is args and CompilerArgs.parse(args) is args
    back = pickle.loads(pickle.dumps(args))
    assert type(back) is CompilerArgs and back == args and back.canonical == args.canonical
    with pytest.raises(AttributeError, match="CompilerArgs is immutable"):
        args.tokens = ("-O1",)


def test_a_bad_list_names_the_graph_type_the_source_and_the_fix():
    with pytest.raises(CompilerArgsError) as caught:
        CompilerArgs.parse(["-O2", "--auto-cast=most"], graph_type="decode", source="options['compiler_args']")
    message = str(caught.value)
    assert message.startswith("compiler args for graph type 'decode': invalid value 'most' for '--auto-cast'")
    assert message.endswith("(these arguments come from options['compiler_args'])")


def _parse_calls(run) -> int:
    """How often the strict parser runs during ``run()`` (counted on its code object: any import of it)."""
    code, calls = flags.parse_compiler_args.__code__, []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            calls.append(1)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return len(calls)


def test_a_graphs_arguments_are_validated_once_from_the_scope_to_the_compilers_argv():
    """The resolver checks the policy's list once per graph type; the scope, the platform args, the key and the
    compiler driver read that checked value (before: 4 parses per call, the platform, the key and the driver each
    parsing the list again)."""
    resolver = CompilerArgsResolver(["--auto-cast=none", "-O1"], lambda graph_type, _, base: [*base[:-1], "-O3"])
    out = {}

    def compile_site():
        with scoped_compiler_args(resolver.args_for("decode"), graph_type="decode"):
            request = resolve_request(CompileSettings(compiler_args=resolver.base_args), "decode")
        out["key"] = create_cache_hash(graph_text="g", input_specs=[((1, 4), "float32")],
                                       compiler_args=request.compiler_args, target=request.target, tool_versions={})
        out["argv"] = prepare_compiler_args(request.compiler_args, target=request.target, graph_type="decode", key=KEY)

    assert _parse_calls(compile_site) == 1
    assert _parse_calls(compile_site) == 0  # the policy's same answer again: the value checked the first time
    assert out["argv"] == ["--auto-cast=none", "-O3"]
    assert out["key"].components.compiler_args == ("--auto-cast=none", "-O3")


def test_the_plugin_option_is_parsed_once_and_handed_to_the_runner_as_is(tmp_path):
    import torch

    from neuron_args.runner import NeuronRunner

    settings = NeuronSettings(compiler_args="--lnc 2 -O1", compiler_args_source="--neuron-compiler-args")
    args = settings.base_args
    assert args == ["--lnc", "2", "-O1"] and settings.base_args is args
    runner = NeuronRunner(torch.nn.Linear(2, 2), graphs=[], compiler_args=args, compiler="local", cache_dir=tmp_path)
    assert runner.settings.compiler_args is args  # not split or checked again on the way


def test_a_runner_refuses_a_bad_base_list_where_it_is_given(tmp_path):
    import torch

    from neuron_args.runner import NeuronRunner

    with pytest.raises(CompilerArgsError) as caught:
        NeuronRunner(torch.nn.Linear(2, 2), graphs=[], compiler_args="-O2 --lnc=4", compiler="local",
                     cache_dir=tmp_path)
    assert "invalid value '4' for '--logical-nc-config'; allowed values are 1, 2" in str(caught.value)
    assert str(caught.value).endswith("(these arguments come from NeuronRunner(compiler_args=...))")


def test_the_compile_cli_refuses_a_bad_base_list_before_any_work(tmp_path, capsys):
    assert cli_main(["compile", str(tmp_path), "--base-compiler-args", "-O2 --no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert "argument --base-compiler-args: compiler args: unknown neuronx-cc flag '--no-such-flag'" in err


def test_recorded_arguments_are_read_back_once_as_the_value_type():
    md = EntryMetadata.parse({"key": KEY, "compiler_args": ["--lnc", "2", "-O1"]}, KEY)
    assert type(md.compiler_args) is CompilerArgs and md.compiler_args.canonical == ("--logical-nc-config=2", "-O1")
    with pytest.raises(CorruptEntryError, match="metadata.json field 'compiler_args' is .* not a list of strings"):
        EntryMetadata.parse({"key": KEY, "compiler_args": ["-O1\x00"]}, KEY)  # no argv can hold a NUL
