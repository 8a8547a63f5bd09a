"""What a user's own setup gets wrong, and the message that says so: inputs served with other dtypes
than warmed up, a cache path with spaces in a copy-pasted fix, a read-only cache or manifest folder."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from neuron_args import CacheMissError
from neuron_args.activity import ACTIVITY, tally
from neuron_args.atomic import directory_problem
from neuron_args.cache import CompileCache, new_metadata
from neuron_args.cache_key import create_cache_hash
from neuron_args.graphs import GraphSpec
from neuron_args.runner import GraphBreakError, NeuronRunner
from neuron_args.settings import CompileSettings

SERVE_TESTS = """
import pytest
import torch

from neuron_args import CacheMissError
from neuron_args.runner import UndeclaredGraphError


def test_served_as_declared(neuron_served):
    neuron_served.run("decode", {"x": torch.ones(1, 8)})


def test_other_dtype_through_run(neuron_served):
    with pytest.raises(CacheMissError) as caught:
        neuron_served.run("decode", {"x": torch.ones(1, 8, dtype=torch.bfloat16)})
    print("MISS:", str(caught.value).replace("\\n", " | "))


def test_other_dtype_by_a_direct_call(neuron_served, neuron_model):
    with pytest.raises(UndeclaredGraphError) as caught:
        neuron_model(torch.ones(1, 8, dtype=torch.float16))
    print("UNDECLARED:", caught.value)
"""


def _key(dtype: str):
    return create_cache_hash(graph_text="HloModule decode", input_specs=[((1, 8), dtype)], compiler_args=["-O1"],
                             target="trn2", tool_versions={"compiler": "fake 1"})


def _build(key):
    def build(entry):
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(b"exe")
        entry.write_metadata(new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"],
                                          target="trn2", status="compiled"))
    return build


def test_a_miss_on_dtypes_alone_says_which_input_to_cast(tmp_path):
    ACTIVITY.reset()
    cache = CompileCache(tmp_path)
    warm, cold = _key("float32"), _key("bfloat16")
    cache.get_or_build(warm, _build(warm))
    with pytest.raises(CacheMissError) as caught, tally(assert_hit=True):
        cache.get_or_build(cold, _build(cold), graph_type="decode")
    message = str(caught.value)
    assert cold.key in message and warm.key in message and "'decode'" in message
    assert "fix: pass inputs of the dtypes warmed up (input 0 is bfloat16, warmed up as float32: " \
           ".to(torch.float32)), or declare a bucket with these dtypes for 'decode'" in message
    assert "warm this graph type and shape up" not in message  # no bucket is missing: a cast fixes it


def test_a_corrupt_entry_s_fix_quotes_a_cache_path_with_spaces(tmp_path):
    ACTIVITY.reset()
    cache = CompileCache(tmp_path / "my cache é")
    key = _key("float32")
    entry, _ = cache.get_or_build(key, _build(key))
    entry.executable_path.write_bytes(b"")
    ACTIVITY.verified.clear()
    with pytest.raises(CacheMissError) as caught, tally(assert_hit=True):
        cache.get_or_build(key, _build(key), graph_type="decode")
    command = str(caught.value).split("`")[1]
    assert shlex.split(command) == ["neuron-args", "cache", "verify", str(cache.root)]  # pastes into a shell


def test_a_user_serving_other_dtypes_is_told_to_cast(neuron_project):
    neuron_project.makepyfile(test_serve_dtypes=SERVE_TESTS)
    result = neuron_project.runpytest("-p", "no:randomly", "-s")
    result.assert_outcomes(passed=3, errors=1)  # the plugin fails a test that swallowed an UndeclaredGraphError
    result.stdout.fnmatch_lines([
        "*MISS: cache miss for graph type 'decode' (key *) * | *fix: pass inputs of the dtypes warmed up (input * is "
        "bfloat16, warmed up as float32: .to(torch.float32)), or declare a bucket with these dtypes for 'decode'*",
        "*UNDECLARED: TinyTwoGraph called while serving with x=[[]1, 8[]]: the call matches no declared bucket*. "
        "The shapes match decode b1 but not the dtypes (x is torch.float16, declared torch.float32): cast the inputs "
        "to them",
    ])


@contextlib.contextmanager
def _read_only_view(path: Path, mount: Path):
    """``path`` seen read-only at ``mount`` (a read-only bind mount: root only)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only file system needs a read-only bind mount, which needs root; this run is not root")
    mount.mkdir()
    done = subprocess.run(["mount", "--bind", str(path), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here (no CAP_SYS_ADMIN in this container?): {done.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], check=True, capture_output=True)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_read_only_cache_serves_and_a_read_only_manifest_folder_is_a_usage_error(neuron_project, warm_cache,
                                                                                  tmp_path):
    with _read_only_view(warm_cache.path, tmp_path / "ro-cache") as ro:
        assert directory_problem(ro) is None  # a prebuilt cache on a read-only image: fine to serve from
        assert directory_problem(ro, writable=True) == "is on a read-only file system"
        assert directory_problem(ro / "new").startswith("cannot be created (Read-only file system")
        neuron_project.makepyfile(test_ro="import torch\n\ndef test_served(neuron_served):\n"
                                          "    neuron_served.run('decode', {'x': torch.ones(1, 8)})\n")
        result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={ro}")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*0 compiles*serve: 1 call(s)*0 miss(es)*"])
        result = neuron_project.runpytest(f"--neuron-manifest-dir={ro}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: --neuron-manifest-dir (ini neuron_manifest_dir, else $VLLM_NEURON_MANIFEST_DIR) {ro} is on a read-only "
                                     "file system; give a writable directory, or leave the option out"])


