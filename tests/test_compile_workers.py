"""Warm local-compiler workers: the one-shot contract kept (command.txt, log, exit statuses, errors),
timeouts, cancel, a worker killed mid-compile, no orphans, parallel_compile's N workers, a compile
taking a worker given back rather than wait for its new one.

Every case runs real processes: workers of the real program, or of a stand-in that runs the real
worker loop but can be held at start or in its first compile (``SLOW_WORKER``), so a test can kill it
or time it out mid-compile and decides who is ready when, not the clock.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from neuron_args import CompileError, OptionsError
from neuron_args.cache import CompileCache
from neuron_args.compilers import LocalCompiler, workers
from neuron_args.compilers.base import prepare_compiler_args
from neuron_args.compilers.process import LOG_FILE, run_compiler, temp_output_path
from neuron_args.compilers.lifetime import CancelScope, CompileCancelled, within
from neuron_args.compilers.local import local_version
from neuron_args.deferred.parallel_compile import parallel_compile
from tests.faults.fault_helpers import REPO, alive, group_alive, wait_until

KEY = "0123456789abcdef0123456789abcdef"
X_SHAPE, Y_SHAPE = (4, 8), (8, 3)

SLOW_WORKER = textwrap.dedent("""
    # the real worker loop; the first request of a worker sleeps $SLOW_WORKER_SLEEP s (or until the file
    # $SLOW_WORKER_GO exists) while the file $SLOW_WORKER_ONCE exists (it is removed), after writing the
    # worker's pid to $SLOW_WORKER_STARTED; a worker waits for the file $SLOW_WORKER_GATE (if set) to start
    import os, sys, time
    from neuron_args.compilers import workers
    real = workers._run_request
    def wait_for(path, seconds):
        deadline = time.monotonic() + seconds
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
    def slow(request, devnull, n):
        once = os.environ["SLOW_WORKER_ONCE"]
        if os.path.exists(once):
            os.unlink(once)
            with open(os.environ["SLOW_WORKER_STARTED"], "w") as f:
                f.write(str(os.getpid()))
            wait_for(os.environ.get("SLOW_WORKER_GO", "/nonexistent"), float(os.environ["SLOW_WORKER_SLEEP"]))
        return real(request, devnull, n)
    workers._run_request = slow
    if os.environ.get("SLOW_WORKER_GATE"):
        wait_for(os.environ["SLOW_WORKER_GATE"], 300)
    sys.exit(workers.serve())
""")


@pytest.fixture(scope="module")
def hlo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real HloModuleProto of tanh(x @ y) + 1, lowered by jax (no torch)."""
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda x, y: jnp.tanh(x @ y) + 1).lower(
        jax.ShapeDtypeStruct(X_SHAPE, jnp.float32), jax.ShapeDtypeStruct(Y_SHAPE, jnp.float32))
    path = tmp_path_factory.mktemp("hlo") / "graph.hlo"
    path.write_bytes(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
    return path


@pytest.fixture
def pool():
    """A pool of the real worker program of this test only; its workers are killed at the end."""
    p = workers.WorkerPool()
    yield p
    _kill_all(p)


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch):
    """A fresh pool in place of this process's shared one (the one ``LocalCompiler()`` uses), pool on."""
    p = workers.WorkerPool()
    monkeypatch.setattr(workers, "_pool", p)
    monkeypatch.delenv(workers.WARM_WORKERS_ENV, raising=False)
    yield p
    _kill_all(p)


