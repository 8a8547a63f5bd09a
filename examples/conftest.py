"""What a model developer adds to use the neuron-args plugin: a ``neuron_model`` fixture.

Session scope: every test shares one model, so the plugin shares one runner and each graph is
traced and warmed up once per session. Under ``--neuron-tp N`` the fixture also runs in each
rank process, after ``torch.distributed`` is initialized, and builds that rank's shard.
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

from examples.tiny_vlm.model import TinyVLM


@pytest.fixture(scope="session")
def neuron_model() -> TinyVLM:
    if dist.is_available() and dist.is_initialized():
        return TinyVLM(tp_rank=dist.get_rank(), tp_size=dist.get_world_size(), seed=0)
    return TinyVLM(seed=0)
