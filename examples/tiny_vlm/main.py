"""The main job: the tiny VLM through warmup and serve on the embedded local compiler.

    python -m examples.tiny_vlm.main [--flow in-process|parallel] [--tp 2] [--dp 2] [--out DIR]

Warmup compiles every graph type and bucket (``-O3`` decode and encoder, ``-O2`` jf, base prefill,
from the model's ``compiler_args_for``); serve runs greedy generation with
``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` on and checks the tokens against eager PyTorch; the
per-graph table is printed and the engine's manifest written and validated.
With ``--tp``/``--dp`` it launches the ranks and engines itself (gloo on CPU).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

PROMPTS = [[5, 17, 42, 8, 99, 3], [255] * 4 + [7, 21, 64], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]]
FORCED = {0: [30, 31]}
MAX_NEW_TOKENS = 6
BASE_COMPILER_ARGS = ["--model-type=transformer", "--auto-cast=none"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.tiny_vlm.main", description=__doc__.split("\n\n")[0])
    p.add_argument("--flow", choices=["in-process", "parallel"], default="in-process")
    p.add_argument("--tp", type=int, default=1, choices=[1, 2], help="tensor-parallel ranks per engine")
    p.add_argument("--dp", type=int, default=1, help="data-parallel engines (each its own manifest)")
    p.add_argument("--out", default="neuron-args-run/tiny-vlm",
                   help="where the compile cache and manifests go (each model its own default: one manifest per run)")
    p.add_argument("--target", default="trn2")
    p.add_argument("--compiler", default="local", choices=["auto", "local", "neuronx-cc"])
    p.add_argument("--optimization-level", type=int, default=None, help="explicit caller level (disables the policy)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def image() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.rand(1, 3, 16, 16, generator=g)


def run_engine(args: argparse.Namespace) -> int:
    """One rank of one engine: warmup, manifest, serve with the assert on, compare with eager."""
    from examples.job import report
    from examples.tiny_vlm.generate import dist_gather_logits, generate
    from examples.tiny_vlm.model import TinyVLM
    from neuron_args.launch import worker_info
    from neuron_args.manifest.engine import get_server_prefix
    from neuron_args.runner import NeuronRunner

    torch.set_num_threads(1)
    info = worker_info()
    out = Path(args.out).resolve()
    os.environ.setdefault("VLLM_NEURON_MANIFEST_DIR", str(out / "manifests"))
    if info.distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=info.rank, world_size=info.world_size)
    model = TinyVLM(tp_rank=info.rank, tp_size=info.world_size, seed=0)
    cfg = model.config
    runner = NeuronRunner(
        model, compiler_args=BASE_COMPILER_ARGS, target=args.target, compiler=args.compiler,
        cache_dir=out / "cache", optimization_level=args.optimization_level, local_rank=info.rank,
        tp_group=(list(range(info.world_size)), info.rank),
        manifest_config={"model": "examples.tiny_vlm (random weights, seed 0)", "dtype": torch.float32,
                         "max_num_seqs": cfg.max_batch - 1, "max_model_len": cfg.max_seq,
                         "topology": {"world_size": info.world_size, "tensor_parallel_size": info.world_size,
                                      "data_parallel_size": info.dp, "has_collectives": info.distributed}},
    )
    say = print if info.rank == 0 else (lambda *a, **k: None)
    say(f"[{get_server_prefix()}] warmup ({args.flow}) of {sorted(runner.graphs)} ...", flush=True)
    warm = runner.warmup(flow=args.flow, emit=False)
    if info.distributed:
        dist.barrier()  # every rank's ledger lines are written before local rank 0 emits
    manifest = runner.emit_manifest()
    gather = dist_gather_logits if info.distributed else (lambda t: t)
    with runner.serve() as served, torch.inference_mode():
        tokens = generate(model, PROMPTS, image=image(), max_new_tokens=MAX_NEW_TOKENS, forced=FORCED, run=runner.run,
                          gather_logits=gather)
    expected = generate(TinyVLM(seed=0), PROMPTS, image=image(), max_new_tokens=MAX_NEW_TOKENS, forced=FORCED)
    ok = report(say, warm=warm, served=served, tokens_match=tokens == expected, tokens=tokens,
                reference="eager PyTorch", manifest=manifest, cache_dir=out / "cache")
    if info.distributed:
        dist.destroy_process_group()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker or (args.tp == 1 and args.dp == 1):
        return run_engine(args)
    from neuron_args.launch import launch

    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    return launch(["-m", "examples.tiny_vlm.main", *passthrough, "--worker"], tp=args.tp, dp=args.dp)


if __name__ == "__main__":
    sys.exit(main())
