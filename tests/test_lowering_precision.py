"""Float64 honesty: a graph computing in float64 is refused, naming the tensor, its line and the fix.

The graph is lowered with jax x64 off and Neuron devices have no float64 arithmetic, so such a graph
would silently give float32 precision. Moving values through float64 (inputs, outputs, conversions)
is exact and stays allowed.
"""
from __future__ import annotations

import pytest
import torch

from neuron_args import scoped_compiler_args
from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.errors import LoweringError


@pytest.fixture
def compile_fn(tmp_path, monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)

    def compile_fn(fn):
        torch._dynamo.reset()
        options = {"cache_dir": str(tmp_path), "compiler": "local", "target": "trn2"}
        return torch.compile(fn, backend="neuron_libtorch", options=options, dynamic=False, fullgraph=True)

    yield compile_fn
    torch._dynamo.reset()


@pytest.mark.parametrize("fn, node", [
    (lambda x: x.double() * 2, "mul"),
    (lambda x: torch.float_power(x, 2), "pow_1"),  # float_power computes in float64 whatever its input
    (lambda x: x.softmax(-1, dtype=torch.float64), "_softmax"),
    (lambda x: (torch.complex(x, x).to(torch.complex128) * 1j).real.float(), "mul"),
    (lambda x: x * torch.ones(4, dtype=torch.float64), "mul"),  # a float64 constant of the caller's
])
def test_a_float64_computation_is_refused_naming_the_tensor_line_and_fix(compile_fn, fn, node):
    with scoped_compiler_args(None, graph_type="decode"), pytest.raises(LoweringError) as caught:
        compile_fn(fn)(torch.randn(4))
    message = str(caught.value)
    assert f"FX node {node!r}" in message and "of graph type 'decode'" in message
    assert "which a Neuron graph cannot run" in message  # the probe's refused class
    assert "test_lowering_precision.py" in message  # the user's line
    assert "fix: compute in float32 (.float()" in message or "fix: compute in complex64" in message


def test_moving_values_through_float64_is_exact_and_allowed(compile_fn):
    x = torch.randn(3, 4)
    out = compile_fn(lambda x: ((x * 2).double().t(), x.double().float() + 1))(x)
    assert out[0].dtype == torch.float64
    torch.testing.assert_close(out, ((x * 2).double().t(), x + 1))
    # torch computes matrix_rank's tolerance in float64 from a 0-dim constant of its own: no request, not refused
    torch.testing.assert_close(compile_fn(torch.linalg.matrix_rank)(x), torch.linalg.matrix_rank(x))
    wide = x.double() / 3
    got = compile_fn(lambda w: w.float() * 2)(wide)
    torch.testing.assert_close(got, wide.float() * 2)
