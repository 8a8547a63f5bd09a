"""Reads of untrusted files: regular files only, never blocking, size-capped (item 2); deeply nested JSON is an
unreadable file, never a RecursionError (item 3)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.cache import QUARANTINE_DIR
from neuron_args.cli import main
from neuron_args.deferred.trace_record import TraceRecord
from neuron_args.manifest.ledger import read_ledger

from tests.security.security_helpers import DEEP_JSON, builder

KEY = "ab" * 16
GOOD_LINE = json.dumps({"key": KEY, "rank": 0, "input_shapes": ["4,"], "compiler_flags": "-O1"}, separators=(",", ":"))


@pytest.fixture
def no_hang():
    """A read that blocks (a FIFO opened the ordinary way) fails the test instead of hanging the session."""
    def expired(*_):
        raise TimeoutError("a read blocked")
    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def _plant(path, kind):
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_metadata_that_is_no_regular_file_is_a_corrupt_entry(built, kind, capsys, no_hang):
    cache, key, entry = built
    _plant(entry.metadata_path, kind)
    assert entry.status == "corrupt"
    assert "not a regular file" in entry.problem()
    assert main(["cache", "ls", str(cache.root)]) == 0
    assert key.key[:12] in capsys.readouterr().out
    assert main(["cache", "verify", str(cache.root)]) == 1
    assert "not a regular file" in capsys.readouterr().out
    ACTIVITY.reset()  # a later process: a warmup moves it aside and rebuilds it, as any corrupt entry
    again, hit = cache.get_or_build(key, builder(key))
    assert not hit and again.status == "complete"
    assert [p.name.split("-")[0] for p in (cache.root / QUARANTINE_DIR).iterdir()] == [key.key]


def test_bounded_read_caps_the_size_and_names_the_file(tmp_path):
    from neuron_args.untrusted import UntrustedFileError, read_bounded

    big = tmp_path / "metadata.json"
    big.write_bytes(b" " * 1001)
    assert read_bounded(big, 1001) == b" " * 1001
    with pytest.raises(UntrustedFileError, match=f"{big} has 1001 bytes, more than the 1000 allowed"):
        read_bounded(big, 1000)


def test_ledger_file_that_is_a_fifo_is_dropped_not_waited_for(tmp_path, no_hang):
    (tmp_path / "1.jsonl").write_text(GOOD_LINE + "\n")
    os.mkfifo(tmp_path / "2.jsonl")
    found = read_ledger(tmp_path)
    assert sorted(found.graphs) == [KEY]
    assert sum(found.dropped.values()) == 1


def test_deep_metadata_is_a_corrupt_entry_that_verify_fix_moves_aside(built, capsys):
    cache, key, entry = built
    entry.metadata_path.write_text(DEEP_JSON)
    assert entry.status == "corrupt" and "nested too deeply" in entry.problem()
    assert entry.metadata() == {}
    assert main(["cache", "ls", str(cache.root)]) == 0
    assert main(["cache", "verify", str(cache.root)]) == 1
    assert main(["cache", "verify", "--fix", str(cache.root)]) == 0
    capsys.readouterr()
    assert not entry.path.exists() and len(list((cache.root / QUARANTINE_DIR).iterdir())) == 1
    again, hit = cache.get_or_build(key, builder(key))  # the warmup rebuilds it
    assert not hit and again.status == "complete"


def test_deep_trace_record_is_read_as_empty(tmp_path):
    record = TraceRecord(tmp_path)
    record.path.write_text(DEEP_JSON)
    assert record.read() == {}


def test_trace_record_lines_of_another_shape_list_no_keys(tmp_path):
    """A job line that is not an object, or keys that are not a list, predict nothing (no crash on them)."""
    record = TraceRecord(tmp_path)
    jobs = {"text": "junk", "number": {"keys": 5}, "none": None, "keyless": {"graph_type": "decode"}}
    record.path.write_text(json.dumps({"version": 1, "jobs": jobs}))
    assert record.complete_keys(jobs) == {}
    assert record.all_complete() is False


@pytest.mark.parametrize("command", [["manifest", "show"], ["manifest", "validate"]])
def test_deep_manifest_is_unreadable_exit_2(tmp_path, capsys, command):
    path = tmp_path / "manifest.json"
    path.write_text(DEEP_JSON)
    assert main([*command, str(path)]) == 2
    assert "nested too deeply" in capsys.readouterr().err


def test_deep_manifest_diff_and_report_compare_are_unreadable_exit_2(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_JSON)
    assert main(["manifest", "diff", str(deep), str(deep)]) == 2
    assert main(["report", "compare", str(deep), str(deep)]) == 2
    err = capsys.readouterr().err
    assert err.count("nested too deeply") == 2 and str(deep) in err


def test_deep_ledger_line_loses_no_other_line(tmp_path):
    other = GOOD_LINE.replace('"rank":0', '"rank":1')
    (tmp_path / "1.jsonl").write_text(GOOD_LINE + "\n" + DEEP_JSON + "\n" + other + "\n")
    found = read_ledger(tmp_path)
    assert found.graphs[KEY].ranks == {0, 1}
    assert dict(found.dropped) == {"torn or non-JSON": 1}


def test_a_compiler_log_that_is_a_fifo_is_not_read(tmp_path, no_hang):
    from neuron_args.compilers.process import log_tail

    log = tmp_path / "log-neuron-cc.txt"
    os.mkfifo(log)
    assert log_tail(log) == f"(log not read: {log} is not a regular file (a FIFO))"
    log.unlink()
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))  # longer than the tail read: the cut line dropped
    assert log_tail(log, 2) == "  line 99998\n  line 99999"


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_farm_task_refuses_a_planted_hlo_module(built, kind, no_hang):
    from neuron_args.deferred.farm import prepare_task
    from neuron_args.errors import CompileError

    _, key, entry = built
    _plant(entry.hlo_path, kind)
    with pytest.raises(CompileError, match=f"cannot read the HLO module of entry {key} .*is not a regular file"):
        prepare_task(entry, entry.info(), ["-O1"])
