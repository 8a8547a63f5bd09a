"""A BERT classifier and a ViT served through ``NeuronRunner``: batch and sequence buckets, each its own graph and args.

Warmup with ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` exported (the warmup compiles regardless), then serve
under it: every bucket hits, calls of the transformers modules themselves are routed to their bucket,
outputs equal eager (fp32), and a shape outside the buckets fails with the graph type, the key and the fix.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CacheMissError
from neuron_args.flags import optimization_level, with_optimization_level
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner, UndeclaredGraphError
from tests.hf.architectures import _BERT_LIKE, _SMALL_VISION, pixel_values, token_ids
from tests.hf.cells import FP32

pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]

#: the classifier's sequence buckets, each declared as its own graph type so it gets its own level (the policy
#: selects by graph type: the runner passes it no inputs): graph type -> (batch, sequence length, level)
TEXT_BUCKETS = {"classify-s8": (1, 8, 1), "classify-s16": (2, 16, 3)}
#: the image model's batch buckets: one graph type, one graph (and key) per bucket, the same level
IMAGE_BUCKETS = {"b1": 1, "b2": 2}
IMAGE_LEVEL = 2


def text(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {"input_ids": token_ids(batch, length), "attention_mask": torch.ones(batch, length, dtype=torch.long)}


class ServedEncoders(torch.nn.Module):
    """Two entry modules, as transformers builds them: a sequence classifier and an image classifier."""

    def __init__(self) -> None:
        import transformers

        super().__init__()
        torch.manual_seed(0)
        self.classifier = transformers.BertForSequenceClassification(transformers.BertConfig(
            **{**_BERT_LIKE, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}, num_labels=3)).eval()
        self.vision = transformers.ViTForImageClassification(transformers.ViTConfig(
            **_SMALL_VISION, num_labels=5)).eval()

    def neuron_graphs(self) -> list[GraphSpec]:
        graphs = [GraphSpec(graph_type, self.classifier, {f"b{b}s{s}": lambda b=b, s=s: text(b, s)})
                  for graph_type, (b, s, _) in TEXT_BUCKETS.items()]
        return graphs + [GraphSpec("vision", self.vision, {name: (lambda b=b: {"pixel_values": pixel_values(b)})
                                                            for name, b in IMAGE_BUCKETS.items()})]

    def compiler_args_for(self, graph_type: str | None, example_inputs: Any, base: Any) -> list[str]:
        level = TEXT_BUCKETS[graph_type][2] if graph_type in TEXT_BUCKETS else IMAGE_LEVEL
        return with_optimization_level(list(base or []), level)


@pytest.fixture(scope="module")
def served(hf_cache: Path) -> Iterator[dict]:
    torch._dynamo.reset()
    model = ServedEncoders()
    runner = NeuronRunner(model, compiler_args=["--auto-cast=none"], compiler="local", cache_dir=hf_cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ASSERT_CACHE_HIT_ENV, "1")
        report = runner.warmup()
        with torch.inference_mode():  # a serving loop's tensors (the runner warmed up with inference tensors)
            calls = [(g, text(b, s)) for g, (b, s, _) in TEXT_BUCKETS.items()]
            calls += [("vision", {"pixel_values": pixel_values(b, seed=7)}) for b in IMAGE_BUCKETS.values()]
            want = [getattr(model, "vision" if g == "vision" else "classifier")(**kw).logits for g, kw in calls]
            with runner.serve(assert_cache_hit=False) as session:  # the hit assertion comes from the variable
                got = [runner.run(g, kw).logits for g, kw in calls]
                routed = model.classifier(**text(2, 16)).logits  # a direct call of the module: its bucket
        yield {"runner": runner, "model": model, "report": report, "session": session, "got": got, "want": want,
               "routed": routed, "mp": mp}
    torch._dynamo.reset()


def test_every_bucket_is_its_own_graph_with_its_own_level(served):
    levels = {(g.graph_type, g.bucket): optimization_level(g.compiler_args) for g in served["report"].graphs}
    assert levels == {**{(t, f"b{b}s{s}"): lvl for t, (b, s, lvl) in TEXT_BUCKETS.items()},
                      **{("vision", n): IMAGE_LEVEL for n in IMAGE_BUCKETS}}
    assert len({g.key for g in served["report"].graphs}) == 4
    assert all(g.how == "compiled" or g.how == "loaded" for g in served["report"].graphs)


def test_served_under_the_hit_assertion_with_eager_outputs(served):
    for got, want in zip(served["got"], served["want"], strict=True):
        torch.testing.assert_close(got, want, **FP32)
    torch.testing.assert_close(served["routed"], served["want"][1], **FP32)
    session = served["session"]
    assert session.calls == {"classify-s8": 1, "classify-s16": 2, "vision": 2}
    assert (session.counts.compiles, session.counts.misses) == (0, 0)


def test_a_sequence_outside_the_buckets_names_the_graph_the_key_and_the_fix(served):
    runner = served["runner"]
    with runner.serve(assert_cache_hit=False), torch.inference_mode(), pytest.raises(CacheMissError) as caught:
        runner.run("classify-s16", text(1, 12))
    message = str(caught.value)
    assert "graph type 'classify-s16'" in message and "(key " in message and "fix:" in message
    assert ASSERT_CACHE_HIT_ENV in message


def test_a_direct_call_outside_the_buckets_lists_the_declared_ones(served):
    with served["runner"].serve(), torch.inference_mode(), pytest.raises(UndeclaredGraphError) as caught:
        served["model"].vision(pixel_values=pixel_values(3))
    message = str(caught.value)
    assert "pixel_values=[3, 3, 32, 32]" in message and "matches no declared bucket" in message
    assert "vision b1: pixel_values=[1, 3, 32, 32]" in message and "declare its shape as a bucket" in message
