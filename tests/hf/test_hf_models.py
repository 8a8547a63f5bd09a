"""The model matrix: Hugging Face decoders and vision encoders through the neuron seams, checked against eager.

Every model is a ``transformers`` architecture from a tiny random config (no download). Each cell
compiles on the embedded local compiler (XLA:CPU), runs the executable and compares its outputs
with eager PyTorch. The cache is shared by the session, so a graph is compiled once however many
cells use it; each cell counts the graphs (keys) its own calls resolved.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuron_args import parallel_compile, scoped_compiler_args
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.errors import LoweringError
from neuron_args.flags import optimization_level, with_optimization_level
from neuron_args.hf import static_cache
from neuron_args.seams import records
from tests.hf.architectures import ARCHITECTURES, DECODERS, ENCODERS, token_ids
from tests.hf.cells import BASE_ARGS, BF16, FP32, SIZES, compile_options, first_forward, inputs, output

REPO = Path(__file__).resolve().parents[2]
# transformers 5.24 renames the cache keyword to `cache`; `past_key_values` works until 5.40
pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")]
ALL = [a.name for a in DECODERS + ENCODERS]
DECODER_NAMES = [a.name for a in DECODERS]


def assert_entries_complete(cache_dir: Path, keys) -> None:
    cache = CompileCache(cache_dir)
    assert all(cache.entry(k).is_complete for k in keys), [cache.entry(k).status for k in keys]


@pytest.mark.parametrize("name", ALL)
def test_forward_without_cache_at_two_shapes(name, compiled, hf_cache, graph_keys):
    arch = ARCHITECTURES[name]
    model = arch.build()
    cm = compiled(model)
    with torch.inference_mode():
        for size in SIZES[arch.kind]:
            kwargs = inputs(arch, size)
            torch.testing.assert_close(output(arch, cm(**kwargs)), output(arch, model(**kwargs)), **FP32)
    keys = graph_keys()
    assert len(keys) == 2, [(r.graph_type, r.input_shapes) for r in keys.values()]
    assert_entries_complete(hf_cache, keys)


@pytest.mark.parametrize("name", DECODER_NAMES)
def test_static_cache_prefill_then_three_decode_steps(name, compiled, hf_cache, graph_keys):
    model = ARCHITECTURES[name].build()
    cm = compiled(model)
    cache, eager_cache = (static_cache(model, 32, batch_size=2) for _ in range(2))
    decode_args = with_optimization_level(BASE_ARGS, 3)
    with torch.inference_mode():
        ids = token_ids(2, 8)
        got = cm(ids, past_key_values=cache, use_cache=True).logits
        want = model(ids, past_key_values=eager_cache, use_cache=True).logits
        torch.testing.assert_close(got, want, **FP32)
        for _ in range(3):
            nxt = want[:, -1:].argmax(-1)
            with scoped_compiler_args(decode_args, graph_type="decode"):
                got = cm(nxt, past_key_values=cache, use_cache=True).logits
            want = model(nxt, past_key_values=eager_cache, use_cache=True).logits
            torch.testing.assert_close(got, want, **FP32)
    for layer, eager_layer in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(layer.keys, eager_layer.keys, **FP32)
        torch.testing.assert_close(layer.values, eager_layer.values, **FP32)
    keys = graph_keys()
    levels = sorted((r.graph_type or "prefill", optimization_level(r.compiler_args)) for r in keys.values())
    assert levels == [("decode", 3), ("prefill", 1)], levels
    assert_entries_complete(hf_cache, keys)


@pytest.mark.parametrize("name", DECODER_NAMES)
def test_dynamic_cache_forward(name, compiled, graph_keys):
    from transformers import DynamicCache

    model = ARCHITECTURES[name].build()
    cm = compiled(model)
    with torch.inference_mode():
        ids = token_ids(2, 8)
        got = cm(ids, past_key_values=DynamicCache(config=model.config), use_cache=True)
        want = model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True)
    torch.testing.assert_close(got.logits, want.logits, **FP32)
    for layer, eager_layer in zip(got.past_key_values.layers, want.past_key_values.layers):
        torch.testing.assert_close(layer.keys, eager_layer.keys, **FP32)
        torch.testing.assert_close(layer.values, eager_layer.values, **FP32)
    assert len(graph_keys()) == 1


@pytest.mark.parametrize("name", ALL)
def test_bfloat16_forward(name, compiled, hf_cache, graph_keys):
    arch = ARCHITECTURES[name]
    model = arch.build().to(torch.bfloat16)
    kwargs = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in inputs(arch, SIZES[arch.kind][0]).items()}
    with torch.inference_mode():
        got, want = output(arch, compiled(model)(**kwargs)), output(arch, model(**kwargs))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, **BF16)
    (record,) = graph_keys().values()
    dtypes = {spec["dtype"] for spec in CompileCache(hf_cache).entry(record.key).metadata()["input_specs"]}
    assert "bfloat16" in dtypes


@pytest.mark.parametrize("name", ALL)
def test_forward_with_gradients_enabled(name, compiled):
    """Parameters require grad and no no_grad(): the forward graph also returns what backward saves."""
    arch = ARCHITECTURES[name]
    model = arch.build()
    assert all(p.requires_grad for p in model.parameters())
    kwargs = inputs(arch, SIZES[arch.kind][0])
    got = output(arch, compiled(model)(**kwargs))
    want = output(arch, model(**kwargs))
    assert got.requires_grad
    torch.testing.assert_close(got, want, **FP32)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("seam", ["neuron_native_lite", "neuron_libtorch_graph_capture"])
def test_other_seams(name, seam, compiled, hf_cache, graph_keys):
    """The native seam compiles and runs; the capture seam's pending entry is built by parallel_compile."""
    arch = ARCHITECTURES[name]
    model = arch.build()
    level2 = with_optimization_level(BASE_ARGS, 2)
    with scoped_compiler_args(level2, graph_type=f"{seam}-check"):
        got, want = first_forward(arch, compiled(model, backend=seam), model)
    torch.testing.assert_close(got, want, **FP32)
    (record,) = graph_keys().values()
    if seam == "neuron_native_lite":
        assert_entries_complete(hf_cache, [record.key])
        return
    parallel_compile(hf_cache, workers=1, quiet=True)
    assert_entries_complete(hf_cache, [record.key])
    md = CompileCache(hf_cache).entry(record.key).metadata()
    assert optimization_level(md["compiler_args"]) == 2


