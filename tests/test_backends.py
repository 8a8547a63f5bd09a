"""The compile path end to end: torch.compile seams -> HLO -> compiler -> executable, keyed on the scope."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_args import CacheKeyArgsConflict, CacheMissError, CompileError, scoped_compiler_args
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, STATS, CompileCache
from neuron_args.seams import records
from tests.models import decoder_inputs, make_decoder, make_mlp, mlp_inputs

REPO = Path(__file__).resolve().parents[1]
FAKE_CC = REPO / "tests" / "fakes" / "neuronx_cc.py"


def options(cache_dir, **over):
    return {"cache_dir": str(cache_dir), "compiler_args": ["--auto-cast=none", "-O1"], "target": "trn2",
            "compiler": "local", **over}


def compile_(model, cache_dir, backend="neuron_libtorch", **over):
    return torch.compile(model, backend=backend, options=options(cache_dir, **over), dynamic=False)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    torch._dynamo.reset()
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...


@pytest.fixture(scope="module")
def mlp_cache(tmp_path_factory):
    """A cache holding the MLP compiled at the base args (-O1) and under an -O3 scope."""
    root = tmp_path_factory.mktemp("mlp-cache")
    torch._dynamo.reset()
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, root)
    with torch.inference_mode():
        cm(x)
        with scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
            cm(x)
    return root


def entries_by_level(root):
    out = {}
    for e in CompileCache(root).entries():
        md = e.metadata()
        out[md["compiler_args"][-1]] = (e, md)
    return out


def test_different_scopes_give_different_keys_and_entries(mlp_cache):
    by_level = entries_by_level(mlp_cache)
    assert sorted(by_level) == ["-O1", "-O3"]
    (e1, md1), (e3, md3) = by_level["-O1"], by_level["-O3"]
    assert e1.key != e3.key and e1.status == e3.status == "complete"
    assert md3["graph_type"] == "decode" and md1["graph_type"] is None
    assert md3["key_components"]["compiler_args"] == ["--auto-cast=none", "-O3"]
    # the -O level reaches the compiler: it is in the recorded command and in the compile log
    assert "-O3" in e3.command_path.read_text() and "-O1" in e1.command_path.read_text()
    assert "xla_backend_optimization_level" in e3.log_path.read_text()
    assert md3["compiler"]["name"] == "local" and md3["compiler"]["format"] == "xla-cpu-executable"
    assert e3.executable_path.name == f"graph_{e3.key}.neff"
    assert md3["output_shapes"] == ["4, 16"] and md3["input_shapes"] == ["4, 32"]


def test_scope_at_call_time_picks_the_variant_and_hits_after_first_call(mlp_cache):
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, mlp_cache)
    with torch.inference_mode():
        ref = model(x)
        base = cm(x)
        with scoped_compiler_args(["--auto-cast=none", "-O3"]):
            o3 = cm(x)
    assert STATS.snapshot() == {"hits": 2, "misses": 0, "compiles": 0, "captures": 0}
    torch.testing.assert_close(base, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o3, ref, rtol=1e-5, atol=1e-5)
    assert {r.optimization_level for r in records.records()} == {1, 3}


def test_serve_path_does_no_file_io_after_first_call(mlp_cache, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(mlp_cache, root)
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, root)
    with torch.inference_mode():
        first = cm(x)
        shutil.rmtree(root)  # the variant is loaded: nothing on disk is needed any more
        again = cm(x)
    torch.testing.assert_close(first, again)


def test_unscoped_serve_call_under_assert_names_the_differing_argument(mlp_cache, monkeypatch, tmp_path):
    import shutil

    root = tmp_path / "only-o3"
    shutil.copytree(mlp_cache, root)
    shutil.rmtree(entries_by_level(root)["-O1"][0].path)  # warmed up only under the decode scope
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, root)
    with torch.inference_mode():
        with scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
            cm(x)  # hit
        with pytest.raises(CacheMissError) as err:
            cm(x)  # outside the scope -> base args -> a key nobody warmed up
    msg = str(err.value)
    assert "compiler_args: changed -O3 -> -O1" in msg
    assert entries_by_level(root)["-O3"][0].key in msg


FRESH = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[2])
    from neuron_args import scoped_compiler_args
    from neuron_args.cache import STATS
    from neuron_args.seams import records
    from tests.models import make_mlp, mlp_inputs
    model, (x,) = make_mlp(), mlp_inputs()
    cm = torch.compile(model, backend="neuron_libtorch", dynamic=False, options={
        "cache_dir": sys.argv[1], "compiler_args": ["--auto-cast=none", "-O1"], "target": "trn2", "compiler": "local"})
    with torch.inference_mode(), scoped_compiler_args(["--auto-cast=none", "-O3"]):
        out = cm(x)
    print(json.dumps({"stats": STATS.snapshot(), "keys": [r.key for r in records.records()],
                      "diff": float((out - model(x)).abs().max())}))
""")


