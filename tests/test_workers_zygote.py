"""The warm workers' zygote and the pool's first-come acquire, through real processes.

Workers forked by the zygote compile as any warm worker; a compile whose new worker is still
starting takes a worker another compile gave back; a zygote killed, retired (another environment)
or orphaned (its parent killed) leaves no process behind and the pool goes on. The stand-in zygote
(``STAND_IN``) is the real one whose workers can be held at start (a gate file) or in their first
compile (sleeping, or until a file exists), so a test decides who is ready when, not the clock.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from neuron_args import CompileError
from neuron_args.compilers import LocalCompiler, workers
from neuron_args.compilers.lifetime import CancelScope, CompileCancelled, within
from neuron_args.compilers.process import LOG_FILE
from neuron_args.deferred.parallel_compile import parallel_compile
from tests.faults.fault_helpers import REPO, alive, wait_until
from tests.test_compile_workers import (  # noqa: F401  (hlo_file: the fixture)
    _children, _compile, _first_line, _kill_all, _local_pending, _run, hlo_file)

STAND_IN = textwrap.dedent("""
    # the real zygote; its workers wait for $STAND_IN_GATE (if set) before they start jax, and the first
    # request after $STAND_IN_ONCE was created writes the worker's pid to $STAND_IN_STARTED, then waits
    # for $STAND_IN_GO (or 300 s without it)
    import os, sys, time
    from neuron_args.compilers import workers, zygote
    real_run, real_serve = workers._run_request, workers.serve
    def wait_for(path, seconds=300):
        deadline = time.monotonic() + seconds
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
    def run(request, devnull, n):
        once = os.environ["STAND_IN_ONCE"]
        if os.path.exists(once):
            os.unlink(once)
            with open(os.environ["STAND_IN_STARTED"], "w") as f:
                f.write(str(os.getpid()))
            wait_for(os.environ.get("STAND_IN_GO", "/nonexistent"))
        return real_run(request, devnull, n)
    def serve(argv=None):
        if os.environ.get("STAND_IN_GATE"):
            wait_for(os.environ["STAND_IN_GATE"])
        return real_serve(argv)
    workers._run_request, workers.serve = run, serve
    sys.exit(zygote.main())
