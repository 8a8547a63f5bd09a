"""NEFFs executed through the Neuron runtime binding: loader choice, specs, core window, one load per process.

torch-neuronx cannot be installed here, so its runtime binding is the fake in ``tests/fakes/torch_neuronx``
(exactly the surface ``neuron_args.neuron_runtime`` uses; it records loads and calls and returns
zeros of the metaneff's output shapes) and neuronx-cc is ``tests/fakes/neuronx_cc.py``. The whole
warmup -> serve path runs with ``compiler="neuronx-cc"``, in this process and in real processes.
``test_real_neff_matches_eager`` runs the real binding on a Neuron host.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from neuron_args import executables
from neuron_args.activity import ACTIVITY
from neuron_args.cache import CompileCache
from neuron_args.errors import CorruptEntryError, NeuronArgsError
from neuron_args.tensors import TensorSpec
from neuron_args.neuron_runtime import (RUNTIME_CORES_ENV, NeffExecutable, RuntimeBindingError, apply_core_window,
                                        core_window, load_binding, metaneff)

REPO = Path(__file__).resolve().parents[1]
FAKES = REPO / "tests" / "fakes"
FAKE_CC = FAKES / "neuronx_cc.py"


class Embedder(torch.nn.Module):
    """int64 token ids in (lowered to int32 in the HLO), float32 out: exercises the dtype casts."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8, _weight=torch.randn(50, 8, generator=gen))
        self.proj = torch.nn.Linear(8, 6)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(ids)).relu() + 1.0


