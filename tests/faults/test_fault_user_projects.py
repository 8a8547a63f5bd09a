"""Users' own projects meeting the plugin: their fixtures, pytest's own options, their models' shapes of forward."""
from __future__ import annotations

import pytest


def test_a_project_fixture_named_like_the_plugins_is_named_in_the_error(neuron_project):
    """A project's own `neuron_runner` (its vLLM-style runner, named so before the plugin came) overrides the plugin's,
    and neuron_served failed with "AttributeError: 'MyRunner' object has no attribute 'graphs'" from inside the
    plugin."""
    neuron_project.makepyfile(test_own="""
        import pytest


        class MyRunner:
            pass


        @pytest.fixture
        def neuron_runner():
            return MyRunner()


        def test_mine(neuron_runner):
            assert isinstance(neuron_runner, MyRunner)


        def test_served(neuron_served):
            pass
    """)
    result = neuron_project.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        f"neuron_warmup needs the neuron-args plugin's `neuron_runner` fixture (a NeuronRunner), but this test gets the "
        f"one defined at {neuron_project.path / 'test_own.py'}:8, which returned MyRunner: it overrides the plugin's "
        "of that name. Rename that fixture (the plugin's fixtures are named neuron_*), or return a NeuronRunner from it",
    ])
