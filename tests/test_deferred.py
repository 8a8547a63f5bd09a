"""The deferred flow: capture seam, parallel_trace children, parallel_compile from recorded arguments."""
from __future__ import annotations

import concurrent.futures as cf
import shutil
from pathlib import Path

import pytest
import torch

from neuron_args import CacheMissError, CompileError, scoped_compiler_args
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, STATS, CompileCache
from neuron_args.deferred import build_trace_job, parallel_compile, parallel_trace
from neuron_args.scope import CompilerArgsResolver
from tests.models import make_mlp, mlp_inputs
from tests.trace_models import fork_server

BASE = ["--auto-cast=none", "-O1"]


def opts(root):
    return {"cache_dir": str(root), "compiler_args": BASE, "target": "trn2", "compiler": "local"}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...


class Policy:
    def compiler_args_for(self, graph_type, example_inputs, base):
        from neuron_args.flags import with_optimization_level

        return with_optimization_level(base, 3) if graph_type == "decode" else list(base)


# Pending entries other tests start from. They are captured with the `traced` graphs in one parallel_trace call
# (each call costs its trace children) and moved aside before those are compiled; a test copies the ones it uses
# into a cache of its own.
PENDING_JOBS = {"b3 -O2": (3, ["-O2"]), "b5 -O3": (5, ["-O3"]), "b6 -O2": (6, ["-O2"]), "b7 -O3": (7, ["-O3"])}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The `traced` jobs captured into one cache, PENDING_JOBS' entries moved aside: (root, results, {name: path})."""
    root = tmp_path_factory.mktemp("deferred")
    resolver = CompilerArgsResolver.from_model(Policy(), BASE)
    model = make_mlp()
    jobs = [
        build_trace_job(resolver, model, {"x": mlp_inputs(batch=1)[0]}, "decode"),
        build_trace_job(resolver, model, {"x": mlp_inputs(batch=4)[0]}, "prefill"),
        (model, {"x": mlp_inputs(batch=2)[0]}),  # the native path's 2-element job: no override
    ]
    extra = [(model, {"x": mlp_inputs(batch=batch)[0]}, args) for batch, args in PENDING_JOBS.values()]
    with torch.inference_mode():  # the mode the tests serve in: parallel_trace traces in its caller's mode
        results = parallel_trace(jobs + extra, options=opts(root), timeout=300, start_method=fork_server())
    aside = tmp_path_factory.mktemp("deferred-pending")
    moved = {}
    for name, result in zip(PENDING_JOBS, results[len(jobs):]):
        (key,) = result.keys
        moved[name] = shutil.move(root / key, aside / key)
    return root, results[:len(jobs)], moved


@pytest.fixture(scope="module")
def traced(captured):
    """Two graphs (decode at -O3 via the policy, prefill at base) plus a 2-element job, captured and compiled."""
    root, traced, _ = captured
    pending = {e.key: e.metadata() for e in CompileCache(root).entries()}
    statuses = {e.key: e.status for e in CompileCache(root).entries()}
    events = []
    report = parallel_compile(root, progress=events.append, workers=2)
    return root, traced, pending, statuses, report, events


@pytest.fixture
def pending_entry(captured, tmp_path):
    """``pending_entry(name)``: a copy in ``tmp_path`` of that PENDING_JOBS entry, as parallel_trace left it."""
    def copy(name):
        path = Path(captured[2][name])
        shutil.copytree(path, tmp_path / path.name)
        return CompileCache(tmp_path).entry(path.name)
    return copy


def test_build_trace_job_resolves_before_the_fork():
    resolver = CompilerArgsResolver.from_model(Policy(), BASE)
    job = build_trace_job(resolver, "model", {"x": 1}, "decode")
    assert len(job) == 3 and job[2] == ["--auto-cast=none", "-O3"] and job.graph_type == "decode"
    assert tuple(job) == ("model", {"x": 1}, ["--auto-cast=none", "-O3"])


@pytest.mark.slow
def test_capture_writes_pending_entries_with_resolved_args(traced):
    root, results, pending, statuses, report, events = traced
    assert [r.status for r in results] == ["captured"] * 3
    assert set(statuses.values()) == {"pending"}
    by_type = {md["graph_type"]: md for md in pending.values()}
    assert by_type["decode"]["compiler_args"] == ["--auto-cast=none", "-O3"]
    assert by_type["prefill"]["compiler_args"] == BASE
    assert by_type[None]["compiler_args"] == BASE
    assert all(md["status"] == "pending" for md in pending.values())