@pytest.mark.slow
def test_same_scope_in_a_fresh_process_hits_the_same_key(mlp_cache):
    env = {**os.environ, ASSERT_CACHE_HIT_ENV: "1"}
    run = subprocess.run([sys.executable, "-c", FRESH, str(mlp_cache), str(REPO)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["stats"] == {"hits": 1, "misses": 0, "compiles": 0, "captures": 0}
    assert got["keys"] == [entries_by_level(mlp_cache)["-O3"][0].key]
    assert got["diff"] < 1e-5


@pytest.mark.slow
def test_decoder_block_matches_eager_over_prefill_and_decode_steps(tmp_path):
    model, ref = make_decoder(), make_decoder()
    cm = compile_(model, tmp_path)
    worst = 0.0
    with torch.inference_mode():
        tokens, pos = decoder_inputs(seq=5)
        out, expected = cm(tokens, pos), ref(tokens, pos)
        worst = max(worst, float((out - expected).abs().max()))
        for step in range(3):
            tok = out[:, -1:].argmax(-1)
            p = torch.tensor([5 + step])
            with scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
                out = cm(tok, p)
            expected = ref(tok, p)
            worst = max(worst, float((out - expected).abs().max()))
    assert worst < 1e-4  # float32 on XLA:CPU vs eager: measured ~1e-6
    torch.testing.assert_close(model.k_cache, ref.k_cache, rtol=1e-4, atol=1e-5)  # the cache really updated in place
    torch.testing.assert_close(model.v_cache, ref.v_cache, rtol=1e-4, atol=1e-5)
    kinds = sorted((r.graph_type or "-", r.optimization_level) for r in records.records())
    assert kinds == [("-", 1), ("decode", 3)]


def test_dynamic_shapes_are_refused_with_the_fix(tmp_path):
    model, (x,) = make_mlp(), mlp_inputs()
    cm = torch.compile(model, backend="neuron_libtorch", options=options(tmp_path), dynamic=True)
    with torch.inference_mode(), pytest.raises(Exception) as err:
        cm(x)
    assert "dynamic=False" in str(err.value) and "static" in str(err.value)


def test_native_seam_conflict_in_process(tmp_path):
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, tmp_path, backend="neuron_native_lite")
    with torch.inference_mode():
        cm(x)
        with scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"), \
                pytest.raises(CacheKeyArgsConflict) as err:
            cm(x)
    assert "'decode'" in str(err.value) and "-O3" in str(err.value) and "-O1" in str(err.value)
    md = CompileCache(tmp_path).entries()[0].metadata()
    assert md["key_components"]["compiler_args"] is None and md["compiler_args"] == ["--auto-cast=none", "-O1"]


NATIVE = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from neuron_args import scoped_compiler_args
    from tests.models import make_mlp, mlp_inputs
    model, (x,) = make_mlp(), mlp_inputs()
    cm = torch.compile(model, backend="neuron_native_lite", dynamic=False, options={
        "cache_dir": sys.argv[1], "compiler_args": ["--auto-cast=none", "-O1"], "target": "trn2", "compiler": "local"})
    with torch.inference_mode(), scoped_compiler_args(sys.argv[3:]):
        cm(x)
    print("ok")
""")


@pytest.mark.slow
def test_native_seam_conflict_across_processes(tmp_path):
    """This process builds the entry under -O3 (the options NATIVE uses); a fresh one asking -O2 finds it on disk.
    One fresh process, not two: what matters is that the second process never saw the first's scope."""
    model, (x,) = make_mlp(), mlp_inputs()
    with torch.inference_mode(), scoped_compiler_args(["-O3"]):
        compile_(model, tmp_path, backend="neuron_native_lite")(x)
    second = subprocess.run([sys.executable, "-c", NATIVE, str(tmp_path), str(REPO), "-O2"],
                            capture_output=True, text=True, timeout=300)
    assert second.returncode != 0
    assert "CacheKeyArgsConflict" in second.stderr and "['-O3']" in second.stderr and "['-O2']" in second.stderr


def _install_fake_cc(tmp_path, monkeypatch, mode):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_CC.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", mode)


def test_compiler_crash_is_a_compile_error_and_leaves_no_complete_entry(tmp_path, monkeypatch):
    _install_fake_cc(tmp_path, monkeypatch, "segv")
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, tmp_path / "cache", compiler="neuronx-cc")
    with torch.inference_mode(), pytest.raises(CompileError) as err:
        cm(x)
    assert "segmentation fault" in str(err.value) and "neuronx-cc compile" in str(err.value)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    assert entry.status == "failed" and not entry.executable_path.exists()


