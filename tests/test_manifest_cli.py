"""The ``neuron-args`` CLI (manifest show / validate / diff, cache ls / verify / explain) and manifest diffing."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from neuron_args.cli import main
from neuron_args.flags import canonical_compiler_args
from neuron_args.activity import ACTIVITY, LedgerActivity
from neuron_args.manifest.diff import compiler_flag_changes, diff_manifests
from neuron_args.manifest.config import build_config
from neuron_args.manifest.emit import emit_manifest
from neuron_args.manifest.ledger import record_graph, register_tp_group
from neuron_args.manifest.show import format_ranks, opt_level
from neuron_args.text import human_size

KEY_A = "0a" * 16
KEY_B = "1b" * 16
KEY_C = "2c" * 16
KEY_D = "3d" * 16


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("VLLM_NEURON_MANIFEST_DIR", "NEURON_VISIBLE_DEVICES", "NEURON_LIBTORCH_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ACTIVITY, "ledger", LedgerActivity())  # this test's own; the process's comes back after


def make_entry(cache: Path, key: str, *, graph_type: str | None, neff_bytes: int = 5000,
               compiler_args=("-O1",), status: str = "compiled", complete: bool = True,
               graph_sha: str = "f" * 64, target: str = "trn2") -> Path:
    """A cache entry laid out as docs/ARCHITECTURE.md specifies."""
    entry = cache / key
    entry.mkdir(parents=True)
    (entry / "graph.hlo").write_bytes(b"HloModuleProto")
    if status == "compiled":
        (entry / f"graph_{key}.neff").write_bytes(b"\x00" * neff_bytes)
        (entry / "command.txt").write_text("neuronx-cc compile graph.hlo\n")
        (entry / "log-neuron-cc.txt").write_text("ok\n")
    metadata = {
        "metadata_version": 1, "key": key, "status": status, "seam": "neuron_libtorch",
        "graph_type": graph_type, "compiler_args": list(compiler_args), "target": target,
        "key_components": {"graph": graph_sha, "input_specs": [{"shape": [4], "dtype": "float32"}],
                           "compiler_args": canonical_compiler_args(list(compiler_args)),
                           "target": target,
                           "tool_versions": {"neuronx-cc": "2.0"}},
        "input_specs": [{"shape": [4], "dtype": "float32"}],
        "output_specs": [{"shape": [4], "dtype": "float32"}],
        "input_shapes": ["4,"], "output_shapes": ["4"],
        "compiler": {"name": "local", "version": "0.10.2", "format": "xla-cpu-executable"},
        "created": "2026-01-01T00:00:00+00:00",
    }
    (entry / "metadata.json").write_text(json.dumps(metadata))
    if complete and status == "compiled":
        (entry / "COMPLETE").write_text("")
    return entry


@pytest.fixture
def deployment(monkeypatch, tmp_path):
    """A cache with two complete entries and the manifest a run over them emitted."""
    cache = tmp_path / "cache"
    make_entry(cache, KEY_A, graph_type="prefill", neff_bytes=949_498, compiler_args=("--optlevel=3",))
    make_entry(cache, KEY_B, graph_type="decode", neff_bytes=2048, compiler_args=("-O1",))
    root = tmp_path / "manifests"
    monkeypatch.setenv("VLLM_NEURON_MANIFEST_DIR", str(root))
    for rank in range(4):
        register_tp_group([0, 1, 2, 3], rank)
        record_graph(key=KEY_A, input_shapes=["4,", "4, 16"], compiler_flags="--target trn2 --optlevel 3")
        if rank < 2:
            record_graph(key=KEY_B, input_shapes=["4,"], compiler_flags="--target trn2 -O1")
    record_graph(key=KEY_C, input_shapes=[""], compiler_flags="--target trn2")  # entry missing
    config = build_config(model="tiny", target="trn2", dtype="torch.bfloat16", max_num_seqs=4,
                          max_model_len=256, topology={"world_size": 4, "tensor_parallel_size": 4},
                          neuron_config={"cache_dir": str(cache)})
    path = emit_manifest(cache_dir=cache, config=config)
    monkeypatch.delenv("VLLM_NEURON_MANIFEST_DIR")
    return types.SimpleNamespace(cache=cache, manifest=path, doc=json.loads(path.read_text()))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# ----------------------------------------------------------------------------- cells


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--target trn2 -O3", "-O3"),
        ("--optlevel=2", "-O2"),
        ("--optlevel 1", "-O1"),
        (["-O", "3"], "-O3"),
        ("-O1 --optlevel=3", "-O3"),  # the last one wins, as in neuronx-cc
        ("--target trn2", "-"),
        ("", "-"),
        (None, "-"),
        ("'unbalanced", "-"),
    ],
)
def test_opt_level(flags, expected):
    assert opt_level(flags) == expected


def test_sizes_and_ranks_are_readable():
    assert [human_size(n) for n in (None, 0, 1023, 1024, 949_498, 5 * 1024**3)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "927.2 KiB", "5.0 GiB"]
    assert format_ranks([0, 1]) == "0,1"
    assert format_ranks([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3,5,7-9"
    assert format_ranks([]) == "-"


# ----------------------------------------------------------------------------- manifest show


def test_show_reads_graph_types_from_the_recorded_cache(deployment, capsys):
    code, out, err = run(capsys, "manifest", "show", str(deployment.manifest))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("manifest v1  model=tiny  target=trn2  dtype=torch.bfloat16")
    assert lines[1] == "3 graphs"
    assert lines[2].split() == ["GRAPH", "TYPE", "HASH", "INPUTS", "OUTPUTS", "-O", "NEFF", "RANKS"]
    rows = {line.split()[1]: line.split() for line in lines[4:]}
    assert rows[KEY_A[:12]] == ["prefill", KEY_A[:12], "(4,)", "(4,", "16)", "(4)", "-O3", "927.2", "KiB", "0-3"]
    assert rows[KEY_B[:12]] == ["decode", KEY_B[:12], "(4,)", "(4)", "-O1", "2.0", "KiB", "0,1"]
    assert rows[KEY_C[:12]] == ["-", KEY_C[:12], "()", "-", "-", "-", "3"]  # recorded by rank 3 only
    assert KEY_A not in out  # short hashes only


def test_show_without_a_cache_has_no_graph_types(deployment, tmp_path, capsys):
    doc = copy.deepcopy(deployment.doc)
    doc["config"]["neuron_config"] = {}
    code, out, _ = run(capsys, "manifest", "show", write(tmp_path, "m.json", doc))
    assert code == 0
    assert "prefill" not in out and "decode" not in out
    # --cache-dir brings them back; a folder holding manifest.json is accepted too
    (tmp_path / "engine").mkdir()
    write(tmp_path / "engine", "manifest.json", doc)
    code, out, _ = run(capsys, "manifest", "show", str(tmp_path / "engine"), "--cache-dir", str(deployment.cache))
    assert code == 0 and "prefill" in out and "decode" in out


# ----------------------------------------------------------------------------- manifest validate


def test_validate_a_good_manifest(deployment, capsys):
    code, out, _ = run(capsys, "manifest", "validate", str(deployment.manifest))
    assert code == 0
    assert out.strip() == (f"OK: {deployment.manifest} is a valid manifest v1 (3 graphs; "
                           f"files checked against {deployment.cache})")


def test_validate_reports_schema_problems(deployment, tmp_path, capsys):
    doc = copy.deepcopy(deployment.doc)
    doc["manifest_version"] = "2"
    doc["graphs"][0]["ranks"] = [3, 1]
    code, out, _ = run(capsys, "manifest", "validate", write(tmp_path, "bad.json", doc))
    assert code == 1
    assert "INVALID" in out and "2 problems" in out
    assert "manifest_version: '1' was expected" in out
    assert "graphs[0].ranks: [3, 1] is not sorted" in out


def test_validate_cross_checks_the_cache(deployment, capsys):
    neff = deployment.cache / KEY_A / f"graph_{KEY_A}.neff"
    neff.write_bytes(b"\x00" * 10)  # recompiled since
    (deployment.cache / KEY_B / "graph.hlo").unlink()
    code, out, _ = run(capsys, "manifest", "validate", str(deployment.manifest),
                       "--cache-dir", str(deployment.cache))
    assert code == 1
    assert f"graphs[0] ({KEY_A[:12]}).neff_size: manifest says 949498 bytes" in out
    assert f"has 10 (recompiled or replaced" in out
    assert f"graphs[1] ({KEY_B[:12]}).hlo_path: {KEY_B}/graph.hlo not found in the cache" in out


def test_validate_skips_a_recorded_cache_that_is_not_here(deployment, tmp_path, capsys):
    doc = copy.deepcopy(deployment.doc)
    doc["config"]["neuron_config"]["cache_dir"] = str(tmp_path / "elsewhere")
    code, out, _ = run(capsys, "manifest", "validate", write(tmp_path, "m.json", doc))
    assert code == 0
    assert "is not on this machine; cache not checked" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read manifest"), ("{not json", "is not JSON"), ("[1, 2]", "holds a JSON list")],
)
def test_validate_unreadable_input_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "manifest", "validate", str(path))
    assert code == 2 and out == ""
    assert err.startswith("neuron-args: ") and message in err


def test_validate_with_a_missing_cache_dir_exits_2(deployment, tmp_path, capsys):
    code, _, err = run(capsys, "manifest", "validate", str(deployment.manifest), "--cache-dir",
                       str(tmp_path / "nope"))
    assert code == 2 and "no such directory" in err


def test_usage_errors_exit_2_and_help_exits_0(capsys):
    assert main([]) == 2
    assert main(["manifest"]) == 2
    assert main(["manifest", "frobnicate"]) == 2
    assert main(["--help"]) == 0
    assert "manifest" in capsys.readouterr().out


# ----------------------------------------------------------------------------- manifest diff


def test_diff_of_identical_runs_is_empty(deployment, tmp_path, capsys):
    doc = copy.deepcopy(deployment.doc)
    for graph in doc["graphs"]:  # what legitimately changes between runs
        if graph["created_timestamp"]:
            graph["created_timestamp"] = "2030-01-01T00:00:00+00:00"
        if graph["neff_size"]:
            graph["neff_size"] += 1
    doc["environment"]["torch"] = "9.9"
    doc["config"]["neuron_config"]["cache_dir"] = "/another/machine/cache"
    code, out, _ = run(capsys, "manifest", "diff", str(deployment.manifest), write(tmp_path, "n.json", doc))
    assert (code, out) == (0, "no differences\n")
    code, out, _ = run(capsys, "manifest", "diff", str(deployment.manifest), write(tmp_path, "n.json", doc),
                       "--include-environment")
    assert code == 1
    assert out.strip().startswith('~ environment.torch: "') and out.strip().endswith('-> "9.9"')


def _changed(doc: dict) -> dict:
    new = copy.deepcopy(doc)
    graph_a = next(g for g in new["graphs"] if g["graph_hash"] == KEY_A)
    graph_a.update(graph_hash=KEY_D, compiler_flags="--target trn2 -O1 --auto-cast none")
    graph_b = next(g for g in new["graphs"] if g["graph_hash"] == KEY_B)
    graph_b.update(ranks=[0, 1, 2, 3], output_shapes=["4", "8"])
    new["graphs"] = [g for g in new["graphs"] if g["graph_hash"] != KEY_C]
    new["graphs"].sort(key=lambda g: g["graph_hash"])
    new["config"]["max_num_seqs"] = 8
    new["config"]["vllm_config"] = {"scheduler": {"chunked": True}}
    return new


def test_diff_reports_graphs_flags_ranks_shapes_and_config(deployment, tmp_path, capsys):
    new_path = write(tmp_path, "new.json", _changed(deployment.doc))
    code, out, _ = run(capsys, "manifest", "diff", str(deployment.manifest), new_path)
    assert code == 1
    lines = out.splitlines()
    assert f"- graph {KEY_A[:12]}  inputs (4,) (4, 16)  flags --target trn2 --optlevel 3" in lines
    assert f"- graph {KEY_C[:12]}  inputs ()  flags --target trn2" in lines
    assert f"+ graph {KEY_D[:12]}  inputs (4,) (4, 16)  flags --target trn2 -O1 --auto-cast none" in lines
    assert (f"~ graph {KEY_A[:12]} -> {KEY_D[:12]} (same input shapes): "
            "compiler_flags -O3 -> -O1, added --auto-cast=none") in lines
    assert f"~ graph {KEY_B[:12]}: ranks [0, 1] -> [0, 1, 2, 3]; output_shapes (4) -> (4) (8)" in lines
    assert "~ config.max_num_seqs: 4 -> 8" in lines
    assert '~ config.vllm_config: null -> {"scheduler": {"chunked": true}}' in lines

    code, out, _ = run(capsys, "manifest", "diff", str(deployment.manifest), new_path, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["same"] is False
    assert [g["graph_hash"] for g in data["added_graphs"]] == [KEY_D]
    assert [g["graph_hash"] for g in data["removed_graphs"]] == [KEY_A, KEY_C]
    assert data["replacements"] == [{
        "old_hash": KEY_A, "new_hash": KEY_D,
        "compiler_flags": {"added": ["--auto-cast=none"], "removed": [],
                           "changed": [{"option": "--optlevel", "old": "-O3", "new": "-O1"}]},
    }]
    assert data["changed_graphs"] == [{
        "graph_hash": KEY_B, "ranks": {"old": [0, 1], "new": [0, 1, 2, 3]},
        "output_shapes": {"old": ["4"], "new": ["4", "8"]},
    }]
    assert {"path": "config.max_num_seqs", "change": "changed", "old": 4, "new": 8} in data["config"]


def test_diff_manifests_api():
    base = {"manifest_version": "1", "config": {"model": "m", "vllm_config": {"a": [1, 2]}},
            "graphs": [{"graph_hash": KEY_A, "compiler_flags": "--target trn2 -O2", "ranks": [0],
                        "input_shapes": ["4,"], "output_shapes": ["4"]}],
            "environment": {"python": "3.11.7"}}
    assert diff_manifests(base, copy.deepcopy(base)).empty
    new = copy.deepcopy(base)
    new["graphs"][0]["compiler_flags"] = "--optlevel=2 --target=trn2"  # same meaning, other spelling
    assert diff_manifests(base, new).empty
    new["config"]["vllm_config"]["a"].append(3)
    del new["config"]["model"]
    result = diff_manifests(base, new)
    assert not result.empty
    assert result.lines() == ["~ config.model: removed (was \"m\")", "~ config.vllm_config.a[2]: added 3"]
    assert json.loads(json.dumps(result.as_dict()))["config"][1] == {
        "path": "config.vllm_config.a[2]", "change": "added", "new": 3}


def test_compiler_flag_changes():
    assert compiler_flag_changes("--target trn2 -O3", "--optlevel 3 --target=trn2") == {
        "added": [], "removed": [], "changed": []}
    assert compiler_flag_changes("--target trn2 -O3 --enable-fast-loading-neuron-binaries",
                                 "--target trn1 -O3 --lnc 2") == {
        "added": ["--logical-nc-config=2"],
        "removed": ["--enable-fast-loading-neuron-binaries"],
        "changed": [{"option": "--target", "old": "--target=trn2", "new": "--target=trn1"}],
    }
    # unknown flags: compared as raw tokens
    assert compiler_flag_changes("--mystery-flag -O1", "--mystery-flag -O2") == {
        "added": [], "removed": [], "changed": [{"option": "--optlevel", "old": "-O1", "new": "-O2"}]}


# ----------------------------------------------------------------------------- cache ls / explain


@pytest.fixture
def cache(tmp_path) -> Path:
    root = tmp_path / "cache"
    make_entry(root, KEY_A, graph_type="prefill", neff_bytes=3000, compiler_args=("--optlevel", "3"))
    make_entry(root, KEY_B, graph_type="decode", status="pending", compiler_args=("-O1",))
    make_entry(root, KEY_C, graph_type=None, complete=False, compiler_args=())
    make_entry(root, KEY_A[:-4] + "ffff", graph_type="prefill", compiler_args=("-O1",), graph_sha="e" * 64)
    (root / f"{KEY_A}.lock").write_text("")
    (root / "not-an-entry").mkdir()
    return root


def _size(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.iterdir() if p.is_file())


def test_cache_ls(cache, capsys):
    code, out, err = run(capsys, "cache", "ls", str(cache))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"compile cache {cache}"
    assert lines[1].split() == ["GRAPH", "TYPE", "KEY", "-O", "STATUS", "SIZE"]
    rows = [line.split() for line in lines[3:-1]]
    other = KEY_A[:-4] + "ffff"
    assert rows == [
        ["decode", KEY_B[:12], "-O1", "pending", *human_size(_size(cache / KEY_B)).split()],
        ["prefill", KEY_A[:12], "-O3", "complete", *human_size(_size(cache / KEY_A)).split()],
        ["prefill", other[:12], "-O1", "complete", *human_size(_size(cache / other)).split()],
        ["-", KEY_C[:12], "-", "crashed", *human_size(_size(cache / KEY_C)).split()],
    ]
    assert _size(cache / KEY_A) > 3000 and human_size(_size(cache / KEY_A)).endswith(" KiB")
    assert lines[-1].startswith("4 entries (2 complete, 1 pending, 1 crashed), ")


def test_cache_ls_defaults_to_the_env_dir(cache, monkeypatch, capsys):
    monkeypatch.setenv("NEURON_LIBTORCH_CACHE_DIR", str(cache))
    code, out, _ = run(capsys, "cache", "ls")
    assert code == 0 and out.splitlines()[0] == f"compile cache {cache}"
    monkeypatch.setenv("NEURON_LIBTORCH_CACHE_DIR", str(cache / "missing"))
    code, out, err = run(capsys, "cache", "ls")
    assert code == 2 and f"no compile cache at {cache / 'missing'}" in err
    monkeypatch.delenv("NEURON_LIBTORCH_CACHE_DIR")
    monkeypatch.setenv("HOME", str(cache.parent / "home"))
    code, _, err = run(capsys, "cache", "ls")
    assert code == 2
    assert f"no compile cache at {cache.parent / 'home' / '.cache/neuron-args/compile-cache'}" in err


def test_cache_explain_with_key_prefixes(cache, capsys):
    other = KEY_A[:-4] + "ffff"
    code, out, err = run(capsys, "cache", "explain", KEY_B[:6], other[:30], "--cache-dir", str(cache))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{KEY_B} vs {other}"
    assert "  graph: different graph content (sha256 ffffffffffff -> eeeeeeeeeeee)" in lines
    assert not any("compiler_args" in line for line in lines)  # both -O1


def test_cache_explain_says_how_flags_differ(cache, capsys):
    code, out, _ = run(capsys, "cache", "explain", KEY_A, KEY_B, "--cache-dir", str(cache))
    assert code == 0
    flag_lines = [line.strip() for line in out.splitlines() if "compiler_args" in line]
    assert len(flag_lines) == 1 and "-O3 -> -O1" in flag_lines[0]


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (KEY_A[:4], "is ambiguous"),
        ("9999", "has a key starting with '9999'"),
        ("xyz", "is not a cache key or key prefix"),
    ],
)
def test_cache_explain_rejects_bad_prefixes(cache, capsys, prefix, message):
    code, out, err = run(capsys, "cache", "explain", prefix, KEY_B, "--cache-dir", str(cache))
    assert code == 2 and out == ""
    assert message in err


def test_cache_explain_needs_key_components(cache, capsys):
    metadata = json.loads((cache / KEY_B / "metadata.json").read_text())
    del metadata["key_components"]
    (cache / KEY_B / "metadata.json").write_text(json.dumps(metadata))
    code, _, err = run(capsys, "cache", "explain", KEY_A, KEY_B, "--cache-dir", str(cache))
    assert code == 2 and f"cache entry {KEY_B} has no key_components" in err


# ----------------------------------------------------------------------------- console script


@pytest.mark.slow
def test_the_console_script(deployment):
    script = Path(sys.executable).with_name("neuron-args")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_NEURON_MANIFEST_DIR"}
    proc = subprocess.run([str(script), "manifest", "validate", str(deployment.manifest)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK: {deployment.manifest} is a valid manifest v1 (3 graphs")
    proc = subprocess.run([str(script), "manifest", "validate", str(deployment.manifest) + ".missing"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "cannot read manifest" in proc.stderr


# ----------------------------------------------------------------------------- --cache-dir, --json, baselines


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_cache_dir_option_and_positional_agree(cache, capsys, command):
    by_position = run(capsys, "cache", command, str(cache))
    assert by_position[0] in (0, 1) and by_position[2] == ""
    assert run(capsys, "cache", command, "--cache-dir", str(cache)) == by_position
    # both, naming the same place (spelled differently): fine
    assert run(capsys, "cache", command, str(cache), "--cache-dir", str(cache / ".." / "cache")) == by_position
    code, out, err = run(capsys, "cache", command, str(cache), "--cache-dir", str(cache.parent))
    assert (code, out) == (2, "")
    assert f"the directory {cache} and --cache-dir {cache.parent} differ; give one" in err


def test_cache_dir_option_missing_dir_is_a_usage_error(tmp_path, capsys):
    for command in (["ls"], ["verify"], ["explain", KEY_A, KEY_B]):
        code, out, err = run(capsys, "cache", *command, "--cache-dir", str(tmp_path / "nowhere"))
        assert (code, out) == (2, "") and f"no compile cache at {tmp_path / 'nowhere'}" in err


def test_cache_ls_json(cache, capsys):
    code, out, err = run(capsys, "cache", "ls", "--cache-dir", str(cache), "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) == {"cache_dir", "entries", "counts", "total_size"}
    assert doc["cache_dir"] == str(cache)
    other = KEY_A[:-4] + "ffff"
    assert [(e["graph_type"], e["key"], e["opt_level"], e["status"]) for e in doc["entries"]] == [
        ("decode", KEY_B, "-O1", "pending"), ("prefill", KEY_A, "-O3", "complete"),
        ("prefill", other, "-O1", "complete"), (None, KEY_C, None, "crashed")]
    assert all(set(e) == {"key", "graph_type", "opt_level", "status", "lock_pid", "size"} for e in doc["entries"])
    assert doc["entries"][1]["size"] == _size(cache / KEY_A)
    assert doc["counts"] == {"complete": 2, "crashed": 1, "pending": 1}
    assert doc["total_size"] == sum(e["size"] for e in doc["entries"])


def _corrupt(cache: Path, key: str) -> None:
    metadata = json.loads((cache / key / "metadata.json").read_text())
    metadata["executable_size"] = 1
    (cache / key / "metadata.json").write_text(json.dumps(metadata))


def test_cache_verify_json_keeps_the_exit_status(cache, capsys):
    code, out, _ = run(capsys, "cache", "verify", "--cache-dir", str(cache), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc == {"cache_dir": str(cache), "checked": 4, "counts": {"complete": 2, "crashed": 1, "pending": 1},
                   "corrupt": [], "fixed": False, "ok": True}
    _corrupt(cache, KEY_A)
    code, out, _ = run(capsys, "cache", "verify", str(cache), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["counts"]["corrupt"] == 1
    assert doc["corrupt"] == [{"key": KEY_A, "graph_type": "prefill", "moved_to": None,
                               "problem": "the executable has 3000 bytes, 1 were recorded (truncated or replaced)"}]
    code, out, _ = run(capsys, "cache", "verify", "--cache-dir", str(cache), "--fix", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fixed"] is True and doc["ok"] is True
    assert doc["corrupt"][0]["key"] == KEY_A and Path(doc["corrupt"][0]["moved_to"]).is_dir()
    assert not (cache / KEY_A).exists()


def test_cache_explain_json(cache, capsys):
    code, out, err = run(capsys, "cache", "explain", KEY_A, KEY_B[:6], "--cache-dir", str(cache), "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) == {"cache_dir", "key_a", "key_b", "graph_types", "identical", "differences"}
    assert (doc["key_a"], doc["key_b"], doc["graph_types"]) == (KEY_A, KEY_B, ["prefill", "decode"])
    assert doc["identical"] is False
    assert any("compiler_args" in line and "-O3 -> -O1" in line for line in doc["differences"])
    code, out, _ = run(capsys, "cache", "explain", KEY_A, KEY_A, "--cache-dir", str(cache), "--json")
    assert code == 0 and json.loads(out)["identical"] is True and json.loads(out)["differences"] == []


def test_manifest_show_json(deployment, capsys):
    code, out, err = run(capsys, "manifest", "show", str(deployment.manifest), "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) == {"path", "kind", "manifest_version", "config", "cache_dir", "note", "graphs"}
    assert (doc["kind"], doc["manifest_version"], doc["cache_dir"]) == ("manifest", "1", str(deployment.cache))
    assert doc["config"]["model"] == "tiny"
    assert [(g["graph_type"], g["graph_hash"], g["opt_level"], g["ranks"]) for g in doc["graphs"]] == [
        ("prefill", KEY_A, "-O3", [0, 1, 2, 3]), ("decode", KEY_B, "-O1", [0, 1]), (None, KEY_C, None, [3])]
    assert doc["graphs"][0]["input_shapes"] == ["4,", "4, 16"]
    assert doc["graphs"][0]["neff_size"] == 949_498


def test_manifest_validate_json_keeps_the_exit_status(deployment, tmp_path, capsys):
    code, out, _ = run(capsys, "manifest", "validate", str(deployment.manifest), "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc == {"path": str(deployment.manifest), "kind": "manifest", "valid": True, "manifest_version": "1",
                   "graphs": 3, "cache_dir": str(deployment.cache), "note": None, "problems": []}
    (deployment.cache / KEY_B / "graph.hlo").unlink()
    code, out, _ = run(capsys, "manifest", "validate", str(deployment.manifest), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["valid"] is False
    assert doc["problems"] == [f"graphs[1] ({KEY_B[:12]}).hlo_path: {KEY_B}/graph.hlo not found in the cache "
                               f"{deployment.cache}"]


def _baseline(deployment, tmp_path) -> Path:
    """The baseline the plugin writes for this deployment's manifest (``--neuron-update-baseline``)."""
    from pytest_neuron_args.baseline import BASELINE_DIRNAME, normalize

    doc = copy.deepcopy(deployment.doc)
    doc["config"]["neuron_config"]["graph_types"] = {KEY_A: "prefill", KEY_B: "decode", "9" * 32: "other"}
    path = tmp_path / "proj" / BASELINE_DIRNAME / "test_serve.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(normalize(doc), indent=2, sort_keys=True) + "\n")
    return path


