"""Faults beyond the fault suite's: damaged entries that only the loader could tell, an argument set raced in
by another process, things in the way of the cache layout, a compiler's leftovers and its odd version output.

Each case reproduces what a real run did before its fix (see the docstrings); the real compiles use the local
compiler on a one-op graph.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from neuron_args import CacheKeyArgsConflict, CacheMissError
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, QUARANTINE_DIR, CompileCache, KeyLock
from neuron_args.compilers.lifetime import supervised_argv
from tests.test_cache import builder, make_key


def _double(x):
    return x * 2 + 1


X = torch.arange(4, dtype=torch.float32)


def _run(root: Path, backend: str = "neuron_libtorch", args: tuple[str, ...] = ("-O1",)) -> torch.Tensor:
    """One call of the one-op graph as a fresh process would make it (no loaded executable, no counters)."""
    torch._dynamo.reset()
    ACTIVITY.reset()
    opts = {"cache_dir": str(root), "compiler": "local", "compiler_args": list(args)}
    return torch.compile(_double, backend=backend, options=opts, dynamic=False)(X)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    ACTIVITY.reset()
    yield
    torch._dynamo.reset()
    ACTIVITY.reset()


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """A cache holding the one-op graph, really compiled (copied by each case before it damages it)."""
    root = tmp_path_factory.mktemp("faults10") / "warm"
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
    (dict(compiler="local"), "records executable format None"),
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


def test_a_file_where_an_entry_folder_belongs_is_replaced_by_the_rebuilt_entry(tmp_path):
    """A file at ``<root>/<key>`` (a bad copy) failed every run with ENOTDIR and 'check the file system'."""
    cache, key = CompileCache(tmp_path), make_key()
    cache.entry(key).path.write_text("not an entry")
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False and entry.status == "complete" and entry.executable_path.read_bytes() == b"exe"


def test_a_file_where_the_corrupt_folder_belongs_does_not_block_moving_entries_aside(tmp_path, caplog):
    """A file at ``<root>/.corrupt`` failed every rebuild of a corrupt entry with EEXIST and 'check the file system'."""
    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.executable_path.write_bytes(b"")  # corrupt: empty
    (tmp_path / QUARANTINE_DIR).write_text("in the way")
    ACTIVITY.verified.clear()  # a later process
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False and entry.status == "complete"
    assert [p.name[:32] for p in (tmp_path / QUARANTINE_DIR).iterdir()] == [key.key]
    assert f"{tmp_path / QUARANTINE_DIR} is not a folder; removed it" in caplog.text


def test_a_neuronx_cc_whose_version_output_is_not_utf8_has_an_unknown_version(tmp_path):
    """A wrapper printing non-UTF-8 bytes for ``--version`` made every compile a Dynamo BackendCompilerFailed
    (UnicodeDecodeError) before anything was compiled."""
    from neuron_args.compilers.neuronx_cc import lookup_version

    exe = tmp_path / "neuronx-cc"
    exe.write_text("#!/bin/sh\nprintf 'NeuronX Compiler version 2.21\\377\\376\\n'\n")
    exe.chmod(0o755)
    ACTIVITY.reset()  # the version is memoized per process
    assert lookup_version(str(exe)) == "2.21"


def test_a_helper_the_compiler_leaves_running_is_killed_when_it_exits(tmp_path):
    """A compiler exiting 0 while a helper it started runs on: the helper was left with ppid 1, in the cache entry's
    folder (seen with a neuronx-cc stand-in that forks)."""
    pid_file = tmp_path / "helper.pid"
    done = subprocess.run(supervised_argv(["/bin/sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 3"], reap=True),
                          timeout=30, start_new_session=True)
    assert done.returncode == 3  # the compiler's own status, unchanged
    helper = int(pid_file.read_text())
    try:
        os.kill(helper, 0)
    except ProcessLookupError:
        return  # killed and reaped by the supervisor
    os.kill(helper, signal.SIGKILL)
    pytest.fail(f"the compiler's helper {helper} outlived it")


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
    assert f"key {entry.key}: not compiled with compiler arguments [] (the key holds ['-O1'])" in graph.error
    assert f"fix: capture the graph again (re-run the warmup or parallel_trace), or remove the entry's folder " \
           f"{entry.path}" in graph.error


def test_a_folder_at_the_lock_file_s_place_is_named_with_the_fix(tmp_path):
    """A directory at ``<root>/.<key>.lock`` failed with EISDIR and 'check the file system of <entry>'."""
    from neuron_args import CompileError

    cache, key = CompileCache(tmp_path), make_key()
    cache.entry(key).lock_path.mkdir()
    with pytest.raises(CompileError) as info:
        cache.get_or_build(key, builder(key))
    assert f"cannot write cache entry {key.key}" in str(info.value) and "(EISDIR)" in str(info.value)
    assert f"fix: remove {cache.entry(key).lock_path} (it is in the way of the cache's own file)" in str(info.value)


def test_an_unclosed_quote_in_neuron_cc_flags_names_the_variable(monkeypatch):
    """Every other bad $NEURON_CC_FLAGS says where it came from; an unclosed quote did not."""
    from neuron_args.errors import CompilerArgsError
    from neuron_args.seams.platform import apply_platform_compiler_args

    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 '--auto-cast=none")
    with pytest.raises(CompilerArgsError) as info:
        apply_platform_compiler_args({})
    assert "No closing quotation" in str(info.value) and "(these arguments come from $NEURON_CC_FLAGS)" in str(info.value)


def test_a_neuronx_cc_version_probe_that_fails_says_so_once_with_what_it_costs(tmp_path, caplog):
    """A failing `neuronx-cc --version` (a broken install, a license check) silently put 'unknown' into every key:
    a warm cache missed everything and compiled again with no word why."""
    from neuron_args.compilers.neuronx_cc import lookup_version

    exe = tmp_path / "neuronx-cc"
    exe.write_text("#!/bin/sh\necho 'ERROR: libneuronxla not found' >&2\nexit 3\n")
    exe.chmod(0o755)
    ACTIVITY.reset()
    assert lookup_version(str(exe)) == lookup_version(str(exe)) == "unknown"
    (record,) = [r for r in caplog.records if "--version` gave no version" in r.getMessage()]
    assert f"`{exe} --version` gave no version (exit status 3: ERROR: libneuronxla not found)" in record.getMessage()
    assert "carry compiler version 'unknown'" in record.getMessage() and "fix: check that" in record.getMessage()
