"""Faults of a shared compile cache: a build waiting for another process's key lock says what it waits
for; a writer killed mid-write leaves no temporary file behind once the key is built again.

The holder (or the killed writer) is a real child process; the waiter (the next build) is this one.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import neuron_args.cache as cache_module
from neuron_args.cache import CompileCache
from neuron_args.cache_key import create_cache_hash
from neuron_args.errors import CompileError
from tests.faults.fault_helpers import make_pending, wait_until

HOLD_THEN_BUILD = textwrap.dedent("""
    import sys
    from neuron_args.cache import CompileCache
    from tests.security.security_helpers import executable_fields
    from neuron_args.cache_key import create_cache_hash

    def build(entry):  # under the key's lock; the test says when (and whether) to finish
        entry.write_metadata({"key": entry.key, "status": "compiling", "graph_type": "decode"})
        print("LOCKED", flush=True)
        if sys.stdin.readline().strip() != "build":
            raise SystemExit(0)
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(b"exe")
        entry.update_metadata(status="compiled", **executable_fields(entry.executable_path))

    CompileCache(sys.argv[1]).get_or_build(create_cache_hash(**KEY_FIELDS), build, graph_type="decode")
""")
KEY_FIELDS = dict(graph_text="HloModule decode", input_specs=[((4,), "float32")], compiler_args=["-O1"],
                  target="trn2", tool_versions={"neuronx-cc": "2.21"})


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "neuron_args.cache" and r.getMessage().startswith("waiting for the lock")]


def _hold(tmp_path, reaper, fake_env):
    """A child process building the key of ``KEY_FIELDS``, holding its lock until told on stdin."""
    script = tmp_path / "hold.py"
    script.write_text(f"KEY_FIELDS = {KEY_FIELDS!r}\n" + HOLD_THEN_BUILD)
    proc = reaper.popen([sys.executable, str(script), str(tmp_path / "cache")], fake_env.env,
                        stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


def _assert_names_holder(message: str, cache: CompileCache, key: str, pid: int) -> None:
    assert f"cache entry {key} (graph type 'decode')" in message, message
    assert str(cache.entry(key).lock_path) in message and f"process {pid} holds it" in message, message
    assert f"fix: if process {pid} is stuck" in message and f"`kill {pid}`" in message, message


@pytest.mark.slow
def test_a_lock_wait_says_once_whom_it_waits_for_then_uses_the_holders_entry(
        tmp_path, fake_env, reaper, monkeypatch, caplog):
    monkeypatch.setattr(cache_module, "LOCK_NOTICE_AFTER", 0.1)
    cache = CompileCache(tmp_path / "cache")
    key = create_cache_hash(**KEY_FIELDS)
    holder = _hold(tmp_path, reaper, fake_env)
    caplog.set_level(logging.WARNING, logger="neuron_args.cache")

    with pytest.raises(CompileError) as caught, cache.lock(key, timeout=0.6):  # the timeout error still holds
        raise AssertionError("took a lock another process holds")
    assert f"waited 1 s for the lock {cache.entry(key).lock_path}" in str(caught.value)
    assert f"(graph type 'decode'): process {holder.pid}" in str(caught.value)
    [notice] = _notices(caplog)
    _assert_names_holder(notice, cache, key.key, holder.pid)
    caplog.clear()

    def never(entry):
        raise AssertionError("the waiter must use the holder's entry, not build its own")

    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(result=cache.get_or_build(key, never, graph_type="decode")))
    waiter.start()
    wait_until(lambda: _notices(caplog), 30, "the waiter's notice")
    holder.stdin.write("build\n")
    holder.stdin.flush()
    waiter.join(30)
    assert not waiter.is_alive(), "the waiter did not get the lock the holder released"
    entry, hit = got["result"]
    assert hit is True and entry.status == "complete" and entry.problem() is None
    assert holder.wait(30) == 0
    [notice] = _notices(caplog)  # once, not once per try
    _assert_names_holder(notice, cache, key.key, holder.pid)


@pytest.mark.slow
def test_the_compile_farm_waiting_for_a_key_says_whom_it_waits_for(tmp_path, fake_env, reaper, monkeypatch, caplog):
    from neuron_args.deferred.parallel_compile import parallel_compile

    monkeypatch.setattr(cache_module, "LOCK_NOTICE_AFTER", 0.0)
    root, key = tmp_path / "cache", create_cache_hash(**KEY_FIELDS).key
    holder = _hold(tmp_path, reaper, fake_env)
    caplog.set_level(logging.WARNING, logger="neuron_args.cache")
    with cf.ThreadPoolExecutor(1) as pool:
        run = threading.Thread(target=parallel_compile, args=(root,), kwargs=dict(
            executor=pool, keys=[key], base_compiler_args=["-O1"], compiler="neuronx-cc", quiet=True,
            raise_on_error=False))
        run.start()
        wait_until(lambda: _notices(caplog), 30, "the farm's notice")
        [notice] = _notices(caplog)
        _assert_names_holder(notice, CompileCache(root), key, holder.pid)
        holder.stdin.write("stop\n")
        holder.stdin.flush()
        assert holder.wait(30) == 0
        run.join(30)
        assert not run.is_alive(), "the farm's wait did not end when the holder let go of the lock"


STALL_METADATA_WRITE = textwrap.dedent("""
    import os, sys, time
    real_replace = os.replace

    def stall(src, dst):  # killed here: the temporary file is written, the rename never happens
        if os.path.basename(dst) == "metadata.json" and "compiled" in open(src).read():
            print("STALLED", src, flush=True)
            time.sleep(600)
        real_replace(src, dst)

    os.replace = stall
    from neuron_args.deferred.parallel_compile import parallel_compile
    parallel_compile(sys.argv[1], workers=1, quiet=True)
