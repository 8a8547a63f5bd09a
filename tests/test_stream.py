"""The streamed parallel flow: each capture compiles as soon as its child reports it, while the others still trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.deferred import ParallelCompileError, parallel_compile
from tests.models import make_mlp, mlp_inputs

REPO = Path(__file__).resolve().parents[1]
BASE = ["--auto-cast=none", "-O1"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()


def capture(root: Path, batches: tuple[int, ...]) -> list[str]:
    """Pending entries of the MLP at each batch size, captured in this process (nothing compiled)."""
    model = torch.compile(make_mlp(), backend="neuron_libtorch_graph_capture", dynamic=False,
                          options={"cache_dir": str(root), "compiler_args": BASE, "target": "trn2", "compiler": "local"})
    for batch in batches:
        model(mlp_inputs(batch=batch)[0])
    entries = CompileCache(root).entries()
    assert sorted(e.status for e in entries) == ["pending"] * len(batches)
    return sorted(e.key for e in entries)


@pytest.mark.slow
def test_streamed_keys_compile_as_they_arrive(tmp_path):
    """The second key is only yielded once the first one's compile has reported: it must start before the rest arrive."""
    first, second = capture(tmp_path, (1, 2))
    built = threading.Event()
    order: list[str] = []

    def keys():
        yield first
        order.append(f"first built before the next key: {built.wait(120)}")
        yield second
        yield first  # a repeat is compiled once

    lines: list[str] = []

    def progress(event):
        order.append(f"built {event.graph.key} ({event.done}/{event.total})")
        lines.append(event.line())
        built.set()

    report = parallel_compile(tmp_path, keys=keys(), progress=progress, workers=2, quiet=True)
    assert order == [f"built {first} (1/1)", "first built before the next key: True", f"built {second} (2/2)"]
    # the first graph finished while keys were still arriving: its line claims no total and no time left
    assert lines[0].startswith(f"[1/1+] - {first[:12]} compiled in ") and lines[0].endswith(", more graphs arriving)")
    assert sorted((g.key, g.status) for g in report.graphs) == [(first, "compiled"), (second, "compiled")]
    assert {e.status for e in CompileCache(tmp_path).entries()} == {"complete"}


@pytest.mark.slow
def test_streamed_compile_reports_failures_and_the_feeders_error_after_the_compiles(tmp_path):
    good, bad = capture(tmp_path, (3, 5))
    CompileCache(tmp_path).entry(bad).hlo_path.write_bytes(b"not an hlo module")
    with pytest.raises(ParallelCompileError) as err:
        parallel_compile(tmp_path, keys=iter([good, bad]), quiet=True)
    assert [(g.key, g.status) for g in err.value.failures] == [(bad, "failed")]
    assert CompileCache(tmp_path).entry(good).status == "complete"

    def broken():
        yield bad
        raise RuntimeError("the key source broke")

    events = []
    with pytest.raises(RuntimeError, match="the key source broke"):
        parallel_compile(tmp_path, keys=broken(), progress=events.append, quiet=True)
    assert [(e.graph.key, e.graph.status) for e in events] == [(bad, "failed")]  # what it fed ran first


def test_cancel_from_another_thread_stops_parallel_trace_and_leaves_no_child(tmp_path):
    """The runner's Ctrl-C path: parallel_trace runs on a thread of its own and is cancelled from the warmup's."""
    import multiprocessing

    from neuron_args.deferred import TraceJob, parallel_trace
    from tests.trace_models import Hanging, fork_server

    cancel, seen = threading.Event(), []

    def before_children():  # the children start right after this: cancel once one is tracing its hanging job
        threading.Timer(1.0, cancel.set).start()

    with pytest.raises(KeyboardInterrupt):
        parallel_trace([TraceJob(Hanging(), {"x": torch.zeros(2)}, None, "hang")] * 2,
                       options={"cache_dir": str(tmp_path), "compiler": "local"}, workers=1, timeout=120,
                       before_children=before_children, cancel=cancel, on_result=lambda i, r: seen.append(i),
                       start_method=fork_server())
    assert seen == []  # no job settled
    assert [p for p in multiprocessing.active_children() if p.name == "neuron-args-trace"] == []  # killed, joined


