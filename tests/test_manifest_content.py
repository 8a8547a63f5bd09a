"""The bytes of an emitted manifest for one fixed input: a speed change to the emitter (ledger
reading, enrichment, the environment snapshot, the JSON writer) must not change what it writes."""
from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import Path

import pytest

from neuron_args.manifest import config as manifest_config
from neuron_args.manifest import emit as manifest_emit
from neuron_args.manifest.config import build_config
from neuron_args.manifest.emit import dumps_manifest, emit_manifest
from neuron_args.manifest.ledger import record_graph, register_tp_group

pytestmark = pytest.mark.usefixtures("clean_ledger")

KEY_A, KEY_B, KEY_C, KEY_D, KEY_E = ("0a" * 16, "1b" * 16, "2c" * 16, "3d" * 16, "4e" * 16)
MTIME = 1767225600.25  # 2026-01-01T00:00:00.250000+00:00


class Mode(enum.Enum):
    FAST = "fast"


@dataclasses.dataclass
class NeuronConfig:
    cache_dir: Path
    mode: Mode = Mode.FAST
    scale: float = 0.125
    label: str = "décodeur \"tiny\"\t✓"
    buckets: tuple = (128, 256)


def _entry(cache: Path, key: str, metadata: object, *, neff: int | None = None) -> None:
    folder = cache / key
    folder.mkdir(parents=True)
    (folder / "graph.hlo").write_bytes(b"HloModuleProto")
    (folder / "metadata.json").write_text(metadata if isinstance(metadata, str) else json.dumps(metadata, indent=2))
    if neff is not None:
        path = folder / f"graph_{key}.neff"
        path.write_bytes(b"\x00" * neff)
        os.utime(path, (MTIME, MTIME))


def _fixed_input(root: Path, cache: Path) -> None:
    _entry(cache, KEY_A, {"status": "compiled", "output_shapes": ["4", "4, 16"], "graph_type": "decode"}, neff=949)
    _entry(cache, KEY_C, {"status": "pending", "output_shapes": ["8,"]})  # captured, not compiled
    _entry(cache, KEY_D, {"output_shapes": ["4x4"]}, neff=1)  # not shape strings: null
    _entry(cache, KEY_E, "{not json")  # unreadable metadata, no executable yet
    flags = "--framework XLA --target trn2 -O1 --output /tmp/x.neff --lnc 2"
    for rank in (3, 0, 2, 1):
        register_tp_group([0, 1, 2, 3], rank)
        record_graph(key=KEY_A, input_shapes=[(4,), (4, 16)], compiler_flags=flags, graph_type="decode")
        record_graph(key=KEY_B, input_shapes=["1,"], compiler_flags=["-O3", "--lnc=2"], graph_type="prefill")
    for key, rank, shapes, flags in ((KEY_C, 5, [(), (2, 3, 4)], "-O2 --verbose=35"), (KEY_D, 5, ["7, 7"], "-O3"),
                                     (KEY_E, 4, [(1,)], ["--lnc=1", "--output", "/tmp/e.neff"])):
        register_tp_group([0, 1, 2, 3, 4, 5], rank)
        record_graph(key=key, input_shapes=shapes, compiler_flags=flags, graph_type="é")
    # another writer's file, rank 4 of KEY_A with other flags: the lowest rank's record wins
    other = root / "ledger" / "nodev" / "7.jsonl"
    other.write_text(json.dumps({"key": KEY_A, "rank": 4, "input_shapes": ["9,"], "compiler_flags": "-O3"}) + "\n")


EXPECTED = """\
{
  "manifest_version": "1",
  "config": {
    "model": "tiny",
    "target": "trn2",
    "dtype": "torch.bfloat16",
    "max_num_seqs": 4,
    "max_model_len": 256,
    "topology": {
      "world_size": 8,
      "tensor_parallel_size": 4,
      "pipeline_parallel_size": 2,
      "data_parallel_size": 1,
      "attention_dp_size": 1,
      "ep_degree": 1,
      "decode_context_parallel_size": 1,
      "has_collectives": true
    },
    "neuron_config": {
      "cache_dir": "<tmp>/cache",
      "mode": "FAST",
      "scale": 0.125,
      "label": "décodeur \\"tiny\\"\\t✓",
      "buckets": [
        128,
        256
      ]
    },
    "vllm_config": {
      "nested": {
        "empty": {},
        "list": [],
        "none": null
      }
    }
  },
  "graphs": [
    {
      "graph_hash": "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a",
      "hlo_path": "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a/graph.hlo",
      "neff_path": "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a/graph_0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a.neff",
      "neff_size": 949,
      "created_timestamp": "2026-01-01T00:00:00.250000+00:00",
      "input_shapes": ["4,", "4, 16"],
      "output_shapes": ["4", "4, 16"],
      "compiler_flags": "--framework XLA --target trn2 -O1 --lnc 2",
      "ranks": [10, 11, 12, 13, 14],
      "input_snapshot_paths": [],
      "output_snapshot_paths": []
    },
    {
      "graph_hash": "1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b",
      "hlo_path": null,
      "neff_path": null,
      "neff_size": null,
      "created_timestamp": null,
      "input_shapes": ["1,"],
      "output_shapes": null,
      "compiler_flags": "-O3 --lnc=2",
      "ranks": [10, 11, 12, 13],
      "input_snapshot_paths": [],
      "output_snapshot_paths": []
    },
    {
      "graph_hash": "2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c",
      "hlo_path": "2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c/graph.hlo",
      "neff_path": null,
      "neff_size": null,
      "created_timestamp": null,
      "input_shapes": ["", "2, 3, 4"],
      "output_shapes": ["8,"],
      "compiler_flags": "-O2 --verbose=35",
      "ranks": [5],
      "input_snapshot_paths": [],
      "output_snapshot_paths": []
    },
    {
      "graph_hash": "3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d",
      "hlo_path": "3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d/graph.hlo",
      "neff_path": "3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d/graph_3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d.neff",
      "neff_size": 1,
      "created_timestamp": "2026-01-01T00:00:00.250000+00:00",
      "input_shapes": ["7, 7"],
      "output_shapes": null,
      "compiler_flags": "-O3",
      "ranks": [5],
      "input_snapshot_paths": [],
      "output_snapshot_paths": []
    },
    {
      "graph_hash": "4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e",
      "hlo_path": "4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e/graph.hlo",
      "neff_path": null,
      "neff_size": null,
      "created_timestamp": null,
      "input_shapes": ["1,"],
      "output_shapes": null,
      "compiler_flags": "--lnc=1",
      "ranks": [14],
      "input_snapshot_paths": [],
      "output_snapshot_paths": []
    }
  ],
  "environment": {
    "python": "3.11.7",
    "Alpha": "2.0",
    "zeta": "1.0rc1"
  }
}
"""


