"""The HF example's ``neuron_model``: a transformers Llama wrapped for the plugin.

Session scope: the tests share one model, so the plugin shares one runner and traces each graph
once per session (a function-scoped model would get a new runner, and new traces, per test).
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the HF example needs transformers (pip install -e '.[hf]')")

from examples.hf_llama.model import HFLlama  # noqa: E402


@pytest.fixture(scope="session")
def neuron_model() -> HFLlama:
    return HFLlama(seed=0)
