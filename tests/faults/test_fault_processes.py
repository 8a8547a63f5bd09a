"""Hung compilers, killed parents, Ctrl-C and SIGTERM during parallel_compile, four processes on one key.

Every case runs real processes: a parent Python (``parallel_compile`` in a child of the test) and
the fake ``neuronx-cc`` it starts, which sleeps before it writes its output (and, where it
matters, starts a helper process of its own, as neuronx-cc does).
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from neuron_args.cache import CompileCache
from neuron_args.deferred.parallel_compile import parallel_compile
from tests.faults.fault_helpers import alive, compile_script, make_pending, wait_until

pytestmark = pytest.mark.slow  # fault processes: compilers hung, killed, interrupted, raced


def _entries_consistent(root) -> dict[str, str]:
    """Every entry complete and sound, or pending with no executable and no leftovers; status by key."""
    statuses = {}
    for entry in CompileCache(root).entries():
        status = entry.status
        assert status in ("complete", "pending"), (entry.key, status)
        if status == "complete":
            assert entry.problem() is None, entry.key
        else:
            names = sorted(p.name for p in entry.path.iterdir())
            assert not entry.executable_path.exists(), names
            assert not [n for n in names if n.endswith(".tmp") or ".partial-" in n], names
        statuses[entry.key] = status
    return statuses


# ------------------------------------------------------------------------------------------ 1. timeout


def test_hung_compiler_times_out_and_its_whole_group_is_killed(tmp_path, fake_env, reaper):
    """parallel_compile(compile_timeout=1) on a neuronx-cc that hangs (with a helper process)."""
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "300", "FAKE_NEURONX_CC_HELPER": "1"}
    proc = reaper.popen([sys.executable, str(compile_script(tmp_path)), str(root), "1", "1"], env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "CompileError" in err and "timed out after 1 s" in err
    assert f"'decode0' {key}" in err  # graph type and key
    assert "command: neuronx-cc compile" in err and "log line 39" in err  # the command and the log tail
    assert "compile_timeout" in err and "NEURON_ARGS_COMPILE_TIMEOUT" in err  # the fix names the knobs
    pids = reaper.compiler_pids()
    assert len(pids) == 2  # the compiler and its helper: both killed with the process group
    wait_until(lambda: not any(alive(p) for p in pids), 10, f"compiler processes {pids} gone")
    assert CompileCache(root).entry(key).status == "pending"  # still pending: a rerun retries it


def test_timeout_from_the_environment_bounds_an_in_process_compile(tmp_path, fake_env, reaper, monkeypatch):
    """``$NEURON_ARGS_COMPILE_TIMEOUT`` applies when no option is given; the compiler is gone after the error."""
    monkeypatch.setenv("NEURON_ARGS_COMPILE_TIMEOUT", "1")
    monkeypatch.setenv("FAKE_NEURONX_CC_SLEEP", "300")
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
    (graph,) = report.graphs
    assert graph.status == "failed" and "timed out after 1 s" in graph.error and key in graph.error
    (pid,) = reaper.compiler_pids()
    wait_until(lambda: not alive(pid), 5, f"compiler {pid} gone")  # SIGKILLed: it exits when next scheduled


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_bad_timeout_setting_is_an_options_error(tmp_path, fake_env, monkeypatch, value):
    from neuron_args.errors import OptionsError

    monkeypatch.setenv("NEURON_ARGS_COMPILE_TIMEOUT", value)
    root = tmp_path / "cache"
    make_pending(root, 1)
    report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
    assert "NEURON_ARGS_COMPILE_TIMEOUT" in report.graphs[0].error
    with pytest.raises(OptionsError, match="compile timeout"):
        parallel_compile(root, compile_timeout=-1)


# ------------------------------------------------------------------------------------------ 2. no orphans


SINGLE_SCRIPT = textwrap.dedent("""
    import sys
    from neuron_args.cache import CompileCache
    from neuron_args.compilers.base import compile_entry
    from neuron_args.compilers import NeuronxCcCompiler
    cache = CompileCache(sys.argv[1])
    entry = cache.entry(sys.argv[2])
    with cache.lock(entry.key):  # what the compile seam does on a miss (without torch)
        compile_entry(entry, NeuronxCcCompiler(), ["-O1"], "trn2", "decode0", entry.info())
        entry.mark_complete()
    print("DONE", entry.key)
