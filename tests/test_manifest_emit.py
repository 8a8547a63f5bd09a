"""Emit: ledger -> <engine-id>/manifest.json (grouping, rank mapping, enrichment, atomic write),
the schema v1 and JSON coercion of config objects."""
from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import importlib.metadata
import json
import logging
import math
import multiprocessing
import os
import platform
from pathlib import Path

import pytest

from neuron_args.manifest.config import build_config, environment_snapshot
from neuron_args.manifest.emit import dumps_manifest, emit_manifest
from neuron_args.manifest.jsonable import to_jsonable
from neuron_args.manifest.ledger import record_graph, register_tp_group
from neuron_args.manifest.schema import MANIFEST_VERSION, schema, validate_manifest

KEY_A = "0a" * 16
KEY_B = "1b" * 16
KEY_C = "2c" * 16


pytestmark = pytest.mark.usefixtures("clean_ledger")


@pytest.fixture
def root(monkeypatch, tmp_path) -> Path:
    path = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(path))
    return path


def make_entry(cache: Path, key: str, *, graph_type: str | None = "decode", neff_bytes: int = 5000,
               output_shapes=("4", "4, 16"), compiler_args=("-O1",), status: str = "compiled") -> Path:
    """A cache entry laid out as docs/ARCHITECTURE.md specifies."""
    entry = cache / key
    entry.mkdir(parents=True)
    (entry / "graph.hlo").write_bytes(b"HloModuleProto")
    compiled = status == "compiled"
    if compiled:
        (entry / f"graph_{key}.neff").write_bytes(b"\x00" * neff_bytes)
        (entry / "command.txt").write_text(f"neuronx-cc compile graph.hlo {' '.join(compiler_args)}\n")
        (entry / "log-neuron-cc.txt").write_text("ok\n")
    metadata = {
        "metadata_version": 1, "key": key, "status": status, "seam": "neuron_libtorch",
        "graph_type": graph_type, "compiler_args": list(compiler_args), "target": "trn2",
        "key_components": {"graph": "f" * 64, "input_specs": [{"shape": [4], "dtype": "float32"}],
                           "compiler_args": sorted(compiler_args), "target": "trn2",
                           "tool_versions": {"neuronx-cc": "2.0"}},
        "input_specs": [{"shape": [4], "dtype": "float32"}],
        "output_specs": [{"shape": [4], "dtype": "float32"}],
        "input_shapes": ["4,"], "output_shapes": list(output_shapes),
        "compiler": {"name": "local", "version": "0.10.2", "format": "xla-cpu-executable"},
        "created": "2026-01-01T00:00:00+00:00",
    }
    (entry / "metadata.json").write_text(json.dumps(metadata))
    if compiled:
        (entry / "COMPLETE").write_text("")
    return entry


def _rank_worker(rank: int, keys: list[str]) -> None:
    register_tp_group([0, 1], rank)
    for key in keys:
        record_graph(key=key, input_shapes=["4,", "4, 16"],
                     compiler_flags="--framework XLA --target trn2 -O1 --output /tmp/x.neff",
                     graph_type="decode")


def _run_ranks(keys: list[str], ranks=(0, 1)) -> list[int]:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_worker, args=(r, keys)) for r in ranks]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return [p.pid for p in procs]


# ----------------------------------------------------------------------------- a real run


