"""Trace children kept across ``parallel_trace`` calls (``keep_children=True``, what a runner passes).

A kept child traces a later call's jobs (pickled to it, with that call's options) once new
children could not fork: it gives the keys a fresh child gives, writes where the later call's
options say, is replaced when it died, leaves when idle, at ``close_kept_children`` and on an
interrupt. Each scenario runs in a fresh process, so the first children fork.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time, multiprocessing.forkserver as forkserver
    sys.path.insert(0, sys.argv[2])
    import torch
    from neuron_args import xla_cpu
    from neuron_args.cache import CompileCache
    from neuron_args.deferred import TraceJob, parallel_trace
    from neuron_args.deferred.parallel_trace import close_kept_children, kept_children, fork_is_safe
    from tests.models import make_mlp, mlp_inputs
    from tests.trace_models import Hanging

    root = sys.argv[1]
    def opts(name):
        return {"cache_dir": os.path.join(root, name), "compiler_args": ["-O1"], "target": "trn2", "compiler": "local"}
    def jobs(level):  # another level, another key: a kept child traces the job it is sent, not the one it inherited
        model = make_mlp()
        return [TraceJob(model, {"x": mlp_inputs(batch=b)[0]}, ["--auto-cast=none", f"-O{level}"], f"b{b}")
                for b in (1, 2)]
    def keys(results):
        return [r.keys for r in results]
    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"

    first = parallel_trace(jobs(1), options=opts("a"), workers=1, timeout=300, keep_children=True)
    kept = kept_children()
    print("first", [r.status for r in first], len({r.pid for r in first}), kept == [first[0].pid])
    xla_cpu.sync_client()  # now forking is unsafe: a new child would come from a fork server
    second = parallel_trace(jobs(2), options=opts("b"), workers=1, timeout=300, keep_children=True,
                            in_process=lambda job: [])
    print("second", fork_is_safe(), [r.status for r in second], {r.pid for r in second} == set(kept),
          forkserver._forkserver._forkserver_pid is None)
    # the same jobs in a child of their own (not kept) give the same keys; the kept child wrote under "b"
    fresh = parallel_trace(jobs(2), options=opts("c"), workers=1, timeout=300, start_method="spawn")
    print("keys", keys(second) == keys(fresh), sorted(e.key for e in CompileCache(opts("b")["cache_dir"]).entries())
          == sorted(k for ks in keys(second) for k in ks), first[0].keys != second[0].keys)
    # the environment is the later call's too: a target from $NEURON_ARGS_TARGET set since the child forked
    os.environ["NEURON_ARGS_TARGET"] = "trn1"
    untargeted = {k: v for k, v in opts("f").items() if k != "target"}
    env_kept = parallel_trace(jobs(2), options=untargeted, workers=1, timeout=300, keep_children=True,
                              in_process=lambda job: [])
    env_fresh = parallel_trace(jobs(2), options={**untargeted, "cache_dir": os.path.join(root, "g")}, workers=1,
                               timeout=300, start_method="spawn")
    del os.environ["NEURON_ARGS_TARGET"]
    print("env", {r.pid for r in env_kept} == set(kept), keys(env_kept) == keys(env_fresh),
          keys(env_kept) != keys(second))
    os.kill(kept[0], signal.SIGKILL)
    import multiprocessing  # reaped (waitpid sees a killed process once all its threads are gone)
    while any(p.pid == kept[0] for p in multiprocessing.active_children()):
        time.sleep(0.05)
    third = parallel_trace(jobs(2), options=opts("d"), workers=1, timeout=300, keep_children=True,
                           in_process=lambda job: [])
    print("replaced", [r.status for r in third], third[0].pid not in kept, keys(third) == keys(second),
          kept_children() == [third[0].pid])
    close_kept_children()
    print("closed", kept_children(), alive(third[0].pid))
    os.environ["NEURON_ARGS_TRACE_IDLE_SECONDS"] = "0.5"
    idle = parallel_trace(jobs(3), options=opts("e"), workers=1, timeout=300, keep_children=True,
                          in_process=lambda job: [])
    deadline = time.monotonic() + 60
    while (kept_children() or alive(idle[0].pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("idle", [r.status for r in idle], kept_children(), alive(idle[0].pid))
    # an interrupt (the cancel event: what Ctrl-C sets) while a kept child is busy: none is left kept or busy
    del os.environ["NEURON_ARGS_TRACE_IDLE_SECONDS"]
    parallel_trace(jobs(1)[:1], options=opts("h"), workers=1, timeout=300, keep_children=True,
                   in_process=lambda job: [])
    print("kept", len(kept_children()))
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    try:
        parallel_trace([TraceJob(Hanging(), {"x": torch.zeros(2)}, None, "hang")], options=opts("h"), workers=1,
                       timeout=120, keep_children=True, cancel=cancel, in_process=lambda job: [])
    except KeyboardInterrupt:
        print("interrupted", kept_children(),
              [p for p in multiprocessing.active_children() if p.name == "neuron-args-trace"])
""")