""")


@pytest.mark.parametrize("flow", ["single", "parallel_compile"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_killed_parent_takes_its_compiler_with_it(tmp_path, fake_env, reaper, sig, flow):
    """kill -9 (or SIGTERM) of a parent mid-compile: the compiler (which would sleep 8 s more) and its
    helper are gone within seconds and write nothing more into the entry; a rerun builds it."""
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    if flow == "single":
        script = tmp_path / "single.py"
        script.write_text(SINGLE_SCRIPT)
        argv = [sys.executable, str(script), str(root), key]
    else:
        argv = [sys.executable, str(compile_script(tmp_path)), str(root), "1"]
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "8", "FAKE_NEURONX_CC_HELPER": "1"}
    proc = reaper.popen(argv, env)
    wait_until(lambda: len(reaper.compiler_pids()) == 2, 30, "the compiler and its helper started")
    entry = CompileCache(root).entry(key)
    time.sleep(0.2)  # the compiler has written its log; it now sleeps before writing its output
    before = {p.name: p.stat().st_mtime_ns for p in entry.path.iterdir()}
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == -sig
    pids = reaper.compiler_pids()
    wait_until(lambda: not any(alive(p) for p in pids), 5, f"compiler processes {pids} gone after the parent died")
    after = {p.name: p.stat().st_mtime_ns for p in entry.path.iterdir()}
    if sig == signal.SIGKILL or flow == "single":  # the parent died on the spot: nothing touched the entry
        assert after == before
    else:  # parallel_compile handled SIGTERM: it killed the compiler and tidied up (the log got its output)
        assert {n: t for n, t in after.items() if n != "log-neuron-cc.txt"} == {
            n: t for n, t in before.items() if n != "log-neuron-cc.txt" and not n.endswith(".tmp")}
    assert not [n for n in after if ".partial-" in n or n.endswith(".neff")], after
    assert not entry.executable_path.exists() and entry.status == "pending"
    rerun = reaper.popen(argv, fake_env.env)
    out, err = rerun.communicate(timeout=60)
    assert "DONE" in out and key in out, err
    assert _entries_consistent(root) == {key: "complete"}


# ------------------------------------------------------------------------------------------ 3. Ctrl-C


@pytest.mark.parametrize("signals", [(signal.SIGINT,), (signal.SIGINT, signal.SIGINT), (signal.SIGTERM,)],
                         ids=["ctrl-c", "ctrl-c-twice", "sigterm"])
def test_interrupting_parallel_compile_of_12_graphs(tmp_path, fake_env, reaper, signals):
    root = tmp_path / "cache"
    keys = make_pending(root, 12)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "1"}
    proc = reaper.popen([sys.executable, str(compile_script(tmp_path)), str(root), "2"], env)
    cache = CompileCache(root)
    # interrupt once two graphs are built and the next ones are compiling
    wait_until(lambda: sum(e.is_complete for e in cache.entries()) >= 2 and len(reaper.compiler_pids()) >= 3,
               60, "two graphs built and a third compiling")
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.05)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("parallel_compile did not exit within 20 s of the interrupt (deadlock?)")
    if signals[0] == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM, err
    else:
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err  # Python re-raises SIGINT
    assert "DONE" not in out
    match = re.search(r"parallel_compile interrupted in .*: (\d+) built, (\d+) failed, (\d+) cancelled", err)
    assert match, err
    built, failed, cancelled = map(int, match.groups())
    pids = reaper.compiler_pids()
    wait_until(lambda: not any(alive(p) for p in pids), 5, "every compiler stopped")
    statuses = _entries_consistent(root)
    assert built == sum(s == "complete" for s in statuses.values()) >= 2
    assert failed == 0 and cancelled == 12 - built >= 8
    # what the log calls built is what is complete on disk
    complete = sorted(k[:12] for k, s in statuses.items() if s == "complete")
    assert re.search(r"built: (.*)", err).group(1).split() == complete
    rerun = reaper.popen([sys.executable, str(compile_script(tmp_path)), str(root), "2"], fake_env.env)
    out, err = rerun.communicate(timeout=120)
    assert out.startswith("DONE"), err
    assert _entries_consistent(root) == dict.fromkeys(keys, "complete")


class _InterruptLostInDel:
    """Ctrl-C arriving while the interpreter runs a ``__del__`` (or a gc callback: jax registers one): the
    handler's ``KeyboardInterrupt`` is raised there and only printed as unraisable, never propagated."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_whose_keyboard_interrupt_is_lost_still_interrupts_parallel_compile(tmp_path, fake_env, reaper,
                                                                                      monkeypatch):
    """The handler cancels the compiles at once; its exception may land where Python drops it. The call must
    still raise KeyboardInterrupt, not return a report whose graphs were cancelled as if it had finished."""
    monkeypatch.setenv("FAKE_NEURONX_CC_SLEEP", "1")
    root = tmp_path / "cache"
    make_pending(root, 4)
    seen = []

    def progress(event):
        seen.append(event.graph.status)
        if len(seen) == 1:
            _InterruptLostInDel()  # dropped at once: Ctrl-C inside its __del__

    with pytest.raises(KeyboardInterrupt):
        parallel_compile(root, workers=1, quiet=True, progress=progress)
    statuses = _entries_consistent(root)
    assert sorted(statuses.values()) == ["complete", "pending", "pending", "pending"]  # a rerun builds the rest
    assert seen[0] == "compiled" and set(seen[1:]) <= {"cancelled"}


