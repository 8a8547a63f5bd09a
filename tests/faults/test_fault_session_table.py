"""The session's table and JSON report say what really happened to each graph when a warmup fails.

A graph whose compile failed is listed as failed (with its key and the compiler's first line), and graphs a
parallel warmup built before a trace failure or a Ctrl-C are listed as compiled by this session, not as loaded.
A graph break is caught however the cache was warmed before.
"""
from __future__ import annotations

import json

import pytest
import torch

from neuron_args.deferred.trace_record import RECORD_NAME
from neuron_args.report import compare
from neuron_args.runner import GraphBreakError, NeuronRunner
from tests.test_plugin_errors import BREAK_CONFTEST

def _report(path) -> dict[str, dict]:
    return {g["key"]: g for g in json.loads(path.read_text())["graphs"]}


@pytest.mark.slow
def test_a_graph_whose_in_process_compile_failed_is_listed_as_failed_with_its_key(neuron_project, fake_env, tmp_path,
                                                                                  monkeypatch):
    """neuronx-cc dies (exit 70) on decode's graph: the test fails with the CompileError, and the summary table and
    the JSON report listed nothing for it (the table only knew graphs that compiled or loaded)."""
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "exit70")
    neuron_project.makepyfile(test_fail="""
        import pytest

        @pytest.mark.graph_type("decode")
        def test_decode(neuron_warmup):
            pass
    """)
    report = tmp_path / "report.json"
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={tmp_path / 'cache'}",
                                      "--neuron-compiler=neuronx-cc", "--neuron-allow-eager-outputs",
                                      f"--neuron-report={report}")
    result.assert_outcomes(errors=1)
    (graph,) = _report(report).values()
    key = graph["key"]
    assert (graph["graph_type"], graph["status"], graph["input_shapes"], graph["compiler_args"]) == (
        "decode", "failed", ["1, 8"], ["-O3"])
    assert graph["error"] == f"neuronx-cc failed for graph type 'decode', key {key}: killed or out of memory (exit status 70)"
    assert json.loads(report.read_text())["totals"]["failed"] == 1
    result.stdout.fnmatch_lines([
        f"decode * (1, 8) * 3 * {key[:12]} * failed *",
        "1 graph: 0 compiled, 0 loaded, 0 captured, 1 failed; *",
        f"failed: decode (1, 8): neuronx-cc failed for graph type 'decode', key {key}: killed or out of memory *",
    ])
    # the nightly comparison calls a graph that stopped building a regression
    built = dict(graph, status="compiled", error=None)
    old = {"graphs": [built]}
    assert compare(old, {"graphs": [graph]}).regression
    assert compare({"graphs": []}, {"graphs": [graph]}).regression  # a new graph that failed is no mere addition
    assert not compare(old, old).regression


HEADER = """
import logging

import pytest
import torch

from neuron_args.flags import with_optimization_level
from neuron_args.graphs import GraphSpec
"""
# decode's second bucket cannot be traced: the trace child captures the other two graphs, which compile
HALF_TRACEABLE = HEADER + """

class HalfTraceable(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(8, width)

    def forward(self, x):
        if x.shape[0] == 3:
            raise ValueError("a bucket of 3 rows is not supported")
        return self.fc(x)

    def neuron_graphs(self):
        return [GraphSpec("prefill", self, {"b4": lambda: {"x": torch.ones(4, 8)}}),
                GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 8)}, "b3": lambda: {"x": torch.ones(3, 8)}})]

    def compiler_args_for(self, graph_type, example_inputs, base):
        return with_optimization_level(base, 3) if graph_type == "decode" else list(base)
"""
# three modules of one pytester session, run in this order on a cold cache (but Broken's two graphs), the parallel
# flow's one trace child kept from each warmup to the next
BREAK_MODULE = BREAK_CONFTEST + """

def test_break(neuron_warmup):
    pass
"""
TRACE_MODULE = HALF_TRACEABLE + """

@pytest.fixture(scope="module")
def neuron_model():
    return HalfTraceable(4)


def test_trace(neuron_warmup):
    pass
"""
# another width, so other keys: Ctrl-C right after its first graph is built (a log handler raises it where the signal
# handler would)
CTRL_C_MODULE = HALF_TRACEABLE + """

class CtrlC(logging.Handler):
    def emit(self, record):
        if " compiled in " in record.getMessage():
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def neuron_model():
    return HalfTraceable(2)


@pytest.fixture(autouse=True)
def ctrl_c_after_the_first_compile():
    logger = logging.getLogger("neuron_args.deferred")
    handler, level = CtrlC(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_interrupted(neuron_warmup):
    pass
"""
namespace: dict = {}
exec(compile(BREAK_CONFTEST, "<Broken>", "exec"), namespace)
Broken = namespace["Broken"]


