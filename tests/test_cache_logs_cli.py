"""``neuron-args cache logs`` / ``cache ls --status`` / ``cache explain DIR KEY_A KEY_B``: what the nightly job
and a developer read of a cache's failed compiles, in-process."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neuron_args.cli import main
from tests.test_manifest_cli import KEY_A, KEY_B, KEY_C, KEY_D, make_entry

KEY_E = "4e" * 16


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A complete entry, a pending one and one of each unbuilt status, each with the log its compile left."""
    root = tmp_path / "cache"
    make_entry(root, KEY_A, graph_type="prefill")
    make_entry(root, KEY_B, graph_type="decode", status="pending")
    for key, status in ((KEY_C, "failed"), (KEY_D, "interrupted"), (KEY_E, "compiling")):  # compiling, no lock: crashed
        entry = make_entry(root, key, graph_type="decode", status=status)
        (entry / "log-neuron-cc.txt").write_text(f"neuronx-cc: error in {key}\n")
        (entry / "command.txt").write_text("neuronx-cc compile graph.hlo -O3\n")
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cache_logs_copies_the_logs_of_failed_crashed_and_interrupted_entries(cache, tmp_path, capsys):
    out_dir = tmp_path / "failed-compiles"
    code, out, err = run(capsys, "cache", "logs", str(cache), "--out", str(out_dir))
    assert (code, err) == (0, "")
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([KEY_C, KEY_D, KEY_E])
    for key in (KEY_C, KEY_D, KEY_E):
        assert (out_dir / key / "log-neuron-cc.txt").read_text() == f"neuronx-cc: error in {key}\n"
        assert (out_dir / key / "command.txt").read_text().startswith("neuronx-cc compile")
        assert json.loads((out_dir / key / "metadata.json").read_text())["key"] == key
    assert out.splitlines()[0] == (f"compile cache {cache}: 3 entries crashed,failed,interrupted, "
                                   f"logs copied to {out_dir}")
    assert f"  failed {KEY_C} (graph type decode): log-neuron-cc.txt, command.txt, metadata.json" in out


def test_cache_logs_status_and_json(cache, tmp_path, capsys):
    code, out, _ = run(capsys, "cache", "logs", "--cache-dir", str(cache), "--out", str(tmp_path / "o"),
                       "--status", "failed", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["statuses"] == ["failed"]
    assert [(e["key"], e["status"], e["files"]) for e in doc["entries"]] == [
        (KEY_C, "failed", ["log-neuron-cc.txt", "command.txt", "metadata.json"])]


def test_cache_logs_collects_nothing_from_a_sound_cache(tmp_path, capsys):
    make_entry(tmp_path / "cache", KEY_A, graph_type="prefill")
    code, out, _ = run(capsys, "cache", "logs", str(tmp_path / "cache"), "--out", str(tmp_path / "o"))
    assert code == 0 and out.startswith(f"compile cache {tmp_path / 'cache'}: 0 entries crashed,failed,interrupted\n")
    assert not (tmp_path / "o").exists()


def test_an_unknown_status_is_a_usage_error(cache, tmp_path, capsys):
    """The nightly step once filtered on a status that does not exist ("incomplete") and collected nothing."""
    for command in (["logs", str(cache), "--out", str(tmp_path / "o")], ["ls", str(cache)]):
        code, out, err = run(capsys, "cache", *command, "--status", "failed,incomplete")
        assert (code, out) == (2, "")
        assert "'incomplete' is not an entry status; give a comma-separated list of complete, corrupt" in err


def test_cache_logs_does_not_follow_a_symlinked_log(cache, tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("not a log")
    os.unlink(cache / KEY_C / "log-neuron-cc.txt")
    os.symlink(secret, cache / KEY_C / "log-neuron-cc.txt")
    code, _, _ = run(capsys, "cache", "logs", str(cache), "--out", str(tmp_path / "o"), "--status", "failed")
    assert code == 0 and sorted(p.name for p in (tmp_path / "o" / KEY_C).iterdir()) == ["command.txt", "metadata.json"]


def test_cache_ls_status_filter(cache, capsys):
    code, out, _ = run(capsys, "cache", "ls", str(cache), "--status", "failed,crashed", "--json")
    assert code == 0
    assert [(e["key"], e["status"]) for e in json.loads(out)["entries"]] == [(KEY_C, "failed"), (KEY_E, "crashed")]


def test_cache_explain_takes_the_cache_folder_first(cache, capsys):
    by_position = run(capsys, "cache", "explain", str(cache), KEY_A, KEY_C[:8])
    assert by_position[0] == 0 and by_position[1].startswith(f"{KEY_A} vs {KEY_C}\n")
    assert run(capsys, "cache", "explain", KEY_A, KEY_C[:8], "--cache-dir", str(cache)) == by_position  # the old form


def test_cache_explain_with_a_folder_and_one_key_is_a_usage_error(cache, capsys):
    code, out, err = run(capsys, "cache", "explain", str(cache), KEY_A)
    assert (code, out) == (2, "")
    assert f"cache explain takes DIR KEY_A KEY_B (or KEY_A KEY_B with --cache-dir DIR or $NEURON_LIBTORCH_CACHE_DIR), " \
           f"got {cache} {KEY_A}" in err