# ------------------------------------------------------------------------------------------ 4 racers, one key

RACE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from neuron_args.cache import CompileCache, CacheEntry
    from neuron_args.compilers.base import compile_entry
    from neuron_args.cache_key import create_cache_hash
    from neuron_args.compilers import NeuronxCcCompiler
    root, start = sys.argv[1], float(sys.argv[2])
    key = create_cache_hash(graph_sha256="ab" * 32, input_specs=[((4, 16), "float32")], compiler_args=["-O1"],
                            target="trn2", tool_versions={"compiler": "neuronx-cc test"})
    def build(entry):
        entry.hlo_path.write_bytes(b"hlo")
        md = {"key": key.key, "status": "compiling", "graph_type": "decode", "compiler_args": ["-O1"]}
        entry.write_metadata(md)
        compile_entry(entry, NeuronxCcCompiler(), ["-O1"], "trn2", "decode", entry.info())
    while time.time() < start:
        time.sleep(0.005)
    entry, hit = CompileCache(root).get_or_build(key, build, graph_type="decode")
    print(json.dumps({"hit": hit, "key": key.key}))
""")


def test_four_processes_racing_one_key_compile_it_once(tmp_path, fake_env, reaper):
    root = tmp_path / "cache"
    script = tmp_path / "race.py"
    script.write_text(RACE_SCRIPT)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "1"}
    start = time.time() + 2
    procs = [reaper.popen([sys.executable, str(script), str(root), str(start)], env) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(eval(out.strip().replace("true", "True").replace("false", "False")))
    assert sorted(r["hit"] for r in results) == [False, True, True, True]
    (entry,) = CompileCache(root).entries()
    assert entry.key == results[0]["key"] and entry.status == "complete" and entry.problem() is None
    compiles = [line for line in fake_env.record.read_text().splitlines() if '"compile"' in line]
    assert len(compiles) == 1


def test_parallel_compile_honours_the_timeout_recorded_at_capture(tmp_path, fake_env, reaper, monkeypatch):
    """The runner hands its options (``compile_timeout`` included) to the capture seam only; the
    deferred build reads the recorded value, ahead of the environment."""
    monkeypatch.setenv("NEURON_ARGS_COMPILE_TIMEOUT", "600")
    monkeypatch.setenv("FAKE_NEURONX_CC_SLEEP", "300")
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    entry = CompileCache(root).entry(key)
    entry.update_metadata(compile_timeout=1)
    report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
    assert "timed out after 1 s" in report.graphs[0].error
    (pid,) = reaper.compiler_pids()
    wait_until(lambda: not alive(pid), 5, f"compiler {pid} gone")  # SIGKILLed: it exits when next scheduled


TRACE_SCRIPT = textwrap.dedent("""
    import sys, torch
    from neuron_args.deferred import TraceJob, parallel_trace
    from tests.trace_models import Hanging
    print("TRACING", flush=True)
    parallel_trace([TraceJob(Hanging(), {"x": torch.zeros(2)}, None, "hang")],
                   options={"cache_dir": sys.argv[1], "compiler": "local"}, timeout=600)
""")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_parent_takes_its_trace_children_with_it(tmp_path, fake_env, reaper):
    script = tmp_path / "trace.py"
    script.write_text(TRACE_SCRIPT)
    proc = reaper.popen([sys.executable, str(script), str(tmp_path / "cache")], fake_env.env)
    assert proc.stdout.readline().strip() == "TRACING"
    wait_until(lambda: _children(proc.pid), 60, "the trace child started")
    children = _children(proc.pid)
    time.sleep(0.5)  # the child is past its start-up and into the hanging forward
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_until(lambda: not any(alive(c) for c in children), 5, f"trace children {children} gone")


def test_ctrl_c_during_a_single_compile_kills_the_compiler_and_the_entry_is_rebuilt(tmp_path, fake_env, reaper):
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    script = tmp_path / "single.py"
    script.write_text(SINGLE_SCRIPT)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "30", "FAKE_NEURONX_CC_HELPER": "1"}
    proc = reaper.popen([sys.executable, str(script), str(root), key], env)
    wait_until(lambda: len(reaper.compiler_pids()) == 2, 30, "the compiler and its helper started")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err
    pids = reaper.compiler_pids()
    wait_until(lambda: not any(alive(p) for p in pids), 5, f"compiler processes {pids} gone")
    assert _entries_consistent(root) == {key: "pending"}
    rerun = reaper.popen([sys.executable, str(script), str(root), key], fake_env.env)
    out, err = rerun.communicate(timeout=60)
    assert f"DONE {key}" in out, err


IN_PROCESS_SCRIPT = textwrap.dedent("""
    import sys
    from neuron_args.cache import CompileCache, new_metadata
    from neuron_args.cache_key import create_cache_hash
    from neuron_args.compilers import NeuronxCcCompiler
    from neuron_args.compilers.base import compile_entry
    cache, compiler = CompileCache(sys.argv[1]), NeuronxCcCompiler()
    key = create_cache_hash(graph_text="HloModule decode", input_specs=[((4,), "float32")], compiler_args=["-O1"],
                            target="trn2", tool_versions={"compiler": "neuronx-cc 2.21"})

    def build(entry):  # what the compile seam does on a miss, without torch
        entry.hlo_path.write_bytes(b"hlo module")
        md = new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"], target="trn2",
                          status="compiling")
        entry.write_metadata(md)
        compile_entry(entry, compiler, ["-O1"], "trn2", "decode", md)

    entry, hit = cache.get_or_build(key, build, graph_type="decode")
    print("DONE", entry.key, "hit" if hit else "built", flush=True)