def test_two_ranks_of_one_engine_produce_one_entry_per_graph(root, tmp_path):
    cache = tmp_path / "cache"
    make_entry(cache, KEY_A, neff_bytes=949)
    pids = _run_ranks([KEY_A, KEY_B])
    ledger_dir = root / "ledger" / "nodev"
    assert sorted(p.name for p in ledger_dir.iterdir()) == sorted(f"{pid}.jsonl" for pid in pids)

    config = build_config(model="tiny", target="trn2", dtype="torch.bfloat16", max_num_seqs=4,
                          max_model_len=256, topology={"world_size": 2, "tensor_parallel_size": 2,
                                                       "has_collectives": True})
    path = emit_manifest(cache_dir=cache, config=config)
    assert path == root / "nodev" / "manifest.json"
    doc = json.loads(path.read_text())
    assert validate_manifest(doc) == []
    assert list(doc) == ["manifest_version", "config", "graphs", "environment"]
    assert doc["manifest_version"] == "1" == MANIFEST_VERSION
    assert [g["graph_hash"] for g in doc["graphs"]] == [KEY_A, KEY_B]
    graph = doc["graphs"][0]
    neff = cache / KEY_A / f"graph_{KEY_A}.neff"
    assert graph == {
        "graph_hash": KEY_A,
        "hlo_path": f"{KEY_A}/graph.hlo",
        "neff_path": f"{KEY_A}/graph_{KEY_A}.neff",
        "neff_size": 949,
        "created_timestamp": dt.datetime.fromtimestamp(neff.stat().st_mtime, dt.timezone.utc).isoformat(),
        "input_shapes": ["4,", "4, 16"],
        "output_shapes": ["4", "4, 16"],
        "compiler_flags": "--framework XLA --target trn2 -O1",  # --output path removed
        "ranks": [0, 1],
        "input_snapshot_paths": [],
        "output_snapshot_paths": [],
    }
    assert dt.datetime.fromisoformat(graph["created_timestamp"]).utcoffset() == dt.timedelta(0)
    # cleanup: only this engine's ledger folder; the shared ledger root stays
    assert not ledger_dir.exists()
    assert (root / "ledger").is_dir()
    assert doc["config"]["topology"] == {
        "world_size": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
        "data_parallel_size": 1, "attention_dp_size": 1, "ep_degree": 1,
        "decode_context_parallel_size": 1, "has_collectives": True,
    }


def test_a_missing_cache_entry_is_listed_with_nulls(root, tmp_path):
    cache = tmp_path / "cache"
    make_entry(cache, KEY_C, status="pending", output_shapes=("8",))  # captured, not compiled
    record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="-O2")
    record_graph(key=KEY_C, input_shapes=["8,"], compiler_flags="-O2")
    doc = json.loads(emit_manifest(cache_dir=cache).read_text())
    assert doc["config"]["neuron_config"] == {"cache_dir": str(cache)}  # no config given: the cache is still named
    missing, pending = doc["graphs"]
    assert missing["graph_hash"] == KEY_B and missing["input_shapes"] == ["4,"]
    for name in ("hlo_path", "neff_path", "neff_size", "created_timestamp", "output_shapes"):
        assert missing[name] is None, name
    assert pending["hlo_path"] == f"{KEY_C}/graph.hlo"
    assert pending["output_shapes"] == ["8"]
    assert (pending["neff_path"], pending["neff_size"], pending["created_timestamp"]) == (None, None, None)
    assert validate_manifest(doc) == []


def test_no_cache_dir_lists_graphs_without_cache_fields(root, tmp_path):
    make_entry(tmp_path / "cache", KEY_A)
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O2")
    (graph,) = json.loads(emit_manifest(cache_dir=None).read_text())["graphs"]
    assert (graph["graph_hash"], graph["hlo_path"], graph["neff_size"], graph["output_shapes"]) == (
        KEY_A, None, None, None)


@pytest.mark.parametrize(
    ("rank_map", "registered", "expected"),
    [
        ([6, 7], None, [6, 7]),  # sequence: the TP group's global ranks
        ({0: 10, 1: 11}, None, [10, 11]),
        (None, ([2, 3], 0), [2, 3]),  # the group registered with the ledger
        (None, None, [0, 1]),  # identity
    ],
)
def test_local_ranks_are_mapped_to_global_ranks(root, tmp_path, rank_map, registered, expected):
    _run_ranks([KEY_A])
    if registered is not None:
        register_tp_group(*registered)
    doc = json.loads(emit_manifest(cache_dir=tmp_path / "cache", rank_map=rank_map).read_text())
    assert doc["graphs"][0]["ranks"] == expected