@pytest.fixture
def slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A pool of the sleeping stand-in; ``slow.arm(seconds)`` makes the next new request sleep."""
    script = tmp_path / "slow_worker.py"
    script.write_text(SLOW_WORKER)
    started, once = tmp_path / "slow-started", tmp_path / "slow-once"
    monkeypatch.setenv("SLOW_WORKER_STARTED", str(started))
    monkeypatch.setenv("SLOW_WORKER_ONCE", str(once))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    p = workers.WorkerPool([sys.executable, str(script)])

    def arm(seconds: float) -> None:
        monkeypatch.setenv("SLOW_WORKER_SLEEP", str(seconds))
        once.touch()

    p.arm, p.started, p.script = arm, started, script
    yield p
    _kill_all(p)


def _kill_all(pool: workers.WorkerPool) -> None:
    for pid in pool.idle_pids():
        os.killpg(pid, signal.SIGKILL)
    pool.close()


def _compile(hlo: Path, entry: Path, compiler: LocalCompiler, args=("-O1",), **kw):
    return compiler.compile(hlo_path=hlo, output_path=entry / f"graph_{KEY}.neff", target="trn2",
                            compiler_args=list(args), workdir=entry, graph_type="decode", key=KEY, **kw)


def _first_line(entry: Path) -> str:
    return (entry / LOG_FILE).read_text().splitlines()[0]


def _run(blob: Path) -> np.ndarray:
    from neuron_args import xla_cpu
    from tests.xla_run import execute

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(X_SHAPE, dtype=np.float32), rng.standard_normal(Y_SHAPE, dtype=np.float32)
    (out,) = execute(xla_cpu.deserialize_executable(blob.read_bytes()), [x, y])
    np.testing.assert_allclose(out, np.tanh(x @ y) + 1, rtol=1e-5, atol=1e-6)
    return out


def _normal(log: str) -> str:
    """A log without what differs run to run: pids, timings, temporary output names."""
    log = re.sub(r"pid \d+(, warm worker, compile \d+)?", "pid N", log)
    log = re.sub(r"(seconds: )[0-9.]+", r"\1S", log)
    return re.sub(r"\.partial-[0-9a-f]+", ".partial-X", log)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _worker_pid(entry: Path) -> int:
    """The pid of the warm worker that compiled ``entry`` (its log's first line names it)."""
    return int(re.search(r"pid (\d+)", _first_line(entry)).group(1))


# ----------------------------------------------------------------------------- the one-shot contract


@pytest.mark.slow
def test_a_warm_worker_writes_what_a_process_of_its_own_writes(hlo_file, tmp_path, pool, monkeypatch):
    """Same command.txt, same entry files, same log (but the first line), same numbers; the worker is reused."""
    warm = [_compile(hlo_file, tmp_path / f"warm{i}", LocalCompiler(pool=pool), ["-O3", "--auto-cast=none"])
            for i in range(2)]
    monkeypatch.setenv(workers.WARM_WORKERS_ENV, "0")
    once = _compile(hlo_file, tmp_path / "once", LocalCompiler(), ["-O3", "--auto-cast=none"])

    firsts = [_first_line(tmp_path / n) for n in ("warm0", "warm1", "once")]
    pids = [re.search(r"pid (\d+)", line).group(1) for line in firsts]
    assert firsts[0].endswith(", warm worker, compile 1)") and firsts[1].endswith(", warm worker, compile 2)")
    assert pids[0] == pids[1] != pids[2] and "warm worker" not in firsts[2]
    assert "jax startup seconds: 0.0" in (tmp_path / "warm1" / LOG_FILE).read_text()  # jax was warm already
    for result in warm:
        assert result.argv[:3] == once.argv[:3] == [sys.executable, "-m", "neuron_args.compilers.local_xla"]
        entry = result.output_path.parent
        assert (entry / "command.txt").read_text() == shlex.join(result.argv) + "\n"
        assert sorted(p.name for p in entry.iterdir()) == sorted(["command.txt", LOG_FILE, result.output_path.name])
        warm_log = _normal((entry / LOG_FILE).read_text()).replace(str(entry), "ENTRY")
        once_log = _normal((tmp_path / "once" / LOG_FILE).read_text()).replace(str(tmp_path / "once"), "ENTRY")
        assert warm_log == once_log
        np.testing.assert_array_equal(_run(result.output_path), _run(once.output_path))
    assert len(pool.idle_pids()) == 1


def test_a_compile_error_on_a_warm_worker_reads_as_from_a_process_of_its_own(tmp_path, pool, monkeypatch):
    bad = tmp_path / "graph.hlo"
    bad.write_bytes(b"\x08\x01 this is not an HloModuleProto")
    entry = tmp_path / "cache" / KEY
    messages = []
    for compiler in (LocalCompiler(pool=pool), None):
        if compiler is None:
            monkeypatch.setenv(workers.WARM_WORKERS_ENV, "off")
            compiler = LocalCompiler()
        with pytest.raises(CompileError) as excinfo:
            _compile(bad, entry, compiler, ["-O2"])
        messages.append(_normal(str(excinfo.value)))
        assert sorted(p.name for p in entry.iterdir()) == ["command.txt", LOG_FILE]
    assert messages[0] == messages[1]
    assert "failed (exit status 1)" in messages[0] and "could not compile" in messages[0] and KEY in messages[0]
    assert len(pool.idle_pids()) == 1  # a compile error leaves the worker fit for the next graph


def test_a_bad_option_exits_2_on_a_warm_worker_with_the_program_s_own_message(hlo_file, tmp_path, pool):
    """Past the driver's validation (a caller that skipped it), the program's exit 2 and stderr arrive as they would."""
    compiler = LocalCompiler(pool=pool)
    entry = tmp_path / "entry"
    output = entry / "out.neff"
    tmp = temp_output_path(output)
    argv = compiler.build_argv(hlo_path=hlo_file, output_path=tmp, target="trn2", log_path=entry / LOG_FILE,
                               compiler_args=["--modle-type=transformer"])
    with pytest.raises(CompileError) as excinfo:
        run_compiler(compiler=compiler.display_name, argv=argv, recorded_argv=argv, tmp_output=tmp,
                     output_path=output, workdir=entry, log_path=entry / LOG_FILE, graph_type="decode", key=KEY,
                     timeout=600, start_child=compiler.start_compiler)
    message = str(excinfo.value)
    assert "failed (exit status 2)" in message
    log = (entry / LOG_FILE).read_text()
    assert "warm worker" in log.splitlines()[0]
    assert "---- compiler stdout/stderr ----" in log and "local-xla: error:" in log and "--model-type" in log
    assert prepare_compiler_args(["-O1"], target="trn2", graph_type="decode", key=KEY) == ["-O1"]


@pytest.mark.slow
def test_the_pool_can_be_turned_off_and_a_stand_in_program_runs_one_process_per_graph(hlo_file, tmp_path, shared,
                                                                                       monkeypatch):
    monkeypatch.setenv(workers.WARM_WORKERS_ENV, "0")
    _compile(hlo_file, tmp_path / "off", LocalCompiler())
    monkeypatch.delenv(workers.WARM_WORKERS_ENV)
    _compile(hlo_file, tmp_path / "stand-in", LocalCompiler(program=[sys.executable, "-m", "neuron_args.compilers.local_xla"]))
    assert "warm worker" not in _first_line(tmp_path / "off") + _first_line(tmp_path / "stand-in")
    assert shared.idle_pids() == []
    _compile(hlo_file, tmp_path / "on", LocalCompiler())
    assert "warm worker" in _first_line(tmp_path / "on") and len(shared.idle_pids()) == 1


def test_a_worker_started_under_another_environment_is_not_reused(hlo_file, tmp_path, pool, monkeypatch):
    _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=pool))
    monkeypatch.setenv("XLA_NEURON_ARGS_TEST_UNUSED", "1")
    _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=pool))
    first, second = (_first_line(tmp_path / n) for n in "ab")
    assert first.endswith("compile 1)") and second.endswith("compile 1)")
    assert re.search(r"pid \d+", first).group() != re.search(r"pid \d+", second).group()


