"""The HF example's ``neuron_model``: a transformers Llama wrapped for the plugin."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the HF example needs transformers (pip install -e '.[hf]')")

from examples.hf_llama.model import HFLlama  # noqa: E402


@pytest.fixture
def neuron_model() -> HFLlama:
    return HFLlama(seed=0)
