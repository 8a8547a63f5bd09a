"""Writes inside cache, manifest and ledger folders never follow links; files get the umask's mode;
a cache root others may write is warned about (items 1 and 7 of the shared-cache hardening)."""
from __future__ import annotations

import logging
import os
import stat

import pytest

from neuron_args.atomic import write_atomic
from neuron_args.cache import CompileCache
from neuron_args.compilers.process import run_compiler
from neuron_args.errors import CompileError
from neuron_args.manifest.engine import get_server_prefix
from neuron_args.manifest.ledger import ledger_dir, read_ledger, record_graph

KEY = "ab" * 16


def test_command_txt_planted_as_a_link_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    workdir = tmp_path / "entry"
    workdir.mkdir()
    (workdir / "command.txt").symlink_to(victim)

    def no_start(*args, **kwargs):
        raise OSError("not started")

    with pytest.raises(CompileError, match="could not start"):
        run_compiler(compiler="neuronx-cc", argv=["/bin/true", "compile"], recorded_argv=["neuronx-cc", "compile", "x"],
                     tmp_output=workdir / "out.tmp", output_path=workdir / "out.neff", workdir=workdir,
                     log_path=workdir / "log.txt", graph_type="decode", key=KEY, timeout=None, start_child=no_start)
    assert victim.read_text() == "the user's file\n"
    assert not (workdir / "command.txt").is_symlink()
    assert (workdir / "command.txt").read_text() == "neuronx-cc compile x\n"


def test_ledger_file_planted_as_a_link_is_replaced_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    root = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    folder = ledger_dir(root, get_server_prefix())
    os.makedirs(folder)
    planted = os.path.join(folder, f"{os.getpid()}.jsonl")
    os.symlink(victim, planted)
    record_graph(key=KEY, input_shapes=["4,"], compiler_flags="-O1")
    assert victim.read_text() == "the user's file\n"
    assert not os.path.islink(planted)
    assert sorted(read_ledger(folder).graphs) == [KEY]


@pytest.mark.parametrize("reader", [False, True], ids=["nobody-reads", "someone-reads"])
def test_ledger_file_planted_as_a_fifo_is_replaced_not_written_to(tmp_path, monkeypatch, reader):
    """A FIFO at a ledger (or log) path blocked the writer when nobody read it, and handed the graph's record to
    whoever did: ``open_for_writing`` replaces it by a regular file."""
    import signal

    root = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    folder = ledger_dir(root, get_server_prefix())
    os.makedirs(folder)
    planted = os.path.join(folder, f"{os.getpid()}.jsonl")
    os.mkfifo(planted)
    listener = os.open(planted, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the ledger write blocked on a planted FIFO"))
    signal.alarm(10)
    try:
        record_graph(key=KEY, input_shapes=["4,"], compiler_flags="-O1")
    finally:
        signal.alarm(0)
    try:
        assert stat.S_ISREG(os.lstat(planted).st_mode)
        assert sorted(read_ledger(folder).graphs) == [KEY]
        if listener is not None:
            assert os.read(listener, 4096) == b""  # the FIFO got nothing: its one writer closed it unwritten
    finally:
        if listener is not None:
            os.close(listener)


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o002, 0o664), (0o022, 0o644)])
def test_write_atomic_honours_the_umask(tmp_path, umask, mode):
    before = os.umask(umask)
    try:
        write_atomic(tmp_path / "metadata.json", "{}")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "metadata.json").stat().st_mode) == mode


def test_a_world_writable_cache_root_is_warned_about_once(tmp_path, caplog):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    cache = CompileCache(root)
    with caplog.at_level(logging.WARNING, logger="neuron_args.cache.trust"):
        cache.check_root()
        cache.check_root()
    warned = [r.getMessage() for r in caplog.records if r.name == "neuron_args.cache.trust"]
    assert len(warned) == 1
    assert "writable by every user" in warned[0] and str(cache.root) in warned[0]
    assert "NEURON_ARGS_CACHE_SIGNING_KEY" in warned[0] and "setLevel(logging.ERROR)" in warned[0]


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_root_of_another_user_is_warned_about_unless_signing_is_on(tmp_path, monkeypatch):
    from neuron_args.cache import warn_if_shared

    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, 12345, -1)
    monkeypatch.setenv("NEURON_ARGS_CACHE_SIGNING_KEY", "s3cret")
    assert warn_if_shared(root) is None  # signing on: every entry is checked anyway
    monkeypatch.delenv("NEURON_ARGS_CACHE_SIGNING_KEY")
    message = warn_if_shared(root)
    assert message is not None and "owned by user id 12345" in message
