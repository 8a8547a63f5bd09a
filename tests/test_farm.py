"""The compile farm: parallel_compile and ``neuron-args compile`` on Dask workers, with and without the cache folder.

Real processes throughout: a ``distributed.LocalCluster`` (worker processes, loopback only), ``dask
worker`` processes in their own mount namespace with the test folder hidden under an empty tmpfs,
the embedded local compiler on captured MLP graphs, and a stand-in ``neuronx-cc``
(``tests/fakes/farm_neuronx_cc.py``) where a compile must hang, fail or be killed.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from neuron_args import scoped_compiler_args
from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, STATS, CompileCache
from neuron_args.cli import main as cli_main
from neuron_args.deferred import parallel_compile
from neuron_args.errors import CompilerArgsError
from tests.models import MLP

distributed = pytest.importorskip("distributed", reason="the farm extra is not installed: pip install -e '.[farm]'")
psutil = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[1]
FAKE_SOURCE = Path(__file__).parent / "fakes" / "farm_neuronx_cc.py"
FAKE_VERSION = "2.21.0.0"
BATCHES = (1, 2, 3, 4)
BASE = ["--auto-cast=none", "-O1"]
LOOPBACK = "127.0.0.1"


def opts(root: Path) -> dict:
    return {"cache_dir": str(root), "compiler_args": BASE, "target": "trn2", "compiler": "local"}


def wait_until(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {seconds:g} s")
        time.sleep(0.1)


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory) -> tuple[Path, Path]:
    """A folder holding the stand-in ``neuronx-cc``, and the folder where it records its calls."""
    bindir = tmp_path_factory.mktemp("farm-bin")
    exe = bindir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SOURCE.read_text())
    exe.chmod(0o755)
    return bindir, tmp_path_factory.mktemp("farm-fake-state")


@pytest.fixture(scope="module")
def cluster(fake_bin):
    """A 2-worker LocalCluster (processes, loopback); its workers find the stand-in neuronx-cc on PATH."""
    bindir, state = fake_bin
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FARM_FAKE_STATE": str(state)}
    lc = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host=LOOPBACK,
                                  dashboard_address=f"{LOOPBACK}:0", env=env)
    client = distributed.Client(lc, set_as_default=False)
    try:
        yield lc, client
    finally:
        client.close()
        lc.close()


@pytest.fixture
def client(cluster):
    lc, client = cluster
    client.wait_for_workers(2, timeout=60)  # a test may have killed one: its nanny restarts it
    return client


@pytest.fixture
def fake_path(fake_bin, monkeypatch):
    bindir, state = fake_bin
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FARM_FAKE_STATE", str(state))
    return state


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    """Four pending entries: an MLP at four batch sizes, captured in this process (copied per test)."""
    root = tmp_path_factory.mktemp("farm-captured") / "cache"
    torch._dynamo.reset()
    cm = torch.compile(make_model(), backend="neuron_libtorch_graph_capture", options=opts(root), dynamic=False)
    with torch.inference_mode():
        for b in BATCHES:
            cm(torch.ones(b, 32))
    torch._dynamo.reset()
    assert [e.status for e in CompileCache(root).entries()] == ["pending"] * len(BATCHES)
    return root


@pytest.fixture
def pending_mlp(captured, tmp_path) -> Path:
    root = tmp_path / "cache"
    shutil.copytree(captured, root)
    return root


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    ACTIVITY.reset()  # this process starts over: records, counters, loaded executables...


def make_model() -> MLP:
    torch.manual_seed(0)
    return MLP().eval()


def make_fake_pending(root: Path, name: str, mode: str, graph_type: str = "decode",
                      version: str = FAKE_VERSION) -> str:
    """A pending entry captured for neuronx-cc ``version`` whose graph.hlo tells the stand-in what to do."""
    key = hashlib.md5(f"{root}/{name}".encode()).hexdigest()
    entry = CompileCache(root).entry(key)
    entry.reset()
    entry.hlo_path.write_bytes(f"FARM:{mode}:{name}".encode())
    entry.write_metadata({
        "metadata_version": 1, "key": key, "seam": "neuron_libtorch_graph_capture", "graph_type": graph_type,
        "compiler_args": ["-O1"], "target": "trn2", "status": "pending",
        "compiler": {"name": "neuronx-cc", "version": version, "format": "neff"},
        "key_components": {"tool_versions": {"compiler": f"neuronx-cc {version}"}},
    })
    return key


def assert_sound(entry) -> None:
    """Complete, with the executable the metadata's size and sha256 describe, and no temp files."""
    md = entry.metadata()
    blob = entry.executable_path.read_bytes()
    assert entry.status == "complete" and md["status"] == "compiled", entry
    assert md["executable_size"] == len(blob) and md["executable_sha256"] == hashlib.sha256(blob).hexdigest()
    assert not [p.name for p in entry.path.iterdir() if p.name.endswith(".tmp") or ".partial-" in p.name]
    assert entry.command_path.read_text().split()[-2:] == BASE or md["compiler"]["name"] == "neuronx-cc"
    assert str(entry.path) in entry.command_path.read_text()  # re-runnable here, not in the worker's temp dir