def _forget_loaded() -> None:
    """Drop this process's loaded executables (a fresh process starts empty)."""
    ACTIVITY.loaded.clear()
    ACTIVITY.eager_outputs.clear()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("NEURON_LIBTORCH_ASSERT_CACHE_HIT", executables.ALLOW_EAGER_ENV, "NEURON_VISIBLE_DEVICES",
                 RUNTIME_CORES_ENV, "FAKE_NEURON_RUNTIME_MODE", "FAKE_NEURON_RUNTIME_RECORD", "WORLD_SIZE",
                 "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...
    yield
    _forget_loaded()
    torch._dynamo.reset()


@pytest.fixture
def fake_cc(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_CC.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "ok")
    return bin_dir


@pytest.fixture
def fake_runtime(monkeypatch):
    """The fake torch_neuronx imported in this process (registers torch.classes.neuron / torch.ops.neuron)."""
    monkeypatch.syspath_prepend(str(FAKES))
    module = importlib.import_module("torch_neuronx")
    yield module
    module.uninstall()
    for name in [n for n in sys.modules if n == "torch_neuronx" or n.startswith("torch_neuronx.")]:
        del sys.modules[name]


def compile_embedder(cache_dir, **options):
    opts = {"cache_dir": str(cache_dir), "compiler_args": ["-O1"], "target": "trn2", "compiler": "neuronx-cc",
            **options}
    model = Embedder()
    return model, torch.compile(model, backend="neuron_libtorch", options=opts, dynamic=False)


IDS = torch.tensor([[3, 1, 4, 1]])


def expected_metaneff(specs, prefix):
    kinds = {"int64": "INT32", "float32": "FLOAT"}
    return [{"name": f"{prefix}{i}", "shape": s["shape"], "dtype": kinds[s["dtype"]]} for i, s in enumerate(specs)]


# -- the core window ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("devices", "cores"), [("2-3", "2-3"), ("4", "4"), ("0,1", "0-1"), ("", None)])
def test_core_window_from_neuron_visible_devices(devices, cores):
    assert core_window({"NEURON_VISIBLE_DEVICES": devices}) == cores
    env = {"NEURON_VISIBLE_DEVICES": devices}
    assert apply_core_window(env) == cores
    assert env.get(RUNTIME_CORES_ENV) == cores


@pytest.mark.parametrize(("window", "world", "rank", "cores"), [("4-7", "2", "0", "4-5"), ("4-7", "2", "1", "6-7"),
                                                              ("2-3", "2", "1", "3"), ("0-1", "1", "0", "0-1")])
def test_tensor_parallel_ranks_take_their_share_of_the_window(window, world, rank, cores):
    assert core_window({"NEURON_VISIBLE_DEVICES": window, "WORLD_SIZE": world, "LOCAL_RANK": rank}) == cores
    # torchrun on several nodes: the node's ranks share the node's window
    env = {"NEURON_VISIBLE_DEVICES": window, "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": world, "RANK": "9",
           "LOCAL_RANK": rank}
    assert core_window(env) == cores


def test_core_window_refuses_gaps_and_a_conflicting_runtime_setting():
    with pytest.raises(NeuronArgsError, match=r"not one contiguous range .*'0-2'"):
        core_window({"NEURON_VISIBLE_DEVICES": "0,2"})
    with pytest.raises(NeuronArgsError, match=r"\(3 cores\) cannot give rank 1 of 2 tensor-parallel ranks"):
        core_window({"NEURON_VISIBLE_DEVICES": "0-2", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    env = {"NEURON_VISIBLE_DEVICES": "2-3", RUNTIME_CORES_ENV: "0-1"}
    with pytest.raises(NeuronArgsError, match=r"NEURON_RT_VISIBLE_CORES='0-1' but NEURON_VISIBLE_DEVICES='2-3'"):
        apply_core_window(env)
    env = {"NEURON_VISIBLE_DEVICES": "2-3", RUNTIME_CORES_ENV: "2-3"}
    assert apply_core_window(env) == "2-3"
    assert apply_core_window({RUNTIME_CORES_ENV: "5"}) == "5"  # no window: the user's setting stands


# -- the binding and the metaneff ----------------------------------------------------------------------
def test_no_torch_neuronx_is_a_binding_error():
    assert importlib.util.find_spec("torch_neuronx") is None
    with pytest.raises(RuntimeBindingError, match="torch_neuronx is not importable"):
        load_binding()


def test_metaneff_is_typed_as_the_hlo(fake_runtime):
    binding = load_binding()
    raw = metaneff(binding, [TensorSpec((1, 4), "int64"), TensorSpec((2,), "bfloat16")],
                   [TensorSpec((1, 4, 6), "float32"), TensorSpec((), "bool")])
    message = fake_runtime.proto.metaneff_pb2.MetaNeff.FromString(raw)
    name = fake_runtime.proto.metaneff_pb2.MetaTensor.DataType.Name
    assert [(t.name, list(t.shape), name(t.data_type)) for t in message.input_tensors] == [
        (b"input0", [1, 4], "INT32"), (b"input1", [2], "BFLOAT16")]
    assert [(t.name, list(t.shape), name(t.data_type)) for t in message.output_tensors] == [
        (b"output0", [1, 4, 6], "FLOAT"), (b"output1", [], "BOOL")]
    with pytest.raises(NeuronArgsError, match="dtype float8_e4m3fn has no Neuron runtime data type"):
        metaneff(binding, [TensorSpec((2,), "float8_e4m3fn")], [])


def test_a_uint64_output_is_two_uint32_words_in_the_neff(fake_runtime):
    """torch.hash_tensor's uint64 leaves the HLO as (low, high) words: the metaneff says so, the executable joins them."""
    spec = TensorSpec((2,), "uint64")
    message = fake_runtime.proto.metaneff_pb2.MetaNeff.FromString(metaneff(load_binding(), [spec], [spec]))
    name = fake_runtime.proto.metaneff_pb2.MetaTensor.DataType.Name
    assert [(list(t.shape), name(t.data_type)) for t in message.input_tensors] == [([2], "INT32")]
    assert [(list(t.shape), name(t.data_type)) for t in message.output_tensors] == [([2, 2], "INT32")]
    words = torch.tensor([[7, 0x80000001], [0, 1]], dtype=torch.uint32)
    (out,) = NeffExecutable(None, lambda inputs, model: [words], [], [spec])()
    assert out.dtype == torch.uint64 and out.view(torch.int64).tolist() == [(0x80000001 << 32) - 2**64 + 7, 1 << 32]


def test_neff_executable_casts_and_checks_inputs(tmp_path, fake_runtime, monkeypatch):
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "6-7")
    neff = tmp_path / "graph.neff"
    neff.write_bytes(b"NEFF-bytes")
    exe = NeffExecutable.load(neff.read_bytes(), [TensorSpec((1, 4), "int64")],
                              [TensorSpec((1, 4), "int64"), TensorSpec((1, 4, 6), "float32")], path=neff)
    assert os.environ[RUNTIME_CORES_ENV] == "6-7"
    (load,) = fake_runtime.LOADS[-1:]
    assert load["visible_cores"] == "6-7" and load["inputs"] == [{"name": "input0", "shape": [1, 4], "dtype": "INT32"}]
    ids, out = exe(IDS)
    assert ids.dtype == torch.int64 and out.shape == (1, 4, 6) and out.dtype == torch.float32
    assert fake_runtime.CALLS[-1]["inputs"] == [{"shape": [1, 4], "dtype": "int32"}]
    with pytest.raises(TypeError, match=r"NEFF input 0 expects int64\[1, 4\], got int32\[1, 4\]"):
        exe(IDS.int())
    with pytest.raises(TypeError, match="NEFF takes 1 tensors, got 2"):
        exe(IDS, IDS)
    short = NeffExecutable(exe.model, lambda inputs, model: [], exe.input_specs, exe.output_specs)
    with pytest.raises(RuntimeBindingError, match="returned 0 tensors where its cache entry records 2 outputs"):
        short(IDS)
    monkeypatch.setenv("FAKE_NEURON_RUNTIME_MODE", "load-fails")
    with pytest.raises(RuntimeBindingError, match=r"could not load .*graph.neff.*NEURON_RT_VISIBLE_CORES=6-7"):
        NeffExecutable.load(neff.read_bytes(), [TensorSpec((1, 4), "int64")], [], path=neff)


# -- the seam: the loader by recorded format ---------------------------------------------------------------
def test_neff_entries_run_through_the_runtime_once_per_process(tmp_path, fake_cc, fake_runtime, monkeypatch):
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "2-3")
    model, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        out = cm(IDS)
        again = cm(IDS)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    md = entry.metadata()
    assert md["compiler"]["format"] == "neff" and {"shape": [1, 4], "dtype": "int64"} in md["input_specs"]
    # the fake runtime returns zeros of the recorded shape: these outputs came from the "NEFF", not from eager
    assert out.shape == again.shape == (1, 4, 6) and not out.any()
    assert model(IDS).min() >= 1.0
    (load,) = fake_runtime.LOADS
    assert load["visible_cores"] == "2-3"
    assert load["inputs"] == expected_metaneff(md["input_specs"], "input")  # described from the recorded specs
    assert load["outputs"] == [{"name": "output0", "shape": [1, 4, 6], "dtype": "FLOAT"}]
    assert load["neff_sha256"] and len(fake_runtime.CALLS) == 2
    torch._dynamo.reset()  # Dynamo compiles the graph again: the loaded NEFF is reused, not reloaded
    _, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        cm(IDS)
    assert len(fake_runtime.LOADS) == 1 and len(fake_runtime.CALLS) == 3
    assert executables.eager_output_graphs() == {}


def test_neff_without_binding_fails_with_what_to_install(tmp_path, fake_cc):
    _, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode(), pytest.raises(RuntimeBindingError) as err:
        cm(IDS)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    text = str(err.value)
    assert f"key {entry.key}" in text and "a graph with no graph type" in text and "graph type None" not in text
    assert "pip install torch-neuronx --extra-index-url=https://pip.repos.neuron.amazonaws.com" in text
    assert "--neuron-allow-eager-outputs" in text and "allow_eager_outputs=True" in text
    assert entry.status == "complete"  # the NEFF was compiled and cached; only running it is impossible


@pytest.mark.parametrize("how", ["option", "env"])
def test_allowed_eager_outputs_say_so(tmp_path, fake_cc, monkeypatch, caplog, how):
    if how == "env":
        monkeypatch.setenv(executables.ALLOW_EAGER_ENV, "1")
    model, cm = compile_embedder(tmp_path / "cache", **({"allow_eager_outputs": True} if how == "option" else {}))
    with caplog.at_level(logging.WARNING, logger="neuron_args.executables"), torch.inference_mode():
        out = cm(IDS)
        cm(IDS)
    torch.testing.assert_close(out, model(IDS))
    (entry,) = CompileCache(tmp_path / "cache").entries()
    assert executables.eager_output_graphs() == {entry.key: None}
    warnings = [r.getMessage() for r in caplog.records if "eager PyTorch" in r.getMessage()]
    assert len(warnings) == 1 and "no Neuron runtime binding" in warnings[0]


def test_eager_outputs_notice_for_the_session_summary():
    assert executables.eager_outputs_notice({}) is None
    line = executables.eager_outputs_notice({"k1": "decode", "k2": "prefill", "k3": "decode", "k4": None})
    assert line.startswith("NEFF OUTPUTS NOT EXECUTED: 4 graphs (graph types decode, prefill)")
    assert "eager PyTorch" in line and "--neuron-allow-eager-outputs" in line
    assert "1 graph compiled" in executables.eager_outputs_notice({"k": None})


def test_option_false_overrides_the_environment(monkeypatch):
    monkeypatch.setenv(executables.ALLOW_EAGER_ENV, "1")
    assert executables.allow_eager_outputs() is True
    assert executables.allow_eager_outputs(False) is False
    monkeypatch.setenv(executables.ALLOW_EAGER_ENV, "0")
    assert executables.allow_eager_outputs(None) is False


def test_unknown_recorded_format_names_the_entry_and_the_fix(tmp_path, fake_cc, fake_runtime):
    _, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        cm(IDS)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    md = entry.metadata()
    entry.write_metadata({**md, "compiler": {**md["compiler"], "format": "tpu-blob"}})
    _forget_loaded()
    with pytest.raises(NeuronArgsError, match=rf"cache entry {entry.key} \(graph type 'decode'\): metadata.json records "
                                              r"executable format 'tpu-blob'.*remove the entry"):
        executables.load_executable(entry, graph_type="decode", allow_eager=False)
    entry.write_metadata({k: v for k, v in md.items() if k != "output_specs"})
    with pytest.raises(NeuronArgsError, match=r"records no valid input_specs/output_specs"):
        executables.load_executable(entry, graph_type="decode", allow_eager=False)


@pytest.mark.parametrize("swap", ["link", "bytes", "fifo"])
def test_the_executable_is_checked_as_it_is_read(tmp_path, fake_cc, fake_runtime, swap):
    """An executable swapped after its entry was verified (for a link to a good copy, other bytes of its size, a
    FIFO) never loads: the read is the check, so the seam moves the entry aside and rebuilds it."""
    _, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        cm(IDS)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    path, good = entry.executable_path, entry.executable_path.read_bytes()
    _forget_loaded()  # verified in this process, not loaded: the next load reads the file again
    path.unlink()
    if swap == "link":
        (tmp_path / "copy.neff").write_bytes(good)
        path.symlink_to(tmp_path / "copy.neff")
    elif swap == "bytes":
        path.write_bytes(bytes(len(good)))
    else:
        os.mkfifo(path)
    got: dict[str, Any] = {}

    def load() -> None:
        try:
            got["exe"] = executables.load_executable(entry, graph_type="decode", allow_eager=False)
        except Exception as exc:  # noqa: BLE001 - asserted below
            got["error"] = exc

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "the executable's read blocked"
    assert isinstance(got.get("error"), CorruptEntryError), got
    assert f"cache entry {entry.key} (graph type 'decode')" in str(got["error"])
    assert {"link": "a link", "bytes": "sha256", "fifo": "not a regular file"}[swap] in got["error"].problem
    assert len(fake_runtime.LOADS) == 1  # the first load only
    torch._dynamo.reset()
    _, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        cm(IDS)  # the seam moves the entry aside and rebuilds it
    assert entry.executable_path.read_bytes() == good and len(fake_runtime.LOADS) == 2


# -- real processes: warmup, then serve from a fresh process ----------------------------------------------------
SCRIPT = textwrap.dedent('''
    import json, sys, torch
    from neuron_args.graphs import GraphSpec
    from neuron_args.runner import NeuronRunner
    from neuron_args.flags import with_optimization_level

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.proj = torch.nn.Linear(8, 6)
        def forward(self, ids):
            return self.proj(self.emb(ids)).relu() + 1.0
        def neuron_graphs(self):
            return [GraphSpec("prefill", self, {"s4": lambda: {"ids": torch.zeros(1, 4, dtype=torch.long)}}),
                    GraphSpec("decode", self, {"b1": lambda: {"ids": torch.zeros(1, 1, dtype=torch.long)}})]
        def compiler_args_for(self, graph_type, example_inputs, base):
            return with_optimization_level(base, 3) if graph_type == "decode" else list(base)

    phase, cache = sys.argv[1], sys.argv[2]
    runner = NeuronRunner(Model(), compiler_args="-O1", compiler="neuronx-cc", cache_dir=cache)
    if phase != "serve":
        runner.warmup(flow="parallel" if phase == "parallel" else "in-process", emit=False)
    with runner.serve():
        outs = [runner.run("prefill", {"ids": torch.ones(1, 4, dtype=torch.long)}),
                runner.run("decode", {"ids": torch.ones(1, 1, dtype=torch.long)}),
                runner.run("decode", {"ids": torch.full((1, 1), 7, dtype=torch.long)})]
    print(json.dumps([[list(o.shape), float(o.abs().sum())] for o in outs]))
''')


@pytest.mark.slow
def test_warmup_then_serve_in_fresh_processes_load_each_neff_once(tmp_path, fake_cc):
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    record, cc_record = tmp_path / "runtime.jsonl", tmp_path / "cc.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "NEURON_VISIBLE_DEVICES": "4-5",
           "FAKE_NEURON_RUNTIME_RECORD": str(record), "FAKE_NEURONX_CC_RECORD": str(cc_record)}
    cache = tmp_path / "cache"
    for phase, extra in (("warmup", {}), ("serve", {"NEURON_LIBTORCH_ASSERT_CACHE_HIT": "1"})):
        run = subprocess.run([sys.executable, str(script), phase, str(cache)], env={**env, **extra},
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.strip().splitlines()[-1]) == [[[1, 4, 6], 0.0], [[1, 1, 6], 0.0],
                                                                   [[1, 1, 6], 0.0]]
    compiles = [json.loads(line) for line in cc_record.read_text().splitlines()]
    assert sum(argv[:1] == ["compile"] for argv in compiles) == 2  # two graphs, compiled by the warmup only
    events = [json.loads(line) for line in record.read_text().splitlines()]
    loads = [e for e in events if e["event"] == "load"]
    by_pid: dict[int, list] = {}
    for e in loads:
        by_pid.setdefault(e["pid"], []).append(e)
    assert len(by_pid) == 2 and all(len(v) == 2 for v in by_pid.values())  # one load per graph per process
    assert {e["visible_cores"] for e in loads} == {"4-5"}
    expected = sorted(json.dumps([expected_metaneff(md["input_specs"], "input"),
                                  expected_metaneff(md["output_specs"], "output")])
                      for md in (entry.metadata() for entry in CompileCache(cache).entries()))
    assert len(expected) == 2
    for pid_loads in by_pid.values():  # each process loaded both NEFFs, described from their entries' specs
        assert sorted(json.dumps([e["inputs"], e["outputs"]]) for e in pid_loads) == expected
    calls = [e for e in events if e["event"] == "call"]
    assert len(calls) >= 6  # every served call ran a NEFF (warmup calls too)