def test_per_graph_level_survives_the_deferred_build(traced):
    root, results, pending, statuses, report, events = traced
    assert report.ok and len(report.graphs) == 3
    for entry in CompileCache(root).entries():
        md = entry.metadata()
        assert entry.status == "complete" and md["status"] == "compiled"
        level = "-O3" if md["graph_type"] == "decode" else "-O1"
        assert entry.command_path.read_text().split()[-1] == level
    assert sorted(e.done for e in events) == [1, 2, 3] and all(e.total == 3 for e in events)
    assert "[3/3]" in max(events, key=lambda e: e.done).line()


def test_both_flows_share_one_entry_and_serve_hits(traced, monkeypatch):
    root = traced[0]
    before = {e.key for e in CompileCache(root).entries()}
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    model = make_mlp()
    cm = torch.compile(model, backend="neuron_libtorch", options=opts(root), dynamic=False)
    x = mlp_inputs(batch=1)[0]
    with torch.inference_mode(), scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
        out = cm(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert STATS.hits == 1 and STATS.compiles == 0
    assert {e.key for e in CompileCache(root).entries()} == before


def test_pending_entries_never_load(tmp_path, monkeypatch, pending_entry):
    model, (x,) = make_mlp(), mlp_inputs(batch=3)
    pending_entry("b3 -O2")  # parallel_trace([(model, {"x": x}, ["-O2"])]) into tmp_path
    (entry,) = CompileCache(tmp_path).entries()
    assert entry.status == "pending"
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    cm = torch.compile(model, backend="neuron_libtorch", options=opts(tmp_path), dynamic=False)
    with torch.inference_mode(), scoped_compiler_args(["-O2"]), pytest.raises(CacheMissError):
        cm(x)


def test_old_cache_entry_without_recorded_args_uses_base(tmp_path, pending_entry):
    pending_entry("b5 -O3")  # parallel_trace([(make_mlp(), {"x": batch 5}, ["-O3"])]) into tmp_path
    (entry,) = CompileCache(tmp_path).entries()
    md = entry.metadata()
    del md["compiler_args"]
    del md["key_components"]["compiler_args"]  # recorded nowhere; a key holding -O3 is never built with -O2
    entry.write_metadata(md)
    with cf.ThreadPoolExecutor(1) as pool:  # any Executor may be passed
        report = parallel_compile(tmp_path, base_compiler_args="--auto-cast=none -O2", executor=pool, quiet=True)
    (g,) = report.graphs
    assert g.used_base_args and g.compiler_args == ["--auto-cast=none", "-O2"] and g.status == "compiled"
    assert entry.command_path.read_text().split()[-1] == "-O2"


def test_one_failing_graph_does_not_stop_the_others(tmp_path, pending_entry):
    pending_entry("b6 -O2")  # parallel_trace of the MLP at batch 6 under -O2 and batch 7 under -O3 into tmp_path
    pending_entry("b7 -O3")
    bad = next(e for e in CompileCache(tmp_path).entries() if e.metadata()["compiler_args"] == ["-O3"])
    bad.hlo_path.write_bytes(b"not an hlo module")
    with pytest.raises(CompileError) as err:
        parallel_compile(tmp_path, quiet=True)
    assert "1 of 2 graphs failed" in str(err.value) and bad.key in str(err.value)
    report = err.value.report
    assert sorted(g.status for g in report.graphs) == ["compiled", "failed"]
    assert bad.status != "complete"


def test_parallel_compile_error_carries_the_failed_graphs_as_data():
    import pickle

    import neuron_args
    from neuron_args.deferred import CompileReport
    from neuron_args.graph_outcome import GraphOutcome

    bad = GraphOutcome("a" * 32, "decode", compiler_args=["-O3"], how="failed",
                       error="local compiler failed\nfix: read the log")
    report = CompileReport([bad, GraphOutcome("b" * 32, "prefill", compiler_args=["-O1"], how="compiled")])
    err = neuron_args.ParallelCompileError(report)
    assert isinstance(err, CompileError) and isinstance(err, neuron_args.NeuronArgsError)
    assert err.failures == [bad] and err.report is report
    text = str(err)
    assert "1 of 2 graphs failed" in text and f"'decode' {'a' * 32}: local compiler failed" in text
    assert "b" * 32 not in text and text.splitlines()[-1].startswith("fix: ")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and again.failures == [bad]


# trace children that crash, raise or hang: their TraceError names the graph type and what happened in
# tests/test_trace_children.py (the same children also prove the jobs after the failed one are traced)


# the spawn fallback once jax's client exists (a plain call): tests/test_trace_record.py, in the fresh process that
# checks the runner's fork server


def test_a_job_compiled_by_the_user_keeps_its_own_options(tmp_path, monkeypatch):
    """(torch.compile(m, backend=capture seam, options={cache_dir: D}), inputs, args): the child calls that
    object, so the pending entry lands under D, not under parallel_trace's options nor the default cache."""
    user_dir, default_dir = tmp_path / "user", tmp_path / "default"
    monkeypatch.setenv("NEURON_LIBTORCH_CACHE_DIR", str(default_dir))
    model = make_mlp()
    compiled = torch.compile(model, backend="neuron_libtorch_graph_capture", dynamic=False,
                             options={**opts(user_dir), "compiler_args": ["--auto-cast=none", "-O1"]})
    (result,) = parallel_trace([(compiled, {"x": mlp_inputs(batch=9)[0]}, ["--auto-cast=none", "-O3"])], timeout=300,
                               start_method=fork_server())  # the job, pickled, is the compiled object
    (entry,) = CompileCache(user_dir).entries()
    assert result.keys == [entry.key] and entry.status == "pending"
    assert entry.metadata()["compiler_args"] == ["--auto-cast=none", "-O3"]  # the job's scope still applies
    assert not default_dir.exists()


def test_neuron_compiled_recognises_only_neuron_seams():
    from neuron_args.deferred.parallel_trace import neuron_compiled

    model = make_mlp()
    capture = torch.compile(model, backend="neuron_libtorch_graph_capture", dynamic=False)
    assert neuron_compiled(capture) is capture
    fn = torch.compile(lambda x: x + 1, backend="neuron_libtorch", dynamic=False)
    assert neuron_compiled(fn) is fn
    assert neuron_compiled(torch.compile(model, backend="eager")) is None
    assert neuron_compiled(model) is None


def test_bad_settings_of_the_deferred_flow_fail_up_front(tmp_path, monkeypatch):
    from neuron_args.errors import CompilerArgsError, OptionsError

    with pytest.raises(CompilerArgsError, match="options\\['compiler_args'\\]"):
        parallel_trace([(make_mlp(), {"x": mlp_inputs()[0]}, None)], options={"compiler_args": 5})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OptionsError, match="is not a directory"):
        parallel_compile(blocker)
    monkeypatch.setenv("NEURON_ARGS_COMPILE_WORKERS", "many")
    with pytest.raises(OptionsError, match="NEURON_ARGS_COMPILE_WORKERS='many'"):
        from neuron_args.deferred.parallel_compile import default_workers

        default_workers(3)


