"""A value read with ``.item()`` and used as a value lowers as a traced scalar; a plain torch.compile's errors name no
graph type and no transformers hint."""
from __future__ import annotations

import pytest
import torch

from neuron_args import LoweringError
from neuron_args.cache import ASSERT_CACHE_HIT_ENV


@pytest.fixture
def backend(tmp_path, monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()

    def compile_(fn):
        return torch.compile(fn, backend="neuron_libtorch", dynamic=False, fullgraph=True,
                             options={"cache_dir": str(tmp_path), "compiler": "local", "target": "trn2"})

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        yield compile_


def test_a_value_read_as_a_divisor_lowers_and_matches_eager(backend):
    x = torch.randn(6)
    got = backend(lambda x: x / x.max().item())(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x / x.max().item())


def test_a_value_read_and_returned_is_eager_value(backend):
    x = torch.randn(6)
    got = backend(lambda x: x.max().item())(x)
    assert isinstance(got, float) and got == pytest.approx(x.max().item(), rel=1e-6)


def test_a_value_read_as_a_size_names_the_line_and_no_graph_type_or_transformers(backend):
    with pytest.raises(LoweringError) as err:
        backend(lambda x, n: x[: n.item()] * 2)(torch.randn(6), torch.tensor(3))  # the line: a slice bound
    text = str(err.value)
    assert "test_item_values.py" in text and "x[: n.item()]" in text, text
    assert "graph type None" not in text and "StaticCache" not in text, text