@pytest.mark.slow
def test_deferred_flow_serves_its_neffs_through_the_runtime(tmp_path, fake_cc):
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    record = tmp_path / "runtime.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "NEURON_VISIBLE_DEVICES": "1",
           "FAKE_NEURON_RUNTIME_RECORD": str(record)}
    run = subprocess.run([sys.executable, str(script), "parallel", str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])[0] == [[1, 4, 6], 0.0]
    events = [json.loads(line) for line in record.read_text().splitlines()]
    loads = [e for e in events if e["event"] == "load"]
    assert len(loads) == 2 and {e["visible_cores"] for e in loads} == {"1"}
    # the warmup ran each graph once in this process (its trace, as soon as parallel_compile built it); serve ran 3
    assert sum(e["event"] == "call" for e in events) == 2 + 3
    assert {e.status for e in CompileCache(tmp_path / "cache").entries()} == {"complete"}


# -- the real binding, on a Neuron host ---------------------------------------------------------------------------
@pytest.mark.neuron_hardware
def test_real_neff_matches_eager(tmp_path):
    if shutil.which("neuronx-cc") is None or importlib.util.find_spec("torch_neuronx") is None:
        pytest.skip("needs neuronx-cc on PATH and torch-neuronx installed (pip install -e '.[neuron]' from the "
                    "Neuron repository)")
    model, cm = compile_embedder(tmp_path / "cache")
    with torch.inference_mode():
        out = cm(IDS)
    torch.testing.assert_close(out, model(IDS), rtol=2e-2, atol=2e-2)
    assert executables.eager_output_graphs() == {}


