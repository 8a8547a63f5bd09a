"""The compiler drivers: the embedded XLA:CPU compiler (real subprocess) and neuronx-cc (a fake)."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuron_args import CompileError, CompilerArgsError
from neuron_args.activity import ACTIVITY
from neuron_args.compilers import (
    COMPILER_ENV,
    CompilerInfo,
    LocalCompiler,
    NeuronxCcCompiler,
    select_compiler,
)
from neuron_args.compilers import local as local_mod
from neuron_args.compilers import neuronx_cc as neuronx_cc_mod
from neuron_args.compilers.base import Compiler
from neuron_args.compilers.process import describe_exit

FAKE_SOURCE = Path(__file__).parent / "fakes" / "neuronx_cc.py"
KEY = "0123456789abcdef0123456789abcdef"
X_SHAPE, Y_SHAPE = (4, 8), (8, 3)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hlo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real HloModuleProto of tanh(x @ y) + 1, lowered by jax (no torch)."""
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda x, y: jnp.tanh(x @ y) + 1).lower(
        jax.ShapeDtypeStruct(X_SHAPE, jnp.float32), jax.ShapeDtypeStruct(Y_SHAPE, jnp.float32)
    )
    path = tmp_path_factory.mktemp("hlo") / "graph.hlo"
    path.write_bytes(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
    return path


def _install_fake(bin_dir: Path, name: str = "neuronx-cc") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SOURCE.read_text())
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


