"""The manifest gate, engine identity and the compile-time ledger (raw os.write JSONL)."""
from __future__ import annotations

import json
import logging
import os
import sys
import types
from pathlib import Path

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.manifest import emit as emit_module
from neuron_args.manifest import engine, ledger
from neuron_args.manifest.engine import get_server_prefix, manifest_root, parse_visible_devices
from neuron_args.manifest.ledger import current_tp_rank, record_graph, register_tp_group

KEY_A = "a" * 32
KEY_B = "b" * 32


pytestmark = pytest.mark.usefixtures("clean_ledger")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _own_file(root: Path, engine_id: str = "nodev", pid: int | None = None) -> Path:
    return root / "ledger" / engine_id / f"{pid or os.getpid()}.jsonl"


# ----------------------------------------------------------------------------- gate / identity


def test_manifest_root_is_read_at_call_time(monkeypatch, tmp_path):
    assert manifest_root() is None
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", "")
    assert manifest_root() is None
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", "   ")
    assert manifest_root() is None
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path / "m"))
    assert manifest_root() == tmp_path / "m"
    assert engine.MANIFEST_DIR_ENV == "VLLM_NEURON_MANIFEST_DIR"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", [3]),
        ("0-7", list(range(8))),
        ("0,1,2,3", [0, 1, 2, 3]),
        ("0-1,4-5", [0, 1, 4, 5]),
        (" 8 - 15 ", list(range(8, 16))),
        ("4,2", [4, 2]),
    ],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "is not a device index"),
        ("a", "'a' is not a device index"),
        ("0,,1", "'' is not a device index"),
        ("7-0", "runs backwards; write '0-7'"),
        ("-1", "is not a device index"),
        ("0-3,2", "more than once"),
        ("1-", "is not a device index"),
    ],
)
def test_parse_visible_devices_rejects(value, message):
    with pytest.raises(ValueError, match="NEURON_VISIBLE_DEVICES") as info:
        parse_visible_devices(value)
    assert message in str(info.value)


def test_server_prefix(monkeypatch):
    assert get_server_prefix() == "nodev"
    for value, expected in [("", "nodev"), ("0-7", "dev0_7"), ("8-15", "dev8_15"),
                            ("3", "dev3_3"), ("0-1,4-5", "dev0_5"), ("2,3", "dev2_3")]:
        monkeypatch.setenv("NEURON_VISIBLE_DEVICES", value)
        assert get_server_prefix() == expected, value
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "x")
    with pytest.raises(ValueError, match="'x' is not a device index"):
        get_server_prefix()


# ----------------------------------------------------------------------------- ranks


def test_register_tp_group_sets_the_recorded_rank():
    assert current_tp_rank() == 0
    register_tp_group([4, 5, 6, 7], 2)
    assert current_tp_rank() == 2
    assert ACTIVITY.ledger.tp_group == ((4, 5, 6, 7), 2)
    ledger.clear_tp_group()
    assert ACTIVITY.ledger.tp_group is None


@pytest.mark.parametrize(
    ("ranks", "rank", "message"),
    [
        ([0, 1], 2, "rank_in_group 2 is not an index into group_ranks [0, 1]"),
        ([0, 1], -1, "not an index"),
        ([], 0, "must be non-empty"),
        ([1, 1], 0, "unique"),
        ([0, 1], True, "not an index"),
    ],
)
def test_register_tp_group_rejects(ranks, rank, message):
    with pytest.raises(ValueError) as info:
        register_tp_group(ranks, rank)
    assert message in str(info.value)
    with pytest.raises(TypeError, match="sequence of global ranks"):
        register_tp_group("01", 0)


def _fake_torch(monkeypatch, *, initialized: bool, rank: int, world: list[int]):
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: initialized
    dist.get_rank = lambda: rank
    dist.group = types.SimpleNamespace(WORLD="world")
    dist.get_process_group_ranks = lambda group: list(world) if group == "world" else []
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


def test_current_tp_rank_falls_back_to_torch_distributed(monkeypatch, tmp_path):
    _fake_torch(monkeypatch, initialized=False, rank=5, world=list(range(6)))
    assert current_tp_rank() == 0
    _fake_torch(monkeypatch, initialized=True, rank=5, world=list(range(6)))
    assert current_tp_rank() == 5
    register_tp_group([0, 1], 1)  # a registered group wins over torch.distributed
    assert current_tp_rank() == 1