# -- the plugin option ------------------------------------------------------------------------------------------
def test_allow_eager_outputs_option_and_ini_key(neuron_project: pytest.Pytester, monkeypatch) -> None:
    neuron_project.makepyfile(test_setting="""
        import os

        def test_setting(neuron_settings):
            assert neuron_settings.allow_eager_outputs is (os.environ["EXPECT"] == "1")
    """)
    for args, ini, expect in (([], "", "0"), (["--neuron-allow-eager-outputs"], "", "1"),
                              ([], "neuron_allow_eager_outputs = true\n", "1")):
        neuron_project.makeini(f"[pytest]\n{ini}")
        monkeypatch.setenv("EXPECT", expect)
        neuron_project.runpytest(*args).assert_outcomes(passed=1)


SERVED_TEST = """
    import torch

    def test_served(neuron_served):
        out = neuron_served.run("decode", {"x": torch.ones(1, 8)})
        assert out.shape == (1, 4) and not out.any()  # zeros: the fake runtime ran the NEFF
"""


@pytest.mark.slow
def test_plugin_serves_neffs_through_the_runtime(neuron_project: pytest.Pytester, tmp_path, fake_cc,
                                                 fake_runtime) -> None:
    neuron_project.makepyfile(test_served=SERVED_TEST)
    result = neuron_project.runpytest("--neuron-compiler", "neuronx-cc", "--neuron-cache-dir", str(tmp_path / "c"))
    result.assert_outcomes(passed=1)
    assert len(fake_runtime.LOADS) == 2 and fake_runtime.CALLS  # both graphs warmed up, loaded once


@pytest.mark.slow
def test_plugin_run_without_the_binding_fails_with_what_to_install(neuron_project: pytest.Pytester, tmp_path,
                                                                    fake_cc) -> None:
    neuron_project.makepyfile(test_served=SERVED_TEST)
    result = neuron_project.runpytest("--neuron-compiler", "neuronx-cc", "--neuron-cache-dir", str(tmp_path / "c"))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*RuntimeBindingError: graph type * compiled to a NEFF*",
                                 "*fix: pip install torch-neuronx --extra-index-url=https://pip.repos.neuron.amazonaws.com*"])
