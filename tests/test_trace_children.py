"""parallel_trace's long-lived children: at most ``workers`` of them, each tracing job after job.

Each test checks what the children report (which process traced each job, its keys) against
the cache entries they wrote (each job's own resolved arguments), and that a failing job fails
alone: the jobs after it still get traced, in the same child (an exception) or a new one (a
crash, a hang). In this process the children start from a preloaded fork server (see
``tests.trace_models.fork_server``); spawn and fork are tested by name below and in fresh processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_args import TraceError
from neuron_args.activity import ACTIVITY
from neuron_args.cache import CompileCache
from neuron_args.deferred import TraceJob, parallel_trace
from tests.models import make_mlp, mlp_inputs
from tests.trace_models import Crashing, FailsToUnpickle, Hanging, Raising, Unpicklable, fork_server

REPO = Path(__file__).resolve().parents[1]
BASE = ["--auto-cast=none", "-O1"]


def opts(root):
    return {"cache_dir": str(root), "compiler_args": BASE, "target": "trn2", "compiler": "local"}


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    ACTIVITY.reset()


def mlp_job(model, batch, level, graph_type=None):
    return TraceJob(model, {"x": mlp_inputs(batch=batch)[0]}, ["--auto-cast=none", f"-O{level}"],
                    graph_type or f"b{batch}")


def args_by_key(root):
    return {e.key: e.metadata()["compiler_args"] for e in CompileCache(root).entries()}


@pytest.mark.slow
def test_n_jobs_on_two_workers_start_exactly_two_children_each_job_keeping_its_args(tmp_path):
    model = make_mlp()
    jobs = [mlp_job(model, batch, 1 + batch % 3) for batch in range(1, 7)]
    results = parallel_trace(jobs, options=opts(tmp_path), workers=2, timeout=300, start_method=fork_server())
    assert [r.status for r in results] == ["captured"] * 6
    pids = {r.pid for r in results}
    assert len(pids) == 2 and os.getpid() not in pids
    stored = args_by_key(tmp_path)
    assert all(len(r.keys) == 1 for r in results)  # each job reports its own key only
    assert sorted(k for r in results for k in r.keys) == sorted(stored)
    for job, result in zip(jobs, results):
        assert stored[result.keys[0]] == job[2] and result.compiler_args == job[2]
        assert CompileCache(tmp_path).entry(result.keys[0]).metadata()["graph_type"] == job.graph_type


@pytest.mark.slow
def test_dynamo_state_does_not_leak_between_jobs_of_one_child(tmp_path):
    """One child, one model: twelve shapes (past Dynamo's default recompile limit of 8 per code object, which a
    child that kept its compiled frames would hit and run eagerly) and one shape under two argument sets."""
    model = make_mlp()
    jobs = [mlp_job(model, batch, 2) for batch in range(1, 13)]
    jobs += [mlp_job(model, 3, 3, "again-O3")]
    with torch._dynamo.config.patch(recompile_limit=8):  # a forked child inherits it; the fork server's has 8 too
        results = parallel_trace(jobs, options=opts(tmp_path), workers=1, timeout=300, start_method=fork_server())
    assert len({r.pid for r in results}) == 1
    assert [len(r.keys) for r in results] == [1] * 13
    stored = args_by_key(tmp_path)
    assert len(stored) == 13
    assert stored[results[2].keys[0]] == ["--auto-cast=none", "-O2"]  # batch 3, first job
    assert stored[results[12].keys[0]] == ["--auto-cast=none", "-O3"]  # batch 3 again, other args: its own key
    assert results[2].keys != results[12].keys


@pytest.mark.slow
def test_a_dying_child_fails_only_its_job_and_a_new_child_traces_the_rest(tmp_path):
    model = make_mlp()
    jobs = [mlp_job(model, 1, 2), TraceJob(Crashing(), {"x": torch.zeros(2)}, ["-O3"], "crash"),
            mlp_job(model, 2, 3), mlp_job(model, 3, 1)]
    with pytest.raises(TraceError) as err:
        parallel_trace(jobs, options=opts(tmp_path), workers=1, timeout=300, start_method=fork_server())
    assert "1 of 4 trace jobs failed" in str(err.value) and "'crash'" in str(err.value)
    assert "killed by signal 11" in str(err.value)
    first, crashed, after, last = err.value.results
    assert [r.status for r in err.value.results] == ["captured", "failed", "captured", "captured"]
    assert first.pid == crashed.pid != after.pid == last.pid
    stored = args_by_key(tmp_path)
    assert [stored[r.keys[0]] for r in (first, after, last)] == [jobs[0][2], jobs[2][2], jobs[3][2]]


def test_a_raising_job_fails_alone_and_its_child_goes_on(tmp_path):
    model = make_mlp()
    jobs = [TraceJob(Raising(), {"x": torch.zeros(2)}, ["-O3"], "raises"), mlp_job(model, 4, 2)]
    with pytest.raises(TraceError) as err:
        parallel_trace(jobs, options=opts(tmp_path), workers=1, timeout=300, start_method=fork_server())
    assert "'raises'" in str(err.value) and "ValueError: bad bucket" in str(err.value)  # the TraceError says it too
    raised, ok = err.value.results
    assert raised.status == "failed" and "'raises'" in raised.error
    # what raised, on which inputs and the fix come before the traceback
    assert raised.error.splitlines()[:3] == [
        "trace of graph type 'raises' raised in the child: ValueError: bad bucket",
        "  inputs: x=(2,) float32",
        "  fix: the model raised on this graph's example inputs; call it eagerly with them to reproduce, then fix "
        "the model or the inputs its bucket returns"]
    assert raised.error.splitlines()[3] == "Traceback (most recent call last):"
    assert ok.status == "captured" and ok.pid == raised.pid
    assert args_by_key(tmp_path) == {ok.keys[0]: jobs[1][2]}


@pytest.mark.slow
def test_a_hung_job_fails_at_its_deadline_and_a_new_child_traces_the_rest(tmp_path):
    """A hung job is killed at its deadline: the TraceError and the job's result name its graph type and the
    deadline (what tests/test_deferred.py checked with a lone hung job), and a new child traces the jobs after it.

    6 s: ten times what the later jobs' traces take (a forked child's MLP: 0.3-0.6 s at load 3); each second of it is
    waited out by the hung job."""
    model = make_mlp()
    jobs = [TraceJob(Hanging(), {"x": torch.zeros(2)}, None, "hangs"), mlp_job(model, 5, 2), mlp_job(model, 6, 3)]
    with pytest.raises(TraceError) as err:
        parallel_trace(jobs, options=opts(tmp_path), workers=1, timeout=6, start_method=fork_server())
    assert "'hangs'" in str(err.value) and "deadline of 6s" in str(err.value)
    hung, *rest = err.value.results
    assert hung.status == "failed" and "'hangs'" in hung.error and "deadline of 6s" in hung.error
    assert [r.status for r in rest] == ["captured", "captured"]
    assert rest[0].pid == rest[1].pid != hung.pid
    assert sorted(args_by_key(tmp_path).values()) == sorted([jobs[1][2], jobs[2][2]])


@pytest.mark.slow
def test_spawned_children_get_each_job_pickled_and_an_unpicklable_one_fails_alone(tmp_path):
    model = make_mlp()
    jobs = [mlp_job(model, 2, 2), TraceJob(Unpicklable(), {"x": torch.zeros(2)}, None, "lambda"),
            TraceJob(FailsToUnpickle(), {"x": torch.zeros(2)}, None, "refuses"), mlp_job(model, 2, 3)]
    with pytest.raises(TraceError) as err:
        parallel_trace(jobs, options=opts(tmp_path), workers=1, timeout=300, start_method="spawn")
    first, bad, refused, last = err.value.results
    assert bad.status == "failed" and "'lambda'" in bad.error and "cannot be sent to its child" in bad.error
    assert refused.status == "failed" and "'refuses'" in refused.error and "did not unpickle" in refused.error
    assert "this model refuses to unpickle" in refused.error
    assert first.status == last.status == "captured" and first.pid == refused.pid == last.pid != os.getpid()
    assert args_by_key(tmp_path) == {first.keys[0]: jobs[0][2], last.keys[0]: jobs[3][2]}


@pytest.mark.slow
def test_before_children_runs_once_before_the_first_child_and_never_without_one(tmp_path):
    calls = []
    model = make_mlp()
    jobs = [mlp_job(model, 1, 2), mlp_job(model, 2, 2), mlp_job(model, 3, 2)]
    parallel_trace(jobs, options=opts(tmp_path), workers=2, timeout=300, before_children=lambda: calls.append(1),
                   start_method=fork_server())
    assert calls == [1]
    parallel_trace([], options=opts(tmp_path), before_children=lambda: calls.append(2))
    assert calls == [1]


SERVER_AFTER_FORK = textwrap.dedent("""
    import sys, multiprocessing.forkserver as forkserver
    sys.path.insert(0, sys.argv[2])
    from neuron_args.deferred.parallel_trace import fork_is_safe, parallel_trace
    from tests.models import make_mlp, mlp_inputs
    opts = {"cache_dir": sys.argv[1], "compiler_args": ["-O1"], "target": "trn2", "compiler": "local"}
    job = (make_mlp(), {"x": mlp_inputs(batch=2)[0]}, ["-O2"])
    parallel_trace([job], options=opts, timeout=300)
    print("plain", forkserver._forkserver._forkserver_pid is not None)
    parallel_trace([job], options=opts, timeout=300, in_process=lambda job: [])
    print("runner", fork_is_safe(), forkserver._forkserver._forkserver_pid is not None)
