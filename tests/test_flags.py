"""The neuronx-cc option table: splitting, validation, -O editing, key and manifest forms."""
from __future__ import annotations

import shlex
import subprocess
import sys
import warnings

import pytest

from neuron_args.errors import CompilerArgsError, NeuronArgsError
from neuron_args.settings import CompileSettings
from neuron_args.flags import (
    KNOWN_TARGETS,
    OPT_LEVELS,
    CompilerArgs,
    Flag,
    canonical_compiler_args,
    closest_option,
    manifest_compiler_flags,
    optimization_level,
    parse_compiler_args,
    remove_options,
    split_compiler_args,
    validate_compiler_args,
    with_optimization_level,
)

BASE = ["--framework", "XLA", "--target", "trn2", "--auto-cast=none", "--lnc", "2"]

# every accepted spelling of "level 2", as the tokens a caller would give
LEVEL_SPELLINGS = [
    pytest.param(["-O2"], id="-O2"),
    pytest.param(["-O", "2"], id="-O_2"),
    pytest.param(["--optlevel", "2"], id="--optlevel_2"),
    pytest.param(["--optlevel=2"], id="--optlevel=2"),
]


# ----------------------------------------------------------------------------- split


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, []),
        ("", []),
        ("--target trn2 -O3", ["--target", "trn2", "-O3"]),
        ("  --target   trn2\t-O3\n", ["--target", "trn2", "-O3"]),
        (
            "--framework XLA --tensorizer-options='--no-foo --bar' -O1",
            ["--framework", "XLA", "--tensorizer-options=--no-foo --bar", "-O1"],
        ),
        (
            '--hlo2tensorizer-options "--a=1 --b" --target trn1',
            ["--hlo2tensorizer-options", "--a=1 --b", "--target", "trn1"],
        ),
        (["--target", "trn2"], ["--target", "trn2"]),
        (("-O1", "--tensorizer-options=--x --y"), ["-O1", "--tensorizer-options=--x --y"]),
    ],
)
def test_split(given, expected):
    assert split_compiler_args(given) == expected


def test_split_returns_a_new_list_and_does_not_resplit_items():
    given = ["--tensorizer-options=--no-foo --bar", "-O1"]
    out = split_compiler_args(given)
    assert out == given and out is not given
    out.append("x")
    assert given == ["--tensorizer-options=--no-foo --bar", "-O1"]


@pytest.mark.parametrize(
    ("given", "needle"),
    [(5, "int"), (b"-O1", "bytes"), (["-O1", 3], "item 1 is int"), ({"-O1"}, "set")],
)
def test_split_rejects_non_strings(given, needle):
    with pytest.raises(TypeError, match=needle):
        split_compiler_args(given)


def test_split_unbalanced_quote_is_a_compiler_args_error():
    with pytest.raises(CompilerArgsError, match="close the quote"):
        split_compiler_args("--tensorizer-options='--a")


# ----------------------------------------------------------------------------- parse / validate


def test_parse_gives_canonical_names_values_and_original_tokens():
    flags = parse_compiler_args(
        ["--target", "trn2", "-O", "3", "-lnc=2", "--enable-saturate-infinity",
         "--internal-foo=1", "--internal-bar", "--tensorizer-options", "--no-foo --bar",
         "--jobs", "4", "--compile_workdir", "/tmp/w"]
    )
    assert flags == [
        Flag("--target", "trn2", ("--target", "trn2")),
        Flag("--optlevel", "3", ("-O", "3")),
        Flag("--logical-nc-config", "2", ("-lnc=2",)),
        Flag("--enable-saturate-infinity", None, ("--enable-saturate-infinity",)),
        Flag("--internal-foo", "1", ("--internal-foo=1",)),
        Flag("--internal-bar", None, ("--internal-bar",)),
        Flag("--tensorizer-options", "--no-foo --bar", ("--tensorizer-options", "--no-foo --bar")),
        Flag("--num-parallel-jobs", "4", ("--jobs", "4")),
        Flag("--compile_workdir", "/tmp/w", ("--compile_workdir", "/tmp/w")),
    ]