""")


def test_ctrl_c_during_an_in_process_compile_says_interrupted_not_crashed(tmp_path, fake_env, reaper):
    """A real SIGINT to a process compiling on a miss (the compile seam's path): the compiler is gone, ``cache ls``
    says ``interrupted`` (the compiler did not crash), and the next run rebuilds the entry."""
    root, script = tmp_path / "cache", tmp_path / "in_process.py"
    script.write_text(IN_PROCESS_SCRIPT)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "30"}
    proc = reaper.popen([sys.executable, str(script), str(root)], env)
    wait_until(lambda: len(reaper.compiler_pids()) == 1, 30, "the compiler started")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err
    (pid,) = reaper.compiler_pids()
    wait_until(lambda: not alive(pid), 5, f"compiler {pid} gone")
    (entry,) = CompileCache(root).entries()
    assert entry.status == "interrupted" and not entry.executable_path.exists()
    listed = subprocess.run([sys.executable, "-m", "neuron_args.cli", "cache", "ls", str(root), "--json"],
                            env=fake_env.env, capture_output=True, text=True, timeout=60)
    assert [row["status"] for row in json.loads(listed.stdout)["entries"]] == ["interrupted"], listed.stdout + listed.stderr
    rerun = reaper.popen([sys.executable, str(script), str(root)], fake_env.env)
    out, err = rerun.communicate(timeout=60)
    assert f"DONE {entry.key} built" in out, err
    assert entry.status == "complete" and entry.metadata()["status"] == "compiled"


def test_four_parallel_compiles_on_one_cache_build_each_graph_once(tmp_path, fake_env, reaper):
    root = tmp_path / "cache"
    keys = make_pending(root, 12)
    env = {**fake_env.env, "FAKE_NEURONX_CC_SLEEP": "0.3"}
    procs = [reaper.popen([sys.executable, str(compile_script(tmp_path)), str(root), "2"], env) for _ in range(4)]
    built = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        built += [item.split("=")[0] for item in out.split()[1:] if item.endswith("=compiled")]
    assert sorted(built) == sorted(keys)  # each graph compiled by exactly one of the four
    compiles = [line for line in fake_env.record.read_text().splitlines() if '"compile"' in line]
    assert len(compiles) == 12
    assert _entries_consistent(root) == dict.fromkeys(keys, "complete")


def test_a_flag_the_installed_neuronx_cc_rejects_names_the_flag_and_the_fix(tmp_path, fake_env, monkeypatch):
    """An ``--internal-*`` flag passes our table (it is the compiler's to judge); a neuronx-cc that does not know it
    fails as argparse does: the error keeps graph type, key and usage line, and says to remove the flag."""
    monkeypatch.setenv("FAKE_NEURONX_CC_REJECT", "--internal-new-pass")
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    entry = CompileCache(root).entry(key)
    entry.update_metadata(compiler_args=["-O1", "--internal-new-pass=on"])
    report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
    (graph,) = report.graphs
    assert graph.status == "failed" and f"graph type 'decode0', key {key}: failed (exit status 2)" in graph.error
    assert "error: unrecognized arguments: --internal-new-pass=on" in graph.error
    assert graph.error.rstrip().endswith("fix: this compiler version rejects an argument named in the log above: "
                                         "remove it from the compiler arguments ($NEURON_CC_FLAGS, "
                                         "options['compiler_args'] or the model's policy), or install the compiler "
                                         "version that has it")
    assert entry.status == "pending" and not entry.executable_path.exists()  # nothing half-built is left
