"""A compiler's log in a cache entry others may write: never written through a link planted there."""
from __future__ import annotations

import pytest

from neuron_args.compilers.process import run_compiler
from neuron_args.errors import CompileError

KEY = "ab" * 16


class _Exited:
    """A child that has already exited with ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.args, self.pid = code, ["neuronx-cc"], 0

    def wait(self, timeout=None) -> int:
        return self.code


@pytest.mark.parametrize("code", [0, 1])
def test_compiler_output_is_not_appended_through_a_log_link_planted_mid_compile(tmp_path, code):
    """Another cache user plants ``log-neuron-cc.txt -> ~/.bashrc`` while the compile runs: the compiler's
    stdout/stderr lands in the entry's own log, the user's file is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    workdir = tmp_path / "entry"
    workdir.mkdir()
    log, tmp = workdir / "log-neuron-cc.txt", workdir / ".out.partial-1.neff"

    def planting_child(argv, *, cwd, stdout):
        stdout.write(b"echo owned\n")
        tmp.write_bytes(b"exe")
        log.symlink_to(victim)
        return _Exited(code)

    def run():
        return run_compiler(compiler="neuronx-cc", argv=["/bin/true"], recorded_argv=["neuronx-cc", "compile"],
                            tmp_output=tmp, output_path=workdir / "out.neff", workdir=workdir, log_path=log,
                            graph_type="decode", key=KEY, timeout=None, start_child=planting_child)

    if code:
        with pytest.raises(CompileError, match=f"key {KEY}"):
            run()
    else:
        run()
    assert victim.read_text() == "the user's file\n"
    assert not log.is_symlink() and "echo owned" in log.read_text()


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