@pytest.mark.parametrize("target", KNOWN_TARGETS)
def test_every_known_target_validates(target):
    assert validate_compiler_args(["--target", target]) == ["--target", target]


@pytest.mark.parametrize(
    "args",
    [
        "--framework XLA --target trn2 --auto-cast=none --auto-cast-type bf16 -O1",
        "--model-type=transformer --distribution-strategy llm-training --lnc=1",
        "--enable-mixed-precision-accumulation --enable-fast-context-switch "
        "--enable-fast-loading-neuron-binaries --enable-internal-neff-wrapper",
        "--verbose=info --pipeline compile --num-parallel-jobs 8 --logfile /tmp/log.txt",
        "--output out.neff --workdir /tmp/w --internal-hlo2tensorizer-options=--x",
        "--auto-cast-type fp8_e4m3 --native-int64=enabled --hlo2tensorizer-options=--verify-hlo",
    ],
)
def test_valid_lists_validate_and_come_back_unchanged(args):
    assert validate_compiler_args(args) == shlex.split(args)


def test_validate_returns_a_new_list():
    given = ["--target", "trn2"]
    out = validate_compiler_args(given)
    assert out == given and out is not given


@pytest.mark.parametrize(
    ("args", "flag", "closest"),
    [
        (["--optlvl=3"], "'--optlvl'", "'--optlevel'"),
        (["--auto-cats", "none"], "'--auto-cats'", "'--auto-cast'"),
        (["--taget", "trn2"], "'--taget'", "'--target'"),
        (["--enable-saturate-infinty"], "'--enable-saturate-infinty'", "'--enable-saturate-infinity'"),
        (["--logical-nc-confg=2"], "'--logical-nc-confg'", "'--logical-nc-config'"),
    ],
)
def test_unknown_flag_names_flag_closest_and_graph_type(args, flag, closest):
    with pytest.raises(CompilerArgsError) as info:
        parse_compiler_args(["--target", "trn2", *args], graph_type="decode")
    message = str(info.value)
    assert "unknown neuronx-cc flag" in message
    assert flag in message
    assert f"Did you mean {closest}?" in message
    assert "'decode'" in message


def test_unknown_flag_without_graph_type_and_without_close_match():
    with pytest.raises(CompilerArgsError) as info:
        validate_compiler_args(["--zzzzzzzzzzzz"])
    message = str(info.value)
    assert "'--zzzzzzzzzzzz'" in message
    assert "Did you mean" not in message
    assert "graph type" not in message


def test_compiler_args_error_is_a_value_error_and_a_neuron_args_error():
    with pytest.raises(ValueError):
        validate_compiler_args(["--nope"])
    with pytest.raises(NeuronArgsError):
        validate_compiler_args(["--nope"])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--target", "trn9"], ["'trn9'", "'--target'", "inf2, trn1, trn1n, trn2, trn3"]),
        (["--auto-cast=fp32"], ["'fp32'", "none, matmult, all"]),
        (["--auto-cast-type", "fp64"], ["'fp64'", "bf16, fp16, tf32, fp8_e4m3"]),
        (["--model-type=llm"], ["'llm'", "generic, transformer, unet-inference"]),
        (["--lnc", "4"], ["'4'", "'--logical-nc-config'", "1, 2"]),
        (["--framework", "xla"], ["'xla'", "XLA, TENSORFLOW, PYTORCH"]),
        (["--verbose=loud"], ["'loud'", "debug, info, warning, error, critical"]),
        (["--distribution-strategy", "dp"], ["'dp'", "llm-training"]),
        (["--jobs", "many"], ["'many'", "positive integer"]),
        (["--num-parallel-jobs=0"], ["'0'", "positive integer"]),
    ],
)
def test_bad_choice_names_the_allowed_values(args, needles):
    with pytest.raises(CompilerArgsError) as info:
        validate_compiler_args(args, graph_type="prefill")
    message = str(info.value)
    for needle in needles + ["'prefill'"]:
        assert needle in message