# ----------------------------------------------------------------------------- record


def test_record_graph_appends_one_line_per_call(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "0-7")
    register_tp_group(list(range(8)), 3)
    record_graph(key=KEY_A, input_shapes=["4,", "4, 16"], compiler_flags="--target trn2 -O1",
                 graph_type="decode")
    record_graph(key=KEY_B, input_shapes=[(4,), (4, 16), ()], compiler_flags=["-O3"])
    lines = _lines(_own_file(tmp_path, "dev0_7"))
    assert lines == [
        {"key": KEY_A, "rank": 3, "input_shapes": ["4,", "4, 16"],
         "compiler_flags": "--target trn2 -O1", "graph_type": "decode"},
        {"key": KEY_B, "rank": 3, "input_shapes": ["4,", "4, 16", ""], "compiler_flags": ["-O3"]},
    ]
    assert sorted(p.name for p in (tmp_path / "ledger").iterdir()) == ["dev0_7"]


def test_record_graph_recreates_a_removed_ledger_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    record_graph(key=KEY_A, input_shapes=[], compiler_flags="")
    own = _own_file(tmp_path)
    for path in own.parent.iterdir():
        path.unlink()
    own.parent.rmdir()  # what an emit does after writing the manifest
    record_graph(key=KEY_B, input_shapes=[], compiler_flags="")
    assert [line["key"] for line in _lines(own)] == [KEY_B]


def test_first_write_of_a_process_truncates_a_stale_same_pid_file(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    own = _own_file(tmp_path)
    own.parent.mkdir(parents=True)
    own.write_text('{"key": "' + "c" * 32 + '", "rank": 9, "input_shapes": [], "compiler_flags": ""}\n'
                   "stale torn li")
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O2")
    record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="-O2")
    assert [(line["key"], line["rank"]) for line in _lines(own)] == [(KEY_A, 0), (KEY_B, 0)]


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_childs_line_survives_os_exit(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    register_tp_group([0, 1], 1)
    pid = os.fork()
    if pid == 0:  # the child: record and leave without any flush or atexit
        try:
            record_graph(key=KEY_A, input_shapes=["2, 3"], compiler_flags="-O1", graph_type="prefill")
        finally:
            os._exit(0)
    assert _wait(pid) == 0
    assert _lines(_own_file(tmp_path, pid=pid)) == [
        {"key": KEY_A, "rank": 1, "input_shapes": ["2, 3"], "compiler_flags": "-O1",
         "graph_type": "prefill"}
    ]
    assert not _own_file(tmp_path).exists()  # the parent wrote nothing


def test_a_forked_child_truncates_its_own_file_once(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    record_graph(key=KEY_A, input_shapes=[], compiler_flags="")  # parent state: file started
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            mine = _own_file(tmp_path, pid=os.getpid())
            mine.write_text("stale line from an earlier run with the same pid\n")
            record_graph(key=KEY_B, input_shapes=[], compiler_flags="")
            record_graph(key="c" * 32, input_shapes=["1,"], compiler_flags="")
            code = 0
        finally:
            os._exit(code)
    assert _wait(pid) == 0
    child_lines = _lines(_own_file(tmp_path, pid=pid))
    assert [line["input_shapes"] for line in child_lines] == [[], ["1,"]]
    assert [line["key"] for line in _lines(_own_file(tmp_path))] == [KEY_A]  # parent's untouched


def test_feature_off_computes_and_creates_nothing(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(ledger, "get_server_prefix", lambda: calls.append("prefix") or "nodev")
    monkeypatch.setattr(ledger, "current_tp_rank", lambda: calls.append("rank") or 0)
    for value in (None, ""):
        if value is not None:
            monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", value)
        record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
        assert emit_module.emit_manifest(cache_dir=tmp_path / "cache") is None
    assert calls == []
    assert list(tmp_path.rglob("*")) == []


def test_an_unwritable_ledger_is_logged_once_and_swallowed(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the manifest dir's parent should be")
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(blocker / "manifests"))
    with caplog.at_level(logging.DEBUG, logger="neuron_args.manifest"):
        record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
        record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="-O1")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "manifest ledger write to" in message and str(blocker) in message
    assert "NotADirectoryError" in message or "FileExistsError" in message
    assert "VLLM_NEURON_MANIFEST_DIR" in message
    assert blocker.read_text().startswith("a regular file")


def test_a_bad_visible_devices_value_is_logged_not_raised(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "0-x")
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        record_graph(key=KEY_A, input_shapes=[], compiler_flags="")
    assert "'x' is not a device index" in caplog.text
    assert list(tmp_path.rglob("*.jsonl")) == []


def test_one_line_per_graph_and_engine_until_an_emit_consumes_the_ledger(tmp_path, monkeypatch):
    from neuron_args.manifest.emit import emit_manifest
    from neuron_args.manifest.ledger import record_graph

    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    monkeypatch.delenv("NEURON_VISIBLE_DEVICES", raising=False)
    ledger = tmp_path / "ledger" / "nodev" / f"{os.getpid()}.jsonl"
    for _ in range(3):  # e.g. Dynamo recompiling one graph: one line
        record_graph(key="a" * 32, input_shapes=["4,"], compiler_flags="-O3")
    assert len(ledger.read_text().splitlines()) == 1
    emit_manifest(cache_dir=None)
    assert not ledger.exists()
    record_graph(key="a" * 32, input_shapes=["4,"], compiler_flags="-O3")  # a relaunch records it again
    assert len(ledger.read_text().splitlines()) == 1


def test_a_short_write_then_an_error_never_glues_the_next_line_to_the_fragment(monkeypatch, tmp_path):
    """ENOSPC after a short write leaves half a line; the next line of this process starts on a new one."""
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(tmp_path))
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
    real_write, calls = os.write, []

    def short_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_full)
    record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="-O1")
    monkeypatch.setattr(os, "write", real_write)
    key_c = "c" * 32
    record_graph(key=key_c, input_shapes=["1,"], compiler_flags="-O3")
    lines = _own_file(tmp_path).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["key"] == key_c
    read = ledger.read_ledger(str(tmp_path / "ledger" / "nodev"))
    graphs, dropped = read.graphs, read.dropped
    assert sorted(graphs) == [KEY_A, key_c] and dropped == {"torn or non-JSON": 1}


