"""Cache entries whose metadata disagrees with what the loader or the key needs: fields of another shape (a hand
edit, a sync tool, another neuron-args), an argument set raced in by another process, a captured entry whose
arguments no longer match its key.

Each case reproduces what a real run did before its fix (see the docstrings); the real compiles use the local
compiler on a one-op graph.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from neuron_args import CacheKeyArgsConflict, CacheMissError
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, QUARANTINE_DIR, CompileCache, KeyLock

pytestmark = pytest.mark.usefixtures("fresh_activity")


def _double(x):
    return x * 2 + 1


X = torch.arange(4, dtype=torch.float32)


def _run(root: Path, backend: str = "neuron_libtorch", args: tuple[str, ...] = ("-O1",)) -> torch.Tensor:
    """One call of the one-op graph as a fresh process would make it (no loaded executable, no counters)."""
    torch._dynamo.reset()
    ACTIVITY.reset()
    opts = {"cache_dir": str(root), "compiler": "local", "compiler_args": list(args)}
    return torch.compile(_double, backend=backend, options=opts, dynamic=False)(X)



@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """A cache holding the one-op graph, really compiled (copied by each case before it damages it)."""
    root = tmp_path_factory.mktemp("entry-metadata") / "warm"
    assert torch.equal(_run(root), _double(X))
    torch._dynamo.reset()
    return root


def _copy(warm: Path, tmp_path: Path):
    root = tmp_path / "cache"
    shutil.copytree(warm, root)
    (entry,) = CompileCache(root).entries()
    return root, entry


def _edit_metadata(entry, **fields):
    md = entry.metadata()
    for name, value in fields.items():
        if value is None:
            md.pop(name, None)
        else:
            md[name] = value
    entry.metadata_path.write_text(json.dumps(md))  # sizes and sha256 still match: only the loader could tell


@pytest.mark.parametrize("damage, said", [
    (dict(input_specs=None, output_specs=None), "records no valid input_specs/output_specs"),
    (dict(compiler={"name": "local", "version": "9", "format": "xla-gpu"}), "records executable format 'xla-gpu'"),
    (dict(compiler="local"), "field 'compiler' is 'local', not an object"),
    (dict(executable_size="12"), "field 'executable_size' is '12', not a count of bytes"),
])
def test_metadata_of_another_shape_is_a_corrupt_entry_moved_aside_and_rebuilt(warm, tmp_path, monkeypatch, damage,
                                                                               said):
    """Valid JSON whose fields are not what the loader reads (a hand edit, a sync tool, another neuron-args) was a
    NeuronArgsError on every run, saying to remove the entry by hand; now it is corrupt like a torn executable."""
    root, entry = _copy(warm, tmp_path)
    _edit_metadata(entry, **damage)
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    with pytest.raises(CacheMissError) as info:
        _run(root)
    assert f"cache entry {entry.key}" in str(info.value) and "is corrupt: metadata.json " + said in str(info.value)
    assert "fix: run the warmup again without" in str(info.value)
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV)
    assert torch.equal(_run(root), _double(X))  # moved aside and rebuilt, no user action
    assert ACTIVITY.stats.compiles == 1 and said in ACTIVITY.corrupt[entry.key]
    assert [p.name[:32] for p in (root / QUARANTINE_DIR).iterdir()] == [entry.key]
    assert entry.status == "complete" and entry.metadata()["input_specs"] == [{"shape": [4], "dtype": "float32"}]
    assert torch.equal(_run(root), _double(X)) and ACTIVITY.stats.compiles == 0  # and the next run loads it



def _in_lock_wait(thread_id: int) -> bool:
    """The thread is waiting for a key lock (``CompileCache.lock``'s polling loop)."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code.co_name == "lock" and frame.f_code.co_filename.endswith(os.path.join("neuron_args", "cache.py")):
            return True
        frame = frame.f_back
    return False


def test_native_key_built_with_other_arguments_while_this_one_waited_is_a_conflict_not_a_hit(tmp_path):
    """neuron_native_lite keys leave the arguments out. Two processes compiling one graph at once, -O1 and -O3: the
    second waited for the first's key lock, then took the -O1 executable as a hit for its -O3 request (reproduced
    with two real processes). Here a thread stands for the first process: it holds the lock until this one waits."""
    first = tmp_path / "first"
    assert torch.equal(_run(first, "neuron_native_lite", ("-O1",)), _double(X))
    (built,) = CompileCache(first).entries()
    root = tmp_path / "cache"
    cache = CompileCache(root)
    lock = KeyLock(cache.entry(built.key))
    assert lock.acquire(0)
    main, failures = threading.get_ident(), []

    def other_process():  # builds the key with -O1 while the main thread waits, then lets go
        try:
            deadline = time.monotonic() + 60
            while not _in_lock_wait(main) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _in_lock_wait(main), "the compile never waited for the key lock"
            shutil.copytree(built.path, cache.entry(built.key).path)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            lock.release()

    helper = threading.Thread(target=other_process)
    helper.start()
    try:
        with pytest.raises(CacheKeyArgsConflict) as info:
            _run(root, "neuron_native_lite", ("-O3",))
    finally:
        helper.join(60)
    assert not failures, failures
    assert f"cache key {built.key}" in str(info.value) and "['-O1']" in str(info.value) and "['-O3']" in str(info.value)
    assert ACTIVITY.stats.hits == 0 and ACTIVITY.stats.compiles == 0


@pytest.mark.parametrize("farm", [False, True], ids=["threads", "farm"])
def test_a_pending_entry_whose_arguments_disagree_with_its_key_is_not_built(tmp_path, farm):
    """A captured entry whose metadata lost its compiler_args (not a list: damaged) was built with the base arguments
    (none) under a key made for -O1: one key, an executable of another argument set, served as a hit later."""
    import concurrent.futures as cf

    from neuron_args.deferred.parallel_compile import parallel_compile

    torch._dynamo.reset()
    opts = {"cache_dir": str(tmp_path), "compiler": "local", "compiler_args": ["-O1"]}
    torch.compile(_double, backend="neuron_libtorch_graph_capture", options=opts, dynamic=False)(X)
    (entry,) = CompileCache(tmp_path).entries()
    _edit_metadata(entry, compiler_args=5)
    with cf.ThreadPoolExecutor(1) if farm else contextlib.nullcontext() as pool:
        report = parallel_compile(tmp_path, executor=pool, quiet=True, raise_on_error=False)
    (graph,) = report.graphs
    assert graph.status == "failed" and entry.status == "pending" and not entry.executable_path.exists()
    assert f"key {entry.key}: metadata.json field 'compiler_args' is 5, not a list of strings" in graph.error
    assert f"fix: capture the graph again (re-run the warmup or parallel_trace), or remove the entry's folder " \
           f"{entry.path}" in graph.error


@pytest.mark.parametrize("farm", [False, True], ids=["threads", "farm"])
def test_a_complete_entry_with_damaged_metadata_is_not_reported_already_complete(tmp_path, farm):
    """A key streamed to parallel_compile whose entry is complete but whose metadata.json is damaged: nothing vouches
    for its executable, so the graph fails naming the fix rather than counting as already built."""
    import concurrent.futures as cf

    from neuron_args.deferred.parallel_compile import parallel_compile

    torch._dynamo.reset()
    opts = {"cache_dir": str(tmp_path), "compiler": "local", "compiler_args": ["-O1"]}
    torch.compile(_double, backend="neuron_libtorch_graph_capture", options=opts, dynamic=False)(X)
    (entry,) = CompileCache(tmp_path).entries()
    assert parallel_compile(tmp_path, quiet=True).graphs[0].status == "compiled" and entry.is_complete
    _edit_metadata(entry, compiler_args=5)
    with cf.ThreadPoolExecutor(1) if farm else contextlib.nullcontext() as pool:
        report = parallel_compile(tmp_path, keys=[entry.key], executor=pool, quiet=True, raise_on_error=False)
    (graph,) = report.graphs
    assert graph.status == "failed" and "metadata.json field 'compiler_args' is 5" in graph.error
    assert "capture the graph again" in graph.error