@pytest.mark.parametrize(
    "args",
    [["-O0"], ["-O4"], ["-O", "7"], ["--optlevel=5"], ["--optlevel", "x"], ["-Ofast"], ["-O", "-1"]],
)
def test_bad_level_is_rejected_with_allowed_levels(args):
    with pytest.raises(CompilerArgsError, match=r"bad optimization level .*1, 2, 3"):
        validate_compiler_args(args)


def test_dash_o_equals_is_not_a_valid_spelling():
    with pytest.raises(CompilerArgsError) as info:
        validate_compiler_args(["-O=3"])
    assert "'-O=3'" in str(info.value) and "'-O3'" in str(info.value)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--target"], "'--target'"),
        (["--target", "--auto-cast=none"], "'--target'"),
        (["-O"], "'-O'"),
        (["-O", "--target", "trn2"], "'-O'"),
        (["--optlevel"], "'--optlevel'"),
        (["--logfile"], "'--logfile'"),
        (["--tensorizer-options"], "'--tensorizer-options'"),
        (["--tensorizer-options", "--target", "trn2"], "'--tensorizer-options'"),
    ],
)
def test_missing_value(args, flag):
    with pytest.raises(CompilerArgsError) as info:
        validate_compiler_args(args, graph_type="encoder")
    message = str(info.value)
    assert f"{flag} needs a value" in message
    assert "'encoder'" in message


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["graph.hlo", "--target", "trn2"], "stray token 'graph.hlo'"),
        (["--enable-saturate-infinity", "1"], "a switch: it takes no value"),
        (["--internal-foo", "bar"], "'--internal-foo=VALUE'"),
        (["--target", "trn2", "trn1"], "stray token 'trn1' after 'trn2'"),
        (["--"], "stray token '--'"),
        (["--enable-fast-context-switch=yes"], "is a switch and takes no value"),
        (["--output="], "non-empty value"),
    ],
)
def test_malformed_tokens(args, needle):
    with pytest.raises(CompilerArgsError, match="compiler args") as info:
        validate_compiler_args(args)
    assert needle in str(info.value)


def test_opaque_options_take_a_dash_value_as_two_tokens():
    flags = parse_compiler_args(["--tensorizer-options", "--no-foo", "-O2"])
    assert [(f.name, f.value) for f in flags] == [
        ("--tensorizer-options", "--no-foo"),
        ("--optlevel", "2"),
    ]


def test_validate_accepts_neuron_cc_flags_style_string():
    env = "--target=trn2 --tensorizer-options='--no-foo --bar' -O 3 --internal-x=\"a b\""
    assert validate_compiler_args(env) == [
        "--target=trn2", "--tensorizer-options=--no-foo --bar", "-O", "3", "--internal-x=a b",
    ]


# ----------------------------------------------------------------------------- with_optimization_level


@pytest.mark.parametrize("spelling", LEVEL_SPELLINGS)
@pytest.mark.parametrize("level", OPT_LEVELS)
def test_with_optimization_level_replaces_every_spelling_in_place(spelling, level):
    given = ["--framework", "XLA", *spelling, "--target", "trn2"]
    snapshot = list(given)
    out = with_optimization_level(given, level)
    assert out == ["--framework", "XLA", f"-O{level}", "--target", "trn2"]
    assert given == snapshot  # never mutated
    assert out is not given


def test_with_optimization_level_appends_when_absent():
    assert with_optimization_level(BASE, 3) == [*BASE, "-O3"]
    assert with_optimization_level(None, 1) == ["-O1"]


def test_with_optimization_level_collapses_many_levels_at_the_first():
    given = ["-O1", "--target", "trn2", "--optlevel", "2", "--auto-cast=none", "--optlevel=3", "-O", "1"]
    assert with_optimization_level(given, 2) == ["-O2", "--target", "trn2", "--auto-cast=none"]


