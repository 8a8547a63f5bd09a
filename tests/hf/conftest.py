"""Fixtures of the Hugging Face model matrix: one compile cache for the session, per-test graph records."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the model matrix needs transformers (pip install -e '.[hf]')")

from neuron_args.cache import ASSERT_CACHE_HIT_ENV  # noqa: E402
from neuron_args.graph_outcome import GraphOutcome  # noqa: E402
from neuron_args.seams import records  # noqa: E402
from tests.hf.cells import compile_options  # noqa: E402


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's compile cache: a graph compiled by one test is loaded by the next that needs it."""
    return tmp_path_factory.mktemp("hf-matrix-cache")


def _resolutions() -> dict[str, int]:
    return {r.key: r.compiles + r.loads + r.captures for r in records.records()}


@pytest.fixture
def compiled(hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., torch.nn.Module]:
    """``compiled(model, backend=...)``: torch.compile on a neuron seam, fullgraph, static shapes."""
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()

    def compile_(model: torch.nn.Module, backend: str = "neuron_libtorch") -> torch.nn.Module:
        return torch.compile(model, backend=backend, options=compile_options(hf_cache), dynamic=False,
                             fullgraph=True)

    yield compile_
    torch._dynamo.reset()


@pytest.fixture
def graph_keys() -> Callable[[], dict[str, GraphOutcome]]:
    """``graph_keys()``: the graphs (one per key) this test resolved (compiled, loaded or captured), by key.

    Counted from the process's records, which stay whole (the plugin's session table reads them).
    """
    before = _resolutions()

    def keys() -> dict[str, GraphOutcome]:
        return {r.key: r for r in records.records() if r.compiles + r.loads + r.captures > before.get(r.key, 0)}

    return keys
