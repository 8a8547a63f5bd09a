"""The plugin's collector policy: only the outermost session freezes, a later session unfreezes, warmups pause."""
from __future__ import annotations

import gc
import textwrap

import pytest

from pytest_neuron_args import gc_policy


@pytest.fixture
def fresh(monkeypatch):
    """A process with no plugin session open (this test runs inside one) and nothing frozen; restored after."""
    monkeypatch.setattr(gc_policy, "_open", [0])
    monkeypatch.setattr(gc_policy, "_frozen", [False])
    monkeypatch.delenv(gc_policy.ENV, raising=False)
    gc.unfreeze()  # the session running this test may have frozen its heap
    yield
    gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.slow
def test_the_outermost_session_freezes_after_collecting_and_the_next_session_unfreezes(fresh):
    import weakref

    gc_policy.session_started()
    dead = Cycle()
    dead_ref = weakref.ref(dead)
    del dead
    alive = Cycle()
    gc_policy.freeze(collect=True)
    assert dead_ref() is None  # garbage is collected before the freeze, never frozen
    assert gc.get_freeze_count() > 0
    alive_ref = weakref.ref(alive)
    del alive
    gc.collect()
    assert alive_ref() is not None  # frozen: left for the process's exit
    gc_policy.session_stopped()
    gc_policy.session_started()  # a later session in the same process
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive_ref() is None
    gc_policy.session_stopped()


def test_a_session_inside_another_and_the_switch_leave_the_heap_alone(fresh, monkeypatch):
    gc_policy.session_started()
    gc_policy.session_started()  # a pytester run inside
    gc_policy.freeze(collect=False)
    assert gc.get_freeze_count() == 0
    gc_policy.session_stopped()
    monkeypatch.setenv(gc_policy.ENV, "0")
    gc_policy.freeze(collect=False)
    assert gc.get_freeze_count() == 0
    gc_policy.session_stopped()


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_restores_the_collector_state(enabled):
    from torch._dynamo import config as dynamo_config

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RuntimeError), gc_policy.paused():
            assert not gc.isenabled()
            assert not dynamo_config.run_gc_after_compile  # nor Dynamo's collection after each compile
            raise RuntimeError("a failing warmup")
        assert gc.isenabled() is enabled
        assert dynamo_config.run_gc_after_compile
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("keep", [True, False])
def test_a_kept_warmup_collects_and_freezes_what_it_leaves_before_the_collector_is_back(fresh, keep):
    import weakref

    gc_policy.session_started()
    try:
        with gc_policy.paused(keep=keep):
            dead = Cycle()
            dead_ref = weakref.ref(dead)
            del dead
            alive = Cycle()  # a shared runner's traces: they outlive the warmup
            frozen_in_block = gc.get_freeze_count()
        assert gc.isenabled()
        if keep:
            assert dead_ref() is None  # garbage is collected before the freeze, never frozen
            assert gc.get_freeze_count() > frozen_in_block
            alive_ref = weakref.ref(alive)
            del alive
            gc.collect()
            assert alive_ref() is not None  # frozen: no later collection walks it
        else:  # a per-test runner's traces die with the test: the collector keeps them
            assert gc.get_freeze_count() == frozen_in_block == 0
            del alive
            gc.collect()
            assert dead_ref() is None
    finally:
        gc_policy.session_stopped()


@pytest.mark.slow
def test_a_session_that_warms_up_freezes_after_collection_and_again_at_its_end(neuron_project, warm_cache):
    """Wired into the plugin: in a process of its own (the outermost session) the heap is frozen when the
    test runs, more of it after the shared runner's warmup (which runs with the collector off), and at session end."""
    neuron_project.makeconftest(neuron_project.path.joinpath("conftest.py").read_text() + textwrap.dedent("""
        import gc

        def pytest_unconfigure(config):
            print(f"FROZEN AT END {gc.get_freeze_count()}")
    """))
    neuron_project.makepyfile(test_frozen="""
        import gc

        def test_warm(neuron_runner):
            print(f"FROZEN IN TEST {gc.get_freeze_count()}")

        def test_warmup_pauses_the_collector(request, neuron_runner):
            real = neuron_runner.warmup
            seen = []
            neuron_runner.warmup = lambda *a, **k: seen.append((gc.isenabled(), gc.get_freeze_count())) or real(*a, **k)
            request.getfixturevalue("neuron_warmup")
            assert [enabled for enabled, _ in seen] == [False] and gc.isenabled()
            # the session's runner: what its warmup left (the traces) is frozen with it
            assert gc.get_freeze_count() > seen[0][1]
    """)
    result = neuron_project.runpytest_subprocess("-s", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    in_test = int(next(line for line in result.outlines if "FROZEN IN TEST" in line).split()[-1])
    at_end = int(next(line for line in result.outlines if "FROZEN AT END" in line).split()[-1])
    assert 0 < in_test < at_end