@pytest.fixture
def fake_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``neuronx-cc`` first on PATH; returns the file its argv is recorded in."""
    bin_dir = tmp_path / "bin"
    _install_fake(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_NEURONX_CC_RECORD", str(record))
    monkeypatch.delenv("FAKE_NEURONX_CC_MODE", raising=False)
    return record


@pytest.fixture
def no_neuronx_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def _entry(tmp_path: Path) -> tuple[Path, Path]:
    entry = tmp_path / "cache" / KEY
    return entry, entry / f"graph_{KEY}.neff"


def _run_reference(blob_path: Path) -> None:
    """Load the executable the local compiler wrote and compare with numpy."""
    from neuron_args import xla_cpu
    from tests.xla_run import execute

    rng = np.random.default_rng(0)
    x = rng.standard_normal(X_SHAPE, dtype=np.float32)
    y = rng.standard_normal(Y_SHAPE, dtype=np.float32)
    exe = xla_cpu.deserialize_executable(blob_path.read_bytes())
    (out,) = execute(exe, [x, y])
    np.testing.assert_allclose(out, np.tanh(x @ y) + 1, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- local compiler


@pytest.mark.slow
@pytest.mark.parametrize(
    ("compiler_args", "level", "ignored"),
    [
        (["-O1", "--auto-cast", "matmult", "--model-type=transformer"], 1,
         ["--auto-cast=matmult", "--model-type=transformer"]),
        (["--optlevel=3", "--enable-saturate-infinity"], 3, ["--enable-saturate-infinity"]),
        ([], 1, []),
    ],
    ids=["O1", "O3", "default"],
)  # fmt: skip
def test_local_compile_writes_a_loadable_executable(
    hlo_file: Path, tmp_path: Path, compiler_args: list[str], level: int, ignored: list[str]
) -> None:
    entry, output = _entry(tmp_path)
    compiler = LocalCompiler()
    result = compiler.compile(
        hlo_path=hlo_file, output_path=output, target="trn2", compiler_args=compiler_args,
        workdir=entry, graph_type="decode", key=KEY,
    )  # fmt: skip

    assert result.output_path == output and output.is_file()
    assert result.output_size == output.stat().st_size > 0
    assert result.log_path == entry / "log-neuron-cc.txt"
    assert result.argv == [
        sys.executable, "-m", "neuron_args.compilers.local_xla", "compile", str(hlo_file),
        "--framework", "XLA", "--target", "trn2", "--output", str(output),
        "--logfile", str(entry / "log-neuron-cc.txt"), *compiler_args,
    ]  # fmt: skip
    assert (entry / "command.txt").read_text() == shlex.join(result.argv) + "\n"
    # nothing but the entry's files: no temp output or captured-output file left behind
    assert sorted(p.name for p in entry.iterdir()) == sorted(
        ["command.txt", "log-neuron-cc.txt", output.name]
    )

    log = result.log_path.read_text()
    assert f"xla_backend_optimization_level={level}" in log
    assert ("(default: no -O given)" in log) == (not compiler_args)
    logged_ignored = [line.split(": ", 1)[1] for line in log.splitlines() if line.startswith("ignored on XLA:CPU: ")]
    assert logged_ignored == ignored
    assert "compile seconds:" in log

    _run_reference(output)


def test_local_compiler_info_needs_no_process() -> None:
    info = LocalCompiler().info
    from importlib import metadata

    assert info == CompilerInfo("local", info.version, "xla-cpu-executable")
    assert info.version.startswith(f"local-xla-cpu/{metadata.version('jaxlib')} ")
    assert info.as_dict() == {"name": "local", "version": info.version, "format": "xla-cpu-executable"}
    assert isinstance(LocalCompiler(), Compiler) and isinstance(NeuronxCcCompiler(), Compiler)


def test_both_drivers_build_one_argv_shape_from_their_program(tmp_path: Path) -> None:
    paths = dict(hlo_path=tmp_path / "graph.hlo", output_path=tmp_path / "out.neff", log_path=tmp_path / "log.txt")
    cc = NeuronxCcCompiler("/opt/neuron/bin/neuronx-cc").build_argv(target="trn1", compiler_args=["-O2"], **paths)
    local = LocalCompiler(program=["py", "-m", "x"]).build_argv(target="trn1", compiler_args=["-O2"], **paths)
    assert cc == ["/opt/neuron/bin/neuronx-cc", "compile", str(paths["hlo_path"]), "--framework", "XLA",
                  "--target", "trn1", "--output", str(paths["output_path"]), "--logfile", str(paths["log_path"]), "-O2"]
    assert local == ["py", "-m", "x", *cc[1:]]


def test_bad_flag_fails_before_any_process_starts(tmp_path: Path, fake_cc: Path) -> None:
    entry, output = _entry(tmp_path)
    hlo = tmp_path / "graph.hlo"
    hlo.write_bytes(b"unused")
    for compiler in (LocalCompiler(program=["/nonexistent/never-run"]), NeuronxCcCompiler()):
        with pytest.raises(CompilerArgsError) as excinfo:
            compiler.compile(
                hlo_path=hlo, output_path=output, target="trn2", compiler_args=["-O3", "--auto-cats=none"],
                workdir=entry, graph_type="prefill", key=KEY,
            )  # fmt: skip
        message = str(excinfo.value)
        assert "--auto-cats" in message and "--auto-cast" in message and "'prefill'" in message
    assert not fake_cc.exists()  # the fake neuronx-cc never ran
    assert not entry.exists()


@pytest.mark.slow
def test_local_program_rejects_a_bad_flag_with_exit_2(hlo_file: Path, tmp_path: Path) -> None:
    """Run by hand (or by a caller that skipped validation), the program itself validates."""
    log = tmp_path / "log.txt"
    out = tmp_path / "out.neff"
    done = subprocess.run(
        [sys.executable, "-m", "neuron_args.compilers.local_xla", "compile", str(hlo_file),
         "--framework", "XLA", "--target", "trn2", "--output", str(out), "--logfile", str(log),
         "-O3", "--modle-type=transformer"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--modle-type" in done.stderr and "--model-type" in done.stderr
    assert "--modle-type" in log.read_text()
    assert not out.exists()


def test_local_compile_of_a_corrupt_hlo_fails_cleanly(tmp_path: Path) -> None:
    entry, output = _entry(tmp_path)
    entry.mkdir(parents=True)
    output.write_bytes(b"stale executable from an earlier build")
    bad = tmp_path / "graph.hlo"
    bad.write_bytes(b"\x08\x01 this is not an HloModuleProto")
    with pytest.raises(CompileError) as excinfo:
        LocalCompiler().compile(
            hlo_path=bad, output_path=output, target="trn1", compiler_args=["-O2"],
            workdir=entry, graph_type="encoder", key=KEY,
        )  # fmt: skip
    message = str(excinfo.value)
    assert "'encoder'" in message and KEY in message
    assert "failed (exit status 1)" in message
    assert "could not compile" in message  # from the log tail
    assert f"command: {(entry / 'command.txt').read_text().strip()}" in message
    assert not output.exists()
    assert sorted(p.name for p in entry.iterdir()) == ["command.txt", "log-neuron-cc.txt"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "decoded"),
    [("segv", "crashed (segmentation fault) (exit status -11)"),
     ("kill", "killed or out of memory (exit status -9)")],
)  # fmt: skip
def test_local_compiler_process_crash_is_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, decoded: str) -> None:
    """A stand-in local program that dies by a signal after writing half an executable."""
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", mode)
    entry, output = _entry(tmp_path)
    hlo = tmp_path / "graph.hlo"
    hlo.write_bytes(b"hlo")
    compiler = LocalCompiler(program=[sys.executable, str(FAKE_SOURCE)])
    with pytest.raises(CompileError) as excinfo:
        compiler.compile(
            hlo_path=hlo, output_path=output, target="trn2", compiler_args=[],
            workdir=entry, graph_type="decode", key=KEY,
        )  # fmt: skip
    assert decoded in str(excinfo.value)
    assert str(excinfo.value).startswith("local compiler (XLA:CPU) failed for graph type 'decode'")
    assert not output.exists()
    assert sorted(p.name for p in entry.iterdir()) == ["command.txt", "log-neuron-cc.txt"]


# ----------------------------------------------------------------------------- neuronx-cc driver


def _compile_with_fake(tmp_path: Path, compiler_args: list[str], **kw):
    entry, output = _entry(tmp_path)
    hlo = tmp_path / "graph.hlo"
    hlo.write_bytes(b"hlo bytes")
    result = NeuronxCcCompiler().compile(
        hlo_path=hlo, output_path=output, target=kw.pop("target", "trn2"), compiler_args=compiler_args,
        workdir=entry, graph_type="decode", key=KEY, **kw,
    )  # fmt: skip
    return hlo, entry, output, result


def test_neuronx_cc_argv_command_and_log(tmp_path: Path, fake_cc: Path) -> None:
    args = ["--target", "trn2", "-O3", "--auto-cast=none", "--output", "elsewhere.neff", "--framework=XLA",
            "--logfile", "/tmp/x.log", "--lnc", "2"]  # fmt: skip
    hlo, entry, output, result = _compile_with_fake(tmp_path, args)
    log = entry / "log-neuron-cc.txt"
    expected = ["neuronx-cc", "compile", str(hlo), "--framework", "XLA", "--target", "trn2",
                "--output", str(output), "--logfile", str(log), "-O3", "--auto-cast=none", "--lnc", "2"]  # fmt: skip
    assert result.argv == expected
    assert (entry / "command.txt").read_text() == shlex.join(expected) + "\n"
    (ran,) = [json.loads(line) for line in fake_cc.read_text().splitlines()]
    # the child wrote to a temporary name in the entry, renamed onto the output on success
    assert ran[:7] == expected[1:8] and ran[8:] == expected[9:]
    assert Path(ran[7]).parent == entry and ran[7].endswith(".neff") and ran[7] != str(output)
    assert output.read_bytes().startswith(b"NEFF") and result.output_size == output.stat().st_size
    text = log.read_text()
    assert text.startswith(f"fake neuronx-cc compiling {hlo} for trn2\n")
    assert "stderr says hello" in text  # the child's own output is appended to the log
    assert sorted(p.name for p in entry.iterdir()) == sorted(["command.txt", "log-neuron-cc.txt", output.name])


def test_conflicting_target_in_args_is_an_error(tmp_path: Path, fake_cc: Path) -> None:
    with pytest.raises(CompilerArgsError) as excinfo:
        _compile_with_fake(tmp_path, ["--target=trn1", "-O2"], target="trn2")
    assert "trn1" in str(excinfo.value) and "trn2" in str(excinfo.value) and KEY in str(excinfo.value)
    with pytest.raises(CompilerArgsError, match="unknown compile target 'trn9'"):
        _compile_with_fake(tmp_path, [], target="trn9")
    assert not fake_cc.exists()


@pytest.mark.parametrize(
    ("mode", "decoded"),
    [
        ("exit70", "killed or out of memory (exit status 70)"),
        ("kill", "killed or out of memory (exit status -9)"),
        ("abort", "aborted (exit status -6)"),
        ("segv", "crashed (segmentation fault) (exit status -11)"),
        ("exit1", "failed (exit status 1)"),
        ("no-output", "exited 0 but wrote no executable"),
    ],
)
def test_neuronx_cc_failures_are_decoded(
    tmp_path: Path, fake_cc: Path, monkeypatch: pytest.MonkeyPatch, mode: str, decoded: str
) -> None:
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", mode)
    entry, output = _entry(tmp_path)
    entry.mkdir(parents=True)
    output.write_bytes(b"stale")
    with pytest.raises(CompileError) as excinfo:
        _compile_with_fake(tmp_path, ["-O2"])
    message = str(excinfo.value)
    assert message.startswith(f"neuronx-cc failed for graph type 'decode', key {KEY}: {decoded}")
    assert f"command: {(entry / 'command.txt').read_text().strip()}" in message
    tail = message.split("(last 20 lines):\n", 1)[1]
    assert "log line 39" in tail and "stderr says hello" in tail
    assert "log line 10\n" not in tail  # only the tail is quoted
    assert "fix: " in message
    assert not output.exists()  # neither the stale nor the half-written executable survives
    assert sorted(p.name for p in entry.iterdir()) == ["command.txt", "log-neuron-cc.txt"]


def test_neuronx_cc_timeout_kills_the_compiler(tmp_path: Path, fake_cc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "sleep")
    entry, output = _entry(tmp_path)
    with pytest.raises(CompileError) as excinfo:
        _compile_with_fake(tmp_path, [], timeout=1.0)
    message = str(excinfo.value)
    assert "timed out after 1 s" in message and "raise the compile timeout" in message
    assert not output.exists()


def test_describe_exit_other_signals() -> None:
    assert describe_exit(-15) == "killed by signal SIGTERM (exit status -15)"
    assert describe_exit(3) == "failed (exit status 3)"


def test_describe_exit_brief_reads_a_trace_childs_status_by_number() -> None:
    """The one reading a dead trace child's message quotes (no compiler table: SIGKILL is not "out of memory")."""
    assert describe_exit(-9, brief=True) == "killed by signal 9"
    assert describe_exit(-11, brief=True) == "killed by signal 11"
    assert describe_exit(1, brief=True) == "exit status 1"
    assert describe_exit(None, brief=True) == "still running"