def test_with_optimization_level_keeps_unknown_flags_and_their_order():
    given = [
        "--some-decode-only-flag", "x", "-O1", "--internal-foo", "--another=1",
        "--tensorizer-options", "-O9 --z",  # an inner tool's options, not our level
    ]
    assert with_optimization_level(given, 3) == [
        "--some-decode-only-flag", "x", "-O3", "--internal-foo", "--another=1",
        "--tensorizer-options", "-O9 --z",
    ]


def test_with_optimization_level_replaces_malformed_levels_too():
    assert with_optimization_level(["-O=2", "--target", "trn2", "-O7"], 1) == ["-O1", "--target", "trn2"]


def test_with_optimization_level_accepts_a_string():
    assert with_optimization_level("--target trn2 -O 1 --tensorizer-options='--a --b'", 3) == [
        "--target", "trn2", "-O3", "--tensorizer-options=--a --b",
    ]


@pytest.mark.parametrize("level", [0, 4, -1, True, False, "3", 3.0, None])
def test_with_optimization_level_rejects_bad_levels(level):
    with pytest.raises(ValueError) as info:
        with_optimization_level(BASE, level)
    assert "1, 2, 3" in str(info.value)
    assert repr(level) in str(info.value)


# ----------------------------------------------------------------------------- optimization_level


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (BASE, None),
        (["-O1"], 1),
        (["-O", "2"], 2),
        (["--optlevel=3"], 3),
        (["-O1", "--target", "trn2", "--optlevel", "3"], 3),  # last wins
        (["--optlevel=3", "-O2"], 2),
        ("--unknown-flag -O2", 2),  # other flags are not checked
    ],
)
def test_optimization_level(args, expected):
    assert optimization_level(args) == expected


@pytest.mark.parametrize("args", [["-O5"], ["-O=2"], ["-O"], ["-O2", "--optlevel", "9"]])
def test_optimization_level_rejects_malformed_last_level(args):
    with pytest.raises(CompilerArgsError, match="1, 2, 3"):
        optimization_level(args)


# ----------------------------------------------------------------------------- canonical form


@pytest.mark.parametrize("spelling", [*LEVEL_SPELLINGS, pytest.param(["-O", "2"], id="again")])
def test_canonical_level_spellings_collapse(spelling):
    assert canonical_compiler_args(["--target", "trn2", *spelling]) == ["-O2", "--target=trn2"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (["--optlevel=3"], ["-O3"]),
        (["--optlevel", "3"], ["-O", "3"]),
        (["--lnc", "2"], ["--logical-nc-config=2"]),
        (["-lnc", "2"], ["--logical-nc-config", "2"]),
        (["--target", "trn2", "-O3"], ["-O3", "--target=trn2"]),
        (["--jobs", "8"], ["--num-parallel-jobs=8"]),
        (["-O1", "-O3"], ["-O3"]),  # last wins
        (["--target", "trn1", "--target=trn2"], ["--target=trn2"]),
        (["--enable-saturate-infinity", "--enable-saturate-infinity"], ["--enable-saturate-infinity"]),
        (["--target", "trn2", "--output", "/a/x.neff", "--logfile=/a/log"], ["--target=trn2"]),
        (["--workdir", "/tmp/a", "--compile_workdir=/tmp/b", "-O2"], ["-O2"]),
        (["--tensorizer-options", "--a --b"], ["--tensorizer-options=--a --b"]),
        ("--framework XLA -O 2 --internal-x=1", ["--internal-x=1", "--optlevel=2", "--framework=XLA"]),
    ],
)
def test_canonical_equal(a, b):
    assert canonical_compiler_args(a) == canonical_compiler_args(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (["-O1"], ["-O3"]),
        (["-O1"], []),
        (["--target", "trn1"], ["--target", "trn2"]),
        (["--auto-cast=none"], []),  # no knowledge of defaults: explicit is different
        (["--internal-a", "--internal-b"], ["--internal-b", "--internal-a"]),  # order sensitive
        (["--internal-a=1"], ["--internal-a=2"]),
        (["--internal-a", "--internal-a"], ["--internal-a"]),  # opaque: repeats kept
        (["--tensorizer-options=--x", "--tensorizer-options=--y"], ["--tensorizer-options=--y"]),
        (["--enable-saturate-infinity"], []),
        (["--lnc", "1"], ["--lnc", "2"]),
    ],
)
def test_canonical_not_equal(a, b):
    assert canonical_compiler_args(a) != canonical_compiler_args(b)


