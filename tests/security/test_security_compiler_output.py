"""The compiler's output is recorded only as read through one descriptor: its temporary name is on a command line
anyone can read, so a link or another user's file swapped in there is refused, never hashed, recorded or signed."""
from __future__ import annotations

import hashlib
import os

import pytest

from neuron_args.compilers.process import run_compiler
from neuron_args.errors import CompileError

KEY = "c" * 32


def _compile(tmp_path, script: str):
    out, tmp = tmp_path / "graph.neff", tmp_path / ".graph.partial.neff"
    argv = ["/bin/sh", "-c", script.format(tmp=tmp)]
    return out, run_compiler(compiler="stand-in", argv=argv, recorded_argv=argv, tmp_output=tmp, output_path=out,
                             workdir=tmp_path, log_path=tmp_path / "log-neuron-cc.txt", graph_type="decode",
                             key=KEY, timeout=30)


def test_the_recorded_digest_is_of_the_bytes_the_compiler_wrote(tmp_path):
    out, result = _compile(tmp_path, "printf NEFF-bytes > {tmp}")
    assert (result.output_size, result.output_sha256) == (10, hashlib.sha256(b"NEFF-bytes").hexdigest())
    assert out.read_bytes() == b"NEFF-bytes"


def test_an_output_swapped_for_a_link_is_refused_not_recorded(tmp_path):
    planted = tmp_path / "someone-elses.neff"
    planted.write_bytes(b"NEFF-not-built-for-this-key")
    with pytest.raises(CompileError) as info:
        _compile(tmp_path, f"printf NEFF > {{tmp}}; rm {{tmp}}; ln -s {planted} {{tmp}}")
    message = str(info.value)
    assert "decode" in message and KEY in message and "without following a link" in message
    assert "fix:" in message and not (tmp_path / "graph.neff").exists()
    assert planted.read_bytes() == b"NEFF-not-built-for-this-key"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_an_output_of_another_user_is_refused_not_recorded(tmp_path):
    with pytest.raises(CompileError) as info:
        _compile(tmp_path, "printf NEFF > {tmp}; chown 54321 {tmp}")
    assert "belongs to uid 54321" in str(info.value) and KEY in str(info.value)
    assert not (tmp_path / "graph.neff").exists()
