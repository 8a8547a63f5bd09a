"""The compile cache: layout, completion marker, locking across processes, assert-hit, native conflict."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_args import CacheKeyArgsConflict, CacheMissError
from neuron_args.activity import ACTIVITY, tally
from neuron_args.cache import (
    ASSERT_CACHE_HIT_ENV, CACHE_DIR_ENV, STATS, CompileCache, _assert_cache_key_args, cache_root, new_metadata,
)
from neuron_args.cache_key import create_cache_hash
from neuron_args.errors import CorruptEntryError
from neuron_args.untrusted import read_chunks

VERSIONS = {"compiler": "fake 1"}


def make_key(args=("-O3",), shape=(4,)):
    return create_cache_hash(graph_text="HloModule decode", input_specs=[(shape, "float32")],
                             compiler_args=list(args), target="trn2", tool_versions=VERSIONS)


def builder(key, graph_type="decode", args=("-O3",)):
    def build(entry):
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(b"exe")
        entry.write_metadata(new_metadata(key, seam="neuron_libtorch", graph_type=graph_type,
                                          compiler_args=list(args), target="trn2", status="compiled"))
    return build


@pytest.fixture(autouse=True)
def _clean_stats(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == Path.home() / ".cache" / "neuron-args" / "compile-cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(str(tmp_path / "opt")) == tmp_path / "opt"


def test_miss_builds_then_hit_loads(tmp_path):
    cache, key = CompileCache(tmp_path), make_key()
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False
    assert entry.status == "complete"
    assert sorted(p.name for p in entry.path.iterdir()) == ["COMPLETE", "graph.hlo", f"graph_{key}.neff", "metadata.json"]
    md = json.loads(entry.metadata_path.read_text())
    assert md["metadata_version"] == 1 and md["key"] == key.key and md["graph_type"] == "decode"
    assert md["key_components"]["compiler_args"] == ["-O3"]

    def never(entry):
        raise AssertionError("must not rebuild a complete entry")

    entry2, hit2 = cache.get_or_build(key, never)
    assert hit2 is True and entry2.path == entry.path
    assert STATS.snapshot() == {"hits": 1, "misses": 1, "compiles": 1, "captures": 0}


def test_incomplete_entry_is_never_loaded_and_is_rebuilt(tmp_path):
    cache, key = CompileCache(tmp_path), make_key()

    def crash(entry):
        entry.executable_path.write_bytes(b"half")
        raise RuntimeError("compiler died")

    with pytest.raises(RuntimeError):
        cache.get_or_build(key, crash)
    assert cache.entry(key).status == "crashed"
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False and entry.executable_path.read_bytes() == b"exe"
    assert entry.status == "complete"


def test_pending_status(tmp_path):
    cache, key = CompileCache(tmp_path), make_key()
    entry = cache.entry(key)
    assert entry.status == "missing"
    entry.path.mkdir(parents=True)
    entry.write_metadata({"status": "pending"})
    assert entry.status == "pending"


def test_assert_cache_hit_names_graph_key_closest_and_difference(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path)
    warm = make_key(("-O3",))
    cache.get_or_build(warm, builder(warm))
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    cold = make_key(("-O1",))
    with pytest.raises(CacheMissError) as err:
        cache.get_or_build(cold, builder(cold), graph_type="decode")
    msg = str(err.value)
    assert "'decode'" in msg and cold.key in msg and warm.key in msg
    assert "compiler_args: changed -O3 -> -O1" in msg
    assert "scoped_compiler_args(resolve_graph_compiler_args" in msg
    assert not cache.entry(cold).path.exists()
    # a hit is still fine under the assert
    assert cache.get_or_build(warm, builder(warm))[1] is True


def test_closest_entry_prefers_what_the_serving_runner_warmed_among_equally_close(tmp_path, monkeypatch):
    """A shared cache may hold another run's -O2 variant exactly as close as this runner's -O3 one: the miss
    explains against the serving runner's entry, whatever the order of the keys on disk."""
    from types import SimpleNamespace

    cache = CompileCache(tmp_path)
    o2, o3 = make_key(("-O2",)), make_key(("-O3",))
    cache.get_or_build(o2, builder(o2, args=("-O2",)))
    cache.get_or_build(o3, builder(o3))
    cold = make_key(("-O1",))
    for warmed in (o2, o3):
        monkeypatch.setattr(ACTIVITY, "serving",
                            SimpleNamespace(warmed={"decode": [SimpleNamespace(key=warmed.key)]}))
        entry, _, diff = cache.closest(cold, None)
        assert entry.key == warmed.key
        assert diff == [f"compiler_args: changed {warmed.components.as_dict()['compiler_args'][0]} -> -O1"]


def test_assert_cache_hit_accepts_only_true_values(tmp_path, monkeypatch):
    cache, key = CompileCache(tmp_path), make_key()
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "0")
    assert cache.get_or_build(key, builder(key))[1] is False


