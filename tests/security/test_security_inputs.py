"""Ledger repair cost (item 4), farm results (item 5) and compiler arguments (item 6) as untrusted input."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from neuron_args.cache import CompileCache, new_metadata
from neuron_args.deferred.farm import CompileOutcome, CompileTask, commit_outcome
from neuron_args.errors import CompileError, NeuronArgsError
from neuron_args.flags import validate_compiler_args
from neuron_args.manifest.ledger import read_ledger

from tests.security.security_helpers import make_key

KEY = "ab" * 16
GOOD_LINE = json.dumps({"key": KEY, "rank": 0, "input_shapes": ["4,"], "compiler_flags": "-O1"}, separators=(",", ":"))


def test_torn_line_repair_parses_each_character_a_bounded_number_of_times(tmp_path, monkeypatch):
    """A torn line of 20,000 fragments: the repair is linear (characters parsed, not seconds, are counted)."""
    torn = ('{"key":"' + "b" * 10) * 20_000
    text = torn + GOOD_LINE + "\n" + GOOD_LINE.replace('"rank":0', '"rank":1') + "\n"
    (tmp_path / "1.jsonl").write_text(text)
    parsed = []
    decode = json.JSONDecoder.decode
    monkeypatch.setattr(json.JSONDecoder, "decode", lambda self, s, *a, **k: parsed.append(len(s)) or decode(self, s, *a, **k))
    found = read_ledger(tmp_path)
    assert found.graphs[KEY].ranks == {0, 1}
    assert dict(found.dropped) == {"torn or non-JSON": 1}
    assert sum(parsed) <= 3 * len(text)


def _task(key):
    return CompileTask(key=key, graph_type="decode", hlo=b"hlo", compiler_args=("-O1",), target="trn2",
                       compiler="neuronx-cc", compiler_version="2.0")


def _outcome(key, **fields):
    blob = b"executable"
    good = dict(key=key, status="compiled", worker="host:1", workdir="/tmp/neuron-args-farm-x", executable=blob,
                executable_sha256=hashlib.sha256(blob).hexdigest(), log=b"ok\n",
                argv=("neuronx-cc", "compile", "/tmp/neuron-args-farm-x/graph.hlo"),
                compiler={"name": "neuronx-cc", "version": "2.0", "format": "neff"},
                compile_seconds=1.0, worker_seconds=1.5)
    return CompileOutcome(**{**good, **fields})


@pytest.fixture
def pending(tmp_path):
    cache, key = CompileCache(tmp_path / "cache"), make_key()
    entry = cache.entry(key)
    entry.reset()
    md = new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"], target="trn2",
                      status="pending")
    entry.write_metadata(md)
    return entry, md


def test_empty_workdir_and_huge_argv_from_a_worker_write_nothing(pending):
    entry, md = pending
    before = sorted(p.name for p in entry.path.iterdir())
    bad = _outcome(entry.key, workdir="", argv=("x" * (2 << 20),))
    with pytest.raises(CompileError, match=f"key {entry.key}: the worker's result is invalid"):
        commit_outcome(entry, md, _task(entry.key), bad)
    assert sorted(p.name for p in entry.path.iterdir()) == before
    assert entry.metadata()["status"] == "pending"


@pytest.mark.parametrize(("field", "value", "why"), [
    ("key", "cd" * 16, "key"),
    ("status", "done", "status"),
    ("worker", ["host"], "worker"),
    ("workdir", "relative/dir", "workdir"),
    ("executable", "text", "executable is not bytes"),
    ("executable_sha256", "z" * 64, "executable_sha256"),
    ("log", "text", "log"),
    ("argv", ("ok", 3), "argv"),
    ("argv", ("a\0b",), "argv"),
    ("compiler", {"name": 1}, "compiler record"),
    ("compile_seconds", float("nan"), "timings"),
    ("worker_seconds", True, "timings"),
    ("error", "e" * (2 << 20), "error"),
])
def test_every_field_of_an_outcome_is_checked_before_writing(pending, field, value, why):
    entry, md = pending
    with pytest.raises(CompileError, match=why):
        commit_outcome(entry, md, _task(entry.key), dataclasses.replace(_outcome(entry.key), **{field: value}))
    assert not entry.executable_path.exists() and not entry.command_path.exists()


def test_a_valid_outcome_is_still_committed(pending):
    entry, md = pending
    assert commit_outcome(entry, md, _task(entry.key), _outcome(entry.key)) == len(b"executable")
    assert entry.command_path.read_text() == f"neuronx-cc compile {entry.path}/graph.hlo\n"


def test_non_utf8_byte_in_neuron_cc_flags_is_rejected_naming_the_variable(monkeypatch):
    from neuron_args.settings import base_compiler_args

    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 --pipeline=a\udcffb")  # how os.environ decodes a 0xff byte
    with pytest.raises(NeuronArgsError, match=r"is not UTF-8 text.*\$NEURON_CC_FLAGS"):
        base_compiler_args(None)
    with pytest.raises(NeuronArgsError, match="not UTF-8 text"):
        validate_compiler_args(["-O1", "--pipeline=a\udcffb"], graph_type="decode")
