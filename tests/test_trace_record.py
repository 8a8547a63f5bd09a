"""The parallel flow on a warm cache: the trace record lets it skip trace children, never at the cost of a key.

A job whose recorded keys are complete is traced in the runner's own process, asserting a cache
hit; its keys come from that trace. A changed model that keeps its fingerprint still gets its own
key: the in-process trace misses and the job goes to a child, is captured and compiled.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_args.cache import STATS, CompileCache
from neuron_args.deferred import TraceJob
from neuron_args.deferred.trace_record import RECORD_NAME, TraceRecord, fingerprint
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.seams import records
from neuron_args.settings import CompileSettings
from tests.test_runner import _fresh  # noqa: F401  (autouse: a fresh Dynamo, records and STATS per test)

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--auto-cast=none", "-O1"]
# the module (the package exports its function under the same name)
parallel_trace_module = importlib.import_module("neuron_args.deferred.parallel_trace")


class Scaled(torch.nn.Module):
    """One linear layer times ``scale``: a plain attribute, so a changed scale keeps the job's fingerprint."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, input):
        return self.lin(input) * self.scale

    def neuron_graphs(self):
        return [GraphSpec("decode", self, {"b1": lambda: {"input": torch.ones(1, 8)}}),
                GraphSpec("prefill", self, {"b4": lambda: {"input": torch.ones(4, 8)}})]


def runner(cache_dir, scale=1.0, args=ARGS):
    return NeuronRunner(Scaled(scale), compiler_args=args, compiler="local", cache_dir=cache_dir)


def no_children(monkeypatch):
    """Make starting any trace child fail the test (the context is made only when a child is needed)."""
    def refuse(*args):
        raise AssertionError("a trace child was started on a warm cache")

    monkeypatch.setattr(parallel_trace_module, "_context", refuse)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """A parallel warmup on an empty cache (children trace, workers compile), then the keys of an in-process one."""
    torch._dynamo.reset()
    root = tmp_path_factory.mktemp("trace-record")
    report = runner(root).warmup(flow="parallel", emit=False)
    torch._dynamo.reset()
    in_process_root = tmp_path_factory.mktemp("in-process")
    in_process = runner(in_process_root).warmup(emit=False)
    torch._dynamo.reset()
    return root, report, {g.graph_type: g.key for g in in_process.graphs}, in_process_root


@pytest.mark.slow
def test_a_cold_parallel_warmup_traces_in_children_and_records_the_keys(cold):
    root, report, in_process, _ = cold
    assert [t.status for t in report.traced] == ["captured", "captured"]
    assert {g.graph_type: g.key for g in report.graphs} == in_process
    jobs = json.loads((root / RECORD_NAME).read_text())["jobs"]
    assert sorted((j["graph_type"], tuple(j["keys"])) for j in jobs.values()) == sorted(
        (g, (k,)) for g, k in in_process.items())
    assert RECORD_NAME not in {e.key for e in CompileCache(root).entries()}  # a dot file: never an entry


def test_a_warm_parallel_warmup_starts_no_child_and_gives_the_same_keys(cold, monkeypatch):
    root, _, in_process, _ = cold
    no_children(monkeypatch)
    r = runner(root)
    report = r.warmup(flow="parallel", emit=False)
    assert [t.status for t in report.traced] == ["loaded", "loaded"]
    assert {g.graph_type: (g.key, g.how) for g in report.graphs} == {g: (k, "loaded") for g, k in in_process.items()}
    assert (report.counts.hits, report.counts.misses, report.counts.compiles) == (2, 0, 0)
    assert STATS.hits == 2  # counted once: by the load in this process, not again as a deferred hit
    assert sorted((rec.key, rec.loads) for rec in records.records()) == sorted((k, 1) for k in in_process.values())
    with r.serve() as served:  # the warmup's own trace serves: no retrace, no miss
        out = r.run("decode", {"input": torch.ones(1, 8)})
    assert served.counts.misses == 0
    torch.testing.assert_close(out, Scaled().lin(torch.ones(1, 8)), rtol=1e-5, atol=1e-5)