""")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygote_pid(pool: workers.WorkerPool) -> int:
    """The zygote process (its supervisor's one child)."""
    (pid,) = _children(pool.zygote.proc.pid)
    return pid


def _worker_pid(entry: Path) -> int:
    return int(re.search(r"pid (\d+)", _first_line(entry)).group(1))


def _stop(pool: workers.WorkerPool) -> None:
    _kill_all(pool)
    for zygote in {pool.zygote} - {None}:
        os.killpg(zygote.proc.pid, signal.SIGKILL)
        zygote.proc.wait(30)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch):
    """A pool of the real worker program and zygote, zygote on; its processes are killed at the end."""
    monkeypatch.delenv(workers.ZYGOTE_ENV, raising=False)
    p = workers.WorkerPool()
    yield p
    _stop(p)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A shared pool whose zygote is the stand-in: ``files`` are its gate, once, started and go paths."""
    script = tmp_path / "stand_in_zygote.py"
    script.write_text(STAND_IN)
    files = {name: tmp_path / f"stand-in-{name}" for name in ("gate", "once", "started", "go")}
    for name, path in files.items():
        monkeypatch.setenv(f"STAND_IN_{name.upper()}", str(path))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv(workers.ZYGOTE_ENV, raising=False)
    monkeypatch.delenv(workers.WARM_WORKERS_ENV, raising=False)
    p = workers.WorkerPool(zygote=[sys.executable, str(script)])
    monkeypatch.setitem(workers._state, "pool", p)
    p.files = files
    yield p
    files["gate"].touch()
    files["go"].touch()
    _stop(p)


def test_workers_forked_by_the_zygote_compile_and_run_right(hlo_file, tmp_path, pool):
    results = [_compile(hlo_file, tmp_path / f"e{i}", LocalCompiler(pool=pool)) for i in range(2)]
    assert pool.prestart(2) == 2  # the second one forked too
    zygote = _zygote_pid(pool)
    leaders = pool.idle_pids()
    assert len(leaders) == 2 and all(_parent(leader) == zygote for leader in leaders)
    served = _worker_pid(tmp_path / "e0")
    assert served == _worker_pid(tmp_path / "e1") and {_parent(served)} < set(leaders)
    assert [_first_line(tmp_path / f"e{i}").endswith(f"warm worker, compile {i + 1})") for i in range(2)] == [True] * 2
    assert "jax startup seconds: 0.000" in (tmp_path / "e0" / LOG_FILE).read_text()  # the worker made its client first
    for result in results:
        _run(result.output_path)
    assert b"neuron_args.compilers.zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes()


@pytest.mark.slow
def test_a_compile_takes_a_worker_given_back_rather_than_wait_for_its_new_one(hlo_file, tmp_path, stand_in):
    """Worker A is up; B is forked for the second thread but held at start: every graph goes to A."""
    files = stand_in.files
    files["gate"].touch()
    assert stand_in.prestart(1) == 1
    (leader_a,) = stand_in.idle_pids()
    (worker_a,) = _children(leader_a)
    files["gate"].unlink()  # from now on a new worker does not start
    files["once"].touch()  # A's first compile waits for "go" ...
    root = tmp_path / "cache"
    keys = _local_pending(root, hlo_file, 4)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=parallel_compile(root, workers=2, quiet=True)))
    thread.start()
    zygote = _zygote_pid(stand_in)
    # ... until the second thread had B forked (held at its start, so never ready)
    wait_until(lambda: len(_children(zygote)) == 2, 60, "a second worker forked for the second thread")
    files["go"].touch()
    thread.join(120)
    assert not thread.is_alive() and result["r"].ok
    assert {k: _worker_pid(root / k) for k in keys} == {k: worker_a for k in keys}
    (leader_b,) = set(_children(zygote)) - {leader_a}
    assert sorted(stand_in.idle_pids()) == sorted([leader_a, leader_b])  # B was given back, still starting
    assert [w.ready for w in stand_in._idle if w.pid == leader_b] == [False]
    files["gate"].touch()
    assert stand_in.prestart(2) == 2  # and it starts once let go


def test_a_killed_zygote_is_logged_and_workers_start_as_processes_of_their_own(hlo_file, tmp_path, pool, caplog):
    _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=pool))
    (leader,) = pool.idle_pids()
    zygote, supervisor = _zygote_pid(pool), pool.zygote.proc.pid
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not alive(zygote) and not alive(leader), 30, "the zygote and its worker gone")
    with caplog.at_level(logging.WARNING, logger="neuron_args.compilers"):
        _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=pool))
    assert (f"the warm-worker zygote (process group {supervisor}) killed or out of memory (exit status -9); "
            "starting warm workers as processes of their own from now on") in caplog.text
    log = (tmp_path / "b" / LOG_FILE).read_text()
    assert "warm worker, compile 1" in log.splitlines()[0] and "compiled again" not in log
    (new_leader,) = pool.idle_pids()
    (worker,) = _children(new_leader)
    assert worker == _worker_pid(tmp_path / "b")
    assert b"neuron_args.compilers.workers" in Path(f"/proc/{worker}/cmdline").read_bytes()  # not a fork
    assert pool.zygote_off and pool.zygote is None


@pytest.mark.slow
def test_a_timeout_kills_the_forked_worker_s_group_and_the_zygote_forks_the_next(hlo_file, tmp_path, stand_in):
    files = stand_in.files
    files["gate"].touch()
    assert stand_in.prestart(1) == 1
    (leader,) = stand_in.idle_pids()
    zygote = _zygote_pid(stand_in)
    (forked,) = _children(leader)
    files["once"].touch()  # the compile hangs (no "go")
    with pytest.raises(CompileError, match=r"timed out after 1 s \(its process group was killed\)"):
        _compile(hlo_file, tmp_path / "hung", LocalCompiler(), timeout=1)
    victim = int(files["started"].read_text())
    assert victim == forked
    wait_until(lambda: not alive(victim) and not alive(leader), 10, "the hung worker and its leader gone")
    _compile(hlo_file, tmp_path / "next", LocalCompiler())
    assert "warm worker, compile 1" in _first_line(tmp_path / "next")
    assert alive(zygote) and _zygote_pid(stand_in) == zygote
    assert _parent(_parent(_worker_pid(tmp_path / "next"))) == zygote


@pytest.mark.slow
def test_a_forked_worker_killed_mid_compile_falls_back_and_a_cancel_kills_one(hlo_file, tmp_path, stand_in):
    """Its leader passes the worker's death on (-9, as the supervisor does); a cancel kills the group at once."""
    files = stand_in.files
    files["gate"].touch()
    files["once"].touch()
    entry = tmp_path / "killed"
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=_compile(hlo_file, entry, LocalCompiler())))
    thread.start()
    wait_until(lambda: files["started"].exists() and files["started"].read_text().strip(), 60, "the compile started")
    victim = int(files["started"].read_text())
    os.kill(victim, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive()
    _run(result["r"].output_path)
    log = (entry / LOG_FILE).read_text()
    assert f"warm compile worker (pid {victim}) killed or out of memory (exit status -9) mid-compile" in log
    assert "warm worker" not in log.splitlines()[0] and not stand_in.broken

    files["started"].unlink()
    files["once"].touch()
    scope, outcome = CancelScope(), {}

    def run() -> None:
        with within(scope):
            try:
                _compile(hlo_file, tmp_path / "cancelled", LocalCompiler())
            except CompileCancelled:
                outcome["cancelled"] = True

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: files["started"].exists() and files["started"].read_text().strip(), 60, "the compile started")
    victim = int(files["started"].read_text())
    leader = _parent(victim)
    scope.cancel()
    thread.join(30)
    assert not thread.is_alive() and outcome == {"cancelled": True}
    wait_until(lambda: not alive(victim) and not alive(leader), 10, "the cancelled worker and its leader gone")
    assert stand_in.idle_pids() == [] and alive(_zygote_pid(stand_in))