def test_an_unmapped_rank_is_kept_and_logged(root, tmp_path, caplog):
    _run_ranks([KEY_A], ranks=(0, 1))
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        doc = json.loads(emit_manifest(cache_dir=tmp_path, rank_map=[4]).read_text())
    assert doc["graphs"][0]["ranks"] == [1, 4]
    assert "TP-local rank(s) [1] are not in the TP group" in caplog.text


def test_two_engines_write_two_manifests(monkeypatch, root, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "0-1")
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "2-3")
    record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="-O3")

    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "0-1")
    first = emit_manifest(cache_dir=cache)
    assert first == root / "dev0_1" / "manifest.json"
    assert (root / "ledger" / "dev2_3").is_dir()  # engine 1's ledger is not ours to remove
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "2-3")
    second = emit_manifest(cache_dir=cache)
    assert second == root / "dev2_3" / "manifest.json"
    assert [g["graph_hash"] for g in json.loads(first.read_text())["graphs"]] == [KEY_A]
    assert [g["graph_hash"] for g in json.loads(second.read_text())["graphs"]] == [KEY_B]
    assert sorted(p.name for p in root.iterdir()) == ["dev0_1", "dev2_3", "ledger"]
    assert list((root / "ledger").iterdir()) == []


def test_emit_engines_names_each_engine_by_its_ledger_folder_and_a_view_leaves_the_source_alone(
        monkeypatch, root, tmp_path):
    """emit_engines hands each ledger folder's engine id to emit_manifest (it set NEURON_VISIBLE_DEVICES from the
    id, parsed back); the environment's devices name no engine here."""
    from neuron_args.manifest.emit import emit_engines

    for devices, key in (("0-1", KEY_A), ("3", KEY_B)):
        monkeypatch.setenv("NEURON_VISIBLE_DEVICES", devices)
        record_graph(key=key, input_shapes=["4,"], compiler_flags="-O1", graph_type="decode")
    record_graph(key=KEY_C, input_shapes=["4,"], compiler_flags="-O3", graph_type="prefill")
    monkeypatch.setenv("NEURON_VISIBLE_DEVICES", "7")
    config = {"model": "m", "neuron_config": {}}
    view = emit_engines(root, tmp_path / "view", cache_dir=tmp_path / "cache", config=config, keys=[KEY_B])
    assert view == [tmp_path / "view" / "dev3_3" / "manifest.json"]
    doc = json.loads(view[0].read_text())
    assert [g["graph_hash"] for g in doc["graphs"]] == [KEY_B]
    assert doc["config"]["neuron_config"]["graph_types"] == {KEY_B: "decode"}
    assert sorted(os.listdir(root / "ledger")) == ["dev0_1", "dev3_3"]  # the source is left alone
    written = emit_engines(root, root, cache_dir=tmp_path / "cache", config=None)
    assert written == [root / "dev0_1" / "manifest.json", root / "dev3_3" / "manifest.json"]
    assert [g["graph_hash"] for g in json.loads(written[1].read_text())["graphs"]] == [KEY_B, KEY_C]
    assert list((root / "ledger").iterdir()) == []  # consumed


def test_relaunch_overwrites_and_an_empty_ledger_still_writes(root, tmp_path):
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
    path = emit_manifest(cache_dir=tmp_path / "cache")
    assert len(json.loads(path.read_text())["graphs"]) == 1
    again = emit_manifest(cache_dir=tmp_path / "cache")  # nothing recorded since
    assert again == path
    doc = json.loads(path.read_text())
    assert doc["graphs"] == []
    assert validate_manifest(doc) == []
    assert os.listdir(path.parent) == ["manifest.json"]  # no temp files accumulate
    umask = os.umask(0o022)
    os.umask(umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask)  # as any program's files: the umask decides


