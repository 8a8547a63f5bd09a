"""Lowering a transformers Llama prefill graph to HLO, beside the eager forward of the same call.

    python benchmarks/bench_lowering.py [--quick] [--size tiny|small] [--seq 128]

Each phase runs in its own fresh process (``--phase``), so peak memory is that process's RSS
high-water mark (``ru_maxrss``) minus the same figure of a process that only imported and built
the model (``--phase base``):

- ``eager``: ``model(input_ids, use_cache=False)`` under ``torch.inference_mode()`` (median of reps);
- ``lower``: ``lower_fx_graph`` of the aot_autograd forward graph of that call, captured once
  (the first lowering also imports torchax and jax: reported apart as ``first``; the median is
  over the following reps). Its extra peak is split into the capture (Dynamo + aot_autograd,
  RSS high-water mark before lowering) and the lowering on top of it.

Prints the table and ratios (lowering / eager forward, time and extra peak memory). Asserts
nothing: speed and memory are reported, never tested.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure  # noqa: E402

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4),
}


def build(size: str, seq: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, max_position_embeddings=max(seq, 128), attn_implementation="sdpa",
                      **SIZES[size])
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase(name: str, size: str, seq: int, reps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    model, ids = build(size, seq)
    if name == "base":
        return {"rss_mb": maxrss_mb()}
    if name == "eager":
        times = []
        with torch.inference_mode():
            model(ids, use_cache=False)  # first call: lazy inits
            for _ in range(reps):
                t = time.perf_counter()
                model(ids, use_cache=False)
                times.append(time.perf_counter() - t)
        return {"median_s": statistics.median(times), "min_s": min(times), "rss_mb": maxrss_mb()}
    from torch._dynamo.backends.common import aot_autograd

    from neuron_args.lowering.hlo import lower_fx_graph

    captured = []

    def fw(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    with torch.inference_mode():
        torch.compile(model, backend=aot_autograd(fw_compiler=fw), dynamic=False, fullgraph=True)(ids, use_cache=False)
    gm, inputs = captured[0]
    captured_rss = maxrss_mb()
    t = time.perf_counter()
    lowered = lower_fx_graph(gm, inputs)
    first = time.perf_counter() - t
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        lower_fx_graph(gm, inputs)
        times.append(time.perf_counter() - t)
    return {"first_s": first, "median_s": statistics.median(times), "min_s": min(times), "rss_mb": maxrss_mb(),
            "captured_rss_mb": captured_rss,
            "hlo_text_kb": len(lowered.hlo_text) / 1024, "nodes": len(gm.graph.nodes)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--phase", choices=["base", "eager", "lower"])
    args = p.parse_args()
    reps = 3 if args.quick else 10
    if args.phase:
        print(json.dumps(phase(args.phase, args.size, args.seq, reps)))
        return 0
    res = {}
    for name in ("base", "eager", "lower"):
        out = subprocess.run([sys.executable, __file__, "--phase", name, "--size", args.size, "--seq", str(args.seq),
                              *(["--quick"] if args.quick else [])], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1])
        res[name] = json.loads(out.stdout.strip().splitlines()[-1])
    base, eager, lower = res["base"]["rss_mb"], res["eager"], res["lower"]
    print(f"Llama prefill ({args.size}: {SIZES[args.size]}, seq {args.seq}, fp32), one thread; {lower['nodes']} FX "
          f"nodes, canonical HLO text {lower['hlo_text_kb']:.0f} KiB")
    print(f"{'':28}{'median':>10}{'min':>10}{'extra peak RSS':>16}")
    print(f"{'eager forward':28}{eager['median_s'] * 1e3:>8.1f}ms{eager['min_s'] * 1e3:>8.1f}ms"
          f"{eager['rss_mb'] - base:>13.0f} MB")
    print(f"{'lower_fx_graph (warm)':28}{lower['median_s'] * 1e3:>8.1f}ms{lower['min_s'] * 1e3:>8.1f}ms"
          f"{lower['rss_mb'] - base:>13.0f} MB")
    print(f"{'lower_fx_graph (first)':28}{lower['first_s'] * 1e3:>8.1f}ms   (imports torchax + jax)")
    print(f"of the lowering process's extra peak: Dynamo + aot capture {lower['captured_rss_mb'] - base:.0f} MB, "
          f"lowering (jax, torchax, tracing) {lower['rss_mb'] - lower['captured_rss_mb']:.0f} MB")
    time_ratio = lower["median_s"] / eager["median_s"]
    memory_ratio = (lower["rss_mb"] - base) / max(eager["rss_mb"] - base, 1)
    print(f"ratio lowering / eager forward: time {time_ratio:.1f}x, extra peak memory {memory_ratio:.1f}x "
          f"(base process {base:.0f} MB)")
    figure("lower_fx_graph / eager forward, Llama prefill (time)", time_ratio, note=f"{args.size}, seq {args.seq}")
    figure("lower_fx_graph / eager forward, Llama prefill (extra peak RSS)", memory_ratio,
           note=f"{args.size}, seq {args.seq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