def test_an_idle_worker_leaves_after_its_idle_time(hlo_file, tmp_path, pool, monkeypatch):
    monkeypatch.setenv(workers.IDLE_ENV, "0.5")
    _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=pool))
    (leader,) = pool.idle_pids()
    (worker,) = pool._idle.children
    wait_until(lambda: worker.proc.poll() is not None, 30, "the idle worker left")
    assert pool.idle_pids() == []
    _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=pool))  # a fresh worker, no fallback
    assert pool.idle_pids() != [leader] and "warm worker, compile 1" in _first_line(tmp_path / "b")
    monkeypatch.setenv(workers.IDLE_ENV, "soon")
    with pytest.raises(OptionsError, match=workers.IDLE_ENV):
        workers.idle_seconds()


# ----------------------------------------------------------------------------- faults


@pytest.mark.slow
def test_a_worker_killed_mid_compile_falls_back_to_a_process_of_its_own(hlo_file, tmp_path, slow, caplog):
    slow.arm(300)
    entry = tmp_path / "entry"
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=_compile(hlo_file, entry, LocalCompiler(pool=slow))))
    with caplog.at_level(logging.WARNING, logger="neuron_args.compilers"):
        thread.start()
        wait_until(slow.started.exists, 60, "the stand-in worker took the compile")
        wait_until(lambda: slow.started.read_text().strip(), 5, "the worker wrote its pid")
        victim = int(slow.started.read_text())
        os.kill(victim, signal.SIGKILL)
        thread.join(120)
    assert not thread.is_alive()
    _run(result["r"].output_path)  # the graph compiled all the same
    log = (entry / LOG_FILE).read_text()
    assert "warm worker" not in log.splitlines()[0]  # the fallback: a process of its own
    assert f"warm compile worker (pid {victim}) killed or out of memory (exit status -9) mid-compile" in log
    assert f"warm local-compiler worker {victim} killed" in caplog.text
    assert not slow.broken and slow.idle_pids() == []  # the dead worker is not given back
    _compile(hlo_file, tmp_path / "next", LocalCompiler(pool=slow))  # a new worker takes the next graph
    assert "warm worker, compile 1" in _first_line(tmp_path / "next") and len(slow.idle_pids()) == 1


