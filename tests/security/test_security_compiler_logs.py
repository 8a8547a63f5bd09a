"""A compiler's log in a cache entry others may write: never written through a link planted there."""
from __future__ import annotations

from pathlib import Path

import pytest

from neuron_args.compilers.process import run_compiler
from neuron_args.errors import CompileError

KEY = "ab" * 16
LOG = "log-neuron-cc.txt"


class _Exited:
    """A child that has already exited with ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.args, self.pid = code, ["neuronx-cc"], 0

    def wait(self, timeout=None) -> int:
        return self.code


def _compile_in_entry(tmp_path, code: int, meddle) -> tuple[Path, str | None]:
    """Run a compile in ``tmp_path/entry`` whose child prints, calls ``meddle(workdir)`` (the other cache user)
    and exits ``code``; the entry's log and the CompileError's text (None: it succeeded)."""
    workdir = tmp_path / "entry"
    workdir.mkdir()
    tmp = workdir / ".out.partial-1.neff"

    def child(argv, *, cwd, stdout):
        stdout.write(b"compiler says hi\n")
        stdout.flush()
        meddle(workdir)
        tmp.write_bytes(b"exe")
        return _Exited(code)

    try:
        run_compiler(compiler="neuronx-cc", argv=["/bin/true"], recorded_argv=["neuronx-cc", "compile"],
                     tmp_output=tmp, output_path=workdir / "out.neff", workdir=workdir, log_path=workdir / LOG,
                     graph_type="decode", key=KEY, timeout=None, start_child=child)
    except CompileError as exc:
        assert code and f"key {KEY}" in str(exc)
        return workdir / LOG, str(exc)
    assert not code
    return workdir / LOG, None


@pytest.mark.parametrize("code", [0, 1])
def test_compiler_output_is_not_appended_through_a_log_link_planted_mid_compile(tmp_path, code):
    """Another cache user plants ``log-neuron-cc.txt -> ~/.bashrc`` while the compile runs: the compiler's
    stdout/stderr lands in the entry's own log, the user's file is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    log, _ = _compile_in_entry(tmp_path, code, lambda workdir: (workdir / LOG).symlink_to(victim))
    assert victim.read_text() == "the user's file\n"
    assert not log.is_symlink() and "compiler says hi" in log.read_text()

def test_the_local_compiler_writes_its_log_in_place_of_a_planted_link(tmp_path):
    """The local compiler child opens ``--logfile`` itself: a link planted there since the driver removed the old
    log is replaced, the user's file untouched."""
    from neuron_args.compilers import local_xla

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    log = tmp_path / "log-neuron-cc.txt"
    log.symlink_to(victim)
    code = local_xla.main(["compile", str(tmp_path / "missing.hlo"), "--target", "trn2", "--output",
                           str(tmp_path / "out.bin"), "--logfile", str(log)])
    assert code != 0
    assert victim.read_text() == "the user's file\n"
    assert not log.is_symlink() and "cannot read the HLO module" in log.read_text()



@pytest.mark.parametrize("kind", ["fifo", "oversized"])
def test_the_local_compiler_refuses_a_planted_hlo_module_at_once(tmp_path, monkeypatch, kind):
    """graph.hlo planted as a FIFO (a read blocks until the compile timeout) or larger than any HLO module (a
    link to /dev/zero never ends, filling memory; the cap lowered here): the child fails at once, saying why."""
    import os
    import threading

    from neuron_args.compilers import local_xla

    hlo = tmp_path / "graph.hlo"
    if kind == "fifo":
        os.mkfifo(hlo)
    else:
        hlo.write_bytes(b"x" * 64)
        monkeypatch.setattr(local_xla, "HLO_LIMIT", 16)
    result = []
    run = threading.Thread(target=lambda: result.append(local_xla.main(
        ["compile", str(hlo), "--target", "trn2", "--output", str(tmp_path / "out.bin"),
         "--logfile", str(tmp_path / "log.txt")])), daemon=True)
    run.start()
    run.join(20)
    if run.is_alive():  # unblock the FIFO's reader so the thread ends
        open(hlo, "wb").close()
        pytest.fail(f"the local compiler blocked on a planted {kind} graph.hlo")
    assert result and result[0] != 0
    assert ("is not a regular file" if kind == "fifo" else "more than the 16") in (tmp_path / "log.txt").read_text()


def test_the_local_compiler_writes_its_executable_in_place_of_a_planted_link(tmp_path, monkeypatch):
    """The temporary output's name is on the child's command line (``/proc/<pid>/cmdline`` is world-readable):
    a link planted there mid-compile is replaced, the executable is not written through it."""
    from neuron_args.compilers import local_xla

    monkeypatch.setattr(local_xla, "compile_client", lambda: None)
    monkeypatch.setattr(local_xla, "_compile", lambda hlo, overrides, log: b"executable")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    hlo, out = tmp_path / "graph.hlo", tmp_path / ".graph.partial-1.neff"
    hlo.write_bytes(b"hlo")
    out.symlink_to(victim)
    code = local_xla.main(["compile", str(hlo), "--target", "trn2", "--output", str(out),
                           "--logfile", str(tmp_path / "log.txt")])
    assert code == 0
    assert victim.read_text() == "the user's file\n"
    assert not out.is_symlink() and out.read_bytes() == b"executable"


@pytest.mark.parametrize("code", [0, 1])
def test_the_compilers_output_is_read_back_from_its_own_file_not_a_link_swapped_in(tmp_path, code):
    """Another cache user lists the entry, sees ``.compiler-output.<id>.tmp`` and swaps it for a link to the
    user's secret mid-compile: the log gets what the compiler printed, never the secret (the log is shared)."""
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY\n")

    def swap(workdir):
        (captured,) = workdir.glob(".compiler-output.*.tmp")
        captured.unlink()
        captured.symlink_to(secret)

    log, error = _compile_in_entry(tmp_path, code, swap)
    assert error is None or ("PRIVATE KEY" not in error and "compiler says hi" in error)
    text = log.read_text()
    assert "PRIVATE KEY" not in text and "compiler says hi" in text

@pytest.mark.slow
def test_a_warm_worker_does_not_write_a_compile_s_output_through_a_link_swapped_in(tmp_path):
    """The warm worker opens the capture file by name: one swapped for a link to the user's file since the driver
    created it is not followed (the compile fails instead, its output not appended to the user's file)."""
    import os
    import signal

    from neuron_args.compilers import workers

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    capture = tmp_path / ".compiler-output.1.tmp"
    pool = workers.WorkerPool()
    try:
        with open(capture, "x+b") as out:
            capture.unlink()
            capture.symlink_to(victim)
            args = ["compile", str(tmp_path / "missing.hlo"), "--target", "trn2", "--output", str(tmp_path / "o"),
                    "--logfile", str(tmp_path / "log.txt")]
            code = pool.start(args, ["python", *args], cwd=tmp_path, stdout=out).wait(120)
        assert code != 0
        assert victim.read_text() == "the user's file\n"
    finally:
        for pid in pool.idle_pids():
            os.killpg(pid, signal.SIGKILL)
        pool.close()