@pytest.fixture(scope="module")
def fresh_process(hf_cache) -> dict:
    """Warm each architecture's first forward here, then run it again in one fresh process under the assert."""
    warmed = {}
    for name in ALL:
        arch = ARCHITECTURES[name]
        torch._dynamo.reset()
        before = {r.key: r.compiles + r.loads for r in records.records()}
        model = arch.build()
        cm = torch.compile(model, backend="neuron_libtorch", options=compile_options(hf_cache), dynamic=False,
                           fullgraph=True)
        first_forward(arch, cm, model)
        warmed[name] = sorted(r.key for r in records.records() if r.compiles + r.loads > before.get(r.key, 0))
    torch._dynamo.reset()
    env = {**os.environ, ASSERT_CACHE_HIT_ENV: "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "tests.hf.fresh_process", str(hf_cache), *ALL], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"warmed": warmed, "fresh": json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("name", ALL)
def test_fresh_process_hits_under_the_cache_hit_assert(name, fresh_process):
    fresh = fresh_process["fresh"][name]
    assert "error" not in fresh, fresh.get("error")
    assert fresh["keys"] == fresh_process["warmed"][name]
    assert fresh["compiles"] == 0
    assert fresh["diff"] <= FP32["atol"]


# -- neuron_args.hf: a transformers decoder as one static prefill graph per bucket and one decode graph


@pytest.mark.parametrize("name", ["mistral", "gemma2", "opt"])
def test_static_causal_lm_generates_like_transformers_past_the_sliding_window(name, compiled, graph_keys):
    """Padded prefill then 20 decode steps (past the window of 16): tokens equal generate(), two graphs.

    OPT sizes its position mask from the cache's filled length (a tensor in a static cache) unless it
    is given an attention mask, which StaticCausalLM passes."""
    from neuron_args.hf import StaticCausalLM

    model = ARCHITECTURES[name].build()
    lm = compiled(StaticCausalLM(model, max_cache_len=32))
    prompt = [5, 17, 42, 8, 99]
    with torch.inference_mode():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        ids = torch.zeros(1, 8, dtype=torch.long)
        ids[0, : len(prompt)] = torch.tensor(prompt)
        tokens = [int(lm(ids, torch.tensor(0))[0, len(prompt) - 1].argmax())]
        while len(tokens) < 20:
            start = torch.tensor(len(prompt) + len(tokens) - 1)
            tokens.append(int(lm(torch.tensor([[tokens[-1]]]), start)[0, 0].argmax()))
    assert tokens == want
    assert len(graph_keys()) == 2


def test_static_cache_without_attention_mask_names_the_item_its_line_and_the_fix(compiled):
    """OPT called with a StaticCache and no mask reads the cache length into Python: the error says where and what to do."""
    model = ARCHITECTURES["opt"].build()
    cache = static_cache(model, 32, batch_size=2)
    with pytest.raises(LoweringError) as caught, torch.inference_mode():
        compiled(model)(input_ids=token_ids(2, 8), past_key_values=cache, use_cache=True)
    message = str(caught.value)
    assert "cannot lower op aten._local_scalar_dense.default" in message
    assert re.search(r'modeling_opt\.py", line \d+, in forward: position_attention_mask = torch\.ones', message)
    assert "pass one; neuron_args.hf.StaticCausalLM does" in message and "fix:" in message


def test_static_cache_takes_each_layers_shape_from_the_model():
    """Multi-query Falcon names its KV heads differently from Llama: the cache follows what the model writes."""
    import transformers

    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(transformers.FalconConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True)).eval()
    cache = static_cache(model, 24, batch_size=3)
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(3, 1, 24, 16)] * 2
    assert all(layer.values.dtype == torch.float32 for layer in cache.layers)