def test_an_idle_worker_that_died_is_replaced_by_a_new_one(hlo_file, tmp_path, pool):
    _compile(hlo_file, tmp_path / "a", LocalCompiler(pool=pool))
    (leader,) = pool.idle_pids()
    os.killpg(leader, signal.SIGKILL)  # an OOM kill, say, while it waited for work
    wait_until(lambda: not group_alive(leader), 10, "the idle worker's process group gone")
    _compile(hlo_file, tmp_path / "b", LocalCompiler(pool=pool))
    log = (tmp_path / "b" / LOG_FILE).read_text()
    assert "warm worker, compile 1" in log.splitlines()[0] and "compiled again" not in log
    assert len(pool.idle_pids()) == 1 and pool.idle_pids() != [leader] and not pool.broken


@pytest.mark.slow
def test_a_hung_worker_times_out_like_a_process_and_is_replaced(hlo_file, tmp_path, slow):
    slow.arm(300)
    assert slow.prestart(1) == 1  # up before the 1 s timeout starts, so it expires in the request
    entry = tmp_path / "entry"
    with pytest.raises(CompileError) as excinfo:
        _compile(hlo_file, entry, LocalCompiler(pool=slow), timeout=1)
    message = str(excinfo.value)
    assert "timed out after 1 s (its process group was killed)" in message and KEY in message
    assert "compile_timeout" in message and "NEURON_ARGS_COMPILE_TIMEOUT" in message
    victim = int(slow.started.read_text())
    wait_until(lambda: not alive(victim), 10, f"the hung worker {victim} gone")
    assert slow.idle_pids() == [] and not (entry / f"graph_{KEY}.neff").exists()
    assert "fell back" not in (entry / LOG_FILE).read_text() and "compiled again" not in (entry / LOG_FILE).read_text()
    _compile(hlo_file, tmp_path / "next", LocalCompiler(pool=slow))
    assert "warm worker, compile 1" in _first_line(tmp_path / "next")


