"""``model.generate()`` of a transformers decoder whose forward is compiled through ``neuron_libtorch``.

``cache_implementation="static"``: transformers allocates a ``StaticCache`` and calls the compiled
forward for the prompt and then once per new token. A wrapper opens each call's scope as a
runner does (prompt: ``prefill`` at the base -O1, one token: ``decode`` at -O3), so the two graphs
carry their own arguments. Greedy tokens and every step's logits equal eager ``generate``. The suite
runs Llama in fp32; ``sweep_generation.py`` runs Llama, Qwen2, Mistral, Gemma 2 and GPT-2 in fp32
and fp16 (CPU eager computes fp16 too, so both sides are compared in fp16).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from neuron_args import scoped_compiler_args
from neuron_args.flags import optimization_level, with_optimization_level
from neuron_args.hf import static_cache
from neuron_args.seams import records
from tests.hf.architectures import ARCHITECTURES, token_ids
from tests.hf.cells import BASE_ARGS, FP32, compile_options

pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]

FP16 = {"atol": 1e-2, "rtol": 1e-2}
DTYPES = {"fp32": (torch.float32, FP32), "fp16": (torch.float16, FP16)}
NEW_TOKENS = 6
PROMPT = 6
#: decoders with sliding-window layers: transformers' static sliding layers count filled positions in a Python int
SLIDING = {"mistral", "gemma2"}


def generate(model: torch.nn.Module, cache: Any = None) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy ``generate`` with transformers' static cache, or with ``cache`` when given."""
    how = {"cache_implementation": "static"} if cache is None else {"past_key_values": cache}
    with torch.inference_mode():
        out = model.generate(token_ids(1, PROMPT), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0, return_dict_in_generate=True, output_logits=True, **how)
    return out.sequences[0, -NEW_TOKENS:].tolist(), [step[0] for step in out.logits]


def scoped_per_graph(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled forward inside the scope of the graph a call runs: several tokens prefill, one token decode."""
    def forward(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        graph = "prefill" if ids.shape[1] > 1 else "decode"
        args_ = list(BASE_ARGS) if graph == "prefill" else with_optimization_level(BASE_ARGS, 3)
        with scoped_compiler_args(args_, graph_type=graph):
            return compiled(*args, **kwargs)

    return forward


def check_generate(name: str, dtype: str, hf_cache: Path, cache: str = "transformers") -> None:
    """Compiled ``generate`` equals eager's (transformers' static cache), with ``cache``: ``"transformers"`` (its
    static cache) or ``"neuron"`` (``neuron_args.hf.static_cache``: full-length layers, whose length is a tensor).

    With transformers' cache a sliding-window model's every decode step is a graph of its own (the
    filled length is a Python int in the graph); the project's cache keeps one decode graph.
    """
    torch_dtype, tolerance = DTYPES[dtype]
    model = ARCHITECTURES[name].build().to(torch_dtype)
    want_tokens, want_logits = generate(model)
    torch._dynamo.reset()
    model.forward = scoped_per_graph(torch.compile(model.forward, backend="neuron_libtorch",
                                                   options=compile_options(hf_cache), dynamic=False, fullgraph=True))
    before = {r.key: r.compiles + r.loads for r in records.records()}
    tokens, logits = generate(model, static_cache(model, PROMPT + NEW_TOKENS) if cache == "neuron" else None)
    assert tokens == want_tokens
    for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
        torch.testing.assert_close(got, want, **tolerance, msg=lambda m, step=step: f"step {step}: {m}")
    graphs = [r for r in records.records() if r.compiles + r.loads > before.get(r.key, 0)]
    decodes = NEW_TOKENS - 1 if cache == "transformers" and name in SLIDING else 1
    assert sorted((r.graph_type, optimization_level(r.compiler_args)) for r in graphs) == [("decode", 3)] * decodes + [
        ("prefill", 1)]
    torch._dynamo.reset()


#: the decoders of the sweep (``sweep_generation.py``); the suite runs the first in fp32
GENERATE = ["llama-sdpa", "qwen2", "mistral", "gemma2", "gpt2"]


@pytest.mark.parametrize("dtype", ["fp32"])
@pytest.mark.parametrize("name", GENERATE[:1])
def test_static_cache_generate_of_a_compiled_decoder_gives_eager_tokens(name, dtype, hf_cache):
    check_generate(name, dtype, hf_cache)


def test_a_static_cache_for_a_compiled_model_compiles_nothing(hf_cache):
    """static_cache probes the model with one eager call: on a compiled forward it must not compile a graph."""
    model = ARCHITECTURES["llama-sdpa"].build()
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="neuron_libtorch", options=compile_options(hf_cache),
                                  dynamic=False, fullgraph=True)
    before = [(r.key, r.compiles, r.loads, r.captures) for r in records.records()]
    cache = static_cache(model, 8)
    assert [(r.key, r.compiles, r.loads, r.captures) for r in records.records()] == before
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(1, 2, 8, 16)] * 2
    torch._dynamo.reset()
