"""Torn and wrong ledger lines, a garbage NEURON_VISIBLE_DEVICES, and a full disk (a tiny tmpfs).

The ledger cases run the writers as real processes; the full-disk cases run where root can mount
a tmpfs (skipped elsewhere, saying so).
"""
from __future__ import annotations

import json
import logging
import os
import sys
import textwrap

import pytest
import torch

from neuron_args.cache import CompileCache
from neuron_args.cli import main as cli
from neuron_args.errors import CompileError
from neuron_args.manifest import ledger
from neuron_args.manifest.emit import emit_manifest
from neuron_args.manifest.ledger import record_graph
from neuron_args.deferred.parallel_compile import parallel_compile
from tests.faults.fault_helpers import fill, make_pending
from tests.models import make_mlp, mlp_inputs

pytestmark = pytest.mark.usefixtures("clean_ledger")

WRITER = textwrap.dedent("""
    import os, sys
    from neuron_args.manifest import ledger
    from neuron_args.manifest.ledger import record_graph
    keys = sys.argv[1:]
    record_graph(key=keys[0], input_shapes=["4, 16"], compiler_flags="-O1", graph_type="prefill")
    # a write that died half-way: the first half of a line, no newline (what a kill mid-write leaves)
    path = os.path.join(ledger.ledger_dir(os.environ["VLLM_NEURON_MANIFEST_DIR"], "nodev"), f"{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'{"key":"' + keys[1].encode() + b'","rank":0,"input_sha')
    os.close(fd)
    for key in keys[2:]:
        record_graph(key=key, input_shapes=["1, 16"], compiler_flags="-O3", graph_type="decode")
    print("WROTE", os.getpid())
""")


def _key(i: int) -> str:
    return f"{i:02x}" * 16


@pytest.mark.slow
def test_a_torn_line_does_not_swallow_the_graphs_written_after_it(tmp_path, fake_env, reaper, monkeypatch, caplog,
                                                                capsys):
    root = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    keys = [_key(i) for i in range(1, 6)]
    env = {**fake_env.env, "VLLM_NEURON_MANIFEST_DIR": str(root)}
    proc = reaper.popen([sys.executable, str(script), *keys], env)
    out, err = proc.communicate(timeout=60)
    assert out.startswith("WROTE"), err
    # and a foreign writer's records whose values could never make a valid manifest entry
    folder = root / "ledger" / "nodev"
    (folder / "999999.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"key": "not-a-key", "rank": 0, "input_shapes": ["4,"], "compiler_flags": "-O1"},
        {"key": ("ab" * 16).upper(), "rank": 0, "input_shapes": ["4,"], "compiler_flags": "-O1"},
        {"key": _key(10), "rank": -1, "input_shapes": ["4,"], "compiler_flags": "-O1"},
        {"key": _key(11), "rank": True, "input_shapes": ["4,"], "compiler_flags": "-O1"},
        {"key": _key(12), "rank": 0, "input_shapes": ["4 x 16"], "compiler_flags": "-O1"},
        {"key": _key(13), "rank": 0, "input_shapes": ["4,"], "compiler_flags": 7},
        {"key": _key(14), "rank": 1, "input_shapes": ["4,"], "compiler_flags": "-O1"},  # valid
    ]) + "\n")
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        path = emit_manifest(cache_dir=None)
    doc = json.loads(path.read_text())
    # the torn graph is lost (it was never written whole); every graph after it is there
    assert [g["graph_hash"] for g in doc["graphs"]] == sorted([keys[0], *keys[2:], _key(14)])
    warning = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert "skipped 7 ledger line(s)" in warning
    assert "1 torn or non-JSON" in warning
    assert "2 key is not 32 lowercase hex characters" in warning
    assert "2 rank is not a non-negative integer" in warning
    assert "1 input_shapes is not a list of shape strings" in warning
    assert "1 compiler_flags is not a string or a list of strings" in warning
    assert cli(["manifest", "validate", str(path)]) == 0
    assert "OK:" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["²", "0-99999999999", "abc", "1,,2", "٣"])
def test_a_garbage_visible_devices_warning_names_the_variable(tmp_path, monkeypatch, caplog, value):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", value)
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        record_graph(key=_key(1), input_shapes=["4,"], compiler_flags="-O1")
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"NEURON_VISIBLE_DEVICES={value!r}" in message and "Fix NEURON_VISIBLE_DEVICES" in message


# ------------------------------------------------------------------------------------------ full disk