def test_fake_neuronx_cc_gets_the_scoped_args(tmp_path, monkeypatch):
    _install_fake_cc(tmp_path, monkeypatch, "ok")
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, tmp_path / "cache", compiler="neuronx-cc", allow_eager_outputs=True)
    with torch.inference_mode(), scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
        out = cm(x)
    # NEFFs are compiled and cached; with no Neuron runtime binding, allowed eager outputs come from PyTorch
    torch.testing.assert_close(out, model(x))
    (entry,) = CompileCache(tmp_path / "cache").entries()
    assert entry.status == "complete" and entry.executable_path.read_bytes()
    argv = entry.command_path.read_text().split()
    assert argv[:2] == ["neuronx-cc", "compile"] and argv[-2:] == ["--auto-cast=none", "-O3"]
    assert argv[argv.index("--target") + 1] == "trn2"
    assert entry.metadata()["compiler"]["name"] == "neuronx-cc"


@pytest.mark.slow
def test_import_does_not_load_jax_and_plain_torch_compile_still_works():
    code = ("import sys, torch, neuron_args, neuron_args.seams.backends;"
            "assert 'jax' not in sys.modules and 'torchax' not in sys.modules, 'jax imported';"
            "from neuron_args.lowering import torchax_compat; torchax_compat.import_torchax();"
            "f = torch.compile(lambda x: x.sin() + 1, backend='eager'); print(float(f(torch.zeros(2)).sum()))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "2.0"


# ------------------------------------------------------------------------------ bad options, timeouts


@pytest.mark.parametrize(("over", "error", "words"), [
    ({"compiler_args": 5}, "CompilerArgsError", ["options['compiler_args'] must be a list", "int 5"]),
    ({"compiler_args": ["-O1", 3]}, "CompilerArgsError", ["options['compiler_args']"]),
    ({"compile_timeout": "soon"}, "OptionsError", ["compile_timeout", "positive number of seconds"]),
    ({"compile_timeout": 0}, "OptionsError", ["compile_timeout"]),
    ({"target": 2}, "OptionsError", ["options['target'] must be a string"]),
    ({"compiler": "gcc"}, "CompilerArgsError", ["unknown compiler 'gcc'"]),
])
def test_bad_options_raise_neuron_args_errors_at_call_time(tmp_path, over, error, words):
    import neuron_args
    from torch._dynamo.exc import BackendCompilerFailed

    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, tmp_path / "cache", **over)
    with torch.inference_mode(), pytest.raises(neuron_args.NeuronArgsError) as err:
        cm(x)
    assert type(err.value).__name__ == error and not isinstance(err.value, BackendCompilerFailed)
    assert all(w in str(err.value) for w in words), str(err.value)
    with torch.inference_mode(), pytest.raises(type(err.value)):  # every later call says the same
        cm(x)


def test_a_cache_dir_that_is_a_file_is_an_options_error(tmp_path):
    from neuron_args.errors import OptionsError

    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    model, (x,) = make_mlp(), mlp_inputs()
    for path in (blocker, blocker / "sub"):
        torch._dynamo.reset()
        with torch.inference_mode(), pytest.raises(OptionsError) as err:
            compile_(model, path)(x)
        assert "pass a directory as options['cache_dir']" in str(err.value)


def test_dynamic_shapes_are_a_lowering_error_saying_dynamic_false(tmp_path):
    from neuron_args.errors import LoweringError

    model = make_mlp()
    cm = torch.compile(model, backend="neuron_libtorch", options={"cache_dir": str(tmp_path), "compiler": "local"},
                       dynamic=True)
    with torch.inference_mode(), pytest.raises(LoweringError) as err:
        cm(mlp_inputs(batch=3)[0])
    assert "dynamic=False" in str(err.value)


def test_compile_timeout_option_kills_a_hung_neuronx_cc(tmp_path, monkeypatch):
    _install_fake_cc(tmp_path, monkeypatch, "ok")
    monkeypatch.setenv("FAKE_NEURONX_CC_SLEEP", "120")
    monkeypatch.setenv("NEURON_ARGS_COMPILE_TIMEOUT", "600")  # the option wins over the environment
    model, (x,) = make_mlp(), mlp_inputs()
    cm = compile_(model, tmp_path / "cache", compiler="neuronx-cc", compile_timeout=1)
    with torch.inference_mode(), pytest.raises(CompileError) as err:
        cm(x)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    message = str(err.value)
    assert "timed out after 1 s" in message and entry.key in message and "command: neuronx-cc compile" in message
    assert "fix: raise the compile timeout" in message
    assert entry.status == "failed" and not entry.executable_path.exists()


def test_compiled_entries_record_size_and_sha256(tmp_path):
    import hashlib

    model, (x,) = make_mlp(), mlp_inputs()
    with torch.inference_mode():
        compile_(model, tmp_path / "cache")(x)
    (entry,) = CompileCache(tmp_path / "cache").entries()
    md, blob = entry.metadata(), entry.executable_path.read_bytes()
    assert md["executable_size"] == len(blob) and md["executable_sha256"] == hashlib.sha256(blob).hexdigest()


def test_each_backend_pickles_as_its_module_level_instance():
    import pickle

    from neuron_args.seams import backends

    for seam in backends.SEAMS:
        backend = getattr(backends, seam)
        assert backend.seam == seam and pickle.loads(pickle.dumps(backend)) is backend
