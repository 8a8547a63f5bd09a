"""Write docs/MODEL_COVERAGE.md from a run of the model matrix (tests/hf) and the layer tests.

    .venv/bin/python scripts/model_coverage.py              # runs pytest on TESTS, then writes the tables
    .venv/bin/python scripts/model_coverage.py --junit F    # from an existing JUnit XML of that run (or several:
                                                            # --junit F --junit G, G's outcomes replacing F's)

Rows are architectures, columns the matrix cells (seam x dtype x cache kind); each cell is the
outcome of its test, so the table says what was run, not what was hoped.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "MODEL_COVERAGE.md"
#: results of ``tests/hf/probe_served.py --out`` (run by hand, in parts): the "served end to end" table
SERVED = REPO / "tests" / "hf" / "served_architectures.json"
SERVED_BEGIN, SERVED_END = "<!-- served end to end: from tests/hf/served_architectures.json -->", "<!-- /served -->"
# every file by path: tests/hf/sweep_generation.py is not collected from its folder (its name), and pytest drops a
# file given next to its folder
TESTS = [*sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests" / "hf").glob("test_*.py")),
         "tests/hf/sweep_generation.py", "tests/test_lowering_layers.py", "tests/test_lowering_linalg.py"]

#: (test function, seam in the parameter id or None) -> column heading: seam · dtype · cache kind
COLUMNS = [
    (("test_forward_without_cache_at_two_shapes", None), "neuron_libtorch · fp32 · no cache, 2 shapes"),
    (("test_static_cache_prefill_then_three_decode_steps", None), "neuron_libtorch · fp32 · StaticCache prefill + 3 decode"),
    (("test_dynamic_cache_forward", None), "neuron_libtorch · fp32 · DynamicCache"),
    (("test_bfloat16_forward", None), "neuron_libtorch · bf16 · no cache"),
    (("test_forward_with_gradients_enabled", None), "neuron_libtorch · fp32 · gradients on"),
    (("test_other_seams", "neuron_native_lite"), "neuron_native_lite · fp32 · no cache"),
    (("test_other_seams", "neuron_libtorch_graph_capture"), "capture + parallel_compile · fp32 · no cache"),
    (("test_fresh_process_hits_under_the_cache_hit_assert", None), "fresh process under the cache-hit assert"),
]
SEAMS = ("neuron_native_lite", "neuron_libtorch_graph_capture")
MARK = {"passed": "pass", "failed": "**FAIL**", "skipped": "skip"}

#: encoder-decoders served through the runner and generating (tests/hf/test_seq2seq_generation.py, the sweep)
SEQ2SEQ_COLUMNS = [
    ("test_tokens_and_logits_equal_transformers_generate", "runner · tokens + logits of 6 greedy steps"),
    ("test_a_second_request_reads_its_own_encoder_states", "runner · a second request"),
    ("test_each_graph_has_its_own_arguments_and_serving_compiles_nothing", "runner · -O1 / -O2 / -O3, serve compiles nothing"),
    ("test_the_manifest_names_each_graph_with_its_level", "manifest names each graph"),
    ("test_a_prefill_of_another_length_is_a_miss_naming_the_graph_and_the_fix", "unknown shape: miss naming graph + fix"),
    ("test_encoder_decoder_warmed_up_in_the_parallel_flow_generates_the_same", "parallel flow warmup, then serve"),
    ("test_generate_of_a_compiled_encoder_decoder_gives_eager_tokens", "compiled `generate()` · static cache"),
    ("test_a_padded_batch_with_its_encoder_mask_generates_like_transformers",
     "batch 2, padded prompt + encoder mask (eager wrapper)"),
]
#: decoders through a compiled ``generate()`` (tests/hf/test_decoder_generate.py, the sweep): (test, dtype) -> heading
GENERATE_COLUMNS = [
    (("test_static_cache_generate_of_a_compiled_decoder_gives_eager_tokens", "fp32"),
     "fp32 · `cache_implementation=\"static\"`"),
    (("test_static_cache_generate_of_a_compiled_decoder_gives_eager_tokens", "fp16"),
     "fp16 · `cache_implementation=\"static\"`"),
    (("test_generate_with_the_neuron_static_cache_keeps_one_decode_graph", "fp32"), "fp32 · `neuron_args.hf.static_cache`"),
    (("test_generate_with_the_neuron_static_cache_keeps_one_decode_graph", "fp16"), "fp16 · `neuron_args.hf.static_cache`"),
]
#: tests/hf/test_served_encoders.py: test function -> what a row says
SERVED_ENCODERS = [
    ("test_every_bucket_is_its_own_graph_with_its_own_level",
     "every bucket its own graph and key; a graph type per bucket that needs its own level (-O1, -O3), two batch "
     "buckets of one type at -O2"),
    ("test_served_under_the_hit_assertion_with_eager_outputs",
     "warmup then serve under `NEURON_LIBTORCH_ASSERT_CACHE_HIT=1`: no miss, logits equal eager, a direct call of the "
     "transformers module routed to its bucket"),
    ("test_a_sequence_outside_the_buckets_names_the_graph_the_key_and_the_fix",
     "a sequence length outside the buckets: `CacheMissError` naming the graph type, the key, the closest entry and the fix"),
    ("test_a_direct_call_outside_the_buckets_lists_the_declared_ones",
     "a direct call with an undeclared batch: `UndeclaredGraphError` listing the declared buckets and the fix"),
]
#: tests/hf/test_decoder_generate.py: checks of ``neuron_args.hf`` that are no model cell
HF_HELPERS = [
    ("test_a_static_cache_for_a_compiled_model_compiles_nothing",
     "`static_cache` for a model whose forward is compiled already: its probe runs eagerly, no graph compiled"),
]

#: tests/test_lowering_layers.py: test function -> what a row says (``{}``: the parameter id)
LAYERS = [
    ("test_embedding_bag_forward_and_backward_match_eager", "`nn.EmbeddingBag` {} · forward + backward"),
    ("test_embedding_bag_bfloat16_rounds_like_the_kernel", "`nn.EmbeddingBag` bf16 sum / mean / max · bit-exact"),
    ("test_embedding_bag_scale_grad_by_freq_divides_by_each_index_count",
     "`nn.EmbeddingBag` `scale_grad_by_freq` · backward (as `nn.Embedding`'s)"),
    ("test_recurrent_layer_forward_matches_eager", "recurrent {} · forward"),
    ("test_recurrent_layer_gradients_match_eager", "recurrent {} (LSTM 2 layers, GRU 1) · forward + backward"),
    ("test_projected_lstm_gradients_match_eager", "recurrent LSTM `proj_size` (2 layers) · forward + backward"),
    ("test_recurrent_layer_bfloat16_is_as_accurate_as_eager",
     "recurrent {} bf16 · forward (eager bf16 within 2e-2; error against fp32 at most eager bf16's + 2^-8 of the size)"),
    ("test_packed_sequences_are_refused_or_left_in_eager",
     "packed sequences: refused by Dynamo (`fullgraph=True`) or left in eager; the LSTM lowering names the fix"),
    ("test_lstm_through_the_seam_traces_under_allow_rnn_and_serves_without_it",
     "`nn.LSTM` through `neuron_libtorch`: traced under `allow_rnn`, served without it"),
    ("test_recurrent_layer_without_allow_rnn_names_the_config", "RNN layer without `allow_rnn`: the error names it"),
    ("test_as_strided_of_a_transposed_tensor_reads_its_memory", "`as_strided` of a transposed tensor (its memory)"),
    ("test_as_strided_outside_its_input_is_refused_with_the_fix", "`as_strided` outside its input: refused, with the fix"),
    ("test_op_group_matches_eager", "ops: {}"),
    ("test_antialiased_resize_and_adaptive_max_pool_gradients_match_eager",
     "antialiased resize + adaptive max pooling · backward"),
    ("test_runtime_checks_of_tensor_values_are_left_out", "`torch._check_tensor_all` in the graph: left out"),
    ("test_linalg_ops_match_eager", "linalg: inv, det, slogdet, logdet, solve (left/right, vector, broadcast), "
     "lu_factor, lu_solve, lu, cholesky (lower/upper), cholesky_solve, cholesky_inverse, matrix_exp, pinv, eigh, "
     "svd, qr, solve_triangular (atol = rtol = 1e-4)"),
    ("test_linalg_gradients_match_eager", "linalg: solve, inv, det, slogdet, logdet, lu_solve, cholesky, "
     "cholesky_solve, pinv, matrix_exp, eigh · backward (atol = rtol = 1e-4)"),
    ("test_singular_inputs_give_eager_info_and_no_error",
     "linalg on singular matrices: `info` of inv_ex, lu_factor_ex, solve_ex, cholesky_ex as eager's; no error raised"),
]

#: what does not lower, or lowers only in part, and why (checked by hand; each fails with a message naming the fix)
LIMITS = [
    "`torch.linalg.inv`, `cholesky`, `solve`, `lu_factor` raise on a singular (not positive-definite) matrix in "
    "eager: that check is a runtime check of tensor values, left out of the executable (see below), so a compiled "
    "call returns inf/nan where eager raises. Their `*_ex` forms return `info` as eager does. The HLO of the "
    "factorizations (LU, Cholesky, QR, eigh, SVD) calls LAPACK kernels (custom calls `lapack_sgetrf_ffi`, "
    "`lapack_spotrf_ffi`...) that XLA:CPU implements: the local compiler runs them; a Neuron target needs its "
    "compiler to provide them.",
    "`torch.linalg.lstsq`: Dynamo refuses it (its `rank` and `singular_values` outputs are data-dependent in size); "
    "use `torch.linalg.pinv(A) @ B` or `torch.linalg.solve(A.mT @ A, A.mT @ B)`.",
    "Packed sequences (`nn.utils.rnn.pack_padded_sequence`): their batch sizes are data, which a static graph cannot "
    "hold; pad the sequences instead (and mask the padded steps). Dynamo decides before the lowering sees the graph: "
    "with `fullgraph=True` it raises its own error (\"Could not guard on data-dependent expression\", not naming "
    "that fix), without it the packed layer runs in eager PyTorch (right values, no Neuron graph). The LSTM "
    "lowering refuses packed batch sizes naming the fix.",
    "`nn.EmbeddingBag(sparse=True)`: Neuron graphs compute dense gradients (refused with the fix). "
    "`scale_grad_by_freq` follows `nn.Embedding`'s documented scaling; torch 2.13's CPU `embedding_bag` kernel "
    "miscounts repeated indices (an index three times in the batch gets 1.5 where `nn.Embedding` gives 1).",
    "`F.rrelu` in training mode (a random slope per element): lowered in eval mode only (refused with the fix).",
    "Op by op: [OP_COVERAGE.md](OP_COVERAGE.md) sweeps torch's OpInfo database through the lowering (619 of 677 "
    "fp32 ops pass); it lists every op that does not, with the cause. Random draws (`exponential_`, `normal_`, "
    "`cauchy_`, dropout) come from the graph's key, drawn from torch's generator per call: repeatable per seed, "
    "not eager's numbers.",
    "`as_strided` over memory its input does not own, or over an input that does not fill one dense block "
    "(refused, naming `.contiguous()` or the owning tensor).",
    "Runtime checks of tensor values (`torch._check_tensor_all`, transformers' input checks such as LLaVA's "
    "image-token count) are left out of the executable, which cannot raise: a call breaking one gives wrong values, "
    "not an error.",
    "LLaVA must run once eagerly before it is compiled: transformers installs its output-capturing hooks on the "
    "first call under a lock Dynamo cannot enter.",
    "Longformer in one graph: its forward reads `is_global_attn` (`.item()`) into a Python `if`, so it runs as "
    "four graphs with that branch in eager (`fullgraph=True` stops at the `.item()`).",
]


#: ``tests/hf/probe_architectures.py`` run by hand (not by this script), outside the suite: one fp32 forward each,
#: every output tensor equal to eager's (atol = rtol = 1e-4). Kind -> the architectures that lower as one graph.
PROBED_ONE_GRAPH = {
    "decoder": "deepseek-v2, olmoe, granite, granitemoe, granitemoehybrid (mamba2 + attention + experts), phimoe, "
               "nemotron, glm, glm4, glm4-moe, helium, recurrent-gemma (RG-LRU), rwkv, mamba2, zamba2, bamba, falcon-h1, "
               "llama4 (text: chunked attention, no-rope layers, experts), lfm2 (short convolutions), lfm2-moe, "
               "smollm3, ernie4.5-moe, minimax (lightning attention), minimax-m2, exaone4, cohere2, mpt, codegen, "
               "biogpt, persimmon, xglm, openai-gpt, diffllama, doge, olmo3, apertus, seed-oss, vaultgemma, bitnet, "
               "flex-olmo, hunyuan-dense, arcee, xlstm",
    "text-encoder": "xlnet, funnel, electra, modernbert, roformer, canine, convbert, yoso, mra, squeezebert, "
                    "megatron-bert, ibert, ernie, rembert, fnet (Fourier mixing), mobilebert, xlm, luke, layoutlm, tapas",
    "speech / audio": "hubert, wavlm, data2vec-audio, sew, unispeech, unispeech-sat, wav2vec2-conformer (relative and "
                      "rotary positions), wav2vec2-bert, ast, moonshine, speecht5 (speech to text, with labels)",
    "vision": "deit, vit-mae (its noise passed in), levit, regnet, efficientnet, mobilenet-v1, mobilenet-v2, swinv2, "
              "poolformer, convnextv2, focalnet, pvt, pvt-v2, hiera, bit, dinov2 with registers, ijepa, vitdet, yolos, "
              "dinov3-vit, dinov3-convnext, aimv2-vision, siglip2-vision (packed patches)",
    "vision-language": "sam (image + point prompts), blip, clip, mllama (cross-attention to image tiles), paligemma",
    "seq2seq": "pegasus, marian, mbart, blenderbot, plbart, umt5, prophetnet",
    "time series / RL": "patchtst, time-series-transformer, informer, decision-transformer",
}
#: probed architectures that lower only with graph breaks: why ``fullgraph=True`` stops (every graph then matches)
PROBED_GRAPH_BREAKS = [
    ("qwen2-vl (m-rope)", "its vision attention splits by `cu_seqlens.tolist()`"),
    ("idefics3", "it drops padding images by boolean-mask indexing (refused in one graph, naming the op and "
                 "`torch.where`)"),
    ("dbrx", "a size read from tensor values in its expert routing (`u0`)"),
    ("big-bird (block sparse)", "`.item()`"),
    ("jetmoe", "`.item()`"),
    ("led", "a data-dependent guard (`Eq(u0, 1)`)"),
    ("ctrl", "Dynamo cannot trace a `python_type()` call"),
    ("xmod", "it picks each sample's language adapter by boolean-mask indexing"),
    ("switch-transformers", "Dynamo stops at an exception raised in its forward (\"Observed exception\")"),
    ("nllb-moe", "a size read from tensor values in its expert routing (`u0`)"),
]
#: probed architectures whose outcome is not a plain pass
PROBED_OTHER = [
    "reformer (LSH attention): its random rotations are drawn inside the graph, from jax's generator keyed from torch's "
    "(as dropout is): repeatable, but not eager's numbers (every other output equal). Under `inference_mode` Dynamo "
    "fails its own guard on a `torch.from_numpy` tensor (\"Guard failed on the same frame it was created\"); probed "
    "under `no_grad` (big-bird too).",
    "nystromformer: Dynamo's fake-tensor run of its forward fails (a broadcast eager does not make), before lowering.",
    "paligemma: transformers' eager SDPA path of its bidirectional Gemma differs from its own eager attention and from "
    "the compiled graph (which equals eager attention); probed with `attn_implementation=\"eager\"`.",
]


def outcomes(junit: Path) -> dict[tuple[str, str | None, str], str]:
    """(test function, seam or None, architecture) -> passed / failed / skipped."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        m = re.fullmatch(r"(\w+)(?:\[(.+)\])?", case.get("name", ""))
        if not m:
            continue
        func, ident = m.group(1), m.group(2) or ""  # "": a test without parameters
        seam = next((s for s in SEAMS if s in ident), None)
        arch = "-".join(p for p in ident.split("-") if p not in SEAMS) if seam is None else \
            ident.replace(seam, "").strip("-")
        if case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        elif case.find("skipped") is not None:
            state = "skipped"
        else:
            state = "passed"
        result[(func, seam, arch)] = state
    return result


