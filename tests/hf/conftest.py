"""Fixtures of the Hugging Face model matrix: one compile cache for the session, per-test graph records."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the model matrix needs transformers (pip install -e '.[hf]')")

from neuron_args.cache import ASSERT_CACHE_HIT_ENV  # noqa: E402
from neuron_args.seams import records  # noqa: E402
from tests.hf.cells import compile_options  # noqa: E402


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's compile cache: a graph compiled by one test is loaded by the next that needs it."""
    return tmp_path_factory.mktemp("hf-matrix-cache")


@pytest.fixture
def compiled(hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., torch.nn.Module]:
    """``compiled(model, backend=...)``: torch.compile on a neuron seam, fullgraph, static shapes."""
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()
    records.clear()

    def compile_(model: torch.nn.Module, backend: str = "neuron_libtorch") -> torch.nn.Module:
        return torch.compile(model, backend=backend, options=compile_options(hf_cache), dynamic=False,
                             fullgraph=True)

    yield compile_
    torch._dynamo.reset()


def graph_keys() -> dict[str, records.GraphRecord]:
    """The graphs (one per key) this test's compiled calls resolved, by key."""
    return {r.key: r for r in records.records()}
