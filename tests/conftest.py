"""Shared fixtures of the project's tests: ``pytester``, and a tiny model project for the plugin's tests."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import signal

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start and interrupt (tests/faults, the farm's Ctrl-C test).

    A shell without job control starts a background job (``cmd &`` in a script, ``nohup``) with SIGINT
    ignored, and every process it starts inherits that: their SIGINT would then do nothing. A handled
    SIGINT is reset to the default in each child's exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

# The conftest of every pytester project in tests/test_plugin_*.py: two graph types of a 2-layer MLP,
# one bucket each, and a policy giving decode -O3 (the projects' ini sets the base to -O1).
MODEL_CONFTEST = '''
import pytest
import torch

from neuron_args.flags import with_optimization_level
from neuron_args.graphs import GraphSpec


class TinyTwoGraph(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def neuron_graphs(self):
        return [GraphSpec("prefill", self, {"b4": lambda: {"x": torch.ones(4, 8)}}),
                GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 8)}})]

    def compiler_args_for(self, graph_type, example_inputs, base):
        return with_optimization_level(base, 3) if graph_type == "decode" else list(base)


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions a test starts (pytester) must not append to the CI job's own $GITHUB_STEP_SUMMARY."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(scope="session")
def neuron_model():
    return TinyTwoGraph()
'''

_ENV = ("VLLM_NEURON_MANIFEST_DIR", "NEURON_CC_FLAGS", "NEURON_ARGS_COMPILER", "NEURON_ARGS_TARGET",
        "NEURON_LIBTORCH_ASSERT_CACHE_HIT", "NEURON_LIBTORCH_CACHE_DIR", "TORCH_TRACE")


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A compile cache holding the model's two graphs (base -O1, decode -O3), shared by the plugin tests.

    Built by a warmup and a served call in this process, which also imports everything a warmup
    needs (torch, jax, torchax) here: in-process pytester runs drop the modules they import when
    they end, and jax cannot be imported twice into one process.
    """
    import torch

    import neuron_args.manifest.diff  # noqa: F401  (deepdiff, jsonschema: imported once, here)
    from neuron_args.manifest.schema import schema, validate_manifest
    from neuron_args.runner import NeuronRunner

    assert validate_manifest({}) and schema()

    namespace: dict = {}
    exec(compile(MODEL_CONFTEST, "<plugin test model>", "exec"), namespace)
    path = tmp_path_factory.mktemp("warm-neuron-cache")
    torch._dynamo.reset()
    runner = NeuronRunner(namespace["TinyTwoGraph"](), compiler_args="-O1", target="trn2", compiler="local",
                          cache_dir=path)
    runner.warmup(emit=False)
    with runner.serve():
        runner.run("decode", {"x": torch.ones(1, 8)})
    torch._dynamo.reset()
    keys = {e.metadata()["graph_type"]: e.key for e in runner.cache.entries()}
    assert sorted(keys) == ["decode", "prefill"], keys
    return SimpleNamespace(path=Path(runner.cache_dir), keys=keys)


@pytest.fixture
def neuron_project(pytester: pytest.Pytester, warm_cache: SimpleNamespace,
                   monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester project with the tiny model's ``neuron_model`` fixture and the shared warm cache."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(MODEL_CONFTEST)
    pytester.makeini(
        "[pytest]\naddopts = -p no:cacheprovider\nneuron_compiler = local\nneuron_compiler_args = -O1\n"
        f"neuron_cache_dir = {warm_cache.path}\n")
    pytester.makefile(".json", keys=json.dumps(warm_cache.keys))
    return pytester


@pytest.fixture
def clean_ledger(monkeypatch):
    """The manifest gate off and the ledger's per-process state fresh, for each manifest test."""
    from neuron_args.activity import ACTIVITY, LedgerActivity

    monkeypatch.delenv("VLLM_NEURON_MANIFEST_DIR", raising=False)
    monkeypatch.delenv("NEURON_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(ACTIVITY, "ledger", LedgerActivity())  # this test's own; the process's comes back after
