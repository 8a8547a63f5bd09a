"""Each model ``scripts/main.sh --model`` runs writes into its own default ``--out``: `--model hf-llama` once
wrote into the tiny VLM's folder and replaced its manifest."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_main_sh_model_has_its_own_default_out_folder():
    script = (REPO / "scripts" / "main.sh").read_text()
    modules = dict(re.findall(r"^\s*([a-z0-9-]+)\) module=([\w.]+) ;;$", script, flags=re.M))
    assert set(modules) == {"tiny-vlm", "hf-llama"}
    outs = {model: Path(importlib.import_module(module).parse_args([]).out) for model, module in modules.items()}
    assert len(set(outs.values())) == len(outs), outs
    for model, out in outs.items():  # no default folder holds another's (its manifests/ and cache/ inside)
        assert not any(other != out and (out in other.parents or other in out.parents) for other in outs.values())
        assert model in out.parts


def test_the_main_jobs_report_prints_the_per_graph_table(tmp_path):
    """examples/job.report, what both main jobs print after serving, in process: the per-graph table included
    (a library change that drops a name it uses fails here, in the fast tier, not only in the slow main-job runs)."""
    from types import SimpleNamespace

    from examples.job import report
    from neuron_args.graph_outcome import GraphOutcome
    from neuron_args.seams import records

    records.clear()
    records.record(GraphOutcome(key="ab" * 16, graph_type="decode", input_shapes=["1,1"], optimization_level=3,
                                compile_seconds=1.25, executable_size=2048, serve_hits=7))
    records.record(GraphOutcome(key="cd" * 16, graph_type="prefill", input_shapes=["1,8"], loads=1))
    counts = SimpleNamespace(compiles=1, hits=1, captures=0, misses=0)
    lines: list[str] = []
    try:
        ok = report(lines.append, warm=SimpleNamespace(seconds=2.0, counts=counts),
                    served=SimpleNamespace(calls={"decode": 7}, counts=SimpleNamespace(compiles=0, misses=0, hits=0)),
                    tokens_match=True, tokens=[1, 2], reference="eager", manifest=None, cache_dir=tmp_path)
    finally:
        records.clear()
    rows = [line.split() for line in "\n".join(lines).splitlines()]
    assert ok is True
    assert ["graph", "type", "inputs", "-O", "key", "how", "compile", "size", "loads", "serve", "hit/miss"] in rows
    assert ["decode", "(1,1)", "3", "abababababab", "-", "1.25s", "2.0", "KiB", "0", "7/0"] in rows
    assert ["prefill", "(1,8)", "-", "cdcdcdcdcdcd", "loaded", "-", "-", "1", "0/0"] in rows