def test_read_ledger_recovers_a_record_glued_to_a_torn_fragment(tmp_path):
    folder = tmp_path / "ledger"
    folder.mkdir()
    good = json.dumps({"key": KEY_B, "rank": 0, "input_shapes": ["4,"], "compiler_flags": "-O1"})
    (folder / "1.jsonl").write_text('{"key":"' + KEY_A + '","ra' + good + "\n" + '{"key": "' + "d" * 32 + '"\n')
    read = ledger.read_ledger(str(folder))
    graphs, dropped = read.graphs, read.dropped
    assert sorted(graphs) == [KEY_B] and dropped == {"torn or non-JSON": 2}


def test_read_ledger_groups_a_graphs_ranks_and_still_checks_every_other_line(tmp_path):
    folder = tmp_path / "ledger"
    folder.mkdir()
    line = lambda key, rank, shapes: ledger._encode(key, rank, shapes, "-O1", "decode").decode()  # noqa: E731
    text = "".join(line(KEY_A, r, ["4, 16"]) for r in (3, 1, 2, 0))
    text += line(KEY_A, 5, ["4, 16"]).replace('"rank":5', '"rank":05')  # not JSON (a leading zero)
    text += line(KEY_A, 6, ["4,16"])  # another shape on another rank: checked, and malformed
    text += line(KEY_A, 7, ["4, 8"])  # another shape: kept with the graph, not taken for rank 3's record
    text += line(KEY_B, 2, [""])
    (folder / "1.jsonl").write_text(text)
    read = ledger.read_ledger(folder)
    graph = read.graphs[KEY_A]
    assert graph.ranks == {0, 1, 2, 3, 7} and graph.rank == 0
    assert graph.record == {"key": KEY_A, "rank": 0, "input_shapes": ["4, 16"], "compiler_flags": "-O1",
                            "graph_type": "decode"}
    assert sorted(read.graphs) == [KEY_A, KEY_B] and read.graphs[KEY_B].ranks == {2}
    assert read.dropped == {"torn or non-JSON": 1, "input_shapes is not a list of shape strings": 1}
    assert read.graphs[KEY_B].record == {"key": KEY_B, "rank": 2, "input_shapes": [""], "compiler_flags": "-O1",
                                         "graph_type": "decode"}