def test_only_local_rank_zero_emits(root, tmp_path):
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
    assert emit_manifest(cache_dir=tmp_path, local_rank=1) is None
    assert not (root / "nodev").exists()
    assert (root / "ledger" / "nodev").is_dir()


def test_torn_and_malformed_lines_are_skipped_and_counted(root, tmp_path, caplog):
    folder = root / "ledger" / "nodev"
    folder.mkdir(parents=True)
    good = {"key": KEY_A, "rank": 1, "input_shapes": ["4,"], "compiler_flags": "-O1"}
    (folder / "100.jsonl").write_text(
        json.dumps(good) + "\n"
        + "\n"  # blank lines are not errors
        + '["a", "list"]\n'
        + '{"key": "' + KEY_B + '"}\n'  # no rank
        + '{"key": "' + KEY_B + '", "rank": "1"}\n'  # rank not an int
        + "not json at all\n"
        + '{"key": "' + KEY_C + '", "rank": 0, "input_sh'  # torn by a kill mid-write
    )
    (folder / "101.jsonl").write_text(json.dumps({**good, "rank": 0}) + "\n")
    (folder / "notes.txt").write_text("ignored: not a ledger file")
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        doc = json.loads(emit_manifest(cache_dir=tmp_path).read_text())
    assert [(g["graph_hash"], g["ranks"]) for g in doc["graphs"]] == [(KEY_A, [0, 1])]
    assert "skipped 5 ledger line(s)" in caplog.text and "2 torn or non-JSON" in caplog.text


def test_an_unwritable_manifest_dir_is_logged_and_returns_none(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(blocker / "sub"))
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
        assert emit_manifest(cache_dir=tmp_path) is None
    assert "manifest emit failed" in caplog.text
    assert "NotADirectoryError" in caplog.text or "FileExistsError" in caplog.text


def test_a_failed_write_keeps_the_ledger(root, tmp_path, caplog):
    record_graph(key=KEY_A, input_shapes=["4,"], compiler_flags="-O1")
    (root / "nodev").write_text("a file where the engine folder should be")
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        assert emit_manifest(cache_dir=tmp_path) is None
    assert f"could not write {root / 'nodev' / 'manifest.json'}" in caplog.text
    assert len(list((root / "ledger" / "nodev").iterdir())) == 1  # retry possible


def test_a_config_with_unknown_fields_is_recorded_without_them(root, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="neuron_args.manifest"):
        doc = json.loads(emit_manifest(cache_dir=tmp_path, config={"model": "m", "colour": "red"}).read_text())
    assert doc["config"]["model"] == "m" and "colour" not in doc["config"]
    assert "dropping unknown field(s) ['colour']" in caplog.text
    assert validate_manifest(doc) == []


# ----------------------------------------------------------------------------- schema


def _valid_doc() -> dict:
    return {
        "manifest_version": "1",
        "config": build_config(model="m", target="trn2"),
        "graphs": [{
            "graph_hash": KEY_A, "hlo_path": f"{KEY_A}/graph.hlo",
            "neff_path": f"{KEY_A}/graph_{KEY_A}.neff", "neff_size": 10,
            "created_timestamp": "2026-08-06T20:37:11.818072+00:00",
            "input_shapes": ["4,", ""], "output_shapes": ["4", "4, 49152"],
            "compiler_flags": "--target trn2 -O1", "ranks": [0, 1],
            "input_snapshot_paths": [], "output_snapshot_paths": [],
        }],
        "environment": {"python": "3.11.7", "torch": "2.13.0"},
    }


