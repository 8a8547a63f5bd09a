"""The compiler-argument scope: nesting, exceptions, thread and task isolation, input checks."""
from __future__ import annotations

import asyncio
import threading

import pytest

from neuron_args import apply_scoped_compiler_args, scoped_compiler_args
from neuron_args.scope import current_compiler_args, current_graph_type


def test_no_scope_leaves_options_unchanged():
    options = {"compiler_args": ["-O1"], "target": "trn2"}
    assert apply_scoped_compiler_args(options) == {"compiler_args": ["-O1"], "target": "trn2"}
    assert apply_scoped_compiler_args(None) == {}


def test_scope_replaces_compiler_args_without_mutating_input():
    options = {"compiler_args": ["-O1"], "target": "trn2"}
    with scoped_compiler_args(["-O3", "--auto-cast=none"]):
        applied = apply_scoped_compiler_args(options)
    assert applied == {"compiler_args": ["-O3", "--auto-cast=none"], "target": "trn2"}
    assert options == {"compiler_args": ["-O1"], "target": "trn2"}
    assert apply_scoped_compiler_args(None if False else {}) == {}


def test_none_scope_means_no_override():
    with scoped_compiler_args(["-O3"]):
        with scoped_compiler_args(None):
            assert apply_scoped_compiler_args({"compiler_args": ["-O1"]}) == {"compiler_args": ["-O1"]}
        assert current_compiler_args() == ("-O3",)


def test_nested_scopes_restore_outer_value_also_on_exception():
    with scoped_compiler_args(["-O1"], graph_type="prefill"):
        with pytest.raises(RuntimeError):
            with scoped_compiler_args(["-O3"], graph_type="decode"):
                assert current_compiler_args() == ("-O3",)
                assert current_graph_type() == "decode"
                raise RuntimeError("boom")
        assert current_compiler_args() == ("-O1",)
        assert current_graph_type() == "prefill"
    assert current_compiler_args() is None
    assert current_graph_type() is None


def test_scope_does_not_leak_into_another_thread():
    seen = {}
    entered, release = threading.Event(), threading.Event()

    def other():
        entered.wait()
        seen["other"] = current_compiler_args()
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with scoped_compiler_args(["-O3"]):
        entered.set()
        release.wait(5)
    t.join(5)
    assert seen == {"other": None}


def test_scope_does_not_leak_between_asyncio_tasks():
    async def worker(args, delay):
        with scoped_compiler_args(args):
            await asyncio.sleep(delay)
            return current_compiler_args()

    async def main():
        return await asyncio.gather(worker(["-O1"], 0.02), worker(["-O3"], 0.01), worker(None, 0.0))

    assert asyncio.run(main()) == [("-O1",), ("-O3",), None]


@pytest.mark.parametrize("bad, fragment", [
    ("-O3", "str"),
    (3, "int"),
    (["-O3", 3], "int 3"),
    ([b"-O3"], "bytes"),
])
def test_scope_rejects_values_that_are_not_a_sequence_of_str(bad, fragment):
    with pytest.raises(TypeError, match=fragment):
        with scoped_compiler_args(bad):
            pass
    assert current_compiler_args() is None


def test_tuple_scope_is_accepted_and_copied():
    args = ["-O2"]
    with scoped_compiler_args(args):
        args.append("--model-type=transformer")
        assert apply_scoped_compiler_args({})["compiler_args"] == ["-O2"]
