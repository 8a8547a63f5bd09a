"""The serve fast path's bytecode reader on the bytecode Dynamo generates here, for the project's models.

``fastpath._read_bytecode`` interprets Dynamo's generated code for a compiled frame opcode by opcode.
A Python or torch that emits an opcode it does not know must fail this file (every cache entry of
every example graph read, every opcode understood), and at serve time the fast path going off for a
graph is a warning, never silent.
"""
from __future__ import annotations

import dis
import logging
import sys
import types

import pytest
import torch

from neuron_args import fastpath
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV
from neuron_args.runner import NeuronRunner
from neuron_args.seams.backends import CAPTURE_SEAM
from tests.test_fastpath import BASE, DecoderModel, Scaled


@pytest.fixture(autouse=True)
def _defaults(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv(fastpath.ENV, raising=False)


def _tiny_vlm() -> torch.nn.Module:
    from examples.tiny_vlm.model import TinyVLM, TinyVLMConfig

    return TinyVLM(TinyVLMConfig(prefill_buckets=(16,), decode_buckets=(4,)), seed=0)


def _tiny_llama() -> torch.nn.Module:
    from tests.test_fastpath_hf import TinyLlama

    return TinyLlama()


def _read_every_entry(runner: NeuronRunner) -> dict[str, int]:
    """Each graph type's number of Dynamo cache entries, every one read by the reader (it raises otherwise)."""
    read: dict[str, int] = {}
    for graph_type in runner.fast_path.graphs:
        forward, _ = fastpath._compiled_frame(runner.spec(graph_type).entry)
        entries = fastpath._cache_entries(forward.__code__)
        for entry in entries:
            replay = fastpath._read_bytecode(entry.code, forward.__globals__)
            assert replay.graph_args, f"{graph_type}: the reader found no graph call"
        read[graph_type] = len(entries)
    return read


@pytest.mark.parametrize("make, graph_types", [
    (DecoderModel, {"prefill", "decode"}),  # a KV cache written by index_put
    pytest.param(_tiny_vlm, {"encoder", "prefill", "decode", "jf"}, marks=pytest.mark.slow),  # variants, one entry
    pytest.param(_tiny_llama, {"prefill", "decode"}, marks=pytest.mark.slow),  # output capturing's global reset
], ids=["decoder", "tiny_vlm", "hf_llama"])
def test_the_reader_understands_every_opcode_dynamo_generates_for_the_example_graphs(make, graph_types,
                                                                                     tmp_path_factory):
    torch._dynamo.reset()
    runner = NeuronRunner(make(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-bytecode"))
    runner.warmup(emit=False)
    assert runner.fast_path.refused == {}, f"Python {sys.version_info[:2]}, torch {torch.__version__}"
    read = _read_every_entry(runner)
    assert set(read) == graph_types and all(n >= 1 for n in read.values())


def test_an_unknown_opcode_is_named_with_the_versions_to_teach_the_reader():
    def computes(x):
        return x + 1  # BINARY_OP: nothing Dynamo's generated code for a replayable frame holds

    with pytest.raises(fastpath.UnknownBytecode) as raised:
        fastpath._read_bytecode(computes.__code__, {})
    assert "BINARY_OP" in str(raised.value) and f"torch {torch.__version__}" in str(raised.value)
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in str(raised.value)
    assert "_read_bytecode" in str(raised.value)


def _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog) -> tuple[NeuronRunner, str]:
    """``Scaled`` warmed on the capture seam (every warning new to this process); the one warning logged."""
    monkeypatch.setattr(ACTIVITY, "said", set())
    torch._dynamo.reset()
    runner = NeuronRunner(Scaled(), compiler_args=BASE, backend=CAPTURE_SEAM,
                          cache_dir=tmp_path_factory.mktemp("fastpath-off"))
    with caplog.at_level(logging.WARNING, logger="neuron_args.fastpath"):
        runner.warmup(emit=False)
    assert runner.fast_path.graphs == {}
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    return runner, warning.getMessage()


def test_a_graph_the_reader_cannot_read_is_served_guarded_and_warned(tmp_path_factory, monkeypatch, caplog):
    """Another Python's opcode (one of Dynamo's instructions renamed): the fast path is off for that graph, loudly."""
    real = dis.get_instructions

    def renamed(code):
        for ins in real(code):
            yield ins._replace(opname="FUTURE_LOAD") if ins.opname.startswith("LOAD_FAST") else ins

    monkeypatch.setattr(fastpath, "dis", types.SimpleNamespace(get_instructions=renamed))  # the reader's only
    runner, warning = _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog)
    ((_, why),) = runner.fast_path.refused.items()
    assert "FUTURE_LOAD" in why
    assert "graph type 'decode'" in warning and "the serve fast path is off" in warning and "FUTURE_LOAD" in warning
    x = torch.ones(2, 8)
    with torch.inference_mode():
        torch.testing.assert_close(runner.run("decode", {"x": x}), Scaled()(x))


def test_learning_that_raises_on_another_torch_is_warned_too(tmp_path_factory, monkeypatch, caplog):
    """The private Dynamo API the fast path reads (its cache entries) gone: served guarded, and said so."""
    def gone(code):
        raise AttributeError("module 'torch._dynamo.eval_frame' has no attribute '_debug_get_cache_entry_list'")

    monkeypatch.setattr(fastpath, "_cache_entries", gone)
    _, warning = _warmed_with_one_warning(tmp_path_factory, monkeypatch, caplog)
    assert "the serve fast path is off" in warning and "_debug_get_cache_entry_list" in warning
