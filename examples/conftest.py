"""What a model developer adds to use the neuron-args plugin: a ``neuron_model`` fixture."""
from __future__ import annotations

import pytest

from examples.tiny_vlm.model import TinyVLM


@pytest.fixture
def neuron_model() -> TinyVLM:
    return TinyVLM(seed=0)
