"""The runtime: LoadedExecutable on the synchronous XLA:CPU client, DLPack in and out, aliased inputs.

Executables are built in-process from small jax functions (``xla_cpu.compile_hlo``), so each test
costs milliseconds; specs are written by hand the way the lowering records them (int64 tensors are
lowered as int32: jax x64 is off).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from neuron_args import xla_cpu
from neuron_args.tensors import TensorSpec
from neuron_args.runtime import LoadedExecutable
from tests.python_calls import python_calls
from tests.xla_run import execute


def build(fn, in_specs, out_specs, client=None) -> LoadedExecutable:
    from neuron_args.tensors import numpy_dtype

    args = [jax.ShapeDtypeStruct(s.shape, numpy_dtype(s.lowered_dtype)) for s in in_specs]
    with jax.enable_x64(False):
        proto = jax.jit(fn, keep_unused=True).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    return LoadedExecutable.from_bytes(xla_cpu.compile_hlo(proto), in_specs, out_specs, client=client)


def spec(shape, dtype="float32") -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


@pytest.fixture(scope="module")
def matmul() -> LoadedExecutable:
    """(a [4, 8], b [8, 3]) -> (a @ b, a + 1, the same product again)."""
    def fn(a, b):
        c = a @ b
        return c, a + 1.0, c

    return build(fn, [spec((4, 8)), spec((8, 3))], [spec((4, 3)), spec((4, 8)), spec((4, 3))])


def test_runs_on_the_synchronous_client_and_matches_torch(matmul):
    assert matmul.executable.client is xla_cpu.runtime_client()
    assert xla_cpu.clients_created(), "forking is unsafe once a client exists; parallel_trace reads this"
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    c, a1, c2 = matmul(a, b)
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a1, a + 1)
    torch.testing.assert_close(c2, c)


def test_outputs_are_writable_fresh_tensors_that_share_nothing(matmul):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    first = matmul(a, b)
    ptrs = {t.data_ptr() for t in first}
    assert len(ptrs) == 3 and not ptrs & {a.data_ptr(), b.data_ptr()}
    expected = a @ b
    first[0].add_(100.0)  # torch writes into what it got (aot copy-back, users)
    torch.testing.assert_close(first[2], expected, rtol=1e-5, atol=1e-5)
    second = matmul(a, b)
    torch.testing.assert_close(second[0], expected, rtol=1e-5, atol=1e-5)
    assert not {t.data_ptr() for t in second} & {t.data_ptr() for t in first}


def test_an_aliased_input_updated_in_place_is_seen_by_the_next_call(matmul):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    matmul(a, b)
    with torch.no_grad():
        b.mul_(2.0)  # same tensor, same storage: the remembered buffer aliases it
    torch.testing.assert_close(matmul(a, b)[0], a @ b, rtol=1e-5, atol=1e-5)
    b2 = torch.randn(8, 3)  # another tensor in the same position
    torch.testing.assert_close(matmul(a, b2)[0], a @ b2, rtol=1e-5, atol=1e-5)
    b2.set_(torch.randn(8, 3))  # same tensor object, new storage
    torch.testing.assert_close(matmul(a, b2)[0], a @ b2, rtol=1e-5, atol=1e-5)
    b3 = torch.randn(3, 8)
    b2.set_(b3.untyped_storage(), 0, (8, 3), (1, 8))  # same object, transposed layout
    torch.testing.assert_close(matmul(a, b2)[0], a @ b2, rtol=1e-5, atol=1e-5)
    b4 = torch.randn(8, 3)
    matmul(a, b4)
    b4.as_strided_((8, 3), (1, 8))  # same object, same data pointer, other strides
    torch.testing.assert_close(matmul(a, b4)[0], a @ b4, rtol=1e-5, atol=1e-5)


def test_inputs_passed_again_are_checked_in_bulk_and_every_change_is_seen():
    """Weights and KV caches passed call after call reuse their buffers through one bulk check; an
    in-place write, new storage, another layout or shape of the same tensor object is still seen."""
    def fn(ids, w, kv):
        return ids + 1, kv @ w

    exe = build(fn, [spec((2,), "int64"), spec((8, 3)), spec((4, 8))], [spec((2,), "int64"), spec((4, 3))])
    w, kv = torch.randn(8, 3), torch.randn(4, 8)

    def check(ids: torch.Tensor) -> None:
        out_ids, out = exe(ids, w, kv)
        assert torch.equal(out_ids, ids + 1)
        torch.testing.assert_close(out, kv @ w, rtol=1e-5, atol=1e-5)

    for step in range(3):  # a new token each step, the same weight and cache
        check(torch.tensor([step, step + 1]))
    stable = exe._stable
    assert stable is not None and stable.tensors == (w, kv) and stable.rest == (0,)
    held = list(stable.held)
    kv.add_(1.0)  # the cache written in place: the same buffer sees it
    check(torch.tensor([7, 8]))
    assert exe._stable is stable and stable.held == held
    w.set_(torch.randn(8, 3))  # same object, new storage
    check(torch.tensor([1, 2]))
    check(torch.tensor([1, 2]))
    w.set_(torch.randn(3, 8).untyped_storage(), 0, (8, 3), (1, 8))  # same object, transposed layout
    check(torch.tensor([1, 2]))
    w.data = torch.randn(8, 3)  # same object, another tensor's data
    check(torch.tensor([3, 4]))
    check(torch.tensor([3, 4]))
    kv.resize_(2, 8)  # same object, same memory (shrunk in place), other shape: refused, not read as [4, 8]
    with pytest.raises(TypeError, match=r"input 2 expects float32\[4, 8\], got float32\[2, 8\]"):
        exe(torch.tensor([0, 1]), w, kv)


def test_non_contiguous_offset_and_grad_requiring_inputs(matmul):
    base = torch.randn(9, 8)
    a = base[1:5]  # storage offset
    b = torch.randn(3, 8).t()  # transposed view
    w = torch.randn(8, 3, requires_grad=True)  # a parameter
    torch.testing.assert_close(matmul(a, b)[0], a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(matmul(a, w)[0], a @ w.detach(), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        a_inf = torch.randn(4, 8)
        torch.testing.assert_close(matmul(a_inf, b)[0], a_inf @ b, rtol=1e-5, atol=1e-5)


def test_wrong_dtype_shape_or_arity_is_refused(matmul):
    with pytest.raises(TypeError, match=r"input 1 expects float32\[8, 3\], got int32\[8, 3\]"):
        matmul(torch.randn(4, 8), torch.zeros(8, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"input 0 expects float32\[4, 8\], got float32\[5, 8\]"):
        matmul(torch.randn(5, 8), torch.randn(8, 3))
    with pytest.raises(TypeError, match="takes 2 tensors, got 1"):
        matmul(torch.randn(4, 8))


def test_int64_and_bool_round_trip_through_their_lowered_types():
    def fn(ids, table, mask):
        return ids * 2 + 1, jnp.take(table, ids, axis=0), jnp.logical_not(mask)

    exe = build(fn, [spec((2, 3), "int64"), spec((10, 4)), spec((2, 3), "bool")],
                [spec((2, 3), "int64"), spec((2, 3, 4)), spec((2, 3), "bool")])
    ids = torch.tensor([[0, 1, 9], [3, 4, 5]])
    table = torch.randn(10, 4)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    doubled, rows, inverted = exe(ids, table, mask)
    assert doubled.dtype is torch.int64 and inverted.dtype is torch.bool
    assert torch.equal(doubled, ids * 2 + 1) and torch.equal(inverted, ~mask)
    torch.testing.assert_close(rows, table[ids])
    doubled.add_(1)  # the cast result is a tensor of its own
    assert torch.equal(exe(ids, table, mask)[0], ids * 2 + 1)
    other = torch.tensor([[9, 8, 7], [6, 5, 4]])  # the staged int32 copy follows each call's values
    assert torch.equal(exe(other, table, mask)[0], other * 2 + 1)
    torch.testing.assert_close(exe(ids.t().contiguous().t(), table, mask)[1], table[ids])


def test_threads_sharing_an_executable_keep_their_inputs_apart():
    import threading

    def fn(ids, w):
        return ids * 3, w * 2.0

    exe = build(fn, [spec((64,), "int64"), spec((64,))], [spec((64,), "int64"), spec((64,))])
    results: dict[int, bool] = {}

    def work(k: int) -> None:
        ids, w = torch.full((64,), k), torch.full((64,), float(k))
        results[k] = all(torch.equal(exe(ids, w)[0], ids * 3) and torch.equal(exe(ids, w)[1], w * 2)
                         for _ in range(200))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: True for k in range(6)}


def test_bfloat16_in_and_out():
    def fn(x, w):
        return (x @ w).astype(jnp.bfloat16), x.astype(jnp.float32)

    exe = build(fn, [spec((4, 8), "bfloat16"), spec((8, 2), "bfloat16")],
                [spec((4, 2), "bfloat16"), spec((4, 8), "float32")])
    x, w = torch.randn(4, 8).bfloat16(), torch.randn(8, 2).bfloat16()
    y, xf = exe(x, w)
    assert y.dtype is torch.bfloat16 and xf.dtype is torch.float32
    torch.testing.assert_close(y, x @ w, rtol=2e-2, atol=2e-2)
    assert torch.equal(xf, x.float())
    y.mul_(2)  # writable


def test_async_client_gives_the_same_results(matmul):
    def fn(a, b):
        c = a @ b
        return c, a + 1.0, c

    exe = build(fn, [spec((4, 8)), spec((8, 3))], [spec((4, 3)), spec((4, 8)), spec((4, 3))],
                client=xla_cpu.cpu_client())
    assert exe.executable.client is xla_cpu.cpu_client() is not xla_cpu.runtime_client()
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    for got, want in zip(exe(a, b), matmul(a, b)):
        torch.testing.assert_close(got, want)


def test_numpy_execute_keeps_its_contract(matmul):
    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 3), np.float32)
    c, a1, _ = execute(matmul.executable, [a, b])
    assert isinstance(c, np.ndarray) and np.allclose(c, 8.0) and np.allclose(a1, 2.0)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_outputs_after_the_first_call_come_out_without_jaxs_python(asynchronous):
    """From the second call on, jaxlib's C++ result handlers make the outputs (``disassemble_into_single_device_arrays``
    calls jax's Python once per output array, ~0.6 us each); each call's outputs are still fresh and right, on
    either client."""
    def fn(a, k):
        return a @ a.T, k.at[0].set(a[0, :4])

    exe = build(fn, [spec((4, 8)), spec((2, 4))], [spec((4, 4)), spec((2, 4))],
                client=xla_cpu.cpu_client() if asynchronous else xla_cpu.sync_client())
    a, k = torch.randn(4, 8), torch.zeros(2, 4)
    first = exe(a, k)
    entered: list[str] = []
    for _ in range(3):
        outs = []
        a.copy_(torch.randn(4, 8))  # the same input tensors: their buffers are reused (a new one calls jax's Python)
        entered += [f for f, _ in python_calls(lambda: outs.extend(exe(a, k)))]
        torch.testing.assert_close(outs[0], a @ a.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[1][0], a[0, :4])
        assert not {t.data_ptr() for t in outs} & {t.data_ptr() for t in first}
        first = outs
    jax_files = sorted({f for f in entered if "/jax/" in f})
    assert jax_files == [], jax_files


def test_without_result_handlers_outputs_are_disassembled_and_it_is_said_once(matmul, monkeypatch, caplog):
    """A jaxlib that makes no result handlers (another version): every call disassembles its outputs, right and
    slower, and the process says so once."""
    from jaxlib import _jax

    from neuron_args import runtime

    monkeypatch.setattr(runtime, "_handlers_missing", False)
    monkeypatch.delattr(_jax, "array_result_handler")
    exe = LoadedExecutable(matmul.executable, matmul.input_specs, matmul.output_specs)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with caplog.at_level("WARNING", logger="neuron_args.runtime"):
        for _ in range(3):
            c, a1, c2 = exe(a, b)
            torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a1, a + 1)
    assert exe._handlers is None
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "this jaxlib has no result handler for executable outputs"]