def test_another_environment_retires_the_zygote_too(hlo_file, tmp_path, pool, monkeypatch):
    _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=pool))
    first = _zygote_pid(pool)
    monkeypatch.setenv("XLA_NEURON_ARGS_TEST_UNUSED", "1")
    _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=pool))
    second = _zygote_pid(pool)
    assert second != first and _parent(_parent(_worker_pid(tmp_path / "b"))) == second
    assert b"XLA_NEURON_ARGS_TEST_UNUSED=1" in Path(f"/proc/{second}/environ").read_bytes()
    wait_until(lambda: not alive(first), 30, "the retired zygote left once its worker did")
    assert not alive(_worker_pid(tmp_path / "a"))


PARENT_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from neuron_args.compilers import LocalCompiler, workers
    hlo, root = Path(sys.argv[1]), Path(sys.argv[2])
    LocalCompiler().compile(hlo_path=hlo, output_path=root / "a" / "out.neff", target="trn2",
                            compiler_args=["-O1"], workdir=root / "a", graph_type="g", key="a")
    pool = workers.shared_pool()
    assert pool.prestart(2) == 2
    print(json.dumps({"supervisor": pool.zygote.proc.pid, "leaders": pool.idle_pids()}), flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_kill_9_of_the_parent_leaves_no_zygote_and_no_worker(hlo_file, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(workers.WARM_WORKERS_ENV, None)
    env.pop(workers.ZYGOTE_ENV, None)
    proc = subprocess.Popen([sys.executable, str(script), str(hlo_file), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        started = json.loads(line)
        (zygote,) = _children(started["supervisor"])
        leaders = started["leaders"]
        forked = [w for leader in leaders for w in _children(leader)]
        pids = [started["supervisor"], zygote, *leaders, *forked]
        assert len(leaders) == 2 and len(forked) == 2 and all(_parent(leader) == zygote for leader in leaders)
        assert all(alive(pid) for pid in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_until(lambda: not any(alive(pid) for pid in pids), 15, f"every process of {pids} gone")
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_a_zygote_that_cannot_start_is_logged_and_the_switch_turns_it_off(hlo_file, tmp_path, monkeypatch, caplog):
    broken = workers.WorkerPool(zygote=[sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        with caplog.at_level(logging.WARNING, logger="neuron_args.compilers"):
            _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=broken))
        assert re.search(r"the warm-worker zygote \(process group \d+\) failed \(exit status 3\); starting warm "
                         "workers as processes of their own from now on", caplog.text)
        assert "warm worker, compile 1" in _first_line(tmp_path / "a") and broken.zygote_off
        assert "compiled again" not in (tmp_path / "a" / LOG_FILE).read_text()
    finally:
        _stop(broken)
    monkeypatch.setenv(workers.ZYGOTE_ENV, "0")
    off = workers.WorkerPool()
    try:
        _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=off))
        (leader,) = off.idle_pids()
        assert off.zygote is None and _children(leader) == [_worker_pid(tmp_path / "b")]
    finally:
        _stop(off)


def test_a_forked_child_lets_go_of_the_pool_so_a_closed_pool_leaves_while_it_lives(pool, monkeypatch):
    """A kept trace child forks from the driver: were it to hold the pipes, an idle worker and its zygote
    would live on after the driver let them go, until that child left."""
    monkeypatch.setitem(workers._state, "pool", pool)
    assert pool.prestart(1) == 1
    zygote, (leader,) = _zygote_pid(pool), pool.idle_pids()
    held = pool.inherited_fds()
    assert len(held) == 3  # the zygote's socket, the worker's request and answer pipes
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports what its copies of the descriptors are, then waits
        os.close(r)
        os.write(w, json.dumps([os.readlink(f"/proc/self/fd/{fd}") for fd in held]).encode())
        os.close(w)
        time.sleep(120)
        os._exit(0)
    try:
        os.close(w)
        with os.fdopen(r) as f:
            assert json.load(f) == [os.devnull] * 3
        pool.close()
        wait_until(lambda: not alive(leader) and not alive(zygote), 30,
                   "the closed pool's worker and zygote left while the forked child lives")
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
