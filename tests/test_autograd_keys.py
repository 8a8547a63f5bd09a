"""The autograd mode is a key component: the deferred flow traces in the caller's mode, so its keys are serve's."""
from __future__ import annotations

import pytest
import torch

from neuron_args import CacheMissError, scoped_compiler_args
from neuron_args.activity import ACTIVITY
from neuron_args.cache_key import autograd_mode
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.cache_key import AUTOGRAD_MODES, create_cache_hash, explain_components
from neuron_args.deferred import parallel_compile, parallel_trace
from neuron_args.deferred.jobs import TraceJob
from neuron_args.seams import records
from tests.models import make_mlp, mlp_inputs
from tests.trace_models import fork_server

ARGS = ["--auto-cast=none", "-O1"]


def opts(root):
    return {"cache_dir": str(root), "compiler_args": ARGS, "target": "trn2", "compiler": "local"}


def test_autograd_mode_changes_the_key_and_is_explained():
    keys = {mode: create_cache_hash(graph_text="HloModule m", input_specs=[((4,), "float32")], compiler_args=ARGS,
                                    target="trn2", tool_versions={}, output_specs=[((4,), "float32")], autograd=mode)
            for mode in AUTOGRAD_MODES}
    assert len({k.key for k in keys.values()}) == 3
    assert explain_components(keys["no_grad"].components.as_dict(), keys["grad"].components.as_dict()) == [
        "autograd: no_grad -> grad"]
    with pytest.raises(ValueError, match="autograd mode 'train'"):
        create_cache_hash(graph_text="g", input_specs=[], compiler_args=None, target="trn2", tool_versions={},
                          autograd="train")


def _serve_keys(model, x, root, mode):
    """The keys a plain torch.compile of ``model`` resolves when called in ``mode`` (compiled or loaded)."""
    records.clear()
    compiled = torch.compile(model, backend="neuron_libtorch", options=opts(root), dynamic=False)
    with autograd_mode(mode), scoped_compiler_args(ARGS, graph_type="decode"):
        compiled(x)
    return [r.key for r in records.records()]


@pytest.mark.slow  # trace children
def test_deferred_and_in_process_flows_key_alike_in_every_autograd_mode(tmp_path, monkeypatch):
    torch._dynamo.reset()
    ACTIVITY.reset()
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    model, x = make_mlp(), mlp_inputs(batch=2)[0]
    deferred, here = tmp_path / "deferred", tmp_path / "here"
    with torch.no_grad():  # a plain job traces in the mode of the parallel_trace call
        traced = parallel_trace([(model, {"x": x}, ARGS)], options=opts(deferred), timeout=300,
                                start_method=fork_server())
    # jobs that record their own mode (the runner's: inference_mode) are traced in it, whatever the call's
    traced += parallel_trace([TraceJob(model, {"x": x}, ARGS, "decode", mode) for mode in ("grad", "inference_mode")],
                             options=opts(deferred), timeout=300, start_method=fork_server())
    report = parallel_compile(deferred)
    assert sorted(g.status for g in report.graphs) == ["compiled"] * 3, (traced, report.graphs)
    deferred_keys = dict(zip(("no_grad", "grad", "inference_mode"), (r.keys for r in traced)))
    assert len({k for keys in deferred_keys.values() for k in keys}) == 3  # one graph per mode, each its own key
    for mode in AUTOGRAD_MODES:
        torch._dynamo.reset()
        assert _serve_keys(model, x, here, mode) == deferred_keys[mode], mode
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")  # and serving the deferred flow's cache in each mode hits
    for mode in AUTOGRAD_MODES:
        torch._dynamo.reset()
        ACTIVITY.reset()
        assert _serve_keys(model, x, deferred, mode) == deferred_keys[mode], mode


def test_a_serve_in_another_autograd_mode_says_so(tmp_path, monkeypatch):
    torch._dynamo.reset()
    ACTIVITY.reset()
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    model = torch.nn.Linear(4, 4).requires_grad_(False)  # one graph in either mode: only the mode differs
    x = torch.randn(2, 4)
    _serve_keys(model, x, tmp_path, "no_grad")
    torch._dynamo.reset()
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    with pytest.raises(CacheMissError) as miss:
        _serve_keys(model, x, tmp_path, "grad")
    lines = [line.strip() for line in str(miss.value).splitlines()]
    assert "autograd: no_grad -> grad" in lines, str(miss.value)
    assert not any(line.startswith("graph:") for line in lines), str(miss.value)


def test_one_graph_called_in_two_modes_runs_and_records_each_modes_key(tmp_path, monkeypatch):
    """A graph called in no_grad, then in inference_mode without Dynamo compiling again (its guards skipped, as
    ``skip_guard_eval_unsafe`` does), picks its executable by the whole key (scope and autograd mode): the second
    mode's call resolves, compiles and records its own key, not the first mode's."""
    torch._dynamo.reset()
    ACTIVITY.reset()
    records.clear()
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    model = torch.nn.Linear(4, 4).requires_grad_(False)
    x = torch.randn(2, 4)
    compiled = torch.compile(model, backend="neuron_libtorch", options=opts(tmp_path), dynamic=False)
    want = model(x)
    with autograd_mode("no_grad"), scoped_compiler_args(ARGS, graph_type="decode"):
        compiled(x)  # compiled in no_grad: Dynamo's only cache entry
    keys = {}
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        for mode in ("no_grad", "inference_mode", "no_grad"):
            before = [r.key for r in records.records()]
            with autograd_mode(mode), scoped_compiler_args(ARGS, graph_type="decode"):
                torch.testing.assert_close(compiled(x), want)
            keys.setdefault(mode, {r.key for r in records.records()} - set(before) or set(before))
    assert len(keys["no_grad"]) == 1 and len(keys["inference_mode"]) == 1
    assert keys["no_grad"] != keys["inference_mode"]
    modes = {e.key: e.metadata()["key_components"]["autograd"] for e in CompileCache(tmp_path).entries()}
    assert modes == {next(iter(keys["no_grad"])): "no_grad", next(iter(keys["inference_mode"])): "inference_mode"}
    torch._dynamo.reset()