def table(results: dict[tuple[str, str | None, str], str]) -> str:
    sys.path.insert(0, str(REPO))
    from tests.hf.architectures import DECODERS, ENCODERS, MORE
    from tests.hf.test_training_steps import MODELS

    head = ["architecture", "kind", *(title for _, title in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arch in DECODERS + ENCODERS:
        cells = [MARK.get(results.get((func, seam, arch.name)), "n/a") for (func, seam), _ in COLUMNS]
        lines.append(f"| {arch.name} | {arch.kind} | " + " | ".join(cells) + " |")
    lines += ["", "Beyond the matrix (`tests/hf/test_more_architectures.py`): one fp32 forward each, lowered and run "
              "on XLA:CPU in-process; some also forward and backward (every parameter's gradient equal to eager's, "
              "atol 1e-4, rtol 1e-3; `—`: forward only).", "",
              "| architecture | kind | fp32 · no cache | fp32 · forward + backward |", "|---|---|---|---|"]
    for arch in MORE:
        state = results.get(("test_forward_matches_eager", None, arch.name))
        backward = results.get(("test_forward_backward_matches_eager", None, arch.name))
        name = f"{arch.name} (graph breaks)" if arch.graph_breaks else arch.name
        lines.append(f"| {name} | {arch.kind} | {MARK.get(state, 'not run')} | {MARK.get(backward, '—')} |")
    lines += ["", "(graph breaks): compiled without `fullgraph=True`; Dynamo splits the forward where it reads a tensor "
              "into Python, and every graph is lowered and run."]
    lines += ["", "Training (`tests/hf/test_training_steps.py`): the model's own loss (labels) in the compiled graph, "
              "its backward graph compiled too, three SGD steps with momentum in eager PyTorch through "
              "`neuron_libtorch`; the parameters after them equal an eager run's (fp32). The labels and token ids "
              "need no gradient, so each backward graph returns `None` for them.", "",
              "| model | fp32 · 3 SGD steps |", "|---|---|"]
    for name in MODELS:
        state = results.get(("test_sgd_steps_match_eager", None, name))
        lines.append(f"| {name} | {MARK.get(state, 'not run')} |")
    dropout = results.get(("test_bert_with_dropout_trains_and_repeats_under_manual_seed", None, ""))
    lines += ["", "BERT with dropout on (0.1, train mode), its masks drawn inside the graph from a key the runtime "
              "takes from torch's generator, compared with itself: the same seed gives the same parameters, "
              f"another seed others, and the loss falls: {MARK.get(dropout, 'not run')}."]
    bf16 = results.get(("test_bfloat16_training_step_is_as_accurate_as_eager", None, ""))
    lines += ["", "A bf16 training step of Llama (one layer, lowered and run on XLA:CPU in-process), measured against the "
              "same step in fp32: every parameter's gradient error at most twice eager bf16's plus one bf16 rounding "
              f"(2^-8) of the gradient's size, the loss within the bf16 tolerance: {MARK.get(bf16, 'not run')}."]
    lines += generation_tables(results)
    lines += ["", served_table()]
    lines += ["", "Layers and ops (`tests/test_lowering_layers.py`, `tests/test_lowering_linalg.py`): compiled on XLA:CPU in-process and compared with "
              "eager (atol = rtol = 1e-5 unless the row says bit-exact; the op groups are four graphs of many ops "
              "each: convolutions and norms, resampling, indexing, math).", "", "| layer or op | result |", "|---|---|"]
    for func, label in LAYERS:
        cases = sorted((arch, state) for (f, _, arch), state in results.items() if f == func)
        for ident, state in cases or [("", None)]:
            lines.append(f"| {label.format(ident)} | {MARK.get(state, 'not run')} |")
    lines += ["", "Probed (`tests/hf/probe_architectures.py`, run by hand, not in the suite): a tiny random config each, "
              "one fp32 forward lowered and run on XLA:CPU in-process, every output tensor equal to eager's "
              "(atol = rtol = 1e-4).", "", "| kind | one graph (`fullgraph=True`) |", "|---|---|"]
    lines += [f"| {kind} | {names} |" for kind, names in PROBED_ONE_GRAPH.items()]
    lines += ["", "With graph breaks (compiled without `fullgraph=True`, every graph lowered and equal to eager): "
              + "; ".join(f"{name}: {why}" for name, why in PROBED_GRAPH_BREAKS) + "."]
    lines += [""] + [f"- {other}" for other in PROBED_OTHER]
    lines += ["", "Known limits:", ""] + [f"- {limit}" for limit in LIMITS]
    return "\n".join(lines)


def generation_tables(results: dict[tuple[str, str | None, str], str]) -> list[str]:
    """Encoder-decoders and decoders generating, and encoders served with buckets: one row per model or check."""
    from tests.hf.generation_models import SEQ2SEQ
    from tests.hf.test_decoder_generate import GENERATE, SLIDING

    lines = ["", "Generation (`tests/hf/test_seq2seq_generation.py`, `tests/hf/test_decoder_generate.py`; the suite runs "
             "Whisper through the runner and Llama's fp32 `generate()`, `tests/hf/sweep_generation.py` every cell). Encoder-"
             "decoders as `neuron_args.hf.StaticSeq2SeqLM`: an `encoder` graph, a decoder `prefill` graph (computes the "
             "cross-attention cache) and a `decode` graph (reads it), one static `EncoderDecoderCache`, served through "
             "`NeuronRunner` with encoder -O1, prefill the base -O2, decode -O3; tokens and every step's logits equal "
             "transformers' greedy `generate` (fp32, atol = rtol = 1e-4).", "",
             "| model | " + " | ".join(title for _, title in SEQ2SEQ_COLUMNS) + " |",
             "|" + "---|" * (len(SEQ2SEQ_COLUMNS) + 1)]
    for name in SEQ2SEQ:
        cells = [MARK.get(results.get((func, None, name)), "n/a" if "padded" in func and name == "whisper" else "not run")
                 for func, _ in SEQ2SEQ_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Decoders: `model.generate()` (greedy, 6 new tokens) with the model's forward compiled through "
              "`neuron_libtorch`, each call in the scope of its graph (prompt: prefill -O1, one token: decode -O3); "
              "tokens equal eager `generate`, logits within fp32 1e-4 / fp16 1e-2 (CPU eager computes fp16, so both "
              "sides run it). transformers' own static sliding-window layers (Mistral, Gemma 2) count filled positions "
              "in a Python int: every decode step is a graph of its own (tokens still equal); passing "
              "`past_key_values=neuron_args.hf.static_cache(model, n)` keeps one decode graph (`n/a`: no sliding "
              "layers).", "", "| model | " + " | ".join(title for _, title in GENERATE_COLUMNS) + " |",
              "|" + "---|" * (len(GENERATE_COLUMNS) + 1)]
    for name in GENERATE:
        cells = [MARK.get(results.get((func, None, f"{name}-{dtype}")),
                          "n/a" if "neuron" in func and name not in SLIDING else "not run")
                 for (func, dtype), _ in GENERATE_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Encoders served with buckets (`tests/hf/test_served_encoders.py`): a BERT sequence classifier "
              "(buckets batch 1 x 8 and batch 2 x 16 tokens) and a ViT image classifier (batch 1 and 2) through "
              "`NeuronRunner` (fp32, atol = rtol = 1e-4). The policy selects by graph type (the runner passes it no "
              "inputs), so a bucket with a level of its own is a graph type of its own.", "",
              "| check | result |", "|---|---|"]
    for func, label in SERVED_ENCODERS + HF_HELPERS:
        lines.append(f"| {label} | {MARK.get(results.get((func, None, '')), 'not run')} |")
    return lines


TINY_MISMATCH = ("not probed", "the generic tiny config is inconsistent for this model (a size it derives from "
                 "others): its own eager forward fails on shapes before any graph")
#: causes triaged by hand where the probe's own words do not say it: name -> (result, cause)
#: RoBERTa-family decoders: transformers' own generate() gives them the positions StaticCausalLM gives
ROBERTA_POSITIONS = ("not ours", "StaticCausalLM passes `position_ids = start + arange(n)`, as transformers' own "
                     "`generate()` does (`_prepare_position_ids_for_generation`: its logits equal these to 5e-8); "
                     "RoBERTa-family learned positions start at `padding_idx + 1` only when the model computes them "
                     "itself, so its no-cache forward differs from its own generate() (0.22 on a tiny RoBERTa)")

SERVED_TRIAGE = {
    **{f"causal:{name}": ROBERTA_POSITIONS for name in (
        "camembert", "data2vec-text", "roberta", "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl", "xmod")},
    "causal:cpmant": ("eager fails", "CPM-Ant adds its own prompt tokens (`prompt_length`) to every input, so the "
                      "positions it writes run past the caller's `start` and the cache: not one position per token"),
    "causal:prophetnet": ("eager fails", "ProphetNet's n-gram self-attention builds masks of the input's length, "
                          "not of a static cache's (`max_cache_len`)"),
    "causal:xlm": ("eager fails", "XLM reads `attention_mask` as the input's padding (asserts one entry per input "
                   "token); StaticCausalLM passes one per cache slot"),
    "causal:blt": ("eager fails", "BLT's own forward fails in transformers before any graph: it builds its "
                   "`DynamicCache(config=...)` from a BltConfig, which has no `num_hidden_layers`"),
    "encoder:levit": ("**FAIL**", "[serve] LeViT fills a Python dict of attention biases (`attention_bias_cache`) on its "
                      "first call in eval mode: the warmup's first graph (batch 1, filling it) is not the graph the same "
                      "bucket serves later (reading it), so serving misses (CacheMissError naming the graph and the key; "
                      "its fix does not name this cause). A user's fix: one eager call before the warmup"),
    **dict.fromkeys(("encoder:layoutlmv3", "encoder:lilt", "encoder:mistral4", "encoder:siglip2"), TINY_MISMATCH),
    "encoder:mobilevitv2": ("not probed", "its stages bring a 32 x 32 image below its 8 x 8 pooling window: its own "
                            "eager forward fails before any graph at the probe's image size"),
    "encoder:t5": ("not ours", "T5ForSequenceClassification reads `config.decoder_start_token_id`, which transformers "
                   "5.24's T5Config no longer has (it moved to the generation config)"),
    "encoder:pp_lcnet": ("not ours", "PPLCNetForImageClassification returns no `logits` (a BaseModelOutputWithNoAttention)"),
    "encoder:imagegpt": ("not probed", "ImageGPT classifies token ids (quantized pixels), not the pixel values the probe "
                         "gives image classifiers"),
    "encoder:shieldgemma2": ("not probed", "ShieldGemma 2 classifies a prompt with an image: it needs token ids too"),
    "seq2seq:fsmt": ("eager fails", "FSMT's decoder, given a cache, attends to every cache slot with no mask (fairseq: "
                     "a growing cache holds only the past), so a static cache's unwritten slots enter its attention: "
                     "eager's own calls change with what the slots held before (1.6e-2 with noise there)"),
    "seq2seq:prophetnet": ("eager fails", "ProphetNet's n-gram self-attention builds masks of the input's length, "
                           "not of a static cache's (`max_cache_len`)"),
}


def served_verdict(record: dict) -> tuple[str, str]:
    """(result, cause) of one probed architecture: pass, refused (a clear error naming the fix), fail (ours), not ours,
    or not probed."""
    cause = re.sub(r"\s+", " ", record.get("cause", "")).replace("|", "/")
    cause = cause.replace(str(REPO) + "/", "").replace(".venv/lib/python3.11/site-packages/", "")
    short = cause if len(cause) <= 180 else cause[:177] + "..."
    stage = record.get("stage", "")
    if record["result"] == "pass":
        return "pass", ""
    if record["result"] == "skip":
        return "not probed", short
    cause = cause.replace("no tiny config: Skip: ", "")
    short = short.replace("no tiny config: Skip: ", "")
    if "StaticCacheError" in cause or "GraphBreakError" in cause or (
            "LoweringError" in cause and ("fix:" in cause or "_local_scalar_dense" in cause
                                          or "NonConcreteBooleanIndexError" in cause)
            and "no lowering exists" not in cause):
        return "refused with the fix", short
    alone = record.get("dynamo_alone")
    if alone and alone != "runs":
        alone = re.sub(r"\s+", " ", alone).replace("|", "/")
        return "not ours", "Dynamo alone (its eager backend, no lowering) fails too: " + (
            alone if len(alone) <= 180 else alone[:177] + "...")
    if stage == "eager":
        return "eager fails", f"the wrapper's calls fail in eager PyTorch (no graph yet): {short}"
    return "**FAIL**", f"[{stage}] {short}"


def served_table(path: Path = SERVED) -> str:
    """The served-end-to-end section from the probe's JSON (``tests/hf/probe_served.py --out``)."""
    results = json.loads(path.read_text()) if path.exists() else {}
    rows = sorted(results.items(), key=lambda item: (["causal", "seq2seq", "encoder"].index(item[0].split(":")[0]),
                                                     item[0]))
    verdicts = [(name, record, *(SERVED_TRIAGE.get(name) if record["result"] != "pass" and name in SERVED_TRIAGE
                                 else served_verdict(record))) for name, record in rows]
    counts: dict[str, dict[str, int]] = {}
    for name, _, result, _ in verdicts:
        kind = counts.setdefault(name.split(":")[0], {})
        kind[result] = kind.get(result, 0) + 1
    summary = "; ".join(f"{kind}: " + ", ".join(f"{n} {r}" for r, n in sorted(c.items(), key=lambda x: -x[1]))
                        for kind, c in counts.items())
    lines = [SERVED_BEGIN, "", "Served end to end (`tests/hf/probe_served.py`, run by hand, not in the suite): every "
             "architecture of transformers' auto mappings (causal LM, seq2seq LM, sequence classification / masked LM, "
             "image classification), a tiny random config each built in code from the config class's defaults (shrunk; "
             "hand-made where the shrink does not fit: `OVERRIDES` in the probe), served as a user serves it: `NeuronRunner` warmup (manifest on), then `runner.serve()` under the cache-hit assert; "
             "causal LMs as `neuron_args.hf.StaticCausalLM` (prefill bucket of 8 at -O1, decode -O3, a prompt and 3 "
             "decode steps), encoder-decoders as `StaticSeq2SeqLM` (encoder, prefill, decode; 4 greedy steps), encoders "
             "with two batch buckets. A pass: every call's logits and the KV cache equal eager PyTorch's same calls "
             "(fp32, atol = rtol = 1e-4), one cache entry per graph, the manifest names each graph, and a fresh process "
             "warms up from the cache with `NEURON_LIBTORCH_ASSERT_CACHE_HIT=1` (no compile) and serves the same. "
             "*not ours*: transformers' eager forward, or Dynamo alone (its `eager` backend, fullgraph, no lowering), "
             "fails the same calls; *refused with the fix*: the user gets an error naming the graph or layer and what "
             "to do; *not probed*: no tiny config here (an extra dependency, a config no tiny one here fits) or no "
             "model served alone (a draft model reading another model's cache).", "", f"Totals: {summary}.", "",
             "| architecture | class | kind | result | cause |", "|---|---|---|---|---|"]
    for name, record, result, cause in verdicts:
        kind, model_type = name.split(":", 1)
        lines.append(f"| {model_type} | {record.get('cls', '')} | {kind} | {result} | {cause} |")
    return "\n".join(lines + ["", SERVED_END])


def write_served_only(path: Path = SERVED) -> int:
    """Replace the served section of the existing document (the other tables keep their last run)."""
    text = OUT.read_text()
    if SERVED_BEGIN in text:
        head, rest = text.split(SERVED_BEGIN, 1)
        text = head + served_table(path) + rest.split(SERVED_END, 1)[1]
    else:
        text = text.replace("\nLayers and ops (", "\n" + served_table(path) + "\n\nLayers and ops (", 1)
    OUT.write_text(text)
    print(f"wrote the served section of {OUT}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", type=Path, action="append", help="JUnit XML of a `pytest` run of TESTS (default: run "
                   "it now); given again, a later file's outcome of a test replaces an earlier one's")
    p.add_argument("--served", type=Path, default=SERVED, help="results of tests/hf/probe_served.py --out")
    p.add_argument("--served-only", action="store_true", help="rewrite only the served-end-to-end section from "
                   "--served (the other tables keep the run they were generated from)")
    args = p.parse_args(argv)
    if args.served_only:
        return write_served_only(args.served)
    junits = args.junit
    if not junits:
        junits = [Path(tempfile.mkdtemp()) / "matrix.xml"]
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *TESTS,
                        f"--junitxml={junits[0]}"], cwd=REPO, check=False)
    results = {}
    for junit in junits:
        results.update(outcomes(junit))
    if not results:
        print(f"no matrix results in {', '.join(map(str, junits))}", file=sys.stderr)
        return 1
    versions = ", ".join(f"{d} {metadata.version(d)}" for d in ("torch", "transformers", "torchax", "jax"))
    OUT.write_text(
        "# Model coverage\n\n"
        "Generated by `scripts/model_coverage.py` from a run of the model matrix (`tests/hf`) and the layer tests "
        "(`tests/test_lowering_layers.py`, `tests/test_lowering_linalg.py`) — do not edit by "
        f"hand. Run of {datetime.now(timezone.utc):%Y-%m-%d} with {versions}.\n\n"
        "Each model is a `transformers` architecture built from a tiny random config. A cell passes when the "
        "compiled graph ran on the embedded local compiler (XLA:CPU) and matched eager PyTorch: fp32 within "
        "atol = rtol = 1e-4, bf16 within atol = rtol = 2e-2; the StaticCache cell also checks the KV cache "
        "and that prefill (base arguments) and decode (`-O3`) made exactly two cache entries. `n/a`: the cell "
        "does not apply (vision encoders have no KV cache).\n\n" + table(results) + "\n")
    print(f"wrote {OUT}")
    return 0 if "failed" not in results.values() else 1


if __name__ == "__main__":
    sys.exit(main())