def test_schema_is_draft_2020_12_and_accepts_a_valid_manifest():
    doc = schema()
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["properties"]["manifest_version"] == {"description": "Schema version.", "const": "1"}
    assert validate_manifest(_valid_doc()) == []


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.update(manifest_version="2"), "manifest_version: '1' was expected"),
        (lambda d: d["graphs"][0].update(ranks=[1, 0]), "graphs[0].ranks: [1, 0] is not sorted"),
        (lambda d: d["graphs"][0].update(ranks=[0, 0]), "graphs[0].ranks: [0, 0] has non-unique elements"),
        (lambda d: d["graphs"][0].update(hlo_path="/abs/graph.hlo"), "graphs[0].hlo_path"),
        (lambda d: d["graphs"][0].update(neff_path=f"../{KEY_A}/x.neff"), "graphs[0].neff_path"),
        (lambda d: d["graphs"][0].update(graph_hash="XYZ"), "graphs[0].graph_hash: 'XYZ' does not match"),
        (lambda d: d["graphs"][0].pop("output_shapes"), "'output_shapes' is a required property"),
        (lambda d: d["graphs"][0].update(extra=1), "Additional properties are not allowed ('extra'"),
        (lambda d: d["graphs"][0].update(created_timestamp="yesterday"), "graphs[0].created_timestamp"),
        (lambda d: d["graphs"].append(dict(d["graphs"][0])), f"graph_hash {KEY_A!r} is listed more than once"),
        (lambda d: d["config"]["topology"].update(world_size=0), "config.topology.world_size: 0 is less than"),
        (lambda d: d["config"].pop("vllm_config"), "'vllm_config' is a required property"),
        (lambda d: d["environment"].pop("python"), "'python' is a required property"),
    ],
)
def test_validate_manifest_names_each_problem(edit, problem):
    doc = _valid_doc()
    edit(doc)
    problems = validate_manifest(doc)
    assert any(problem in p for p in problems), problems


def test_unsorted_graphs_are_a_problem():
    doc = _valid_doc()
    doc["graphs"].insert(0, {**doc["graphs"][0], "graph_hash": KEY_B})
    assert validate_manifest(doc) == ["graphs: entries are not sorted by graph_hash"]
    assert validate_manifest([]) == ["(top level): a manifest is a JSON object, got list"]


def test_dumps_manifest_round_trips_and_keeps_graph_lists_on_one_line():
    doc = _valid_doc()
    text = dumps_manifest(doc)
    assert json.loads(text) == doc
    assert '      "ranks": [0, 1],' in text.splitlines()
    assert '  "graphs": [' in text.splitlines()
    empty = {**doc, "graphs": []}
    assert json.loads(dumps_manifest(empty)) == empty


# ----------------------------------------------------------------------------- config, env, coercion


class Mode(enum.Enum):
    EAGER = "eager"
    COMPILED = 3


@dataclasses.dataclass
class Parallel:
    tensor_parallel_size: int = 2
    mode: Mode = Mode.COMPILED
    where: Path = Path("/models/tiny")
    tags: frozenset = frozenset({"b", "a"})


class Slotted:
    __slots__ = ("alpha", "_hidden")

    def __init__(self) -> None:
        self.alpha = 1
        self._hidden = 2


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