@pytest.mark.slow
def test_cancel_kills_a_busy_worker_at_once_and_starts_no_fallback(hlo_file, tmp_path, slow):
    slow.arm(300)
    scope, outcome = CancelScope(), {}

    def run() -> None:
        with within(scope):
            try:
                _compile(hlo_file, tmp_path / "entry", LocalCompiler(pool=slow))
            except CompileCancelled:
                outcome["cancelled"] = True

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: slow.started.exists() and slow.started.read_text().strip(), 60, "the compile started")
    victim = int(slow.started.read_text())
    scope.cancel()
    thread.join(30)
    assert not thread.is_alive() and outcome == {"cancelled": True}
    wait_until(lambda: not alive(victim), 10, f"the cancelled worker {victim} gone")
    log = (tmp_path / "entry" / LOG_FILE).read_text() if (tmp_path / "entry" / LOG_FILE).exists() else ""
    assert "compiled again" not in log and slow.idle_pids() == []



@pytest.mark.slow
def test_a_compile_cancelled_as_its_worker_gets_ready_gives_the_worker_back_once(hlo_file, tmp_path, pool,
                                                                                  monkeypatch):
    """Cancelled between its worker getting ready and the request: the unused worker goes back once (given back
    twice, it was listed twice and closing the pool failed)."""
    scope, real = CancelScope(), workers.PooledCompile._await_worker

    def await_then_cancel(self, deadline):
        ready = real(self, deadline)
        scope.cancel()
        return ready

    monkeypatch.setattr(workers.PooledCompile, "_await_worker", await_then_cancel)
    with within(scope), pytest.raises(CompileCancelled):
        _compile(hlo_file, tmp_path / "entry", LocalCompiler(pool=pool))
    assert len(pool.idle_pids()) == 1
    pool.close()

