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


def test_a_node_without_a_stack_trace_is_placed_by_its_nearest_traced_neighbour():
    """aot_autograd's own nodes (a cast it adds around a value read) carry no stack trace: the error names the
    user's line of the node next to it, not none ("Original traceback: None")."""
    from neuron_args.lowering.hlo import lower_fx_graph

    lib = torch.library.Library("neuron_args_keys_test", "FRAGMENT")  # noqa: TOR901 - an op with no lowering
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x.clone(), "CPU")
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    doubled.meta["stack_trace"] = '  File "/src/model.py", line 12, in forward\n    y = x * 2\n'
    opaque = graph.call_function(torch.ops.neuron_args_keys_test.opaque.default, (doubled,))
    graph.output((opaque,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    example = torch.randn(3)
    for node, value in zip(graph.nodes, (example, example * 2, example * 2)):
        node.meta["val"] = value
    with pytest.raises(LoweringError) as err:
        lower_fx_graph(gm, [example])
    text = str(err.value)
    assert 'it comes from "/src/model.py", line 12, in forward: y = x * 2' in text, text
    assert "graph type None" not in text and "of graph type" not in text, text
