"""The benchmarks compare like with like: bench_deferred's deferred flow traces the graphs its in-process flow compiles."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from neuron_args.cache_key import current_autograd_mode
from neuron_args.cache import CompileCache
from neuron_args.deferred.jobs import normalize_job
from neuron_args.deferred.parallel_trace import _run_job
from neuron_args.settings import CompileSettings
from tests.models import make_mlp, mlp_inputs

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench_deferred():
    spec = importlib.util.spec_from_file_location("bench_deferred", BENCHMARKS / "bench_deferred.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_deferred_traces_in_the_mode_its_in_process_flow_compiles_in(tmp_path):
    bench = _bench_deferred()
    [job] = bench.trace_jobs(make_mlp(), [mlp_inputs(batch=2)[0]])
    with torch.enable_grad():  # the benchmark calls parallel_trace in grad mode, which a plain job would inherit
        job = normalize_job(job, current_autograd_mode())
    settings = CompileSettings.from_options(bench.options(str(tmp_path)), "bench_deferred")
    status, keys = _run_job(job, settings)  # what a trace child runs for the job
    assert status == "ok" and len(keys) == 1, keys
    components = CompileCache(tmp_path).entry(keys[0]).info().key_components
    assert components["autograd"] == bench.SERVE_MODE == "inference_mode"
    # the MLP's forward returns one tensor; a grad-mode trace would also return the activations its backward saves
    assert components["output_specs"] == [{"shape": [2, 16], "dtype": "float32"}]