def test_parallel_compile_says_what_it_cannot_build_instead_of_skipping_it_silently(tmp_path, caplog):
    """A pending entry without its graph fails naming the fix; one with unreadable metadata is named in the log."""
    import json

    from neuron_args.compilers.local import local_version

    root = tmp_path / "cache"
    no_hlo, garbage = root / ("a" * 32), root / ("b" * 32)  # keys: 32 hex characters
    no_hlo.mkdir(parents=True)
    (no_hlo / "metadata.json").write_text(json.dumps({
        "metadata_version": 1, "key": no_hlo.name, "status": "pending", "seam": "neuron_libtorch_graph_capture",
        "graph_type": "decode", "compiler_args": ["-O1"], "target": "trn2",
        "compiler": {"name": "local", "version": local_version(), "format": "xla-cpu-executable"}}))
    garbage.mkdir()
    (garbage / "graph.hlo").write_bytes(b"\x00hlo")
    (garbage / "metadata.json").write_text("{not json")
    with caplog.at_level("WARNING", logger="neuron_args"):
        report = parallel_compile(root, quiet=True, raise_on_error=False)
    (graph,) = report.graphs
    assert (graph.key, graph.graph_type, graph.status) == (no_hlo.name, "decode", "failed")
    assert "has no graph.hlo" in graph.error and "capture it again" in graph.error and str(no_hlo) in graph.error
    said = [r.getMessage() for r in caplog.records if garbage.name in r.getMessage()]
    assert len(said) == 1 and "no readable metadata.json" in said[0] and "capture it again" in said[0]
    assert CompileCache(root).entry(garbage.name).path.is_dir()  # nothing is removed behind the user's back


def test_trace_record_all_complete_predicts_a_warm_cache(tmp_path):
    import json

    from neuron_args.deferred.trace_record import RECORD_NAME, RECORD_VERSION, TraceRecord

    cache = CompileCache(tmp_path)
    record = TraceRecord(tmp_path)
    assert not record.all_complete()  # no record: a cold cache
    keys = ["a" * 32, "b" * 32]
    for key in keys:
        cache.entry(key).path.mkdir(parents=True)
    record.note({"fp1": ("prefill", [keys[0]]), "fp2": ("decode", [keys[1]])})
    cache.entry(keys[0]).mark_complete()
    assert not record.all_complete()  # decode's entry is not built
    cache.entry(keys[1]).mark_complete()
    assert record.all_complete()
    (tmp_path / RECORD_NAME).write_text(json.dumps({"version": RECORD_VERSION, "jobs": {}}))
    assert not record.all_complete()  # a record of no job predicts nothing