def test_validate_a_baseline_says_so_and_checks_it_as_one(deployment, tmp_path, capsys):
    path = _baseline(deployment, tmp_path)
    code, out, err = run(capsys, "manifest", "validate", str(path))
    assert (code, err) == (0, ""), out
    assert out.startswith(f"OK: {path} is a manifest baseline")
    assert "3 graphs" in out
    code, out, _ = run(capsys, "manifest", "validate", str(path), "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["kind"], doc["valid"], doc["problems"], doc["cache_dir"]) == ("baseline", True, [], None)
    # found as a baseline by its content too (renamed out of .neuron-baseline/)
    moved = tmp_path / "elsewhere.json"
    moved.write_text(path.read_text())
    assert run(capsys, "manifest", "validate", str(moved))[1].startswith(f"OK: {moved} is a manifest baseline")
    # a broken baseline is invalid as a baseline, with the baseline's own rules
    broken = json.loads(path.read_text())
    del broken["graphs"][0]["compiler_flags"]
    broken["graphs"][1]["neff_size"] = 12
    broken_path = path.with_name("broken.json")
    broken_path.write_text(json.dumps(broken))
    code, out, _ = run(capsys, "manifest", "validate", str(broken_path))
    assert code == 1
    assert out.splitlines()[0] == f"INVALID: {broken_path}: 2 problems (checked as a baseline)"
    assert "'compiler_flags' is a required property" in out
    assert "graphs[1]: a baseline leaves out neff_size" in out
    assert "environment" not in out and "created_timestamp' is a required" not in out


def test_show_of_a_baseline_does_not_look_for_its_placeholder_cache(deployment, tmp_path, capsys):
    path = _baseline(deployment, tmp_path)
    code, out, err = run(capsys, "manifest", "show", str(path))
    assert (code, err) == (0, "")
    assert "not on this machine" not in out and "<cache_dir>" not in out
    code, out, _ = run(capsys, "manifest", "show", str(path), "--json")
    doc = json.loads(out)
    assert (code, doc["kind"], doc["cache_dir"], doc["note"]) == (0, "baseline", None, None)
    assert [g["graph_type"] for g in doc["graphs"]] == ["prefill", "decode", None]


def test_a_manifest_without_environment_is_still_checked_as_a_manifest(deployment, tmp_path, capsys):
    doc = copy.deepcopy(deployment.doc)
    del doc["environment"]
    code, out, _ = run(capsys, "manifest", "validate", write(tmp_path, "m.json", doc), "--json")
    result = json.loads(out)
    assert code == 1 and result["kind"] == "manifest"
    assert any("'environment' is a required property" in p for p in result["problems"])


def test_baseline_constants_match_the_plugin():
    from neuron_args.manifest import show
    from pytest_neuron_args import baseline

    assert show.BASELINE_VOLATILE_GRAPH_FIELDS == baseline.VOLATILE_GRAPH_FIELDS
    assert show.BASELINE_CACHE_DIR_PLACEHOLDER == baseline.CACHE_DIR_PLACEHOLDER
    assert show.BASELINE_DIRNAME == baseline.BASELINE_DIRNAME


@pytest.mark.slow
def test_consistency_through_python_m(deployment, tmp_path):
    """The same flags through a real process: ``python -m neuron_args.cli``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_NEURON_MANIFEST_DIR", "NEURON_LIBTORCH_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "neuron_args.cli", *argv], capture_output=True, text=True,
                              env=env, timeout=120)

    proc = cli("cache", "ls", "--cache-dir", str(deployment.cache), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [e["graph_type"] for e in json.loads(proc.stdout)["entries"]] == ["decode", "prefill"]
    proc = cli("cache", "verify", str(deployment.cache), "--cache-dir", str(tmp_path))
    assert proc.returncode == 2 and "differ; give one" in proc.stderr
    proc = cli("manifest", "validate", str(_baseline(deployment, tmp_path)), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["kind"] == "baseline"
