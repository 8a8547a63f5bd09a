"""Corrupt cache entries and the compile lock, seen by a fresh process and by ``neuron-args cache``.

A warm cache is built once here; each case copies it, damages the copy the way a crash, a full
disk or a bad copy would, and a *new* process (no per-process state) then loads it twice: under
``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` (a ``CacheMissError`` that says corrupt, with the key and the
fix) and without it (the entry is moved aside, rebuilt, and the output is right).
"""
from __future__ import annotations

import json
import shutil
import signal
import sys
import textwrap

import pytest
import torch

from neuron_args.cache import QUARANTINE_DIR, CompileCache
from neuron_args.cli import main as cli
from tests.faults.fault_helpers import wait_until
from tests.models import make_mlp, mlp_inputs

# first: the rerun process loads each key once (later cases are caught by the checksum before any load)
CASES = ("undeserializable-old-entry", "truncated", "missing", "same-size-garbage", "metadata-not-an-object")

RERUN = textwrap.dedent("""
    import json, logging, os, sys
    import torch
    from neuron_args import CacheMissError
    from tests.models import make_mlp, mlp_inputs
    logging.basicConfig(level=logging.WARNING)
    out = {}
    for root in sys.argv[1:]:
        model, (x,) = make_mlp(), mlp_inputs()
        opts = {"cache_dir": root, "compiler": "local", "compiler_args": ["-O1"]}
        torch._dynamo.reset()
        os.environ["NEURON_LIBTORCH_ASSERT_CACHE_HIT"] = "1"
        try:
            with torch.inference_mode():
                torch.compile(model, backend="neuron_libtorch", options=opts, dynamic=False)(x)
            error = None
        except CacheMissError as exc:
            error = str(exc)
        del os.environ["NEURON_LIBTORCH_ASSERT_CACHE_HIT"]
        torch._dynamo.reset()
        with torch.inference_mode():
            y = torch.compile(model, backend="neuron_libtorch", options=opts, dynamic=False)(x)
            ok = torch.allclose(y, model(x), atol=1e-5)
        out[root] = {"error": error, "ok": ok}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache holding the MLP's graph, compiled by the local compiler in this process."""
    root = tmp_path_factory.mktemp("warm-corrupt") / "cache"
    model, (x,) = make_mlp(), mlp_inputs()
    torch._dynamo.reset()
    with torch.inference_mode():
        torch.compile(model, backend="neuron_libtorch", dynamic=False,
                      options={"cache_dir": str(root), "compiler": "local", "compiler_args": ["-O1"]})(x)
    torch._dynamo.reset()
    (entry,) = CompileCache(root).entries()
    md = entry.metadata()
    assert md["executable_size"] == entry.executable_path.stat().st_size and len(md["executable_sha256"]) == 64
    return root


def _damage(root, case):
    (entry,) = CompileCache(root).entries()
    exe, blob = entry.executable_path, entry.executable_path.read_bytes()
    if case == "truncated":
        exe.write_bytes(blob[: len(blob) // 2])
    elif case == "missing":
        exe.unlink()
    elif case == "same-size-garbage":
        exe.write_bytes(bytes(len(blob)))
    elif case == "undeserializable-old-entry":  # no checksum recorded: only the load can tell
        md = entry.metadata()
        del md["executable_size"], md["executable_sha256"]
        entry.write_metadata(md)
        exe.write_bytes(b"not an executable" * 10)
    elif case == "metadata-not-an-object":
        entry.metadata_path.write_text("[1, 2, 3]")
    return entry.key


@pytest.mark.slow
def test_corrupt_entries_are_a_miss_then_moved_aside_and_rebuilt(warm, tmp_path, fake_env, reaper, capsys):
    roots, keys = {}, {}
    for case in CASES:
        roots[case] = tmp_path / case
        shutil.copytree(warm, roots[case])
        keys[case] = _damage(roots[case], case)

    # the CLI: ls shows what a stat can tell, verify checks every checksum
    assert cli(["cache", "ls", str(roots["truncated"])]) == 0
    assert " corrupt " in capsys.readouterr().out
    assert cli(["cache", "ls", str(roots["metadata-not-an-object"])]) == 0
    assert " corrupt " in capsys.readouterr().out
    assert cli(["cache", "verify", str(roots["same-size-garbage"])]) == 1
    out = capsys.readouterr().out
    assert f"corrupt {keys['same-size-garbage']}" in out and "sha256" in out and "--fix" in out

    script = tmp_path / "rerun.py"
    script.write_text(RERUN)
    proc = reaper.popen([sys.executable, str(script), *map(str, roots.values())], fake_env.env)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    results = json.loads(stdout.strip().splitlines()[-1])
    for case, root in roots.items():
        result = results[str(root)]
        assert result["error"] is not None, case
        assert f"cache entry {keys[case]}" in result["error"] and "is corrupt" in result["error"], case
        assert "fix: run the warmup again without NEURON_LIBTORCH_ASSERT_CACHE_HIT" in result["error"], case
        assert result["ok"], case  # rebuilt and right
        (entry,) = CompileCache(root).entries()
        assert entry.status == "complete" and entry.problem() is None, case
        assert len(list((root / QUARANTINE_DIR).iterdir())) == 1, case  # the damaged entry, kept for a post-mortem
        assert f"compile cache entry {keys[case]} was corrupt" in stderr, case
    assert "JaxRuntimeError" not in stderr.split("WARNING")[0]  # no raw runtime error reached the user
    assert cli(["cache", "verify", str(roots["truncated"])]) == 0


@pytest.mark.slow
def test_verify_fix_moves_corrupt_entries_aside(warm, tmp_path, capsys):
    root = tmp_path / "cache"
    shutil.copytree(warm, root)
    key = _damage(root, "truncated")
    assert cli(["cache", "verify", str(root), "--fix"]) == 0
    assert f"corrupt {key}" in capsys.readouterr().out
    assert CompileCache(root).entries() == [] and len(list((root / QUARANTINE_DIR).iterdir())) == 1
    assert cli(["cache", "verify", str(root)]) == 0


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from neuron_args.cache import CompileCache
    cache = CompileCache(sys.argv[1])
    entry = cache.entry(sys.argv[2])
    with cache.lock(entry.key):
        entry.reset()
        entry.write_metadata({"key": entry.key, "status": "compiling", "graph_type": "decode"})
        print("LOCKED", flush=True)
        time.sleep(120)
""")


@pytest.mark.slow
def test_cache_ls_tells_a_compile_in_progress_from_a_crashed_one(tmp_path, fake_env, reaper, capsys):
    root, key = tmp_path / "cache", "5e" * 16
    script = tmp_path / "hold.py"
    script.write_text(HOLD_LOCK)
    proc = reaper.popen([sys.executable, str(script), str(root), key], fake_env.env)
    assert proc.stdout.readline().strip() == "LOCKED"
    assert cli(["cache", "ls", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"compiling (pid {proc.pid})" in out, out
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_until(lambda: CompileCache(root).entry(key).status == "crashed", 5, "the lock released by the dead holder")
    assert cli(["cache", "ls", str(root)]) == 0
    assert " crashed " in capsys.readouterr().out