""")


@pytest.mark.slow
def test_a_build_killed_mid_write_leaves_no_temporary_file_after_the_next_build(tmp_path, fake_env, reaper):
    from neuron_args.deferred.parallel_compile import parallel_compile

    root = tmp_path / "cache"
    [key] = make_pending(root, 1)
    script = tmp_path / "stall.py"
    script.write_text(STALL_METADATA_WRITE)
    proc = reaper.popen([sys.executable, str(script), str(root)], fake_env.env)
    line = proc.stdout.readline().split()
    assert line[:1] == ["STALLED"], (line, proc.stderr.read() if proc.poll() is not None else "")
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 between the temporary file and the rename
    proc.wait(30)
    entry = CompileCache(root).entry(key)
    left = [p.name for p in entry.path.iterdir() if p.name.endswith(".tmp")]
    assert left == [Path(line[1]).name] and left[0].startswith(".metadata.json.")
    assert entry.status == "pending"  # the metadata still says so: the next parallel_compile builds it

    report = parallel_compile(root, workers=1, quiet=True)
    assert [(g.key, g.status) for g in report.graphs] == [(key, "compiled")], report.graphs
    assert entry.status == "complete" and entry.problem() is None
    assert [p.name for p in entry.path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_write_sweeps_its_own_names_stale_temporary_files_and_spares_young_ones(tmp_path):
    """Where no lock tells a dead writer from a live one (the trace record, a manifest): by age."""
    from neuron_args.atomic import STALE_AFTER, write_atomic

    dead, young, other = (tmp_path / n for n in (".record.json.ab12.tmp", ".record.json.cd34.tmp",
                                                  ".manifest.json.ef56.tmp"))
    for path in (dead, young, other):
        path.write_text("half")
    old = time.time() - STALE_AFTER - 60
    os.utime(dead, (old, old))
    os.utime(other, (old, old))
    write_atomic(tmp_path / "record.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([young.name, other.name, "record.json"])