PARENT_SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    from pathlib import Path
    from neuron_args.compilers import LocalCompiler, workers
    hlo, root = Path(sys.argv[1]), Path(sys.argv[2])
    def compile(name):
        LocalCompiler().compile(hlo_path=hlo, output_path=root / name / "out.neff", target="trn2",
                                compiler_args=["-O1"], workdir=root / name, graph_type="g", key=name)
    t = threading.Thread(target=compile, args=("a",))  # the thread that asked for the worker ends ...
    t.start(); t.join()
    time.sleep(0.5)
    compile("b")  # ... and the worker is still there for the next graph
    (leader,) = workers.shared_pool().idle_pids()
    print(json.dumps({"leader": leader}), flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_warm_workers_outlive_the_thread_that_started_them_but_not_the_parent(hlo_file, tmp_path):
    """kill -9 of the parent: its idle worker and the worker's supervisor are gone within seconds."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(workers.WARM_WORKERS_ENV, None)
    proc = subprocess.Popen([sys.executable, str(script), str(hlo_file), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    leader = worker = None
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        leader = json.loads(line)["leader"]
        (worker,) = _children(leader)
        first, second = _first_line(tmp_path / "a"), _first_line(tmp_path / "b")
        assert f"pid {worker}, warm worker, compile 1" in first and f"pid {worker}, warm worker, compile 2" in second
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_until(lambda: not alive(leader) and not alive(worker), 10, "the worker died with its parent")
    finally:
        for pid in (leader, worker):
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


# ----------------------------------------------------------------------------- parallel_compile


def _local_pending(root: Path, hlo: Path, n: int) -> list[str]:
    keys = []
    for i in range(n):
        key = f"{i:04x}" + "beef" * 7
        entry = root / key
        entry.mkdir(parents=True)
        (entry / "graph.hlo").write_bytes(hlo.read_bytes())
        (entry / "metadata.json").write_text(json.dumps({
            "metadata_version": 1, "key": key, "status": "pending", "seam": "neuron_libtorch_graph_capture",
            "graph_type": f"g{i}", "compiler_args": ["-O1"], "target": "trn2",
            "compiler": {"name": "local", "version": local_version(), "format": "xla-cpu-executable"}}))
        keys.append(key)
    return keys


def test_parallel_compile_with_2_threads_starts_2_warm_workers(hlo_file, tmp_path, shared):
    """Each thread starts a worker when none is idle; a thread whose new worker is not ready yet takes one given
    back meanwhile, so how the graphs split between the two depends on timing: every graph runs on one of them."""
    root = tmp_path / "cache"
    keys = _local_pending(root, hlo_file, 6)
    report = parallel_compile(root, workers=2, quiet=True)
    assert report.ok and sorted(g.key for g in report.graphs) == keys
    firsts = [_first_line(root / k) for k in keys]
    assert all("warm worker" in line for line in firsts)
    leaders = shared.idle_pids()
    assert len(leaders) == 2
    workers_of = {c for leader in leaders for c in _children(leader)}
    assert len(workers_of) == 2
    assert {int(re.search(r"pid (\d+)", line).group(1)) for line in firsts} <= workers_of
    for entry in CompileCache(root).entries():
        assert entry.status == "complete" and entry.problem() is None


def test_prestarted_workers_take_the_graphs_of_parallel_compile(hlo_file, tmp_path, shared):
    root = tmp_path / "cache"
    keys = _local_pending(root, hlo_file, 4)
    assert shared.prestart(2) == 2 and shared.prestart(1) == 2  # nothing more to start
    leaders = set(shared.idle_pids())
    workers_of = {c for leader in leaders for c in _children(leader)}
    assert len(workers_of) == 2
    parallel_compile(root, workers=2, quiet=True)
    logs = [(root / k / LOG_FILE).read_text() for k in keys]
    assert {int(re.search(r"pid (\d+)", log).group(1)) for log in logs} <= workers_of
    assert all("jax startup seconds: 0.000" in log for log in logs)  # jax was up before the first graph
    assert set(shared.idle_pids()) == leaders


def test_a_prestart_that_does_not_wait_hands_its_worker_to_the_next_compile(hlo_file, tmp_path, shared, monkeypatch):
    """prestart(wait=False) returns before jax started in the worker; the worker started before this process
    imported jax (which sets TF_CPP_MIN_LOG_LEVEL=1 when unset) is still the one the compile takes."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    root = tmp_path / "cache"
    keys = _local_pending(root, hlo_file, 2)
    assert shared.prestart(1, wait=False) == 1
    (leader,) = shared.idle_pids()
    assert not shared._idle.children[0].ready  # nobody waited for it
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # as importing jax here would
    assert parallel_compile(root, workers=1, quiet=True).ok
    logs = [(root / k / LOG_FILE).read_text() for k in keys]
    assert {int(re.search(r"pid (\d+)", log).group(1)) for log in logs} == set(_children(leader))
    assert shared.idle_pids() == [leader]


@pytest.fixture(scope="module")
def lapack_hlo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inv(a) @ b: a graph whose HLO calls LAPACK custom calls (lapack_sgetrf_ffi ...), lowered by jax."""
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda a, b: jnp.linalg.inv(a) @ b).lower(
        jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32))
    assert "lapack_" in lowered.as_text("hlo")
    path = tmp_path_factory.mktemp("lapack") / "graph.hlo"
    path.write_bytes(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
    return path


def _run_inv(blob: Path) -> None:
    from neuron_args import xla_cpu
    from tests.xla_run import execute

    rng = np.random.default_rng(0)
    a = (rng.standard_normal((4, 4)) + 4 * np.eye(4)).astype(np.float32)
    b = rng.standard_normal((4, 4), dtype=np.float32)
    (out,) = execute(xla_cpu.deserialize_executable(blob.read_bytes()), [a, b])
    np.testing.assert_allclose(out, np.linalg.inv(a) @ b, rtol=1e-4, atol=1e-5)


def test_worker_compiles_lapack_custom_calls_without_importing_jax(lapack_hlo: Path, shared, tmp_path: Path) -> None:
    entry = tmp_path / "inv"
    result = _compile(lapack_hlo, entry, LocalCompiler())
    log = (entry / LOG_FILE).read_text()
    assert "warm worker" in _first_line(entry)
    assert "xla client: jaxlib's own (jax not imported)" in log
    assert "importing jax" not in log
    _run_inv(result.output_path)


FALLBACK = textwrap.dedent("""
    # the one-shot program with no custom-call targets queued: the compile must import jax for them
    import sys
    from neuron_args.compilers import local_xla
    local_xla.preload = lambda: None
    sys.exit(local_xla.main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_custom_call_only_jax_registers_is_compiled_after_importing_jax(lapack_hlo: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "no_targets.py"
    script.write_text(FALLBACK)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    entry = tmp_path / "inv"
    result = _compile(lapack_hlo, entry, LocalCompiler([sys.executable, str(script)]))
    log = (entry / LOG_FILE).read_text()
    assert re.search(r"importing jax for its custom-call targets \(.*lapack_\w+_ffi", log), log
    assert "xla client: jaxlib's own (jax not imported)" in log  # the client came first; jax only for the targets
    _run_inv(result.output_path)


def _tiny_runner(cache: Path):
    import torch

    from neuron_args.runner import NeuronRunner
    from tests.conftest import MODEL_CONFTEST

    namespace: dict = {}
    exec(compile(MODEL_CONFTEST, "<tiny model>", "exec"), namespace)
    torch._dynamo.reset()
    return NeuronRunner(namespace["TinyTwoGraph"](), compiler_args="-O1", target="trn2", compiler="local",
                        cache_dir=cache)


@pytest.mark.slow
def test_in_process_warmup_starts_its_worker_before_the_first_compile_on_a_cold_cache_only(
        shared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_args.cache import STATS

    started = []
    real = shared.prestart

    def prestart(n, timeout=300.0, wait=True):
        before = STATS.snapshot()
        count = real(n, timeout, wait)
        started.append((before, shared._idle.children[-1]))
        return count

    monkeypatch.setattr(shared, "prestart", prestart)
    STATS.reset()  # counted from zero, as in a fresh process (earlier tests in this one may have missed without compiling)
    cache = tmp_path / "cache"
    report = _tiny_runner(cache).warmup(emit=False)
    assert report.counts.compiles == 2
    [(before, worker)] = started
    assert before["compiles"] == before["misses"] == STATS.compiles - 2 == STATS.misses - 2  # before any miss
    logs = [entry.log_path.read_text().splitlines()[0] for entry in CompileCache(cache).entries()]
    assert any(f"pid {worker.worker_pid}, warm worker, compile 1)" in line for line in logs), logs

    warm = workers.WorkerPool()  # a later process on the warm cache: its record lists every job complete
    monkeypatch.setattr(workers, "_pool", warm)
    try:
        assert _tiny_runner(cache).warmup(emit=False).counts.compiles == 0
        assert warm.idle_pids() == []  # nothing started
    finally:
        _kill_all(warm)


def test_a_session_that_will_compile_starts_a_worker_at_collection(neuron_project: pytest.Pytester, shared,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    neuron_project.makepyfile(test_up="""
        from neuron_args.compilers import workers

        def test_up(neuron_runner):
            assert len(workers.shared_pool().idle_pids()) == 1  # up before any warmup of this test
    """)
    neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={tmp_path / 'cold'}").assert_outcomes(passed=1)
    [leader] = shared.idle_pids()
    assert alive(leader)
    _kill_all(shared)
    fresh = workers.WorkerPool()
    monkeypatch.setattr(workers, "_pool", fresh)
    neuron_project.runpytest("-p", "no:randomly", "--collect-only", f"--neuron-cache-dir={tmp_path / 'cold2'}")
    assert fresh.idle_pids() == []  # collecting compiles nothing: nothing started


def test_a_session_on_a_warm_cache_starts_no_worker(neuron_project: pytest.Pytester, shared) -> None:
    neuron_project.makepyfile(test_warm="""
        from neuron_args.compilers import workers

        def test_warm(neuron_warmup):
            assert neuron_warmup.counts.compiles == 0
            assert workers.shared_pool().idle_pids() == []
    """)
    neuron_project.runpytest("-p", "no:randomly").assert_outcomes(passed=1)


# ----------------------------------------------------------------------------- first come, and forked children


@pytest.mark.slow
def test_a_compile_takes_a_worker_given_back_rather_than_wait_for_its_new_one(hlo_file, tmp_path, slow, monkeypatch):
    """Worker A is up; B is started for the second thread but held at start: every graph goes to A."""
    gate, go = tmp_path / "slow-gate", tmp_path / "slow-go"
    monkeypatch.setenv("SLOW_WORKER_GATE", str(gate))
    monkeypatch.setenv("SLOW_WORKER_GO", str(go))
    monkeypatch.setattr(workers, "_pool", slow)
    monkeypatch.delenv(workers.WARM_WORKERS_ENV, raising=False)
    slow.arm(300)  # A's first compile waits for "go" ... (armed before A starts: it reads the sleep at start)
    gate.touch()
    assert slow.prestart(1) == 1
    (leader_a,) = slow.idle_pids()
    (worker_a,) = _children(leader_a)
    gate.unlink()  # from now on a new worker does not start
    root = tmp_path / "cache"
    keys = _local_pending(root, hlo_file, 4)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=parallel_compile(root, workers=2, quiet=True)))
    thread.start()

    def leaders() -> set[int]:  # the stand-in's supervisors this process started (from lifetime's start thread)
        pids = {int(c) for task in Path("/proc/self/task").iterdir() for c in (task / "children").read_text().split()}
        return {pid for pid in pids
                if alive(pid) and str(slow.script).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()}

    # ... until the second thread had B started (held at its gate, so never ready)
    wait_until(lambda: slow.started.exists() and len(leaders()) == 2, 60, "a second worker started for the 2nd thread")
    (leader_b,) = leaders() - {leader_a}
    go.touch()
    thread.join(120)
    assert not thread.is_alive() and result["r"].ok
    assert {k: _worker_pid(root / k) for k in keys} == {k: worker_a for k in keys}
    assert sorted(slow.idle_pids()) == sorted([leader_a, leader_b])  # B was given back, still starting
    (worker_b,) = [w for w in slow._idle.children if w.pid == leader_b]
    assert not worker_b.ready
    gate.touch()
    assert worker_b.wait_ready(time.monotonic() + 120)  # and it starts once let go


def test_a_forked_child_lets_go_of_the_pool_so_a_closed_pool_leaves_while_it_lives(pool, monkeypatch):
    """A kept trace child forks from the driver: were it to hold the connections, an idle worker would live on after
    the driver let it go, until that child left."""
    monkeypatch.setattr(workers, "_pool", pool)
    assert pool.prestart(1) == 1
    (leader,) = pool.idle_pids()
    held = pool.inherited_fds()
    assert len(held) == 1  # the worker's connection (one socket both ways)
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
            assert json.load(f) == [os.devnull] * len(held)
        pool.close()
        wait_until(lambda: not alive(leader), 30, "the closed pool's worker left while the forked child lives")
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