@pytest.mark.slow
def test_kept_children_trace_a_later_call_with_its_options_are_replaced_when_dead_and_leave(tmp_path):
    """One fresh process for every kept-child contract (each fresh interpreter costs its imports and first
    children): a later call's jobs and options, a dead child replaced, close, idle, and an interrupt that leaves
    no trace child kept or busy."""
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(REPO)], capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.splitlines() == [
        "first ['captured', 'captured'] 1 True",
        "second False ['captured', 'captured'] True True",  # the kept child: no fork server was started
        "keys True True True",
        "env True True True",  # $NEURON_ARGS_TARGET set after the kept child forked reaches its key
        "replaced ['captured', 'captured'] True True True",
        "closed [] False",
        "idle ['captured', 'captured'] [] False",
        "kept 1",
        "interrupted [] []",  # the interrupt: no trace child kept or busy (what a Ctrl-C of a runner's trace leaves)
    ]


RUNNERS = textwrap.dedent('''
    import json, multiprocessing, sys, multiprocessing.forkserver as forkserver
    from pathlib import Path
    import torch
    from neuron_args.deferred.parallel_trace import close_kept_children, kept_children
    from neuron_args.graphs import GraphSpec
    from neuron_args.runner import NeuronRunner

    class Model(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            torch.manual_seed(width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.SiLU(), torch.nn.Linear(width, 8)).eval()
        def neuron_graphs(self):
            return [GraphSpec("prefill", self.mlp, {"b4": lambda: {"input": torch.ones(4, 8)}}),
                    GraphSpec("decode", self.mlp, {"b1": lambda: {"input": torch.ones(1, 8)}})]

    def main():
        out = {}
        for name, width in (("first", 16), ("second", 24)):
            runner = NeuronRunner(Model(width), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                                  cache_dir=Path(sys.argv[1]))
            report = runner.warmup(flow="parallel", emit=False)
            with torch.inference_mode():
                x4, x1 = torch.randn(4, 8), torch.randn(1, 8)
                with runner.serve() as served:  # asserting a hit: serving traces here (jax's client: no more forks)
                    outs = [runner.run("prefill", {"input": x4}), runner.run("decode", {"input": x1})]
                eager = [runner.model.mlp(x4), runner.model.mlp(x1)]
            out[name] = {"traced": sorted((t.graph_type, t.status) for t in report.traced),
                         "pids": sorted({t.pid for t in report.traced}), "kept": sorted(kept_children()),
                         "served": [served.counts.misses, served.counts.compiles],
                         "equal": [bool(torch.allclose(o, e, rtol=1e-5, atol=1e-5)) for o, e in zip(outs, eager)]}
        out["fork server"] = forkserver._forkserver._forkserver_pid is not None
        close_kept_children()
        out["left"] = [p.pid for p in multiprocessing.active_children() if p.name == "neuron-args-trace"]
        print(json.dumps(out))

    if __name__ == "__main__":
        main()
''')


