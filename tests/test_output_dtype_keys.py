"""Output specs are a key component: graphs whose HLO is one (64-bit types lowered as 32-bit) but whose outputs torch
expects in other dtypes get their own keys, executables and dtypes, in one process and across processes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.cli import main as cli
from neuron_args.errors import LoweringError
from neuron_args.seams import records

#: pairs of functions that lower to one HLO and return other dtypes: the first is compiled first
SAME_HLO = {
    "double": (lambda x: (x * 2).double(), lambda x: x * 2),
    "argmax_int32": (lambda x: torch.argmax(x).to(torch.int32), lambda x: torch.argmax(x)),
}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()  # no executable loaded earlier in this process


def compiled(fn, root):
    return torch.compile(fn, backend="neuron_libtorch", dynamic=False,
                         options={"cache_dir": str(root), "compiler": "local", "target": "trn2"})


def keys_of(fn, root, x):
    """``fn``'s result compiled into ``root`` and the keys it resolved."""
    records.clear()
    out = compiled(fn, root)(x)
    return out, [r.key for r in records.records()]


@pytest.mark.parametrize("name", list(SAME_HLO))
@pytest.mark.parametrize("shared", [False, True], ids=["separate-caches", "one-cache"])
def test_graphs_of_one_hlo_and_other_output_dtypes_keep_their_dtypes_in_one_process(name, shared, tmp_path):
    x = torch.randn(4)
    first, second = SAME_HLO[name]
    got_first, (key_first,) = keys_of(first, tmp_path / "a", x)
    got_second, (key_second,) = keys_of(second, tmp_path / ("a" if shared else "b"), x)
    for got, fn in ((got_first, first), (got_second, second)):
        want = fn(x)
        assert got.dtype == want.dtype and torch.allclose(got.to(want.dtype), want)
    assert key_first != key_second


def test_cache_explain_names_the_output_dtype(tmp_path, capsys):
    x = torch.randn(4)
    first, second = SAME_HLO["double"]
    _, (a,) = keys_of(first, tmp_path, x)
    _, (b,) = keys_of(second, tmp_path, x)
    assert cli(["cache", "explain", a, b, "--cache-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["differences"] == ["output_specs: output 0 float64[4] -> float32[4]"]
    assert CompileCache(tmp_path).entry(b).metadata()["key_components"]["output_specs"] == [
        {"shape": [4], "dtype": "float32"}]


_FIRST = """
import sys, torch
torch.compile(lambda x: (x * 2).double(), backend="neuron_libtorch", dynamic=False,
              options={"cache_dir": sys.argv[1], "compiler": "local", "target": "trn2"})(torch.randn(4))
"""


@pytest.mark.slow  # a fresh interpreter builds the first graph
def test_a_cache_shared_across_processes_serves_each_output_dtype_its_own_entry(tmp_path):
    subprocess.run([sys.executable, "-c", _FIRST, str(tmp_path)], check=True, timeout=600)
    (built,) = [e.key for e in CompileCache(tmp_path).entries()]
    x = torch.randn(4)
    got, (key,) = keys_of(lambda x: x * 2, tmp_path, x)  # no "hit" on the float64 graph's entry
    assert got.dtype == torch.float32 and torch.equal(got, x * 2)
    assert key != built and len(list(CompileCache(tmp_path).entries())) == 2


#: ops whose float64 ``dtype=`` variant returned float64 to a float32 call compiled after it in one process
MASKED = {
    "masked.log_softmax": torch.masked.log_softmax,
    "masked.softmin": torch.masked.softmin,
}


@pytest.mark.parametrize("name", list(MASKED))
def test_an_op_compiled_after_its_float64_variant_returns_eager_dtype_and_values(name, tmp_path):
    """As an op sweep runs the corpus (one op after another in one process): the ``with_dtype`` variant first.

    Computing in float64 is refused (a Neuron graph cannot), so the variant leaves no entry; the float32
    call after it compiles its own graph and returns eager's dtype and values."""
    op = MASKED[name]
    x, mask = torch.randn(3, 5), torch.rand(3, 5) > 0.3
    wide, plain = (lambda x, m: op(x, 1, dtype=torch.float64, mask=m)), (lambda x, m: op(x, 1, mask=m))
    torch._dynamo.reset()
    with pytest.raises(LoweringError, match="which a Neuron graph cannot run"):
        compiled(wide, tmp_path)(x, mask)
    torch._dynamo.reset()
    got, want = compiled(plain, tmp_path)(x, mask), plain(x, mask)
    assert got.dtype == want.dtype == torch.float32, name
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
