"""Training steps of real models: the loss in the compiled graph, backward compiled too, the optimizer eager.

Each model (a decoder with its language-model loss, a text and a vision encoder with a
classification head) takes three SGD steps with momentum through ``neuron_libtorch``; its
parameters after those steps must equal an eager run's. The token ids and labels need no
gradient, so every backward graph returns ``None`` for them; one model also freezes its embeddings.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from tests.hf.architectures import _LLAMA_LIKE, _VISION, VOCAB, pixel_values, token_ids
from tests.hf.cells import BF16, FP32
from tests.xla_run import run_on_xla_cpu

pytestmark = pytest.mark.slow  # the transformers matrix

STEPS = 3
# given, so the first call does not set it (a Python attribute Dynamo guards on: a recompile on the second step)
_SINGLE = "single_label_classification"


def _llama(frozen_embeddings: bool = False) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_LLAMA_LIKE, attn_implementation="sdpa"))
    if frozen_embeddings:
        model.get_input_embeddings().requires_grad_(False)
    ids = token_ids(2, 8)
    return model, {"input_ids": ids, "labels": ids}


def _bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, problem_type=_SINGLE)
    return transformers.BertForSequenceClassification(config), {
        "input_ids": token_ids(2, 8), "attention_mask": torch.ones(2, 8, dtype=torch.long),
        "labels": torch.tensor([0, 2])}


def _vit() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(**_VISION, num_labels=3, attn_implementation="sdpa", problem_type=_SINGLE)
    return transformers.ViTForImageClassification(config), {"pixel_values": pixel_values(2),
                                                            "labels": torch.tensor([0, 2])}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, Any]]]] = {
    "llama-sdpa": _llama,
    "llama-frozen-embeddings": lambda: _llama(frozen_embeddings=True),
    "bert": _bert,
    "vit": _vit,
}


def train(model: torch.nn.Module, call: Callable[..., Any], batch: dict[str, Any]) -> list[float]:
    """``STEPS`` SGD steps (momentum; dropout is 0, so train mode is deterministic); the losses."""
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = call(**batch).loss
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


@pytest.mark.parametrize("name", list(MODELS))
def test_sgd_steps_match_eager(name, compiled, graph_keys):
    model, batch = MODELS[name]()
    eager = copy.deepcopy(model)
    got = train(model, compiled(model), batch)
    want = train(eager, eager, batch)
    torch.testing.assert_close(got, want, **FP32)
    for (param, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, **FP32, msg=lambda m, param=param: f"{param}: {m}")
        assert (p.grad is None) == (q.grad is None), param
    assert len(graph_keys()) == 2  # one forward and one backward graph, each compiled once


def test_bert_with_dropout_trains_and_repeats_under_manual_seed(compiled):
    """Dropout on (BERT's default 0.1, train mode): each step draws new masks in the graph; the same seed
    gives the same parameters, another seed other ones, and the loss goes down."""
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, num_labels=3,
                                     problem_type=_SINGLE)
    assert config.hidden_dropout_prob > 0 and config.attention_probs_dropout_prob > 0
    batch = {"input_ids": token_ids(2, 8), "labels": torch.tensor([0, 2])}
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    initial = copy.deepcopy(model.state_dict())
    step = compiled(model)  # one compiled model: each run starts from the same parameters, copied in place
    runs = []
    for seed in (1, 1, 2):
        model.load_state_dict(initial)
        torch.manual_seed(seed)
        losses = train(model, step, batch)
        runs.append((losses, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (losses, same), (again, twin), (_, other) = runs
    assert losses == again and torch.equal(same, twin) and not torch.equal(same, other)
    assert losses[-1] < losses[0]


def test_bfloat16_training_step_is_as_accurate_as_eager():
    """A bf16 training step (llama, its language-model loss, forward and backward lowered and run on XLA:CPU
    in-process as the local compiler runs them; the seams' training path is the fp32 test's).

    Compiled and eager bf16 round differently (matmul accumulation order, backward ops lowered as the vjp of
    their forward), so neither equals the other elementwise; what the lowering promises is eager's precision.
    Both are measured against the same step in fp32: for every parameter the compiled gradient's largest
    error is at most twice eager's plus one bf16 rounding (2^-8) of the gradient's size. The loss, a forward
    value, is held to the bf16 forward tolerance.
    """
    import transformers

    torch.manual_seed(0)  # one layer: the step's graphs are llama's whole, at half the compile time
    config = transformers.LlamaConfig(**{**_LLAMA_LIKE, "num_hidden_layers": 1}, attn_implementation="sdpa")
    model, ids = transformers.LlamaForCausalLM(config), token_ids(2, 8)
    batch = {"input_ids": ids, "labels": ids}
    reference = copy.deepcopy(model)  # fp32
    model = model.to(torch.bfloat16)
    eager = copy.deepcopy(model)
    losses = []
    torch._dynamo.reset()
    lowered = torch.compile(model, backend=aot_autograd(fw_compiler=run_on_xla_cpu, bw_compiler=run_on_xla_cpu),
                            dynamic=False, fullgraph=True)
    for m, call in ((model, lowered), (eager, eager), (reference, reference)):
        m.train()
        loss = call(**batch).loss
        loss.backward()
        losses.append(loss.detach().float())
    torch.testing.assert_close(losses[0], losses[1], **BF16)
    for (name, p), (_, q), (_, f) in zip(model.named_parameters(), eager.named_parameters(),
                                         reference.named_parameters(), strict=True):
        assert p.grad.dtype == torch.bfloat16, name
        got, want = (p.grad.float() - f.grad).abs().max(), (q.grad.float() - f.grad).abs().max()
        assert got <= 2 * want + 2 ** -8 * f.grad.abs().max(), f"{name}: compiled error {got}, eager error {want}"
