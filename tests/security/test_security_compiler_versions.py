"""A key hashes its compiler's version: no path builds it with another version and stores that under the key."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from neuron_args.cache import CompileCache
from neuron_args.deferred import parallel_compile

FAKE_SOURCE = Path(__file__).resolve().parents[1] / "fakes" / "farm_neuronx_cc.py"
INSTALLED, CAPTURED = "2.21.0.0", "2.19.1.0"


@pytest.fixture
def fake_cc(tmp_path, monkeypatch):
    """The farm's stand-in ``neuronx-cc`` (version 2.21.0.0) first on PATH; the folder where it records calls."""
    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    exe = bindir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SOURCE.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FARM_FAKE_STATE", str(state))
    monkeypatch.setenv("FARM_FAKE_VERSION", INSTALLED)
    return state


def pending(root: Path, name: str, version: str) -> str:
    """A pending entry captured (its key computed) for neuronx-cc ``version``."""
    key = hashlib.md5(f"{root}/{name}".encode()).hexdigest()
    entry = CompileCache(root).entry(key)
    entry.reset()
    entry.hlo_path.write_bytes(f"FARM:ok:{name}".encode())
    entry.write_metadata({
        "metadata_version": 1, "key": key, "seam": "neuron_libtorch_graph_capture", "graph_type": "decode",
        "compiler_args": ["-O1"], "target": "trn2", "status": "pending",
        "compiler": {"name": "neuronx-cc", "version": version, "format": "neff"},
        "key_components": {"tool_versions": {"compiler": f"neuronx-cc {version}"}},
    })
    return key


def test_own_threads_refuse_a_key_computed_for_another_compiler_version(tmp_path, fake_cc):
    """The compiler was upgraded between capture and parallel_compile: the executable 2.21 would build must not be
    stored under the key 2.19 hashed (a 2.19 server would load it as a hit); the farm refuses it already."""
    root = tmp_path / "cache"
    key = pending(root, "upgraded", CAPTURED)
    report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
    (g,) = report.graphs
    assert g.status == "failed", g
    assert key in g.error and "'decode'" in g.error and "fix:" in g.error
    assert f"version {INSTALLED!r}" in g.error and repr(CAPTURED) in g.error
    entry = CompileCache(root).entry(key)
    assert entry.status == "pending" and not entry.executable_path.exists()
    assert not (fake_cc / "upgraded.calls").exists()  # refused before the compiler ran


def test_own_threads_build_a_key_computed_for_the_installed_version(tmp_path, fake_cc):
    root = tmp_path / "cache"
    key = pending(root, "same", INSTALLED)
    report = parallel_compile(root, workers=1, quiet=True)
    assert [g.status for g in report.graphs] == ["compiled"]
    assert CompileCache(root).entry(key).info().compiler_version == INSTALLED


def test_a_build_killed_after_its_metadata_before_its_marker_is_built_again(tmp_path, fake_cc):
    """parallel_compile killed between metadata.json ("compiled") and the marker: the entry is crashed, its
    capture intact; the next parallel_compile builds it (it skipped it silently, and the warmup's serve missed)."""
    import json

    from neuron_args.deferred.parallel_compile import pending_keys

    root = tmp_path / "cache"
    key = pending(root, "killed", INSTALLED)
    entry = CompileCache(root).entry(key)
    doc = json.loads(entry.metadata_path.read_text())
    entry.write_metadata({**doc, "status": "compiled"})
    assert entry.status == "crashed"
    assert pending_keys(root) == [key]
    report = parallel_compile(root, workers=1, quiet=True)
    assert [(g.key, g.status) for g in report.graphs] == [(key, "compiled")]
    assert entry.is_complete and (fake_cc / "killed.calls").exists()


def test_an_entry_recording_no_arguments_is_not_built_with_base_arguments_its_key_does_not_hold(tmp_path, fake_cc):
    """metadata.json without compiler_args (damaged, or edited) but a key hashing -O1: parallel_compile's base
    arguments -O3 would build an executable its key does not describe; refused, naming the key and the fix."""
    import json

    from neuron_args.flags import CompilerArgs

    root = tmp_path / "cache"
    key = pending(root, "unrecorded", INSTALLED)
    entry = CompileCache(root).entry(key)
    doc = json.loads(entry.metadata_path.read_text())
    doc.pop("compiler_args")
    doc["key_components"]["compiler_args"] = list(CompilerArgs.of(["-O1"]).canonical)
    entry.write_metadata(doc)
    report = parallel_compile(root, workers=1, base_compiler_args=["-O3"], quiet=True, raise_on_error=False)
    (g,) = report.graphs
    assert g.status == "failed" and key in g.error and "the key holds" in g.error and "fix:" in g.error
    assert entry.status == "pending" and not (fake_cc / "unrecorded.calls").exists()
    report = parallel_compile(root, workers=1, base_compiler_args=["-O1"], quiet=True)  # the key's own: built
    assert [g.status for g in report.graphs] == ["compiled"]