""")


@pytest.mark.slow
def test_a_runner_whose_children_forked_starts_the_fork_server_for_its_next_trace(tmp_path):
    """Once its children forked, a runner's trace starts the fork server its next call needs (after jax's client
    exists in the runner's process); a plain parallel_trace call starts none."""
    run = subprocess.run([sys.executable, "-c", SERVER_AFTER_FORK, str(tmp_path), str(REPO)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["plain", "False", "runner", "True", "True"]


UNGUARDED = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from neuron_args.deferred import parallel_trace
    from tests.models import make_mlp, mlp_inputs

    # no `if __name__ == "__main__":` guard: a spawned child runs this again while importing the main module
    parallel_trace([(make_mlp(), {{"x": mlp_inputs(batch=2)[0]}}, ["-O1"])], start_method="spawn", timeout=300,
                   options={{"cache_dir": {cache!r}, "compiler_args": ["-O1"], "compiler": "local"}})
""")


@pytest.mark.slow
def test_a_child_that_dies_importing_an_unguarded_script_names_the_fix(tmp_path):
    script = tmp_path / "warm.py"
    script.write_text(UNGUARDED.format(repo=str(REPO), cache=str(tmp_path / "c")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "trace child of graph type" in done.stderr and "died without a result (exit status 1)" in done.stderr
    assert 'fix: put the script\'s code under `if __name__ == "__main__":`' in done.stderr