RACE = textwrap.dedent("""
    import sys, time
    from neuron_args.cache import CompileCache, STATS, new_metadata
    from neuron_args.cache_key import create_cache_hash
    key = create_cache_hash(graph_text="HloModule race", input_specs=[((4,), "float32")],
                            compiler_args=["-O3"], target="trn2", tool_versions={"compiler": "fake 1"})
    def build(entry):
        with open(sys.argv[2], "a") as log:
            log.write("built\\n")
        time.sleep(1.0)
        entry.executable_path.write_bytes(b"exe")
        entry.write_metadata(new_metadata(key, seam="s", graph_type="decode", compiler_args=["-O3"], target="trn2"))
    entry, hit = CompileCache(sys.argv[1]).get_or_build(key, build)
    print("hit" if hit else "built", entry.executable_path.read_bytes().decode())
""")


@pytest.mark.slow
def test_two_processes_racing_on_one_key_compile_it_once(tmp_path):
    log = tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "cache"), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outs == ["built exe", "hit exe"]
    assert log.read_text() == "built\n"


CONFLICT = textwrap.dedent("""
    import sys
    from neuron_args.cache import CompileCache, _assert_cache_key_args, new_metadata
    from neuron_args.cache_key import create_cache_hash
    key = create_cache_hash(graph_text="HloModule native", input_specs=[((4,), "float32")],
                            compiler_args=None, target="trn2", tool_versions={"compiler": "fake 1"})
    args = sys.argv[2:]
    cache = CompileCache(sys.argv[1])
    _assert_cache_key_args(cache.entry(key), args, graph_type="decode")
    def build(entry):
        entry.executable_path.write_bytes(b"exe")
        entry.write_metadata(new_metadata(key, seam="neuron_native_lite", graph_type="decode", compiler_args=args, target="trn2"))
    print(cache.get_or_build(key, build)[1])
""")


@pytest.mark.slow
def test_native_conflict_is_caught_across_processes(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, "-c", CONFLICT, str(tmp_path), *args],
                                       capture_output=True, text=True, timeout=60)
    first = run("-O3")
    assert first.returncode == 0 and first.stdout.strip() == "False"
    same = run("--optlevel=3")
    assert same.returncode == 0 and same.stdout.strip() == "True"
    other = run("-O1")
    assert other.returncode != 0
    assert "CacheKeyArgsConflict" in other.stderr
    assert "['-O3']" in other.stderr and "['-O1']" in other.stderr


def test_assert_cache_key_args_in_process(tmp_path):
    cache = CompileCache(tmp_path)
    key = create_cache_hash(graph_text="g", input_specs=[], compiler_args=None, target="trn2", tool_versions={})
    cache.get_or_build(key, builder(key, args=("-O3",)))
    _assert_cache_key_args(cache.entry(key), ["-O3"])
    with pytest.raises(CacheKeyArgsConflict, match=r"graph type 'decode'"):
        _assert_cache_key_args(cache.entry(key), ["-O2"], graph_type="decode")


def test_find_by_prefix(tmp_path):
    cache, key = CompileCache(tmp_path), make_key()
    cache.get_or_build(key, builder(key))
    assert cache.find(key.key[:6]).key == key.key
    with pytest.raises(KeyError):
        cache.find("zz")


def test_metadata_that_is_not_an_object_is_corrupt_and_never_breaks_a_miss_explanation(tmp_path):
    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.metadata_path.write_text('["not", "an", "object"]')
    from neuron_args.activity import ACTIVITY

    ACTIVITY.verified.clear()  # a new process: verification happens once per process and key
    assert entry.metadata() == {} and entry.status == "corrupt"
    assert "metadata.json holds a JSON list" in entry.problem()
    other = make_key(shape=(8,))
    with pytest.raises(CacheMissError) as err, tally(assert_hit=True):  # the explanation walks every entry too
        cache.get_or_build(other, builder(other))
    assert other.key in str(err.value)
    with pytest.raises(CacheMissError, match="is corrupt: metadata.json holds a JSON list"), tally(assert_hit=True):
        cache.get_or_build(key, builder(key))
    rebuilt, hit = cache.get_or_build(key, builder(key))
    assert hit is False and rebuilt.status == "complete"
    assert [p.name[:32] for p in (tmp_path / ".corrupt").iterdir()] == [key.key]


def test_a_neighbour_with_damaged_key_components_never_breaks_a_miss_explanation(tmp_path):
    """The miss explanation compares the key with every complete entry's recorded components (untrusted): one whose
    arguments or tool versions have another shape is still compared, and the serve gets its CacheMissError."""
    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.update_metadata(key_components={**key.components.as_dict(), "compiler_args": [3], "tool_versions": ["x"]})
    other = make_key(args=("-O1",))
    with pytest.raises(CacheMissError) as err, tally(assert_hit=True):
        cache.get_or_build(other, builder(other))
    assert f"closest warmed-up entry: {key.key}" in str(err.value)
    assert "compiler_args: [3] -> ['-O1']" in str(err.value)
    assert "tool_versions: ['x'] -> {'compiler': 'fake 1'}" in str(err.value)


