"""A key hashes its compiler's version and arguments: no path builds it another way and stores that under the key;
a build killed before its marker is built again; a farm worker's log past the cap is sent as its end."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from neuron_args.cache import CompileCache
from neuron_args.deferred import parallel_compile
from tests.faults.fault_helpers import FAKE_CC_VERSION as INSTALLED

CAPTURED = "2.19.1.0"


def compiles(record: Path) -> list[list[str]]:
    """The compile command lines the fake neuronx-cc ran (its --version probes left out)."""
    lines = record.read_text().splitlines() if record.exists() else []
    return [argv for argv in map(json.loads, lines) if argv[:1] == ["compile"]]


def pending(root: Path, name: str, version: str) -> str:
    """A pending entry captured (its key computed) for neuronx-cc ``version``."""
    key = hashlib.md5(f"{root}/{name}".encode()).hexdigest()
    entry = CompileCache(root).entry(key)
    entry.reset()
    entry.hlo_path.write_bytes(f"hlo module {name}".encode())
    entry.write_metadata({
        "metadata_version": 1, "key": key, "seam": "neuron_libtorch_graph_capture", "graph_type": "decode",
        "compiler_args": ["-O1"], "target": "trn2", "status": "pending",
        "compiler": {"name": "neuronx-cc", "version": version, "format": "neff"},
        "key_components": {"tool_versions": {"compiler": f"neuronx-cc {version}"}},
    })
    return key


def test_own_threads_refuse_a_key_computed_for_another_compiler_version(tmp_path, fake_env):
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
    assert not compiles(fake_env.record)  # refused before the compiler ran


def test_own_threads_build_a_key_computed_for_the_installed_version(tmp_path, fake_env):
    root = tmp_path / "cache"
    key = pending(root, "same", INSTALLED)
    report = parallel_compile(root, workers=1, quiet=True)
    assert [g.status for g in report.graphs] == ["compiled"]
    assert CompileCache(root).entry(key).info().compiler_version == INSTALLED


def test_a_build_killed_after_its_metadata_before_its_marker_is_built_again(tmp_path, fake_env):
    """parallel_compile killed between metadata.json ("compiled") and the marker: the entry is crashed, its
    capture intact; the next parallel_compile builds it (it skipped it silently, and the warmup's serve missed)."""
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
    assert entry.is_complete and len(compiles(fake_env.record)) == 1


def test_an_entry_recording_no_arguments_is_not_built_with_base_arguments_its_key_does_not_hold(tmp_path, fake_env):
    """metadata.json without compiler_args (damaged, or edited) but a key hashing -O1: parallel_compile's base
    arguments -O3 would build an executable its key does not describe; refused, naming the key and the fix."""
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
    assert entry.status == "pending" and not compiles(fake_env.record)
    report = parallel_compile(root, workers=1, base_compiler_args=["-O1"], quiet=True)  # the key's own: built
    assert [g.status for g in report.graphs] == ["compiled"]


def test_a_worker_sends_the_tail_of_a_log_past_the_cap_not_an_invalid_result(tmp_path, fake_env, monkeypatch):
    """A verbose compile's log larger than the cap on what a worker may send (lowered here): the worker sends its
    end (where the errors are), and the good executable is committed, not refused as an invalid result."""
    from neuron_args import deferred
    from neuron_args.cache import CompileCache
    from neuron_args.deferred.farm import commit_outcome, prepare_task, run_compile_task

    monkeypatch.setattr(deferred.farm, "MAX_LOG_BYTES", 24)
    root = tmp_path / "cache"
    entry = CompileCache(root).entry(pending(root, "verbose", INSTALLED))
    md = entry.info()
    outcome = run_compile_task(prepare_task(entry, md, ["-O1"]))
    assert outcome.status == "compiled", outcome.error
    assert len(outcome.log) == 24 and outcome.log.endswith(b"\n")
    assert commit_outcome(entry, md, prepare_task(entry, md, ["-O1"]), outcome) > 0
    assert entry.is_complete and entry.log_path.read_bytes() == outcome.log