def test_canonical_sorts_named_and_keeps_opaque_order_after_them():
    given = [
        "--internal-z=1", "--target", "trn2", "--tensorizer-options", "--no-foo --bar",
        "-O", "3", "--internal-a", "--enable-saturate-infinity", "--lnc", "2",
        "--hlo2tensorizer-options=--h", "--auto-cast", "none", "--output", "/x/y.neff",
    ]
    assert canonical_compiler_args(given) == [
        "--auto-cast=none",
        "--enable-saturate-infinity",
        "--logical-nc-config=2",
        "-O3",
        "--target=trn2",
        "--internal-z=1",
        "--tensorizer-options=--no-foo --bar",
        "--internal-a",
        "--hlo2tensorizer-options=--h",
    ]


def test_canonical_validates():
    with pytest.raises(CompilerArgsError, match="--optlevel"):
        canonical_compiler_args(["--optlvl=3"])
    with pytest.raises(CompilerArgsError, match="1, 2, 3"):
        canonical_compiler_args(["-O4"])


def test_canonical_is_idempotent():
    once = canonical_compiler_args("--lnc 2 -O 1 --target trn2 --internal-q --tensorizer-options='--a --b'")
    assert canonical_compiler_args(once) == once


# ----------------------------------------------------------------------------- manifest form


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--framework", "XLA", "--target", "trn2", "--logfile=/abs/x.txt", "-O3"],
         "--framework XLA --target trn2 -O3"),
        (["--output", "/cache/k/graph_k.neff", "--target", "trn2", "--auto-cast=none"],
         "--target trn2 --auto-cast=none"),
        (["--workdir=/tmp/w", "--compile_workdir", "/tmp/c", "-O", "2"], "-O 2"),
        (["--internal-dump-dir=relative", "--internal-keep=1", "--internal-out=/abs/p", "--lnc", "2"],
         "--internal-keep=1 --lnc 2"),
        (["--internal-enable-dump", "--internal-other=~/x", "-O1"], "-O1"),
        # unknown flags and strays are kept, never an error
        (["--some-unknown", "value", "--optlvl=3", "--target", "trn9"],
         "--some-unknown value --optlvl=3 --target trn9"),
        (["--logfile"], ""),  # dangling path option: dropped
        ([], ""),
        (None, ""),
    ],
)
def test_manifest_compiler_flags(args, expected):
    assert manifest_compiler_flags(args) == expected


def test_manifest_keeps_order_and_round_trips_tokens_with_spaces():
    given = ["-O3", "--tensorizer-options=--no-foo --bar", "--target", "trn2", "--logfile", "/l"]
    line = manifest_compiler_flags(given)
    assert split_compiler_args(line) == ["-O3", "--tensorizer-options=--no-foo --bar", "--target", "trn2"]


def test_manifest_accepts_a_string_and_never_raises():
    assert manifest_compiler_flags("--target trn2 --output /x.neff -O1") == "--target trn2 -O1"
    unclosed = manifest_compiler_flags("--tensorizer-options='unclosed")  # shlex cannot split it
    assert shlex.split(unclosed) == ["--tensorizer-options='unclosed"]
    assert manifest_compiler_flags(["-O1", 3]) == "-O1 3"
    assert manifest_compiler_flags(7) == "7"