def test_an_entry_whose_executable_was_replaced_is_caught_by_its_checksum(tmp_path):
    from neuron_args.activity import ACTIVITY
    from tests.security.security_helpers import executable_fields

    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.update_metadata(**executable_fields(entry.executable_path))
    entry.executable_path.write_bytes(b"EXE")  # same size, other bytes
    ACTIVITY.verified.clear()  # a new process
    assert entry.status == "complete"  # ls looks at sizes only
    assert "sha256" in entry.problem()
    rebuilt, hit = cache.get_or_build(key, builder(key))
    assert hit is False and rebuilt.executable_path.read_bytes() == b"exe"


def test_a_first_hit_reads_the_executable_once_and_loads_the_bytes_it_hashed(tmp_path, monkeypatch):
    """The verification of a hit reads and hashes the executable and hands those bytes to the load: no second
    read, and a file replaced in between is not what loads."""
    from neuron_args import cache as cache_module
    from tests.security.security_helpers import executable_fields

    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.update_metadata(**executable_fields(entry.executable_path))
    ACTIVITY.verified.clear()  # a new process
    reads = []
    monkeypatch.setattr(cache_module, "read_chunks", lambda *a: reads.append(a[3]) or read_chunks(*a))
    hit_entry, hit = cache.get_or_build(key, builder(key))
    entry.executable_path.write_bytes(b"EXE")  # replaced after the check
    assert hit and hit_entry.executable_bytes("decode") == b"exe" and reads == [entry.executable_path]
    with pytest.raises(CorruptEntryError, match="sha256"):  # nothing kept: read and checked again
        hit_entry.executable_bytes("decode")


def test_checking_an_executable_streams_its_hash_and_keeps_nothing(tmp_path):
    """``cache ls``/``verify`` hash an executable a MiB at a time: checking a 64 MiB one holds far less than it,
    and only the check of a load (``keep``) keeps the bytes."""
    import tracemalloc

    from tests.security.security_helpers import executable_fields

    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.executable_path.write_bytes(os.urandom(1 << 20) * 64)
    entry.update_metadata(**executable_fields(entry.executable_path))
    tracemalloc.start()
    try:
        assert entry.problem() is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"checking held {peak} bytes"
    assert entry._executable is None
    assert entry.problem(keep=True) is None and entry.executable_bytes("decode") == entry.executable_path.read_bytes()


def test_status_is_an_enum_equal_to_its_word(tmp_path):
    from neuron_args.cache import EntryStatus

    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    assert entry.status is EntryStatus.COMPLETE and entry.status == "complete" and f"{entry.status}" == "complete"
    assert json.dumps({"status": entry.status}) == '{"status": "complete"}'
    assert [e.key for e in cache.entries()] == [key.key]  # lock files and other names are not entries
    (tmp_path / "notes").mkdir()
    assert [e.key for e in cache.entries()] == [key.key] and cache.lookup("../notes") is None


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from neuron_args.cache import CompileCache
    with CompileCache(sys.argv[1]).lock(sys.argv[2]):
        print("held", flush=True)
        time.sleep(60)
""")


@pytest.mark.slow
def test_waiting_for_a_held_lock_times_out_naming_the_holder_and_the_lock_file(tmp_path):
    from neuron_args.errors import CompileError

    cache, key = CompileCache(tmp_path), make_key()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path), key.key], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cache.entry(key).lock_pid() == holder.pid
        with pytest.raises(CompileError) as caught, cache.lock(key, timeout=0.5):
            raise AssertionError("took a lock another process holds")
        message = str(caught.value)
        assert f"process {holder.pid}" in message and str(tmp_path / f".{key.key}.lock") in message
        assert key.key in message and "fix:" in message
    finally:
        holder.kill()
        holder.wait()
    with cache.lock(key, timeout=5):  # the dead holder's lock is free
        assert cache.entry(key).lock_pid() > 0


def test_a_key_lock_is_released_from_another_thread(tmp_path):
    import threading

    from neuron_args.cache import KeyLock

    cache, key = CompileCache(tmp_path), make_key()
    held = KeyLock(cache.entry(key))
    assert held.acquire()
    assert cache.entry(key).lock_pid() is not None
    releaser = threading.Thread(target=held.release)
    releaser.start()
    releaser.join()
    assert cache.entry(key).lock_pid() is None
    again = KeyLock(cache.entry(key))
    assert again.acquire()
    again.release()


@pytest.mark.slow
def test_neuron_args_imports_and_locks_without_fcntl(tmp_path):
    """Off POSIX there is no fcntl: the cache's lock falls back to filelock's portable lock."""
    code = textwrap.dedent("""
        import os, sys, warnings
        sys.modules["fcntl"] = None  # as on Windows: `import fcntl` fails
        warnings.simplefilter("ignore")
        import neuron_args, neuron_args.cli
        from neuron_args.cache import CompileCache
        cache = CompileCache(sys.argv[1])
        with cache.lock("0" * 32):
            print(cache.entry("0" * 32).lock_pid(), os.getpid())
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    holder, me = proc.stdout.split()
    assert holder == me