def _reference_read(folder) -> tuple[dict, dict]:
    """What read_ledger means, line by line with no shortcut: decode (or recover after a torn
    fragment), drop what cannot be a manifest graph, group by key, the lowest rank's record."""
    graphs: dict[str, list] = {}
    dropped: dict[str, int] = {}
    decode = json.JSONDecoder().decode
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".jsonl")):
        for line in (folder / name).read_bytes().decode("utf-8", errors="replace").splitlines():
            try:
                record = decode(line)
            except ValueError:
                if not line.strip():
                    continue
                record = ledger._after_torn(line)
                dropped["torn or non-JSON"] = dropped.get("torn or non-JSON", 0) + 1
                if record is None:
                    continue
            problem = ledger._problem(record)
            if problem is not None:
                dropped[problem] = dropped.get(problem, 0) + 1
                continue
            ranks, best, rank = graphs.setdefault(record["key"], [set(), record, record["rank"]])
            ranks.add(record["rank"])
            if record["rank"] < rank:
                graphs[record["key"]][1:] = [record, record["rank"]]
    return {k: (r, rec, rank) for k, (r, rec, rank) in graphs.items()}, dropped


def _rank_file(rank, keys, shapes=("4, 16",), rank_text=None) -> str:
    text = "".join(ledger._encode(k, rank, list(shapes), "-O1 --lnc 2", "decode").decode() for k in keys)
    return text if rank_text is None else text.replace(f'"rank":{rank},', f'"rank":{rank_text},')


KEYS = [f"{i:032x}" for i in range(5)]


@pytest.mark.parametrize(
    "files",
    [
        [_rank_file(r, KEYS) for r in (3, 0, 2, 1, 12, 10)],  # one TP group: later files' lines by rank slot
        [_rank_file(2, KEYS), _rank_file(1, KEYS[:4]), _rank_file(0, KEYS + [KEYS[0]])],  # fewer, more lines
        [_rank_file(2, KEYS), _rank_file(1, KEYS[::-1]), _rank_file(5, KEYS, shapes=("4, 8",))],  # order, content
        [_rank_file(2, KEYS), _rank_file(1, KEYS, rank_text="01"), _rank_file(3, KEYS, rank_text="-3")],  # bad ranks
        [_rank_file(2, KEYS), _rank_file(1, KEYS).replace("\n", "\r\n"), _rank_file(4, KEYS) + "\n",
         _rank_file(5, KEYS).rstrip("\n")],  # other line breaks, a blank line, no final newline
        [_rank_file(2, KEYS)[:-30] + _rank_file(2, KEYS)[-30:].replace("}", ""), _rank_file(1, KEYS),
         _rank_file(0, KEYS)],  # a torn last line in the first file
        [_rank_file(7, KEYS[:1]) + _rank_file(8, KEYS[1:]), _rank_file(1, KEYS[:1]) + _rank_file(6, KEYS[1:]),
         _rank_file(0, KEYS)],  # two ranks in one file
        [_rank_file(2, KEYS), _rank_file(1, KEYS, shapes=("4,16",)), _rank_file(0, KEYS, shapes=("4,16",))],  # bad
        ["", _rank_file(1, KEYS), "\n", _rank_file(0, KEYS)],  # empty files
    ],
)
def test_read_ledger_equals_a_line_by_line_read(tmp_path, files):
    folder = tmp_path / "ledger"
    folder.mkdir()
    for i, text in enumerate(files):
        (folder / f"{100 + i}.jsonl").write_bytes(text.encode())
    read = ledger.read_ledger(folder)
    graphs, dropped = _reference_read(folder)
    assert {k: (g.ranks, g.record, g.rank) for k, g in read.graphs.items()} == graphs
    assert dict(read.dropped) == dropped