def test_a_full_disk_tears_a_ledger_line_and_the_next_graphs_survive(tiny_disk, monkeypatch, caplog, capsys):
    """A real short write: the ledger line that crosses into a page the full tmpfs cannot give."""
    root = tiny_disk / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    written, i = [], 0
    path = root / "ledger" / "nodev" / f"{os.getpid()}.jsonl"

    def line_length(key: str) -> int:
        return len(ledger._encode(key, 0, ["4, 16"], "-O1", "decode"))

    while True:  # fill the ledger's first page until the next line no longer fits in it
        key = _key(i)
        if path.exists() and path.stat().st_size + line_length(key) > 4096:
            break
        record_graph(key=key, input_shapes=["4, 16"], compiler_flags="-O1", graph_type="decode")
        written.append(key)
        i += 1
    filler = fill(tiny_disk)
    size = path.stat().st_size
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        record_graph(key=_key(i), input_shapes=["4, 16"], compiler_flags="-O1", graph_type="decode")
    assert 4096 > size and path.stat().st_size == 4096  # half a line went in, then ENOSPC
    assert "No space left on device" in caplog.text
    filler.unlink()
    later = [_key(j) for j in range(i + 1, i + 4)]
    for key in later:
        record_graph(key=key, input_shapes=["1, 16"], compiler_flags="-O3", graph_type="decode")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        manifest = emit_manifest(cache_dir=None)
    doc = json.loads(manifest.read_text())
    assert [g["graph_hash"] for g in doc["graphs"]] == sorted(written + later)
    assert "skipped 1 ledger line(s)" in caplog.text and "1 torn or non-JSON" in caplog.text
    assert cli(["manifest", "validate", str(manifest)]) == 0
    capsys.readouterr()


def test_a_full_disk_fails_the_compile_cleanly_and_a_rerun_completes(tiny_disk, monkeypatch):
    """The embedded compiler on a full cache disk: a CompileError with the key and the fix, no
    complete entry; once space is back the same call compiles."""
    for name in ("NEURON_LIBTORCH_ASSERT_CACHE_HIT", "NEURON_ARGS_COMPILE_TIMEOUT", "NEURON_CC_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    cache_dir = tiny_disk / "cache"
    model, (x,) = make_mlp(), mlp_inputs()
    opts = {"cache_dir": str(cache_dir), "compiler": "local", "compiler_args": ["-O1"]}
    filler = fill(tiny_disk)
    torch._dynamo.reset()
    with torch.inference_mode(), pytest.raises(CompileError) as err:
        torch.compile(model, backend="neuron_libtorch", options=opts, dynamic=False)(x)
    message = str(err.value)
    (entry,) = CompileCache(cache_dir).entries()
    assert f"cache entry {entry.key}" in message and "No space left on device" in message
    assert "fix: free space on the file system" in message
    assert not entry.is_complete
    filler.unlink()
    torch._dynamo.reset()
    with torch.inference_mode():
        y = torch.compile(model, backend="neuron_libtorch", options=opts, dynamic=False)(x)
        torch.testing.assert_close(y, model(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    (entry,) = CompileCache(cache_dir).entries()
    assert entry.status == "complete" and entry.problem() is None


EFBIG_SCRIPT = """
import resource, sys
from neuron_args.cache import CompileCache
from neuron_args.cache_key import create_cache_hash
key = create_cache_hash(graph_sha256="cd" * 32, input_specs=[((4, 16), "float32")], compiler_args=["-O1"],
                        target="trn2", tool_versions={"compiler": "local test"})
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    CompileCache(sys.argv[1]).get_or_build(key, lambda entry: entry.hlo_path.write_bytes(b"h" * 8192),
                                           graph_type="prefill")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.slow
def test_a_file_size_limit_is_named_as_such_not_blamed_on_the_graph(tmp_path, fake_env, monkeypatch):
    """A job under `ulimit -f` (batch schedulers set one): the compiler's write of the executable and the cache's
    own writes fail with EFBIG ("File too large"). The fix said "fix the graph or its compiler arguments"
    (the compiler's failure) and "check the file system" (the cache's)."""
    import subprocess

    monkeypatch.setenv("FAKE_NEURONX_CC_FILE_LIMIT", "16")
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    (graph,) = parallel_compile(root, workers=1, quiet=True, raise_on_error=False).graphs
    assert graph.status == "failed" and key in graph.error and "'decode0'" in graph.error
    assert "File too large" in graph.error  # the compiler's traceback, in the log tail
    assert f"fix: the compiler hit a file-size limit writing into {root / key}: raise the job's limit (`ulimit -f`) " \
           "or point the compile cache to a file system that takes files this large" in graph.error
    done = subprocess.run([sys.executable, "-c", EFBIG_SCRIPT, str(tmp_path / "cache2")], capture_output=True,
                          text=True, timeout=120, env=fake_env.env)
    assert done.stdout.startswith("CompileError cannot write cache entry "), done.stdout + done.stderr
    assert "(graph type 'prefill')" in done.stdout and "File too large (EFBIG)" in done.stdout
    assert "fix: raise the job's file-size limit (`ulimit -f`) or point the cache elsewhere" in done.stdout
