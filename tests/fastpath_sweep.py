"""Which transformers architectures the serve fast path replays: run by hand (not collected by the suite).

    .venv/bin/python -m tests.fastpath_sweep [NAME ...]

Each decoder of ``tests/hf/architectures.py`` is served as a :class:`neuron_args.hf.StaticCausalLM`
through ``NeuronRunner`` (prefill 4 tokens, then decode steps), each encoder-decoder of
``tests/hf/generation_models.py`` as a ``StaticSeq2SeqLM``; prints per architecture the calls each graph
type served fast, why a graph was refused, and whether the greedy tokens and last logits equal eager.
"""
from __future__ import annotations

import sys
import tempfile
import time
import warnings

import torch

from neuron_args.graphs import GraphSpec
from neuron_args.hf import StaticCausalLM
from neuron_args.runner import NeuronRunner

BASE = ["--auto-cast=none", "-O1"]
PROMPT = [[5, 17, 42, 8]]
STEPS = 8


class Served(StaticCausalLM):
    def neuron_graphs(self) -> list[GraphSpec]:
        def call(tokens: list[list[int]], start: int) -> dict[str, torch.Tensor]:
            with torch.inference_mode():
                return {"input_ids": torch.tensor(tokens), "start": torch.tensor(start)}

        return [GraphSpec("prefill", self, {"s4": lambda: call(PROMPT, 0)}),
                GraphSpec("decode", self, {"b1": lambda: call([[3]], 4)})]


def greedy(run, steps: int = STEPS) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        out = run("prefill", {"input_ids": torch.tensor(PROMPT), "start": torch.tensor(0)})
        tokens = [int(out[0, -1].argmax())]
        for pos in range(4, 4 + steps):
            out = run("decode", {"input_ids": torch.tensor([[tokens[-1]]]), "start": torch.tensor(pos)})
            tokens.append(int(out[0, -1].argmax()))
    return tokens, out[0, -1]


def report(name: str, runner: NeuronRunner, same: bool, seconds: float) -> None:
    fast = {g: sum(f.calls for f in fs) for g, fs in runner.fast_path.graphs.items()}
    refused = {g: why for (g, _), why in runner.fast_path.refused.items()}
    print(f"{name:14s} fast calls {fast}  eager-equal {same}  {seconds:.1f}s" + (f"  refused {refused}" if refused else ""),
          flush=True)


def decoder(name: str) -> None:
    from tests.hf.architectures import ARCHITECTURES

    arch = ARCHITECTURES[name]
    torch._dynamo.reset()
    start = time.perf_counter()
    lm, reference = Served(arch.build(), max_cache_len=16), Served(arch.build(), max_cache_len=16)
    runner = NeuronRunner(lm, compiler_args=BASE, compiler="local", cache_dir=tempfile.mkdtemp(prefix="fastpath-sweep-"))
    runner.warmup(emit=False)
    tokens, last = greedy(runner.run)
    want, want_last = greedy(lambda g, kw: reference(**kw))
    report(name, runner, tokens == want and torch.allclose(last, want_last, rtol=1e-4, atol=1e-4),
           time.perf_counter() - start)


def seq2seq(name: str) -> None:
    from tests.hf.generation_models import BASE as SEQ2SEQ_BASE
    from tests.hf.generation_models import SEQ2SEQ, ServedSeq2Seq, eager_generate

    spec = SEQ2SEQ[name]
    torch._dynamo.reset()
    start = time.perf_counter()
    lm = ServedSeq2Seq(spec)
    runner = NeuronRunner(lm, compiler_args=SEQ2SEQ_BASE, compiler="local",
                          cache_dir=tempfile.mkdtemp(prefix="fastpath-sweep-"))
    runner.warmup(emit=False)
    with runner.serve(), torch.inference_mode():
        tokens, _ = lm.greedy(runner.run)
    want, _ = eager_generate(lm.model, spec.encoder_inputs())
    report(name, runner, tokens == want, time.perf_counter() - start)


def main(names: list[str]) -> None:
    from tests.hf.architectures import ARCHITECTURES
    from tests.hf.generation_models import SEQ2SEQ

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    decoders = [a.name for a in ARCHITECTURES.values() if a.kind == "decoder" and a.supports_static_cache]
    for name in names or decoders + sorted(SEQ2SEQ):
        try:
            (seq2seq if name in SEQ2SEQ else decoder)(name)
        except Exception as exc:  # one architecture failing does not stop the sweep
            print(f"{name:14s} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