def test_neuronx_cc_version_is_parsed_and_memoized(fake_cc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ACTIVITY.reset()  # a fresh process: no version looked up yet
    compiler = NeuronxCcCompiler()
    assert compiler.info == CompilerInfo("neuronx-cc", "2.21.33363.0+82d8b54d", "neff")
    assert compiler.info.as_dict() == {"name": "neuronx-cc", "version": "2.21.33363.0+82d8b54d", "format": "neff"}
    assert NeuronxCcCompiler().info.version == "2.21.33363.0+82d8b54d"
    assert [json.loads(line) for line in fake_cc.read_text().splitlines()] == [["--version"]]


def test_neuronx_cc_version_unknown_on_failure(fake_cc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ACTIVITY.reset()  # a fresh process: no version looked up yet
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "bad-version")
    assert NeuronxCcCompiler().info.version == "unknown"
    assert neuronx_cc_mod.parse_version("neuronx-cc 2.5.0.1") == "2.5.0.1"
    assert neuronx_cc_mod.parse_version("no digits here") == "unknown"


# ----------------------------------------------------------------------------- selection


def test_select_auto_follows_path(fake_cc: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(COMPILER_ENV, raising=False)
    assert isinstance(select_compiler(), NeuronxCcCompiler)
    assert isinstance(select_compiler("auto"), NeuronxCcCompiler)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert isinstance(select_compiler(), LocalCompiler)


def test_select_precedence_options_over_env_over_path(fake_cc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILER_ENV, "local")
    assert isinstance(select_compiler(), LocalCompiler)  # env beats PATH detection
    assert isinstance(select_compiler(None), LocalCompiler)
    assert isinstance(select_compiler("neuronx-cc"), NeuronxCcCompiler)  # options beat env
    monkeypatch.setenv(COMPILER_ENV, "neuronx-cc")
    assert isinstance(select_compiler("local"), LocalCompiler)
    assert isinstance(select_compiler(), NeuronxCcCompiler)


def test_select_errors(no_neuronx_cc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPILER_ENV, raising=False)
    with pytest.raises(CompileError) as excinfo:
        select_compiler("neuronx-cc")
    assert "not on PATH" in str(excinfo.value) and "compiler='local'" in str(excinfo.value)
    assert "Neuron" in str(excinfo.value)
    with pytest.raises(CompilerArgsError) as excinfo:
        select_compiler("gcc")
    assert "'gcc'" in str(excinfo.value)
    assert all(choice in str(excinfo.value) for choice in ("'auto'", "'local'", "'neuronx-cc'"))
    monkeypatch.setenv(COMPILER_ENV, "xla")
    with pytest.raises(CompilerArgsError, match=f"'xla' \\(from {COMPILER_ENV}\\)"):
        select_compiler()


@pytest.mark.slow
def test_import_does_not_start_jax() -> None:
    code = (
        "import sys, neuron_args.compilers, neuron_args.compilers.local_xla; "
        "print('jax' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_local_version_is_memoized(monkeypatch: pytest.MonkeyPatch) -> None:
    ACTIVITY.reset()  # a fresh process: no version looked up yet
    first = local_mod.local_version()
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "changed")
    assert local_mod.local_version() == first


# ----------------------------------------------------------------------------- timeouts and lifetime


def test_compile_timeout_precedence_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_args.settings import COMPILE_TIMEOUT_ENV, DEFAULT_TIMEOUTS, resolve_compile_timeout
    from neuron_args.errors import OptionsError

    monkeypatch.delenv(COMPILE_TIMEOUT_ENV, raising=False)
    assert resolve_compile_timeout(None, "neuronx-cc") == DEFAULT_TIMEOUTS["neuronx-cc"] == 7200
    assert resolve_compile_timeout(None, "local") == DEFAULT_TIMEOUTS["local"] == 1800
    assert NeuronxCcCompiler().default_timeout == 7200 and LocalCompiler().default_timeout == 1800
    monkeypatch.setenv(COMPILE_TIMEOUT_ENV, " 90 ")
    assert resolve_compile_timeout(None, "neuronx-cc") == 90.0
    assert resolve_compile_timeout(5, "neuronx-cc") == 5.0
    assert NeuronxCcCompiler().default_timeout == 90.0
    for bad in (0, -1, "x", True, float("inf")):
        with pytest.raises(OptionsError, match="compile timeout"):
            resolve_compile_timeout(bad, "local")
    monkeypatch.setenv(COMPILE_TIMEOUT_ENV, "forever")
    with pytest.raises(OptionsError, match=COMPILE_TIMEOUT_ENV):
        resolve_compile_timeout(None, "local")


@pytest.mark.slow
def test_compilers_run_under_the_supervisor_and_a_missing_program_cannot_start(tmp_path: Path, fake_cc: Path) -> None:
    from neuron_args.compilers.lifetime import SUPERVISOR, supervised_argv

    argv = supervised_argv(["neuronx-cc", "compile"])
    assert argv[:4] == [sys.executable, "-I", "-S", str(SUPERVISOR)] and argv[5:] == ["neuronx-cc", "compile"]
    entry, output = _entry(tmp_path)
    hlo = tmp_path / "graph.hlo"
    hlo.write_bytes(b"hlo")
    with pytest.raises(CompileError, match="could not start"):
        NeuronxCcCompiler(str(tmp_path / "no-such-neuronx-cc")).compile(
            hlo_path=hlo, output_path=output, target="trn2", compiler_args=[], workdir=entry, key=KEY)


def test_a_cancelled_scope_starts_no_compiler(tmp_path: Path, fake_cc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_args.compilers.lifetime import CancelScope, CompileCancelled, within

    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_NEURONX_CC_RECORD", str(record))
    scope = CancelScope()
    scope.cancel()
    with within(scope), pytest.raises(CompileCancelled):
        _compile_with_fake(tmp_path, [])
    assert not record.exists()


def test_a_hung_version_probe_with_a_helper_holding_the_pipe_cannot_hang(tmp_path: Path) -> None:
    from neuron_args.compilers import neuronx_cc

    exe = tmp_path / "hung-neuronx-cc"
    exe.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)\n")
    exe.chmod(0o755)
    assert neuronx_cc.lookup_version(str(exe), timeout=1) == "unknown"
