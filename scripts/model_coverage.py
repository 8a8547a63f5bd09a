"""Write docs/MODEL_COVERAGE.md from a run of the model matrix (tests/hf).

    .venv/bin/python scripts/model_coverage.py              # runs pytest tests/hf, then writes the table
    .venv/bin/python scripts/model_coverage.py --junit F    # from an existing JUnit XML of that run

Rows are architectures, columns the matrix cells (seam x dtype x cache kind); each cell is the
outcome of its test, so the table says what was run, not what was hoped.
"""
from __future__ import annotations

import argparse
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
        lines.append(f"| {arch.name} | {arch.kind} | {MARK.get(state, 'not run')} | {MARK.get(backward, '—')} |")
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", type=Path, help="JUnit XML of a `pytest tests/hf` run (default: run it now)")
    args = p.parse_args(argv)
    junit = args.junit
    if junit is None:
        junit = Path(tempfile.mkdtemp()) / "matrix.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/hf",
                        f"--junitxml={junit}"], cwd=REPO, check=False)
    results = outcomes(junit)
    if not results:
        print(f"no matrix results in {junit}", file=sys.stderr)
        return 1
    versions = ", ".join(f"{d} {metadata.version(d)}" for d in ("torch", "transformers", "torchax", "jax"))
    OUT.write_text(
        "# Model coverage\n\n"
        "Generated by `scripts/model_coverage.py` from a run of the model matrix (`tests/hf`) — do not edit by "
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
