"""The main job on a Hugging Face model: a transformers Llama through warmup and serve.

    python -m examples.hf_llama.main [--flow in-process|parallel] [--out DIR]

Warmup compiles the prefill buckets (base arguments) and the decode graph (``-O3`` from the
model's ``compiler_args_for``); serve generates greedily with ``NEURON_LIBTORCH_ASSERT_CACHE_HIT``
on and checks the tokens against ``transformers``' own ``generate``; the per-graph table is
printed and the engine's manifest written and validated.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

PROMPTS = [[5, 17, 42, 8, 99, 3], list(range(3, 23)), [7] * 30]
MAX_NEW_TOKENS = 12
BASE_COMPILER_ARGS = ["--model-type=transformer", "--auto-cast=none"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.hf_llama.main", description=__doc__.split("\n\n")[0])
    p.add_argument("--flow", choices=["in-process", "parallel"], default="in-process")
    p.add_argument("--out", default="neuron-args-run/hf-llama",
                   help="where the compile cache and manifests go (each model its own default: one manifest per run)")
    p.add_argument("--target", default="trn2")
    p.add_argument("--compiler", default="local", choices=["auto", "local", "neuronx-cc"])
    p.add_argument("--optimization-level", type=int, default=None, help="explicit caller level (disables the policy)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from examples.hf_llama.generate import generate, reference
    from examples.job import report
    from examples.hf_llama.model import HFLlama
    from neuron_args.manifest.engine import get_server_prefix
    from neuron_args.runner import NeuronRunner

    args = parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out).resolve()
    os.environ.setdefault("VLLM_NEURON_MANIFEST_DIR", str(out / "manifests"))
    model = HFLlama(seed=0)
    runner = NeuronRunner(
        model, compiler_args=BASE_COMPILER_ARGS, target=args.target, compiler=args.compiler,
        cache_dir=out / "cache", optimization_level=args.optimization_level,
        manifest_config={"model": "transformers LlamaForCausalLM (tiny random config, seed 0)",
                         "dtype": torch.float32, "max_num_seqs": 1, "max_model_len": model.max_cache_len,
                         "topology": {"world_size": 1, "tensor_parallel_size": 1, "data_parallel_size": 1,
                                      "has_collectives": False}},
    )
    print(f"[{get_server_prefix()}] warmup ({args.flow}) of {sorted(runner.graphs)} ...", flush=True)
    warm = runner.warmup(flow=args.flow, emit=False)
    manifest = runner.emit_manifest()
    with runner.serve() as served, torch.inference_mode():
        tokens = [generate(model, p, max_new_tokens=MAX_NEW_TOKENS, run=runner.run) for p in PROMPTS]
    expected = [reference(HFLlama(seed=0), p, max_new_tokens=MAX_NEW_TOKENS) for p in PROMPTS]
    ok = report(print, warm=warm, served=served, tokens_match=tokens == expected, tokens=tokens,
                reference="transformers generate()", manifest=manifest, cache_dir=out / "cache")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
