"""The runner resolver: the design's precedence table, stamping, policy errors and determinism."""
from __future__ import annotations

import pytest

from neuron_args import PolicyError
from neuron_args.flags import with_optimization_level
from neuron_args.scope import BASE_ARGS_ATTR, CompilerArgsResolver

BASE = ["--target", "trn2", "--auto-cast=none", "-O1"]


class Model:
    def __init__(self):
        self.seen_bases = []

    def compiler_args_for(self, graph_type, example_inputs, base):
        self.seen_bases.append(list(base))
        base = list(base or [])
        if graph_type in ("decode", "encoder"):
            return with_optimization_level(base, 3)
        if graph_type == "jf":
            return with_optimization_level(base, 2)
        return base


class NoPolicy:
    pass


@pytest.mark.parametrize("explicit, graph_type, expected", [
    (None, "decode", ["--target", "trn2", "--auto-cast=none", "-O3"]),
    (None, "encoder", ["--target", "trn2", "--auto-cast=none", "-O3"]),
    (None, "jf", ["--target", "trn2", "--auto-cast=none", "-O2"]),
    (None, "prefill", BASE),
    (None, None, None),          # untagged graph: no override
    (2, "decode", None),         # explicit caller level disables the policy
    (2, "prefill", None),
])
def test_precedence(explicit, graph_type, expected):
    r = CompilerArgsResolver.from_model(Model(), BASE, explicit_optimization_level=explicit)
    assert r.resolve_graph_compiler_args(graph_type) == expected


def test_explicit_level_is_carried_by_the_base_list_and_disables_stamping():
    model = Model()
    r = CompilerArgsResolver.from_model(model, BASE, explicit_optimization_level=2)
    assert r.per_graph is False
    assert r.base_args == ["--target", "trn2", "--auto-cast=none", "-O2"]
    assert not hasattr(model, BASE_ARGS_ATTR)
    assert model.seen_bases == []


def test_no_policy_means_compiler_default():
    r = CompilerArgsResolver.from_model(NoPolicy(), BASE)
    assert r.per_graph is False
    assert r.resolve_graph_compiler_args("decode") is None
    assert r.base_args == BASE


def test_policy_enabled_stamps_base_and_gets_a_copy():
    model = Model()
    r = CompilerArgsResolver.from_model(model, " ".join(BASE))
    assert getattr(model, BASE_ARGS_ATTR) == BASE

    def mutating(graph_type, example_inputs, base):
        base.append("--enable-saturate-infinity")
        return base

    r2 = CompilerArgsResolver(BASE, mutating)
    assert r2.resolve_graph_compiler_args("decode")[-1] == "--enable-saturate-infinity"
    assert r2.base_args == BASE
    assert r.resolve_graph_compiler_args("decode")[-1] == "-O3"


def test_policy_that_raises_names_model_and_graph_type():
    class Broken:
        def compiler_args_for(self, graph_type, example_inputs, base):
            raise KeyError(graph_type)

    r = CompilerArgsResolver.from_model(Broken(), BASE)
    with pytest.raises(PolicyError, match=r"Broken\.compiler_args_for raised for graph type 'decode'") as err:
        r.resolve_graph_compiler_args("decode")
    assert isinstance(err.value.__cause__, KeyError)


@pytest.mark.parametrize("returned, fragment", [
    ("-O3", "returned str"),
    (None, "returned NoneType"),
    (["-O3", 3], "non-str items"),
    (["--optlvl=3"], "--optlevel"),
])
def test_policy_returning_wrong_things_is_reported(returned, fragment):
    class Wrong:
        def compiler_args_for(self, graph_type, example_inputs, base):
            return returned

    r = CompilerArgsResolver.from_model(Wrong(), BASE)
    with pytest.raises(PolicyError) as err:
        r.resolve_graph_compiler_args("decode")
    assert "Wrong" in str(err.value) and "decode" in str(err.value)
    assert fragment in str(err.value)


def test_non_deterministic_policy_is_detected_with_both_lists():
    calls = iter([3, 2])

    class Flaky:
        def compiler_args_for(self, graph_type, example_inputs, base):
            return with_optimization_level(base, next(calls))

    r = CompilerArgsResolver.from_model(Flaky(), BASE)
    assert r.resolve_graph_compiler_args("decode")[-1] == "-O3"
    with pytest.raises(PolicyError, match="not deterministic") as err:
        r.resolve_graph_compiler_args("decode")
    assert "-O3" in str(err.value) and "-O2" in str(err.value)


def test_example_inputs_is_none_today():
    got = []

    def policy(graph_type, example_inputs, base):
        got.append(example_inputs)
        return base

    CompilerArgsResolver(BASE, policy).resolve_graph_compiler_args("decode")
    assert got == [None]