@pytest.mark.slow
def test_a_second_runner_traces_in_the_first_runners_children_and_serves_what_eager_computes(tmp_path):
    import json
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "VLLM_NEURON"))}
    env.update(PYTHONPATH=str(REPO), NEURON_ARGS_TRACE_WORKERS="2")
    script = tmp_path / "runners.py"
    script.write_text(RUNNERS)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.splitlines()[-1])
    first, second = out["first"], out["second"]
    for one in (first, second):
        assert one["traced"] == [["decode", "captured"], ["prefill", "captured"]]
        assert one["served"] == [0, 0] and one["equal"] == [True, True]
    assert len(first["pids"]) == 2 and first["kept"] == first["pids"]
    assert second["pids"] == first["pids"] and second["kept"] == first["pids"]  # no new child, no fork server
    assert out["fork server"] is False
    assert out["left"] == []


ORPHANS = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[2])
    from neuron_args.deferred import TraceJob, parallel_trace
    from neuron_args.deferred.parallel_trace import kept_children
    from tests.models import make_mlp, mlp_inputs

    jobs = [TraceJob(make_mlp(), {"x": mlp_inputs(batch=b)[0]}, None, f"b{b}") for b in (1, 2)]
    thread = threading.Thread(target=lambda: parallel_trace(jobs, options={"cache_dir": sys.argv[1], "compiler": "local"},
                                                            workers=2, timeout=300, keep_children=True))
    thread.start()
    thread.join()  # the thread that forked the children is gone: they are kept, alive (not killed, not zombies)
    time.sleep(1)  # a parent-death signal of the ended thread would have arrived by now
    kept = kept_children()
    print(" ".join(map(str, kept)), all(open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in kept), flush=True)
    os._exit(0)  # no clean-up at exit: the kept children must notice their parent is gone
""")


@pytest.mark.slow
def test_children_kept_by_a_thread_outlive_it_but_not_their_parent(tmp_path):
    import os
    import time

    run = subprocess.run([sys.executable, "-c", ORPHANS, str(tmp_path), str(REPO)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    *pids, alive = run.stdout.split()
    assert len(pids) == 2 and alive == "True"

    def running(pid):
        try:
            return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 60
    while any(running(int(p)) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if running(int(p))] == []


def test_no_more_children_are_kept_than_a_call_may_use_and_closing_stops_them_all():
    from neuron_args.deferred.parallel_trace import _KEPT
    from neuron_args.compilers.lifetime import IdleChildren

    class Child:
        def __init__(self, name, stopped):
            self.name, self.stopped = name, stopped

        def stop(self):
            self.stopped.append(self.name)

    assert isinstance(_KEPT, IdleChildren)  # the kept trace children are the shared idle set below
    stopped: list[str] = []
    kept = IdleChildren(Child.stop)
    for name in "abc":
        kept.put(Child(name, stopped), 30, cap=2)
    assert [c.name for c in kept.children] == ["b", "c"] and stopped == ["a"]  # the oldest beyond the cap
    kept.close()
    assert stopped == ["a", "b", "c"] and kept.children == [] and kept.timer is None


def test_each_kept_child_stops_its_idle_time_after_it_was_put_back_and_a_taken_one_never():
    from neuron_args.compilers.lifetime import IdleChildren

    stopped: list[str] = []
    kept = IdleChildren(stopped.append)
    kept.put("short", 0.2)
    kept.put("long", 30)
    kept.put("taken", 0.2)
    kept.put("now", 0)  # 0: not kept
    assert kept.take(1, lambda c: c == "taken") == ["taken"]  # the ones it refuses are stopped
    assert stopped == ["now", "short", "long"] and kept.children == []
    kept.put("short", 0.2)
    kept.put("long", 30)
    time.sleep(0.6)
    assert stopped[3:] == ["short"] and kept.children == ["long"]
    kept.close()
    assert stopped[4:] == ["long"] and kept.timer is None
