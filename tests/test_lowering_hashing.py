"""``torch.hash_tensor`` lowers exactly: its uint64 leaves the HLO as two uint32 words and equals eager bit for bit."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.tensors import TensorSpec, from_lowered_output
from tests.test_lowering_ops import Lowered


def floats() -> torch.Tensor:
    """float32 values whose float64 patterns cover every case: normal, subnormal, signed zeros, inf, NaN."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3)) * 1e3
    x[0, :5] = torch.tensor([1e-40, -1.4e-45, 3e-39, -0.0, 0.0])
    x[1, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan")])
    x[2, :3] = torch.tensor([3.4e38, -1.17549435e-38, 1.0])
    return x


def ints(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    low, high = max(info.min, -2**31), min(info.max, 2**31 - 1)  # int64 values the graph holds (lowered as int32)
    x = torch.randint(low, high, (4, 6), generator=torch.Generator().manual_seed(4), dtype=torch.int64).to(dtype)
    x[0, :3] = torch.tensor([low, high, 0]).to(dtype)
    return x


INPUTS = {
    "float32": floats(),
    "float16": floats().clamp(-6e4, 6e4).half(),  # converted eagerly: the input's own bits are hashed
    "bfloat16": floats().bfloat16(),
    "int32": ints(torch.int32),
    "int64": ints(torch.int64),
    "int8": ints(torch.int8),
    "uint8": ints(torch.uint8),
    "bool": floats() > 0,
}
DIMS = [{}, {"dim": None}, {"dim": ()}, {"dim": 1}, {"dim": -2}, {"dim": (0, 1)}, {"dim": 1, "keepdim": True},
        {"dim": (0, 1), "keepdim": True}]


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.uint64 and got.shape == want.shape
    assert got.view(torch.int64).tolist() == want.view(torch.int64).tolist()


@pytest.mark.parametrize("name", INPUTS)
def test_hash_tensor_equals_eager_bit_for_bit(name):
    """Every dtype family (floats widened to float64, signed ints sign-extended, unsigned and bool zero-extended)
    and every form of ``dim``/``keepdim``: one graph returns all of them."""
    x = INPUTS[name]

    def hashes(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.hash_tensor(x, **kw) for kw in DIMS)

    backend = Lowered()
    with torch.inference_mode():
        got, want = backend(hashes)(x), hashes(x)
    assert len(got) == len(DIMS)
    for g, w in zip(got, want, strict=True):
        assert_bits_equal(g, w)
    assert "u64" not in backend.hlo[0] and "s64" not in backend.hlo[0]  # x64 stays off: the words are 32-bit
    if name == "float32":  # the high words differ from eager's by far more than one element's low bits
        assert {int(h) >> 32 for h in want[3].view(torch.int64)} != {0}


def test_hash_tensor_scalar_and_other_outputs_beside_it():
    """A 0-dim input, and a hash returned with float outputs: only the hash's output is read as words."""
    x = floats()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sum(), torch.hash_tensor(x[1, 1]), x * 2, torch.hash_tensor(x, 0)

    with torch.inference_mode():
        got, want = Lowered()(fn)(x), fn(x)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    torch.testing.assert_close(got[2], want[2], equal_nan=True)
    assert_bits_equal(got[1], want[1])
    assert_bits_equal(got[3], want[3])


def test_a_uint64_output_that_is_not_a_hash_keeps_its_value():
    """Any other uint64 output also leaves the HLO as words (its high word 0: the graph computed it as uint32)."""
    x = ints(torch.int32).clamp(0, 2**31 - 2)
    fn = lambda x: (x + 1).to(torch.uint64)  # noqa: E731
    with torch.inference_mode():
        got, want = Lowered()(fn)(x), fn(x)
    assert_bits_equal(got, want)


def hash_used_in_graph(x: torch.Tensor) -> torch.Tensor:
    return torch.hash_tensor(x) + 1


def hash_of_float64(x: torch.Tensor) -> torch.Tensor:
    return torch.hash_tensor(x.double())


# the fixes are kept off the lines that call the op: the error quotes the user's line
REFUSALS = {hash_used_in_graph: "Return the hash and use it outside the compiled function",
            hash_of_float64: "Hash that tensor outside the compiled function"}


@pytest.mark.parametrize("fn", REFUSALS, ids=["used_in_graph", "float64"])
def test_a_hash_the_graph_cannot_keep_exact_is_refused_with_the_fix(fn):
    backend = Lowered()
    with torch.inference_mode(), pytest.raises(BackendCompilerFailed):
        backend(fn)(floats())
    message = str(backend.errors[0])
    assert "aten.hash_tensor" in message and REFUSALS[fn] in message


def test_word_pairs_are_read_back_as_uint64():
    spec = TensorSpec((2,), "uint64")
    assert spec.lowered_output_shape == (2, 2) and spec.lowered_output_dtype == "uint32"
    words = torch.tensor([[1, 2], [0xFFFFFFFF, 0x80000000]], dtype=torch.uint32)
    assert from_lowered_output(words, spec).view(torch.int64).tolist() == [(2 << 32) | 1, -(2**31) * 2**32 + 2**32 - 1]
    assert TensorSpec((2,), "int64").lowered_output_shape == (2,)


def test_hash_tensor_through_the_seam_and_the_cache(tmp_path, monkeypatch):
    """neuron_libtorch compiles the hash with the local compiler, records its spec, and serves it from the cache."""
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    x = floats()
    fn = lambda x: torch.hash_tensor(x, 1)  # noqa: E731
    options = {"cache_dir": str(tmp_path), "compiler": "local", "target": "trn2"}
    for assert_hit in (False, True):
        torch._dynamo.reset()
        if assert_hit:
            monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
        with torch.inference_mode():
            got = torch.compile(fn, backend="neuron_libtorch", options=options, dynamic=False, fullgraph=True)(x)
        assert_bits_equal(got, fn(x))
    torch._dynamo.reset()
    [entry] = CompileCache(tmp_path).entries()
    assert entry.metadata()["output_specs"] == [{"shape": [4], "dtype": "uint64"}]