def serve_all_hits(root: Path, monkeypatch) -> None:
    """Serve every batch size under NEURON_LIBTORCH_ASSERT_CACHE_HIT: all hits, outputs as eager."""
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    STATS.reset()
    torch._dynamo.reset()
    model = make_model()
    cm = torch.compile(model, backend="neuron_libtorch", options=opts(root), dynamic=False)
    try:
        with torch.inference_mode(), scoped_compiler_args(BASE):
            for b in BATCHES:
                x = torch.randn(b, 32)
                torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    finally:
        torch._dynamo.reset()
    assert STATS.hits == len(BATCHES) and STATS.misses == 0 and STATS.compiles == 0


# ----------------------------------------------------------------------------- LocalCluster


@pytest.mark.slow
def test_cli_compiles_on_a_local_cluster_and_serve_hits(pending_mlp, client, capsys, monkeypatch):
    address = client.scheduler.address
    worker_pids = set(client.run(os.getpid).values())
    rc = cli_main(["compile", str(pending_mlp), "--scheduler", address, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["compiled"] == len(BATCHES) and doc["failed"] == 0
    assert sorted(g["key"] for g in doc["graphs"]) == [e.key for e in CompileCache(pending_mlp).entries()]
    assert f"[{len(BATCHES)}/{len(BATCHES)}]" in err  # plain progress lines: stderr is not a terminal
    for entry in CompileCache(pending_mlp).entries():
        assert_sound(entry)
        host, pid = entry.metadata()["compiled_on"]["worker"].rsplit(":", 1)
        assert int(pid) in worker_pids and int(pid) != os.getpid()
    serve_all_hits(pending_mlp, monkeypatch)


def test_a_worker_with_another_compiler_version_is_refused(tmp_path, fake_path):
    root = tmp_path / "cache"
    key = make_fake_pending(root, "old", "ok", version="2.19.1.0")
    with cf.ThreadPoolExecutor(2) as pool:
        report = parallel_compile(root, executor=pool, quiet=True, raise_on_error=False)
    (g,) = report.graphs
    assert g.status == "failed" and key in g.error and "'decode'" in g.error
    assert f"version {FAKE_VERSION!r}" in g.error and "'2.19.1.0'" in g.error and "fix:" in g.error
    entry = CompileCache(root).entry(key)
    assert entry.status == "pending" and not entry.executable_path.exists()
    assert not (fake_path / "old.calls").exists()  # refused before the compiler ran


def test_a_thread_pool_builds_with_auto_and_refuses_another_compiler_name(tmp_path, fake_path):
    root = tmp_path / "cache"
    key = make_fake_pending(root, "threaded", "ok")
    with cf.ThreadPoolExecutor(2) as pool:
        report = parallel_compile(root, executor=pool, compiler="local", quiet=True, raise_on_error=False)
        (g,) = report.graphs
        assert g.status == "failed" and "captured for compiler 'neuronx-cc'" in g.error and key in g.error
        report = parallel_compile(root, executor=pool, compiler="auto", quiet=True)
    assert [g.status for g in report.graphs] == ["compiled"]
    assert_sound(CompileCache(root).entry(key))


def test_the_worker_pool_refuses_another_compiler_name_as_the_farm_does(tmp_path, fake_path):
    root = tmp_path / "cache"
    key = make_fake_pending(root, "pooled", "ok")
    report = parallel_compile(root, compiler="local", quiet=True, raise_on_error=False)
    (g,) = report.graphs
    assert g.status == "failed" and key in g.error and "'decode'" in g.error
    assert "captured for compiler 'neuronx-cc'" in g.error and "compiling it with 'local'" in g.error
    assert CompileCache(root).entry(key).status == "pending"
    assert not (fake_path / "pooled.calls").exists()


def test_auto_is_each_entrys_own_compiler_on_the_worker_pool_too(pending_mlp, fake_path):
    """Entries captured for the local compiler build with it under compiler="auto" though neuronx-cc is on PATH
    (on the own threads as through an executor); an unknown name fails before any graph is built."""
    with pytest.raises(CompilerArgsError, match=r"unknown compiler 'xla' \(from parallel_compile\(compiler\)\)"):
        parallel_compile(pending_mlp, compiler="xla", quiet=True)
    assert {e.status for e in CompileCache(pending_mlp).entries()} == {"pending"}
    report = parallel_compile(pending_mlp, compiler=" Auto", quiet=True)
    assert [g.status for g in report.graphs] == ["compiled"] * len(BATCHES)
    assert {CompileCache(pending_mlp).entry(g.key).info().compiler_name for g in report.graphs} == {"local"}


def test_a_worker_without_the_compiler_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no neuronx-cc here
    root = tmp_path / "cache"
    key = make_fake_pending(root, "nocc", "ok")
    with cf.ThreadPoolExecutor(1) as pool:
        report = parallel_compile(root, executor=pool, quiet=True, raise_on_error=False)
    (g,) = report.graphs
    assert g.status == "failed" and f"key {key}, on worker {socket.gethostname()}:" in g.error
    assert "'neuronx-cc' was requested" in g.error and "not on PATH" in g.error
    assert CompileCache(root).entry(key).status == "pending"


def test_cli_local_pool_lists_each_failed_graph_and_exits_1(tmp_path, fake_path, capsys):
    root = tmp_path / "cache"
    good = [make_fake_pending(root, f"good{i}", "ok", graph_type="prefill") for i in range(2)]
    bad = make_fake_pending(root, "bad", "fail")
    rc = cli_main(["compile", str(root), "--workers", "2"])
    out, err = capsys.readouterr()
    assert rc == 1
    failed = [line for line in err.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and f"'decode' {bad}" in failed[0] and "exit status 1" in failed[0]
    assert "2 compiled, 0 already complete, 1 failed" in out and "[3/3]" in err
    cache = CompileCache(root)
    for key in good:
        assert_sound(cache.entry(key))
    entry = cache.entry(bad)
    assert entry.status == "pending" and not entry.executable_path.exists()
    assert "does not compile" in entry.log_path.read_text()  # the worker's log, where the error points
    assert cli_main(["compile", str(root), "--workers", "1", "--json"]) == 1  # a rerun builds the failed one only
    doc = json.loads(capsys.readouterr().out)
    assert [g["key"] for g in doc["graphs"]] == [bad] and doc["failed"] == 1


def test_a_worker_killed_mid_compile_is_retried_on_another_worker(tmp_path, client, fake_bin):
    _, state = fake_bin
    root = tmp_path / "cache"
    key = make_fake_pending(root, "killme", "sleep-once")
    worker_pids = set(client.run(os.getpid).values())
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(report=parallel_compile(
        root, executor=client.get_executor(pure=False), quiet=True, raise_on_error=False)))
    thread.start()
    started = state / "killme.started"
    compiler_pid = None
    try:
        wait_until(started.exists, 60, "the first compile to start")
        compiler_pid = int(started.read_text())
        ancestors = [p.pid for p in psutil.Process(compiler_pid).parents()]
        (victim,) = [pid for pid in ancestors if pid in worker_pids]
        entry = CompileCache(root).entry(key)
        assert not entry.is_complete and not entry.executable_path.exists()  # pending (its lock held meanwhile)
        os.kill(victim, signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive()
    finally:
        if compiler_pid:
            kill_quietly(compiler_pid)  # the killed worker's compiler, orphaned
        thread.join(5)
    (g,) = result["report"].graphs
    assert g.status == "compiled", g.error
    entry = CompileCache(root).entry(key)
    assert_sound(entry)
    assert entry.metadata()["compiled_on"]["worker"].rsplit(":", 1)[1] != str(victim)
    assert len((state / "killme.calls").read_text().splitlines()) == 2


def test_an_unreachable_scheduler_is_a_clear_error_within_the_timeout(pending_mlp, capsys):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    address = f"tcp://{LOOPBACK}:{port}"
    rc = cli_main(["compile", str(pending_mlp), "--scheduler", address, "--connect-timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"cannot reach the Dask scheduler at {address} within 2 s" in err and "fix:" in err
    assert {e.status for e in CompileCache(pending_mlp).entries()} == {"pending"}


def test_scheduler_without_the_farm_extra_says_how_to_install_it(pending_mlp, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the [farm] extra were not installed
    assert cli_main(["compile", str(pending_mlp), "--scheduler", f"tcp://{LOOPBACK}:8786"]) == 2
    assert "pip install 'neuron-args[farm]'" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_cancels_the_remote_compiles(tmp_path, client, fake_bin):
    _, state = fake_bin
    root = tmp_path / "cache"
    keys = [make_fake_pending(root, f"hang{i}", "sleep") for i in range(2)]
    cmd = [sys.executable, "-m", "neuron_args.cli", "compile", str(root), "--scheduler", client.scheduler.address]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids: list[int] = []
    try:
        started = [state / f"hang{i}.started" for i in range(2)]
        wait_until(lambda: all(p.exists() for p in started), 60, "both compiles to start on the workers")
        pids = [int(p.read_text()) for p in started]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "interrupted; 2 entries stay pending" in err
        wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                   for p in pids), 20, "the workers to kill their compilers")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in pids:
            kill_quietly(pid)
    for key in keys:
        entry = CompileCache(root).entry(key)
        assert entry.status == "pending" and not entry.executable_path.exists()
    assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3  # the workers are free again


# ----------------------------------------------------------------------------- workers without the cache folder


def _unshare_can_mount(path: Path) -> str | None:
    """None when ``unshare -m`` can mount a tmpfs over ``path`` here, else why not."""
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs farm-probe '{path}'"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -m cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}"
    return None


@pytest.mark.slow
def test_workers_that_cannot_see_the_cache_folder(pending_mlp, tmp_path_factory, monkeypatch):
    hidden = tmp_path_factory.getbasetemp()  # every test folder, the cache's included
    assert hidden in pending_mlp.parents
    reason = _unshare_can_mount(hidden)
    if reason:
        pytest.skip(reason)
    scheduler = distributed.LocalCluster(n_workers=0, processes=True, host=LOOPBACK,
                                         dashboard_address=f"{LOOPBACK}:0")
    client = distributed.Client(scheduler, set_as_default=False)
    procs = []
    try:
        worker = (f"{sys.executable} -m distributed.cli.dask_worker {scheduler.scheduler_address} --no-nanny "
                  f"--nthreads 1 --host {LOOPBACK} --dashboard-address {LOOPBACK}:0 --death-timeout 60")
        for _ in range(2):
            procs.append(subprocess.Popen(
                ["unshare", "-m", "sh", "-c", f"mount -t tmpfs farm-hidden '{hidden}' && exec {worker}"],
                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True))
        client.wait_for_workers(2, timeout=60)
        sees = client.run(os.path.exists, str(pending_mlp / CompileCache(pending_mlp).entries()[0].key))
        assert sees and not any(sees.values()), sees  # the workers cannot read the cache folder
        assert all(os.path.exists(e.hlo_path) for e in CompileCache(pending_mlp).entries())
        report = parallel_compile(pending_mlp, executor=client.get_executor(pure=False), quiet=True)
        assert report.ok and [g.status for g in report.graphs] == ["compiled"] * len(BATCHES)
    finally:
        client.close()
        scheduler.close()
        for proc in procs:
            with_group = proc.poll() is None
            if with_group:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for entry in CompileCache(pending_mlp).entries():
        assert_sound(entry)
    serve_all_hits(pending_mlp, monkeypatch)


# ----------------------------------------------------------------------------- more faults, output forms


@pytest.mark.slow
def test_a_graph_whose_workers_keep_dying_is_reported_failed_with_no_half_entry(tmp_path, fake_bin):
    """allowed-failures 0: the first dead worker fails the task (KilledWorker), reported, entry pending."""
    bindir, state = fake_bin
    root = tmp_path / "cache"
    key = make_fake_pending(root, "doomed", "sleep")
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FARM_FAKE_STATE": str(state)}
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        lc = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host=LOOPBACK,
                                      dashboard_address=f"{LOOPBACK}:0", env=env)
    client = distributed.Client(lc, set_as_default=False)
    compiler_pid = None
    try:
        (worker_pid,) = client.run(os.getpid).values()
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(report=parallel_compile(
            root, executor=client.get_executor(pure=False), quiet=True, raise_on_error=False)))
        thread.start()
        started = state / "doomed.started"
        wait_until(started.exists, 60, "the compile to start")
        compiler_pid = int(started.read_text())
        os.kill(worker_pid, signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive()
    finally:
        if compiler_pid:
            kill_quietly(compiler_pid)
        client.close()
        lc.close()
    (g,) = result["report"].graphs
    assert g.status == "failed" and key in g.error and "'decode'" in g.error
    assert "died repeatedly" in g.error and "fix:" in g.error and "stays pending" in g.error
    entry = CompileCache(root).entry(key)
    assert entry.status == "pending" and sorted(p.name for p in entry.path.iterdir()) == ["graph.hlo", "metadata.json"]


def test_timeout_and_nothing_pending(tmp_path, fake_path, capsys):
    root = tmp_path / "cache"
    key = make_fake_pending(root, "slow", "sleep")
    started = fake_path / "slow.started"
    try:
        rc = cli_main(["compile", str(root), "--workers", "1", "--timeout", "1", "--json"])
    finally:
        if started.exists():
            kill_quietly(int(started.read_text()))
    out, err = capsys.readouterr()
    assert rc == 1 and json.loads(out)["failed"] == 1
    assert f"FAILED 'decode' {key}:" in err and "timed out after 1 s" in err
    assert cli_main(["compile", str(root), "--timeout", "0"]) == 2  # argparse: not a positive number
    assert "not a positive number of seconds" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["compile", str(empty)]) == 0
    assert "no pending entries" in capsys.readouterr().out


@pytest.mark.slow
def test_progress_is_a_bar_on_a_terminal(tmp_path, fake_path, monkeypatch, capsys):
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    root = tmp_path / "cache"
    for i in range(3):
        make_fake_pending(root, f"bar{i}", "ok")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli_main(["compile", str(root), "--workers", "2"]) == 0
    text = terminal.getvalue()
    assert "3/3" in text and "graph" in text and "\r" in text  # tqdm redraws one line
    assert "[1/3]" not in text  # not the plain lines


@pytest.mark.slow
def test_losing_the_scheduler_mid_run_fails_the_graphs_clearly(tmp_path, fake_bin, capsys):
    """A ``dask scheduler`` process killed while its worker compiles: exit 1, the graph listed, entry pending."""
    bindir, state = fake_bin
    root = tmp_path / "cache"
    key = make_fake_pending(root, "orphaned", "sleep")
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FARM_FAKE_STATE": str(state)}
    common = dict(cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                  start_new_session=True)
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", LOOPBACK,
                               "--port", "0", "--dashboard-address", f"{LOOPBACK}:0",
                               "--scheduler-file", str(scheduler_file)], **common)]
    compiler_pid = None
    try:
        wait_until(scheduler_file.exists, 60, "the scheduler to start")
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                       str(scheduler_file), "--no-nanny", "--nthreads", "1", "--host", LOOPBACK,
                                       "--dashboard-address", f"{LOOPBACK}:0", "--death-timeout", "10"], **common))
        address = json.loads(scheduler_file.read_text())["address"]
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(rc=cli_main(
            ["compile", str(root), "--scheduler", address, "--connect-timeout", "30"])))
        thread.start()
        started = state / "orphaned.started"
        wait_until(started.exists, 60, "the compile to start")
        compiler_pid = int(started.read_text())
        procs[0].kill()
        thread.join(120)
        assert not thread.is_alive()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if compiler_pid:
            kill_quietly(compiler_pid)
    err = capsys.readouterr().err
    assert result["rc"] == 1
    assert f"lost the Dask scheduler at {address}" in err and f"FAILED 'decode' {key}" in err
    entry = CompileCache(root).entry(key)
    assert entry.status == "pending" and sorted(p.name for p in entry.path.iterdir()) == ["graph.hlo", "metadata.json"]


def test_a_graph_whose_key_lock_stays_held_fails_after_the_lock_timeout_naming_it(tmp_path, fake_path, monkeypatch):
    """A wedged holder of the key's lock never hangs a farm build: past the cache's lock timeout the graph fails
    naming its graph type, key, the lock's holder and the fix; the entry stays pending and nothing compiled."""
    from neuron_args.cache import KeyLock
    pc = importlib.import_module("neuron_args.deferred.parallel_compile")  # the package's name is the function

    root = tmp_path / "cache"
    key = make_fake_pending(root, "wedged", "ok")
    held = KeyLock(CompileCache(root).entry(key))
    assert held.acquire()
    monkeypatch.setattr(pc, "LOCK_TIMEOUT", 0.5)
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            (graph,) = pc.parallel_compile(root, executor=pool, keys=[key], quiet=True, raise_on_error=False).graphs
    finally:
        held.release()
    assert graph.status == "failed" and key in graph.error and "'decode'" in graph.error
    assert f"process {os.getpid()}" in graph.error and "fix:" in graph.error and "stays pending" in graph.error
    assert CompileCache(root).entry(key).status == "pending"
    assert not (fake_path / "wedged.calls").exists()