def test_an_in_process_warmup_records_its_keys_so_a_parallel_one_starts_no_child(cold, monkeypatch):
    _, _, in_process, root = cold
    no_children(monkeypatch)
    report = runner(root).warmup(flow="parallel", emit=False)
    assert [t.status for t in report.traced] == ["loaded", "loaded"]
    assert {g.graph_type: g.key for g in report.graphs} == in_process


def test_changed_arguments_are_another_job_and_compile(cold):
    root, _, in_process, _ = cold
    report = runner(root, args=["--auto-cast=none", "-O2"]).warmup(["prefill"], flow="parallel", emit=False)
    assert [t.status for t in report.traced] == ["captured"]
    assert report.graphs[0].key != in_process["prefill"] and report.graphs[0].how == "compiled"


def test_a_changed_model_with_the_same_fingerprint_misses_here_and_compiles_in_the_flow(cold):
    root, _, in_process, _ = cold
    old = fingerprint(TraceJob(Scaled(1.0), {"input": torch.ones(1, 8)}, ARGS, "decode"), CompileSettings())
    assert fingerprint(TraceJob(Scaled(3.0), {"input": torch.ones(1, 8)}, ARGS, "decode"), CompileSettings()) == old
    r = runner(root, scale=3.0)
    report = r.warmup(["decode"], flow="parallel", emit=False)
    assert [t.status for t in report.traced] == ["captured"]  # the in-process trace missed: a child captured it
    (graph,) = report.graphs
    assert graph.key != in_process["decode"] and graph.how == "compiled"
    assert (report.counts.misses, report.counts.compiles, report.counts.hits) == (1, 1, 0)
    assert STATS.misses == 0  # the in-process miss is not counted: the flow's compile is
    with r.serve() as served:
        out = r.run("decode", {"input": torch.ones(1, 8)})
    assert served.counts.misses == 0
    torch.testing.assert_close(out, Scaled().lin(torch.ones(1, 8)) * 3.0, rtol=1e-5, atol=1e-5)


def test_parallel_trace_without_an_in_process_tracer_always_uses_children(cold, monkeypatch):
    root, _, _, _ = cold
    no_children(monkeypatch)
    job = TraceJob(Scaled(), {"input": torch.ones(4, 8)}, ARGS, "prefill")
    with pytest.raises(AssertionError, match="a trace child was started"):
        parallel_trace_module.parallel_trace([job], options={"cache_dir": str(root), "compiler_args": ARGS,
                                                             "compiler": "local"})


def test_the_fingerprint_names_what_the_keys_depend_on():
    job = TraceJob(Scaled(), {"input": torch.ones(1, 8)}, ARGS, "decode")
    fp = fingerprint(job, CompileSettings(compiler_args=tuple(ARGS), runner="a", cache_dir="/x"))
    assert fp == fingerprint(TraceJob(Scaled(), {"input": torch.zeros(1, 8)}, ARGS, "decode"),
                             CompileSettings(compiler_args=tuple(ARGS), runner="b", cache_dir="/y"))  # values, process, folder
    changed = [
        TraceJob(Scaled(), {"input": torch.ones(2, 8)}, ARGS, "decode"),
        TraceJob(Scaled(), {"input": torch.ones(1, 8, dtype=torch.float64)}, ARGS, "decode"),
        TraceJob(Scaled(), {"input": torch.ones(1, 8)}, ["-O3"], "decode"),
        TraceJob(Scaled(), {"input": torch.ones(1, 8)}, ARGS, "prefill"),
        TraceJob(torch.nn.Linear(8, 8), {"input": torch.ones(1, 8)}, ARGS, "decode"),
    ]
    assert fp not in {fingerprint(j, CompileSettings(compiler_args=tuple(ARGS))) for j in changed}
    assert fp != fingerprint(job, CompileSettings(compiler_args=tuple(ARGS), target="inf2"))