# ----------------------------------------------------------------------------- remove / lookup


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["-O"], ["--target", "trn2", "--lnc", "2", "--internal-foo=1", "--unknown", "x"]),
        (["--optlevel"], ["--target", "trn2", "--lnc", "2", "--internal-foo=1", "--unknown", "x"]),
        (["-lnc", "--target"], ["-O", "2", "--internal-foo=1", "--unknown", "x", "--optlevel=3"]),
        ("--internal-foo", ["--target", "trn2", "-O", "2", "--lnc", "2", "--unknown", "x",
                            "--optlevel=3"]),
        ([], ["--target", "trn2", "-O", "2", "--lnc", "2", "--internal-foo=1", "--unknown", "x",
              "--optlevel=3"]),
    ],
)
def test_remove_options(names, expected):
    given = ["--target", "trn2", "-O", "2", "--lnc", "2", "--internal-foo=1", "--unknown", "x",
             "--optlevel=3"]
    snapshot = list(given)
    assert remove_options(given, names) == expected
    assert given == snapshot


def test_remove_options_drops_paths_with_values_in_any_form():
    given = "--output /a.neff --logfile=/b --tensorizer-options '--x --y' -O1"
    assert remove_options(given, ["--output", "--logfile", "--tensorizer-options"]) == ["-O1"]


def test_remove_options_unknown_name_is_an_error_with_the_closest():
    with pytest.raises(CompilerArgsError, match="'--optlevel'"):
        remove_options(["-O1"], ["--optlvl"])


@pytest.mark.parametrize(
    ("args", "name", "expected"),
    [
        (["--target", "trn2"], "--target", "trn2"),
        (["--target=trn1", "--target", "trn2"], "--target", "trn2"),
        (["--lnc", "2"], "--logical-nc-config", "2"),
        (["--logical-nc-config=1"], "-lnc", "1"),
        (["-O3"], "--optlevel", "3"),
        (["--optlevel", "1"], "-O", "1"),
        (["--internal-foo=bar"], "--internal-foo", "bar"),
        (["--internal-foo"], "--internal-foo", None),
        (["--tensorizer-options", "--a --b"], "--tensorizer-options", "--a --b"),
        (BASE, "--auto-cast", "none"),
        (BASE, "--output", None),
        ("--unknown x --target trn2", "--target", "trn2"),
    ],
)
def test_option_value(args, name, expected):
    assert CompilerArgs(args).value(name) == expected


def test_option_value_errors():
    with pytest.raises(CompilerArgsError, match="'--target'"):
        CompilerArgs(BASE).value("--targt")
    with pytest.raises(CompilerArgsError, match=r"is a switch and has no value; use \.has\(\)"):
        CompilerArgs(BASE).value("--enable-saturate-infinity")


def test_has_option():
    args = CompilerArgs(["--enable-saturate-infinity", "--lnc=2", "--internal-x"])
    assert args.has("--enable-saturate-infinity")
    assert args.has("-lnc")
    assert args.has("--internal-x")
    assert not args.has("--enable-fast-context-switch")
    assert not args.has("--internal-y")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("--optlvl", "--optlevel"),
        ("--optlvl=3", "--optlevel"),
        ("--auto-cats", "--auto-cast"),
        ("--Target", "--target"),
        ("-o3", "-O3"),
        ("--lnc", "--logical-nc-config"),
        ("-O", "--optlevel"),
        ("--internal-anything", "--internal-anything"),
        ("--completely-unrelated-thing-xyz", None),
    ],
)
def test_closest_option(name, expected):
    assert closest_option(name) == expected


