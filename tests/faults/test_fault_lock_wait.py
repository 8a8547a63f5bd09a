"""Faults of a shared compile cache: a build waiting for another process's key lock says what it waits for.

The holder is a real child process; the waiter is this one (the cache API, the compile farm).
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import subprocess
import sys
import textwrap
import threading

import pytest

from neuron_args.cache import LOCK_NOTICE_ENV, CompileCache, executable_fields, lock_notice_seconds
from neuron_args.cache_key import create_cache_hash
from neuron_args.errors import CompileError, OptionsError
from tests.faults.fault_helpers import make_pending, wait_until

HOLD_THEN_BUILD = textwrap.dedent("""
    import sys
    from neuron_args.cache import CompileCache, executable_fields
    cache = CompileCache(sys.argv[1])
    entry = cache.entry(sys.argv[2])
    with cache.lock(entry.key):
        entry.reset()
        entry.write_metadata({"key": entry.key, "status": "compiling", "graph_type": "decode"})
        print("LOCKED", flush=True)
        if sys.stdin.readline().strip() == "build":  # the test says when (and whether) to finish
            entry.hlo_path.write_bytes(b"hlo")
            entry.executable_path.write_bytes(b"exe")
            entry.write_metadata({"key": entry.key, "status": "compiled", "graph_type": "decode",
                                  **executable_fields(entry.executable_path)})
            entry.mark_complete()
""")


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "neuron_args.cache" and r.getMessage().startswith("waiting for the lock")]


def _hold(tmp_path, reaper, fake_env, key: str):
    script = tmp_path / "hold.py"
    script.write_text(HOLD_THEN_BUILD)
    proc = reaper.popen([sys.executable, str(script), str(tmp_path / "cache"), key], fake_env.env,
                        stdin=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "LOCKED"
    return proc


def _assert_names_holder(message: str, cache: CompileCache, key: str, pid: int) -> None:
    assert f"cache entry {key} (graph type 'decode')" in message, message
    assert str(cache.entry(key).lock_path) in message and f"process {pid} holds it" in message, message
    assert f"fix: if process {pid} is stuck" in message and f"`kill {pid}`" in message, message


def test_a_lock_wait_says_once_whom_it_waits_for_then_uses_the_holders_entry(
        tmp_path, fake_env, reaper, monkeypatch, caplog):
    monkeypatch.setenv(LOCK_NOTICE_ENV, "0.1")
    cache = CompileCache(tmp_path / "cache")
    key = create_cache_hash(graph_text="HloModule decode", input_specs=[((4,), "float32")], compiler_args=["-O1"],
                            target="trn2", tool_versions={"neuronx-cc": "2.21"})
    holder = _hold(tmp_path, reaper, fake_env, key.key)
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


def test_the_compile_farm_waiting_for_a_key_says_whom_it_waits_for(tmp_path, fake_env, reaper, monkeypatch, caplog):
    from neuron_args.deferred.farm import submit_graph

    monkeypatch.setenv(LOCK_NOTICE_ENV, "0")
    root = tmp_path / "cache"
    [key] = make_pending(root, 1)
    holder = _hold(tmp_path, reaper, fake_env, key)  # rewrites the entry's metadata: graph type 'decode'
    caplog.set_level(logging.WARNING, logger="neuron_args.cache")
    with cf.ThreadPoolExecutor(1) as pool:
        future = submit_graph(pool, root, key, ["-O1"], "neuronx-cc")
        wait_until(lambda: _notices(caplog), 30, "the farm's notice")
        assert future.cancel() and future.cancelled()
    [notice] = _notices(caplog)
    _assert_names_holder(notice, CompileCache(root), key, holder.pid)
    holder.stdin.write("stop\n")
    holder.stdin.flush()
    assert holder.wait(30) == 0


def test_a_bad_lock_notice_setting_names_the_variable_and_the_fix(monkeypatch):
    monkeypatch.setenv(LOCK_NOTICE_ENV, "soon")
    with pytest.raises(OptionsError, match=rf"{LOCK_NOTICE_ENV}='soon' is not a number of seconds.*unset it"):
        lock_notice_seconds()
    monkeypatch.delenv(LOCK_NOTICE_ENV)
    assert lock_notice_seconds() == 5.0