def test_a_damaged_record_or_an_incomplete_key_predicts_nothing(tmp_path, caplog):
    record = TraceRecord(tmp_path)
    record.note({"fp": ("decode", ["0" * 32])})
    assert record.read() == {"fp": {"graph_type": "decode", "keys": ["0" * 32]}}
    assert record.complete_keys(["fp"]) == {}  # no complete entry with that key
    (tmp_path / RECORD_NAME).write_text("{not json")
    assert record.read() == {} and "unreadable" in caplog.text


FORK_SERVER = textwrap.dedent("""
    import sys, logging, multiprocessing.forkserver as forkserver, torch
    sys.path.insert(0, sys.argv[3])
    logging.basicConfig(level=logging.WARNING)
    from neuron_args import xla_cpu
    from neuron_args.deferred.parallel_trace import fork_is_safe, parallel_trace
    from tests.models import make_mlp, mlp_inputs
    print("before", fork_is_safe())
    xla_cpu.cpu_client()   # the jax client now exists: forked children would hang
    print("after", fork_is_safe())
    def opts(root):
        return {"cache_dir": root, "compiler_args": ["-O1"], "target": "trn2", "compiler": "local"}
    jobs = [(make_mlp(), {"x": mlp_inputs(batch=b)[0]}, ["-O2"]) for b in (2, 3)]
    r = parallel_trace(jobs, options=opts(sys.argv[1]), timeout=300, in_process=lambda job: [])
    print("safe", fork_is_safe(), "server", forkserver._forkserver._forkserver_pid is not None,
          "status", *[t.status for t in r])
    print("--- plain call ---", file=sys.stderr, flush=True)
    r = parallel_trace(jobs[:1], options=opts(sys.argv[2]), timeout=300)
    print("plain", r[0].status)
""")


@pytest.mark.slow
def test_once_forking_is_unsafe_the_runners_children_start_from_a_fork_server_and_a_plain_call_spawns(tmp_path):
    """One fresh process (each costs an import of torch and jax) for both start methods once jax's client exists:
    a runner's call (an in-process tracer) starts the fork server and never spawns; a plain parallel_trace call
    (no fork server of its own) falls back to spawn and says so (what tests/test_deferred.py checked alone)."""
    runner, plain = tmp_path / "runner", tmp_path / "plain"
    run = subprocess.run([sys.executable, "-c", FORK_SERVER, str(runner), str(plain), str(REPO)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["before", "True", "after", "False", "safe", "False", "server", "True",
                                  "status", "captured", "captured", "plain", "captured"]
    runner_said, plain_said = run.stderr.split("--- plain call ---")
    assert "spawn" not in runner_said
    assert "starting trace children with spawn" in plain_said
    assert sorted(e.status for e in CompileCache(runner).entries()) == ["pending", "pending"]
    assert [e.status for e in CompileCache(plain).entries()] == ["pending"]


@pytest.mark.slow
def test_a_warm_parallel_session_starts_no_child_and_counts_each_graph_once(neuron_project):
    neuron_project.makepyfile(test_warm="""
        def test_warm(neuron_warmup):
            print("traced:", *sorted(t.status for t in neuron_warmup.traced))
    """)
    first = neuron_project.runpytest_subprocess("--neuron-flow=parallel", "-s", "-p", "no:randomly")
    # children, unless an earlier session of this same project recorded the jobs (the warm cache is shared)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["*cache activity: 2 hits, 0 misses, 0 compiles, 0 captures*"])
    again = neuron_project.runpytest_subprocess("--neuron-flow=parallel", "-s", "-p", "no:randomly")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["*traced: loaded loaded", "2 graphs: 0 compiled, 2 loaded, 0 captured; *; "
                                "cache activity: 2 hits, 0 misses, 0 compiles, 0 captures*"])