# A fresh process, so the trace children fork and inherit the patched _run_job: the decode job's child waits
# (bounded) until the runner's progress callback says prefill's compile finished. Without streaming, compiles
# start after every capture, so that wait runs out first and the order below is reversed.
SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    import torch
    import neuron_args.deferred.parallel_trace
    from neuron_args.graphs import GraphSpec
    from neuron_args.runner import NeuronRunner

    trace_module = sys.modules["neuron_args.deferred.parallel_trace"]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8)).eval()
        def neuron_graphs(self):
            return [GraphSpec("prefill", self.mlp, {"b4": lambda: {"input": torch.ones(4, 8)}}),
                    GraphSpec("decode", self.mlp, {"b1": lambda: {"input": torch.ones(1, 8)}})]

    cache, events = Path(sys.argv[1]), Path(sys.argv[2])
    marker = events.with_suffix(".prefill-built")

    def note(what):
        with open(events, "a") as f:  # one append per line, from every process
            f.write(what + "\\n")

    real = trace_module._run_job

    def run_job(job, options):
        if job.graph_type == "decode":
            deadline = time.monotonic() + float(sys.argv[3])
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        out = real(job, options)
        note(f"captured {job.graph_type}")
        return out

    trace_module._run_job = run_job

    def progress(event):
        note(f"built {event.graph.graph_type}")
        if event.graph.graph_type == "prefill":
            marker.touch()

    runner = NeuronRunner(Model(), compiler_args=["--auto-cast=none", "-O1"], compiler="local", cache_dir=cache)
    report = runner.warmup(flow="parallel", progress=progress, emit=False)
    with torch.inference_mode():
        x4, x1 = torch.randn(4, 8), torch.randn(1, 8)
    with runner.serve() as served:  # asserting a hit
        outs = [runner.run("prefill", {"input": x4}), runner.run("decode", {"input": x1})]
    with torch.inference_mode():
        eager = [runner.model.mlp(x4), runner.model.mlp(x1)]
    print(json.dumps({
        "traced": [[t.graph_type, t.status] for t in report.traced],
        "counts": [report.counts.hits, report.counts.misses, report.counts.compiles, report.counts.captures],
        "built": sorted(g.status for g in report.compile_report.graphs),
        "warmed": sorted((w.graph_type, w.how) for ws in runner.warmed.values() for w in ws),
        "served": [served.counts.misses, served.counts.compiles],
        "equal": [bool(torch.allclose(o, e, rtol=1e-5, atol=1e-5)) for o, e in zip(outs, eager)],
    }))
''')


@pytest.mark.slow
def test_a_cold_parallel_warmup_compiles_a_capture_while_the_other_child_still_traces(tmp_path):
    script, events = tmp_path / "stream.py", tmp_path / "events.txt"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "VLLM_NEURON"))}
    env.update(PYTHONPATH=str(REPO), NEURON_ARGS_TRACE_WORKERS="2")
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), str(events), "120"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = events.read_text().splitlines()
    # prefill's compile finished (and was reported here) before the decode child finished its capture
    assert lines == ["captured prefill", "built prefill", "captured decode", "built decode"], lines
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["traced"] == [["prefill", "captured"], ["decode", "captured"]]
    assert out["counts"] == [0, 2, 2, 2] and out["built"] == ["compiled", "compiled"]
    assert out["warmed"] == [["decode", "compiled"], ["prefill", "compiled"]]
    assert out["served"] == [0, 0] and out["equal"] == [True, True]
    assert {e.status for e in CompileCache(tmp_path / "cache").entries()} == {"complete"}