class _RaisesForBucketB2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] == 2:
            raise ValueError("batch 2 is not supported by this head")
        return self.fc(x)

    def neuron_graphs(self):
        return [GraphSpec("decode", self, {"b1": lambda: {"x": torch.ones(1, 4)}, "b2": lambda: {"x": torch.ones(2, 4)}})]


def test_a_model_that_raises_in_forward_during_warmup_is_not_called_a_graph_break(tmp_path):
    torch._dynamo.reset()
    runner = NeuronRunner(_RaisesForBucketB2(), compiler="local", cache_dir=tmp_path)
    with pytest.raises(GraphBreakError) as caught:
        runner.warmup(emit=False)
    torch._dynamo.reset()
    message = str(caught.value)
    assert message.startswith("graph type 'decode': the model raised while it was traced, at ")
    assert 'raise ValueError("batch 2 is not supported by this head")' in message
    assert "ValueError('batch 2 is not supported by this head')" in message
    assert "not a graph break (allowing graph breaks would not help)" in message
    assert "--neuron-allow-graph-breaks" not in message


def test_manifest_show_on_a_folder_of_unemitted_ledger_lines_says_how_to_emit(tmp_path, capsys):
    from neuron_args.cli import main as cli

    folder = tmp_path / "my manifests"
    (folder / "ledger" / "dev0_1").mkdir(parents=True)
    (folder / "ledger" / "dev0_1" / "4242.jsonl").write_text('{"key": "x"}\n')
    assert cli(["manifest", "show", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"cannot read manifest {folder / 'manifest.json'}: No such file or directory; {folder} holds ledger " \
           "lines of engine(s) dev0_1 that no process emitted yet: an engine emits at its end " \
           "(NeuronRunner.emit_manifest(), neuron_args.manifest.emit_manifest), or run pytest with " \
           f"--neuron-manifest-dir={shlex.quote(str(folder))}" in err


class _KilledInForward(torch.nn.Module):
    """SIGKILLs its own process in forward: a trace child the out-of-memory killer took."""

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGKILL)
        return x


@pytest.mark.slow
def test_a_trace_child_killed_by_a_signal_names_the_bucket_and_the_likely_cause(tmp_path):
    from neuron_args import TraceError
    from neuron_args.deferred import TraceJob, parallel_trace
    from tests.trace_models import fork_server

    torch._dynamo.reset()
    job = TraceJob(_KilledInForward(), {"x": torch.zeros(2, 4)}, ["-O1"], "decode")
    with pytest.raises(TraceError) as caught:
        parallel_trace([job], options={"cache_dir": str(tmp_path), "compiler": "local"}, workers=1, timeout=300,
                       start_method=fork_server())
    message = str(caught.value)
    assert "trace child of graph type 'decode' died without a result (killed by signal 9) while tracing inputs " \
           "x=(2, 4) float32; fix: a signal ended it (SIGKILL with no one sending it is mostly the kernel's " \
           "out-of-memory killer: see `dmesg`): trace fewer jobs at once (NEURON_ARGS_TRACE_WORKERS)" in message


SERVED_ONCE = "import torch\n\ndef test_served(neuron_served):\n    neuron_served.run('decode', {'x': torch.ones(1, 8)})\n"


def _failed_session(project, manifests):
    """One served test that passes in a session that fails: its manifest could not be written."""
    project.makepyfile(test_m=SERVED_ONCE)
    result = project.runpytest("-p", "no:randomly", f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    return result


def test_a_manifest_the_session_cannot_write_fails_it_saying_why(neuron_project, tmp_path, monkeypatch):
    import errno

    from neuron_args.manifest import emit

    def disk_full(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(emit, "write_atomic", disk_full)
    manifests = tmp_path / "manifests"
    _failed_session(neuron_project, manifests).stdout.fnmatch_lines([
        f"manifest NOT written (the session fails): could not write {manifests / 'nodev' / 'manifest.json'} "
        "(OSError: [[]Errno 28[]] No space left on device*); free space or make the folder writable (or give another "
        "--neuron-manifest-dir) and rerun"])
    assert list((manifests / "ledger" / "nodev").glob("*.jsonl"))  # the lines stay for a post-mortem


def test_a_full_disk_under_the_manifest_folder_fails_the_session(neuron_project, tiny_disk):
    from tests.faults.fault_helpers import fill

    manifests = tiny_disk / "manifests"
    manifests.mkdir()
    fill(tiny_disk)
    _failed_session(neuron_project, manifests).stdout.fnmatch_lines([
        f"manifest NOT written (the session fails): none of the 2 graph(s) of this session reached the ledger in "
        f"{manifests} (its writes failed: a full disk or an unwritable folder); free space *"])


def test_a_corrupt_entry_in_a_read_only_cache_is_a_compile_error_saying_so(tmp_path, capsys):
    from neuron_args.cli import main as cli
    from neuron_args.errors import CompileError

    ACTIVITY.reset()
    key = _key("float32")
    entry, _ = CompileCache(tmp_path / "cache").get_or_build(key, _build(key))
    entry.executable_path.write_bytes(b"")
    ACTIVITY.verified.clear()
    with _read_only_view(tmp_path / "cache", tmp_path / "ro") as ro:
        with pytest.raises(CompileError) as caught:
            CompileCache(ro).get_or_build(key, _build(key), graph_type="decode")
        capsys.readouterr()
        assert cli(["cache", "verify", "--fix", str(ro)]) == 2  # a message, not a traceback
        assert capsys.readouterr().err.strip() == (
            f"neuron-args: cannot move corrupt entry {key.key} (graph type 'decode') aside in {ro}: Read-only file "
            f"system; make {ro} writable and run again (a corrupt entry is never loaded meanwhile)")
    assert str(caught.value) == (
        f"cache entry {key.key} (graph type 'decode') in {ro} is corrupt (the executable is empty) and cannot be moved aside to be rebuilt: Read-only file system (EROFS). It is never "
        f"loaded; a run that can write the cache moves it aside and rebuilds it.\nfix: make {ro} writable or point the "
        "cache elsewhere (options['cache_dir'] or $NEURON_LIBTORCH_CACHE_DIR)")


def test_quarantining_one_key_twice_in_one_second_keeps_both_copies(tmp_path, monkeypatch):
    import time

    ACTIVITY.reset()
    cache, key = CompileCache(tmp_path), _key("float32")
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101T000000")  # a clock set back to one second
    entry, _ = cache.get_or_build(key, _build(key))
    for _ in range(3):
        entry.executable_path.write_bytes(b"")  # corrupt: empty
        ACTIVITY.verified.clear()
        assert cache.get_or_build(key, _build(key))[1] is False  # moved aside and rebuilt
    kept = sorted(p.name for p in (tmp_path / ".corrupt").iterdir())
    stem = f"{key.key}-20260101T000000-{os.getpid()}"
    assert kept == [stem, f"{stem}~1", f"{stem}~2"]


def test_torch_neuronx_cache_flags_in_neuron_cc_flags_are_refused_naming_the_fix(monkeypatch):
    """``NEURON_CC_FLAGS="--cache_dir=..."`` (torch-neuronx's cache) through a seam: refused before any key, saying
    whose flag it is, where the folder goes instead and where the list came from."""
    from neuron_args.errors import CompilerArgsError
    from neuron_args.settings import apply_platform_compiler_args

    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=/var/tmp/neuron-compile-cache -O2")
    with pytest.raises(CompilerArgsError) as caught:
        apply_platform_compiler_args(CompileSettings.from_options({"target": "trn2"}, "test"), graph_type="decode")
    text = str(caught.value)
    assert text.startswith("compiler args for graph type 'decode': '--cache_dir' (token "
                           "'--cache_dir=/var/tmp/neuron-compile-cache') is not a neuronx-cc flag: torch-neuronx")
    assert "$NEURON_LIBTORCH_CACHE_DIR or (pytest) --neuron-cache-dir" in text
    assert text.endswith("(these arguments come from $NEURON_CC_FLAGS)")
    monkeypatch.setenv("NEURON_CC_FLAGS", "--retry_failed_compilation")
    with pytest.raises(CompilerArgsError, match="compiles the graph again on the next miss"):
        apply_platform_compiler_args(CompileSettings.from_options({"target": "trn2"}, "test"))


def test_output_logfile_and_workdir_in_the_arguments_keep_the_cache_layout(tmp_path, fake_env, monkeypatch):
    """--output/--logfile are the cache's (dropped, and the user is told once where they go); a --workdir shared by
    every compile gets one folder per key in it, so concurrent compiles never mix their files."""
    from neuron_args.compilers import NeuronxCcCompiler
    from neuron_args.compilers.base import compile_entry
    from neuron_args.errors import CompilerArgsWarning
    from tests.faults.fault_helpers import make_pending

    monkeypatch.setattr(ACTIVITY, "said", set())
    root, work = tmp_path / "cache", tmp_path / "shared work"
    keys = make_pending(root, 2)
    args = ["-O1", "--logfile=/tmp/mine.log", f"--workdir={work}", "--output", "/tmp/mine.neff"]
    with pytest.warns(CompilerArgsWarning) as caught:
        for key in keys:
            entry = CompileCache(root).entry(key)
            compile_entry(entry, NeuronxCcCompiler(), args, "trn2", "decode0", entry.info())
    told = sorted(str(w.message) for w in caught)
    assert len(told) == 2 and all(f"key {keys[0]}" in t for t in told), told  # once per option, not per compile
    assert told[0].startswith("graph type 'decode0', key ") and "--logfile in the compiler arguments is ignored" in told[0]
    assert "--output in the compiler arguments is ignored" in told[1] and "Fix: remove --output" in told[1]
    ran = [json.loads(line) for line in fake_env.record.read_text().splitlines() if '"compile"' in line]
    for key, argv in zip(keys, ran):
        assert argv[10:] == ["-O1", f"--workdir={work / key}"]  # the driver's --output/--logfile only
        assert argv[6:10] == ["--output", argv[7], "--logfile", str(root / key / "log-neuron-cc.txt")]
    assert CompileCache(root).entry(keys[0]).metadata()["compiler_args"] == args  # recorded as given


def test_a_corrupt_entry_the_session_rebuilt_is_named_in_its_summary(neuron_project, warm_cache, tmp_path):
    """A truncated executable (zero bytes) in the session's cache: moved aside and rebuilt, as before, and the
    summary now says so (it was only a log record pytest keeps to itself when the tests pass)."""
    import shutil

    cache = tmp_path / "copy of the warm cache"
    shutil.copytree(warm_cache.path, cache)
    key = warm_cache.keys["decode"]
    CompileCache(cache).entry(key).executable_path.write_bytes(b"")
    neuron_project.makepyfile(test_one="import torch\n\ndef test_decode(neuron_served):\n"
                                       "    neuron_served.run('decode', {'x': torch.ones(1, 8)})\n")
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={cache}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"cache entry {key} was corrupt (the executable has 0 bytes, * were recorded "
                                 "(truncated or replaced)): moved to .corrupt/ in the cache and rebuilt; *"])
    assert CompileCache(cache).entry(key).problem() is None and len(list((cache / ".corrupt").iterdir())) == 1
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={cache}")
    result.assert_outcomes(passed=1)
    assert "was corrupt" not in result.stdout.str()  # told by the session that found it, not by the next one


HOLD_MANIFEST_DIR = """
import sys, time
from pathlib import Path
from pytest_neuron_args.state import lock_folder
fd = lock_folder(Path(sys.argv[1]))
print("HOLDING" if fd is not None else "CANNOT", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_two_sessions_on_one_manifest_folder_the_second_is_a_usage_error(neuron_project, tmp_path):
    """A live session's ledger lines are never deleted by a second session's start-up (it deleted them: the first
    then failed with 'full disk or unwritable folder'); a holder that died leaves a lock that blocks nothing."""
    import sys

    manifests = tmp_path / "manifests"
    ledger = manifests / "ledger" / "nodev"
    ledger.mkdir(parents=True)
    (ledger / "1.jsonl").write_text("{}\n")  # the live session's line so far
    neuron_project.makepyfile(test_one="def test_one():\n    pass\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_MANIFEST_DIR, str(manifests)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "HOLDING"
        result = neuron_project.runpytest(f"--neuron-manifest-dir={manifests}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: manifest folder {manifests} is in use by another pytest session "
                                     f"(pid {holder.pid}): *Give each session its own --neuron-manifest-dir*"])
        assert (ledger / "1.jsonl").read_text() == "{}\n"
    finally:
        holder.kill()
        holder.wait()
    result = neuron_project.runpytest(f"--neuron-manifest-dir={manifests}")  # the holder died: its lock is free
    result.assert_outcomes(passed=1)
    assert not ledger.exists()  # a dead session's lines are cleared, as before
    assert not [p for p in manifests.rglob("*") if p.is_file()]  # the lock leaves no file behind
    # a session inside a session of this process (pytest.main, pytester) on its folder: the outer one owns it
    from pytest_neuron_args.state import lock_folder

    ledger.mkdir(parents=True)
    (ledger / "1.jsonl").write_text("{}\n")
    outer = lock_folder(manifests)
    try:
        neuron_project.makepyfile(test_one="def test_one():\n    pass\n")
        result = neuron_project.runpytest(f"--neuron-manifest-dir={manifests}")
        result.assert_outcomes(passed=1)
        assert (ledger / "1.jsonl").read_text() == "{}\n" and not (manifests / "nodev").exists()
    finally:
        os.close(outer)


def test_the_default_cache_folder_without_a_home_directory(monkeypatch, capsys):
    """A container user with no passwd entry and no $HOME: Python's bare RuntimeError became an OptionsError (seams)
    and a usage error (CLI) naming what to set; an absolute $XDG_CACHE_HOME is the per-user cache's parent."""
    import pwd

    from neuron_args.cache import CACHE_DIR_ENV, cache_root
    from neuron_args.cli import main
    from neuron_args.errors import OptionsError

    for name in ("HOME", "XDG_CACHE_HOME", CACHE_DIR_ENV):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(OptionsError, match=r"no home directory to expand '~' in \(\$HOME is unset .*Fix: give the "
                                           r"folder as options\['cache_dir'\], \$NEURON_LIBTORCH_CACHE_DIR"):
        cache_root()
    assert main(["cache", "ls"]) == 2
    assert "neuron-args: compile cache folder ~/.cache/neuron-args/compile-cache: no home directory" in \
        capsys.readouterr().err
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG rule: only absolute paths count
    with pytest.raises(OptionsError):
        cache_root()
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/ci")
    assert cache_root() == Path("/var/cache/ci/neuron-args/compile-cache")
    assert cache_root("/srv/cache") == Path("/srv/cache")


def test_a_manifest_whose_graphs_lost_their_executables_says_so(neuron_project, warm_cache, tmp_path):
    """The cache removed during the session (`rm -rf` of it from another terminal, a cleanup job): the tests pass on
    the executables already loaded, and the manifest was written with every NEFF path null, without a word. And an
    older session's manifest of another engine, left in the folder, is named as not this session's."""
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache.path, cache)
    manifests = tmp_path / "manifests"
    (manifests / "dev0_1").mkdir(parents=True)  # an earlier session's other engine (--neuron-tp=2): not this one's
    (manifests / "dev0_1" / "manifest.json").write_text("{}")
    neuron_project.makepyfile(test_gone="""
        import shutil

        def test_warm(neuron_warmup, neuron_cache):
            assert len(neuron_warmup.graphs) == 2
            shutil.rmtree(neuron_cache.root)
    """)
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-cache-dir={cache}",
                                      f"--neuron-manifest-dir={manifests}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"manifest written: {manifests / 'nodev' / 'manifest.json'}",
                                 f"  2 of its 2 graph(s) have no executable in the cache {cache}: not built (a warmup "
                                 "failed or was interrupted before their compile) or removed from the cache during the "
                                 "session; rerun to build them *",
                                 f"not written by this session: {manifests / 'dev0_1' / 'manifest.json'} (another "
                                 "engine's, from an earlier session: remove it if that engine is gone, *"])


def test_the_manifest_of_an_interrupted_session_says_it_is_partial(neuron_project, tmp_path):
    """Ctrl-C after one graph type's warmup: the manifest written at the session's end lists only that one; it was
    reported as 'manifest written' like a whole session's."""
    manifests = tmp_path / "manifests"
    neuron_project.makepyfile(test_stop="""
        import pytest

        @pytest.mark.graph_type("prefill")
        def test_prefill(neuron_warmup):
            raise KeyboardInterrupt  # Ctrl-C before the decode warmup of the next test

        def test_all(neuron_warmup):
            pass
    """)
    result = neuron_project.runpytest("-p", "no:randomly", f"--neuron-manifest-dir={manifests}", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = json.loads((manifests / "nodev" / "manifest.json").read_text())
    assert list(doc["config"]["neuron_config"]["graph_types"].values()) == ["prefill"]
    result.stdout.fnmatch_lines([f"manifest written: {manifests / 'nodev' / 'manifest.json'}",
                                 "  the session was interrupted: it lists only the graphs the warmups reached by then; "
                                 "rerun to write the whole manifest"])