@pytest.mark.slow
def test_importing_flags_pulls_in_neither_torch_nor_jax():
    code = (
        "import sys, neuron_args.flags; "
        "print(sorted(m for m in ('torch', 'jax', 'torchax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_flag_changes_is_option_level_and_ignores_order():
    from neuron_args.flags import FlagChanges, flag_changes

    old = canonical_compiler_args("-O3 --lnc 2 --auto-cast=none")
    new = canonical_compiler_args("--auto-cast none -O1 --enable-saturate-infinity")
    change = flag_changes(old, new)
    assert change == FlagChanges(added=("--enable-saturate-infinity",), removed=("--logical-nc-config=2",),
                                 changed=(("--optlevel", "-O3", "-O1"),))
    assert change.as_dict()["changed"] == [{"option": "--optlevel", "old": "-O3", "new": "-O1"}]
    assert not flag_changes(["-O1", "--lnc=2"], ["--lnc=2", "-O1"])


def test_a_target_in_the_arguments_that_disagrees_names_both_sources_and_the_fix(monkeypatch):
    """The seams' platform step: where each target came from, and how to set it in one place."""
    from neuron_args.settings import NEURON_CC_FLAGS_ENV, apply_platform_compiler_args
    from neuron_args.target import TARGET_ENV

    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.setenv(NEURON_CC_FLAGS_ENV, "--target=trn1 -O2")
    with pytest.raises(CompilerArgsError) as excinfo:
        apply_platform_compiler_args(CompileSettings.from_options({"target": "trn2"}, "test"), graph_type="decode")
    text = str(excinfo.value)
    assert text.startswith("graph type 'decode': $NEURON_CC_FLAGS say --target trn1 but options['target'] is 'trn2'")
    assert "drop --target from $NEURON_CC_FLAGS" in text and "--neuron-target=trn1" in text
    monkeypatch.setenv(TARGET_ENV, "inf2")  # below the arguments' own --target in precedence: no conflict
    assert apply_platform_compiler_args(CompileSettings.from_options({"compiler_args": ["--target", "trn1"]}, "test")).target == "trn1"
    monkeypatch.delenv(TARGET_ENV)
    with pytest.raises(CompilerArgsError, match=r"^unknown compile target 'trn9' \(from options\['target'\]\)"):
        CompileSettings.from_options({"target": "trn9", "compiler_args": []}, "test")  # checked where it enters
    # one place is fine: the arguments alone, or the option alone
    assert apply_platform_compiler_args(CompileSettings.from_options({"compiler_args": ["--target=trn1", "-O2"]}, "test")).target == "trn1"
    assert apply_platform_compiler_args(CompileSettings.from_options({"target": "trn1", "compiler_args": ["-O2"]}, "test")).compiler_args == ("-O2",)


# ----------------------------------------------------------------------------- an option given twice


@pytest.fixture
def told_afresh():
    """This process has told no repeated option yet (the warnings are said once per process)."""
    from neuron_args.activity import ACTIVITY

    said = set(ACTIVITY.said)
    ACTIVITY.said.clear()
    yield
    ACTIVITY.said.clear()
    ACTIVITY.said.update(said)


def test_repeated_options_are_the_conflicting_ones_in_any_spelling():
    from neuron_args.flags import RepeatedOption, repeated_options

    assert repeated_options("-O1 -O3") == [RepeatedOption("--optlevel", ("-O1", "-O3"))]
    assert repeated_options("-O1 -O3")[0].effective == "-O3"
    assert repeated_options(["--lnc", "2", "-O2", "--logical-nc-config=1"]) == [
        RepeatedOption("--logical-nc-config", ("--lnc 2", "--logical-nc-config=1"))]
    # equal values in other spellings, repeated switches, inner tools' option strings: not conflicts
    assert repeated_options("-O3 --optlevel=3 -O 3 --jobs 4 --num-parallel-jobs=04") == []
    assert repeated_options("--enable-saturate-infinity --enable-saturate-infinity") == []
    assert repeated_options(["--internal-x=1", "--internal-x=2", "--tensorizer-options=--a", "--tensorizer-options=--b"]) == []


def test_an_option_given_twice_warns_once_naming_source_values_effective_and_fix(monkeypatch, told_afresh):
    """Last wins, as in neuronx-cc (and in the key), but the user is told once where and what compiles."""
    from neuron_args.errors import CompilerArgsWarning
    from neuron_args.settings import NEURON_CC_FLAGS_ENV, apply_platform_compiler_args
    from neuron_args.target import TARGET_ENV

    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.setenv(NEURON_CC_FLAGS_ENV, "-O1 --auto-cast=none -O3")
    with pytest.warns(CompilerArgsWarning) as caught:
        args = apply_platform_compiler_args(CompileSettings.from_options({}, "test"), graph_type="decode")
    assert args.compiler_args == ("-O1", "--auto-cast=none", "-O3")  # handed on as given: neuronx-cc keeps -O3
    (warning,) = caught
    assert str(warning.message) == (
        "graph type 'decode': $NEURON_CC_FLAGS gives --optlevel 2 times with different values ('-O1', '-O3'); "
        "neuronx-cc keeps the last, so '-O3' is what compiles and what the cache key holds. Fix: give --optlevel "
        "once in $NEURON_CC_FLAGS (remove '-O1').")
    assert canonical_compiler_args(list(args.compiler_args)) == canonical_compiler_args(["--auto-cast=none", "-O3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_platform_compiler_args(CompileSettings.from_options({}, "test"), graph_type="prefill")  # told once per process, not per graph
        apply_platform_compiler_args(CompileSettings.from_options({"compiler_args": "-O2 -O2"}, "test"))  # the same value twice is no conflict
    with pytest.warns(CompilerArgsWarning, match=r"^options\['compiler_args'\] gives --logical-nc-config 2 times"):
        apply_platform_compiler_args(CompileSettings.from_options({"compiler_args": ["--lnc=1", "--lnc=2"]}, "test"))


def test_a_repeat_in_a_scope_or_a_policy_names_it(told_afresh):
    from neuron_args.errors import CompilerArgsWarning
    from neuron_args.scope import CompilerArgsResolver, resolve_request, scoped_compiler_args

    with pytest.warns(CompilerArgsWarning, match=r"^graph type 'decode': scoped_compiler_args\(\.\.\.\) gives "
                                                 r"--auto-cast 2 times .*'--auto-cast=all'"):
        with scoped_compiler_args(["--auto-cast=none", "--auto-cast=all"], graph_type="decode"):
            resolve_request(CompileSettings.from_options({"compiler_args": ["-O1"], "target": "trn2"}, "test"), "decode")

    class Appends:
        def compiler_args_for(self, graph_type, example_inputs, base):
            return base + ["-O3"]  # the base's -O1 stays in the list

    resolver = CompilerArgsResolver.from_model(Appends(), "-O1")
    with pytest.warns(CompilerArgsWarning) as caught:
        assert resolver.resolve_graph_compiler_args("decode") == ["-O1", "-O3"]
    text = str(caught[0].message)
    assert text.startswith("graph type 'decode': Appends.compiler_args_for gives --optlevel 2 times")
    assert "return with_optimization_level(base, N)" in text


def test_options_equal_to_the_scope_are_named_as_the_options(told_afresh):
    """Where a list came from is said by whoever hands it on (the scope's read names the scope), not guessed by
    comparing it with the scope's: settings given the same list as an open scope are still the options."""
    from neuron_args.errors import CompilerArgsError
    from neuron_args.scope import scoped_compiler_args
    from neuron_args.settings import apply_platform_compiler_args

    with scoped_compiler_args(["-O1", "--auto-cast=bogus"], graph_type="decode"):
        with pytest.raises(CompilerArgsError) as excinfo:
            apply_platform_compiler_args(CompileSettings(compiler_args=["-O1", "--auto-cast=bogus"]))
    assert str(excinfo.value).endswith("(these arguments come from options['compiler_args'])")


def test_a_repeat_in_a_runners_compiler_args_names_the_runner(told_afresh, tmp_path):
    import torch

    from neuron_args.errors import CompilerArgsWarning
    from neuron_args.runner import NeuronRunner

    with pytest.warns(CompilerArgsWarning, match=r"^NeuronRunner\(compiler_args=\.\.\.\) gives --auto-cast 2 times .*"
                                                 r"remove '--auto-cast=none'"):
        NeuronRunner(torch.nn.Linear(2, 2), graphs=[], compiler_args="--auto-cast=none --auto-cast=all",
                     cache_dir=tmp_path)