def _built_broken(cache, record: bool) -> None:
    """Broken's two graphs (its graph break splits it) built by an in-process warmup that allowed the break; the trace
    record lists them unless ``record`` is False (another cache's record, a changed option: a fingerprint missed)."""
    torch._dynamo.reset()
    allowed = NeuronRunner(Broken(), compiler="local", compiler_args="-O1", cache_dir=cache, fullgraph=False)
    assert len(allowed.warmup(emit=False).graphs) == 2
    if not record:
        (cache / RECORD_NAME).unlink()
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_parallel_flow_lists_what_it_built_before_it_failed_and_catches_every_graph_break(neuron_project,
                                                                                              tmp_path, monkeypatch):
    """Three warmups of the parallel flow fail, each its own way.

    - Broken's graph break: its two graphs were built, but the trace record did not list the job, so a trace child
      captured them, nothing needed compiling, and the warmup passed: the fullgraph check never ran.
    - One of HalfTraceable's trace jobs raises: the other two graphs were captured and compiled by this session, yet
      the table said 'loaded' (the warmup's compile report was dropped with the TraceError).
    - Ctrl-C right after Other's first graph was built: the interrupted session's table listed it as 'loaded' too.

    The summary also names the graph types whose warmup failed before they had a key (a trace, a graph break).
    """
    cache = tmp_path / "cache"
    _built_broken(cache, record=False)
    monkeypatch.setenv("NEURON_ARGS_TRACE_WORKERS", "1")  # one trace child, kept from one model's warmup to the next
    neuron_project.makepyfile(test_1_break=BREAK_MODULE, test_2_trace=TRACE_MODULE, test_3_stop=CTRL_C_MODULE)
    report = tmp_path / "report.json"
    result = neuron_project.runpytest("-p", "no:randomly", "--neuron-flow=parallel", f"--neuron-cache-dir={cache}",
                                      f"--neuron-report={report}", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_break _*",
        f"E *.GraphBreakError: graph break in graph type 'decode' at {neuron_project.path / 'test_1_break.py'}:*",
        "*_ ERROR at setup of test_trace _*",
        "E *TraceError: 1 of 3 trace jobs failed:*",
    ])
    graphs = sorted((g["graph_type"], g["input_shapes"], g["compiler_args"], g["status"])
                    for g in _report(report).values())
    assert graphs == [("decode", ["1, 8"], ["-O3"], "compiled"), ("prefill", ["4, 8"], ["-O1"], "compiled"),
                      ("prefill", ["4, 8"], ["-O1"], "compiled")]
    result.stdout.fnmatch_lines([  # and the graph types that failed with no key to list them by
        "3 graphs: 3 compiled, 0 loaded, 0 captured; *3 misses, 3 compiles, 3 captures*",
        "warmup failed: graph type 'decode' in test_1_break.py::test_break: GraphBreakError: graph break in graph type "
        "'decode' at *test_1_break.py:* (in forward): torch._dynamo.graph_break()",
        "warmup failed: graph type 'decode' in test_2_trace.py::test_trace: TraceError: trace of graph type 'decode' "
        "failed: ValueError: a bucket of 3 rows is not supported",
    ])


def test_a_graph_break_of_a_job_the_trace_record_lists_is_the_same_graph_break_error(tmp_path):
    """The record lists Broken's job complete, so it is traced here, not in a child: the break was a TraceError
    wrapping it (another error type for the same fault, depending on what the cache held)."""
    _built_broken(tmp_path, record=True)
    with pytest.raises(GraphBreakError, match=r"graph break in graph type 'decode' at <Broken>:"):
        NeuronRunner(Broken(), compiler="local", compiler_args="-O1", cache_dir=tmp_path).warmup(flow="parallel",
                                                                                                 emit=False)


def test_a_report_the_session_cannot_write_fails_it_after_the_summary(neuron_project, tiny_disk, monkeypatch):
    """--neuron-report and $GITHUB_STEP_SUMMARY on a full disk: pytest ended in a raw OSError traceback from its
    sessionfinish, the graphs table was never printed and the trace children were not closed."""
    from tests.faults.fault_helpers import fill

    fill(tiny_disk)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tiny_disk / "summary.md"))
    neuron_project.makepyfile(test_warm="def test_warm(neuron_warmup):\n    pass\n")
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-report={tiny_disk / 'report.json'}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "2 graphs: 0 compiled, 2 loaded, 0 captured; *",
        f"NOT written (the session fails): --neuron-report {tiny_disk / 'report.json'}: No space left on device; free "
        "space or make the folder writable (or give another path) and rerun",
        f"NOT written (the session fails): $GITHUB_STEP_SUMMARY {tiny_disk / 'summary.md'}: No space left on device; *",
    ])