def test_the_manifest_of_a_fixed_input_is_byte_for_byte_pinned(monkeypatch, tmp_path):
    root, cache = tmp_path / "manifests", tmp_path / "cache"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    monkeypatch.setattr(manifest_emit, "environment_snapshot",
                        lambda: {"python": "3.11.7", "Alpha": "2.0", "zeta": "1.0rc1"})
    _fixed_input(root, cache)
    config = build_config(
        model="tiny", target="trn2", dtype="torch.bfloat16", max_num_seqs=4, max_model_len=256,
        topology={"world_size": 8, "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "has_collectives": True},
        neuron_config=NeuronConfig(cache_dir=cache), vllm_config={"nested": {"empty": {}, "list": [], "none": None}},
    )
    path = emit_manifest(cache_dir=cache, config=config, rank_map={0: 10, 1: 11, 2: 12, 3: 13, 4: 14})
    assert path == root / "nodev" / "manifest.json"
    assert path.read_text(encoding="utf-8").replace(str(tmp_path), "<tmp>") == EXPECTED


def test_dumps_manifest_is_pinned_for_awkward_values():
    doc = {
        "manifest_version": "1",
        "config": {"s": "\u2028 \x00 \\ / \ud7ff é", "f": [1.5, -0.0, 1e300, 3], "t": True, "n": None, "e": []},
        "graphs": [{"graph_hash": "k", "ranks": [0], "input_shapes": ["4,"], "nested": {"a": [1, {"b": None}]},
                    "flags": "--x=\"y\"", "mixed": ["a", 1, True, None], "on": True, "x": 1.5,
                    "ints": [3, -1, 2**70]}],
        "environment": {},
    }
    assert dumps_manifest(doc) == (
        '{\n'
        '  "manifest_version": "1",\n'
        '  "config": {\n'
        '    "s": "\u2028 \\u0000 \\\\ / \ud7ff é",\n'
        '    "f": [\n'
        '      1.5,\n'
        '      -0.0,\n'
        '      1e+300,\n'
        '      3\n'
        '    ],\n'
        '    "t": true,\n'
        '    "n": null,\n'
        '    "e": []\n'
        '  },\n'
        '  "graphs": [\n'
        '    {\n'
        '      "graph_hash": "k",\n'
        '      "ranks": [0],\n'
        '      "input_shapes": ["4,"],\n'
        '      "nested": {"a": [1, {"b": null}]},\n'
        '      "flags": "--x=\\"y\\"",\n'
        '      "mixed": ["a", 1, true, null],\n'
        '      "on": true,\n'
        '      "x": 1.5,\n'
        '      "ints": [3, -1, 1180591620717411303424]\n'
        '    }\n'
        '  ],\n'
        '  "environment": {}\n'
        '}\n'
    )
    assert json.loads(dumps_manifest(doc)) == doc


@pytest.mark.parametrize(
    "text",
    [
        "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n\nName: not-this\n",
        "Metadata-Version: 2.1\r\nName: crlf\r\nVersion: 2\r\n\r\nbody",
        "Version: 3\nName: late\n",  # no blank line, no body
        "Metadata-Version: 2.1\n" + "Classifier: x\n" * 2000 + "Name: far\nVersion: 4\n\nbody\n" * 2000,
        "Metadata-Version: 2.1\n" + "Classifier: x\n" * 2000 + "\nName: after-the-header\nVersion: 5\n",
        "Name: only-name\n" + "Summary: " + "y" * 9000 + "\n",
        "",
    ],
)
def test_name_and_version_reads_the_header_as_a_whole_parse_would(text):
    name = version = None
    for line in text.splitlines():  # the definition: the header is the block before the first blank line
        if not line or (name and version):
            break
        if name is None and line.startswith("Name:"):
            name = line[5:].strip()
        elif version is None and line.startswith("Version:"):
            version = line[8:].strip()
    assert manifest_config._name_and_version(text) == (name, version)