def test_to_jsonable_on_awkward_objects():
    torch = pytest.importorskip("torch")
    import numpy as np

    cyclic_list: list = [1]
    cyclic_list.append(cyclic_list)
    cyclic_dict: dict = {"name": "d"}
    cyclic_dict["self"] = cyclic_dict

    class Holder:
        def __init__(self) -> None:
            self.me = self
            self.value = 1.5
            self._private = "skipped"

    obj = {
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([4, 16]),
        "tensor": torch.zeros(2, 3),
        "parallel": Parallel(),
        "enum": Mode.EAGER,
        "set": {3, 1, 2},
        "nan": math.nan,
        "inf": -math.inf,
        "bytes": b"\x00a",
        1: "int key",
        None: "none key",
        Mode.COMPILED: "enum key",
        "cycle_list": cyclic_list,
        "cycle_dict": cyclic_dict,
        "holder": Holder(),
        "slots": Slotted(),
        "bad_repr": BadRepr(),
        "cls": Parallel,
        "func": json.dumps,
        "np_scalar": np.float32(0.5),
        "np_array": np.zeros((2, 2), dtype=np.int8),
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        "tuple": (1, "two", None),
    }
    out = to_jsonable(obj)
    json.dumps(out, allow_nan=False)  # plain, strict JSON
    assert out["dtype"] == "torch.bfloat16"
    assert out["device"] == "cpu"
    assert out["size"] == [4, 16]
    assert out["tensor"] == "tensor(shape=[2, 3], dtype=torch.float32)"
    assert out["parallel"] == {"tensor_parallel_size": 2, "mode": "COMPILED", "where": "/models/tiny",
                               "tags": ["a", "b"]}
    assert out["enum"] == "EAGER"
    assert out["set"] == [1, 2, 3]
    assert (out["nan"], out["inf"]) == ("nan", "-inf")
    assert out["bytes"] == "b'\\x00a'"
    assert (out["1"], out["null"], out["COMPILED"]) == ("int key", "none key", "enum key")
    assert out["cycle_list"] == [1, "<cycle: list>"]
    assert out["cycle_dict"] == {"name": "d", "self": "<cycle: dict>"}
    assert out["holder"] == {"me": "<cycle: Holder>", "value": 1.5}
    assert out["slots"] == {"alpha": 1}
    assert out["bad_repr"] == "<unrepresentable BadRepr: RuntimeError>"
    assert out["cls"].endswith("test_manifest_emit.Parallel")
    assert out["func"] == "json.dumps"
    assert out["np_scalar"] == 0.5
    assert out["np_array"] == "ndarray(shape=[2, 2], dtype=int8)"
    assert out["when"] == "2026-01-02T03:04:05+00:00"
    assert out["tuple"] == [1, "two", None]


def test_to_jsonable_survives_deep_nesting():
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    out = to_jsonable(deep)
    json.dumps(out)
    depth, cur = 0, out
    while isinstance(cur, list) and cur:
        cur, depth = cur[0], depth + 1
    assert isinstance(cur, str) and depth < 100  # cut off with a repr, no RecursionError


def test_build_config_fills_the_topology_and_coerces_configs():
    torch = pytest.importorskip("torch")
    config = build_config(model=Path("/models/tiny"), target="trn2", dtype=torch.bfloat16,
                          max_num_seqs=4, max_model_len=256, topology={"ep_degree": 4},
                          neuron_config={"cache_dir": Path("/cache")}, vllm_config=Parallel())
    assert config == {
        "model": "/models/tiny", "target": "trn2", "dtype": "torch.bfloat16",
        "max_num_seqs": 4, "max_model_len": 256,
        "topology": {"world_size": 1, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                     "data_parallel_size": 1, "attention_dp_size": 1, "ep_degree": 4,
                     "decode_context_parallel_size": 1, "has_collectives": False},
        "neuron_config": {"cache_dir": "/cache"},
        "vllm_config": {"tensor_parallel_size": 2, "mode": "COMPILED", "where": "/models/tiny",
                        "tags": ["a", "b"]},
    }
    with pytest.raises(ValueError, match=r"unknown topology key\(s\) \['tp'\]"):
        build_config(model="m", target="trn2", topology={"tp": 2})
    with pytest.raises(ValueError, match=r"topology\['world_size'\] must be a positive int, got 0"):
        build_config(model="m", target="trn2", topology={"world_size": 0})
    with pytest.raises(ValueError, match="max_num_seqs must be a positive int or None"):
        build_config(model="m", target="trn2", max_num_seqs=-1)


def test_environment_snapshot_lists_python_and_distributions():
    env = environment_snapshot()
    assert next(iter(env)) == "python"
    assert env["python"] == platform.python_version()
    assert env["deepdiff"] == importlib.metadata.version("deepdiff")
    assert env["jsonschema"] == importlib.metadata.version("jsonschema")
    assert all(isinstance(v, str) for v in env.values())
