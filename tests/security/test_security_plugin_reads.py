"""The plugin reads manifests and baselines as untrusted input: deep nesting, a FIFO or a huge file is an
error naming the file, never a RecursionError, a hang or a memory blow-up."""
from __future__ import annotations

import os

import pytest

from neuron_args.untrusted import UntrustedFileError
from pytest_neuron_args.assertions import ManifestView
from pytest_neuron_args.baseline import Baseline
from tests.security.security_helpers import DEEP_JSON


def test_a_deeply_nested_manifest_is_an_untrusted_file_error_naming_it(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(DEEP_JSON)
    with pytest.raises(UntrustedFileError, match=f"{path} is not JSON \\(nested too deeply\\)"):
        ManifestView.load(path)


def test_a_manifest_that_is_a_fifo_is_refused_at_once(tmp_path):
    path = tmp_path / "manifest.json"
    os.mkfifo(path)
    with pytest.raises(UntrustedFileError, match="is not a regular file \\(a FIFO\\)"):
        ManifestView.load(path)


def test_a_deeply_nested_baseline_fails_the_check_as_unreadable_with_the_fix(tmp_path):
    path = tmp_path / "t.py__test_a.json"
    path.write_text(DEEP_JSON)
    baseline = Baseline(path, nodeid="t.py::test_a", update=False, update_hint="pytest t.py --neuron-update-baseline")
    with pytest.raises(AssertionError) as failed:
        baseline.check({"manifest_version": "1", "graphs": []})
    message = str(failed.value)
    assert f"manifest baseline {path} is unreadable (UntrustedFileError" in message
    assert "nested too deeply" in message and "pytest t.py --neuron-update-baseline" in message


def test_a_rank_s_serve_file_that_is_a_fifo_deep_or_ill_typed_reads_as_reporting_nothing(tmp_path):
    from pytest_neuron_args.ranks import read_serves, serve_file, serve_problems

    os.mkfifo(serve_file(tmp_path, 0))  # an ordinary open would block the pytest process forever
    serve_file(tmp_path, 1).write_text(DEEP_JSON)
    serve_file(tmp_path, 2).write_text('{"outcome": "passed", "export": {"serve_misses": "many", '
                                       '"serve_calls": {"decode": "3", "prefill": 2, "bad": true}}}')
    results = read_serves(tmp_path, 3)
    assert [r["outcome"] for r in results] == [None, None, "passed"]
    assert (results[2]["serve_calls"], results[2]["serve_misses"]) == (2, 0)
    problems = serve_problems(results)
    assert [p.split(":")[0] for p in problems] == ["rank 0 reported nothing (0 calls, 0 misses)",
                                                   "rank 1 reported nothing (0 calls, 0 misses)"]


def test_a_rank_writes_its_serve_file_in_place_of_a_planted_link_not_through_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from neuron_args import envs
    from pytest_neuron_args.ranks import note_phase, serve_file

    monkeypatch.setattr(envs, "RANK", 0)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    serve_file(tmp_path, 0).symlink_to(victim)
    note_phase(tmp_path, SimpleNamespace(failed=False, skipped=False, when="call", longrepr=None), {"serve_misses": 0})
    assert victim.read_text() == "the user's file"
    assert not serve_file(tmp_path, 0).is_symlink()
    assert '"outcome": "passed"' in serve_file(tmp_path, 0).read_text()


def test_a_rank_s_warmup_file_that_is_a_fifo_deep_or_ill_typed_reads_as_reporting_nothing(tmp_path):
    from pytest_neuron_args.ranks import read_warmups, warmup_file

    os.mkfifo(warmup_file(tmp_path, 0))  # an ordinary open would block the pytest process forever
    warmup_file(tmp_path, 1).write_text(DEEP_JSON)
    warmup_file(tmp_path, 2).write_text('{"rank": "2; rm", "graphs": "all", "error": "", "weights": [1]}')
    warmup_file(tmp_path, 3).write_text('{"rank": 9, "graphs": [], "error": null, "weights": {"w": "d"}}')
    results = read_warmups(tmp_path, 4)
    assert [(r["rank"], r["graphs"], r["error"], r["weights"]) for r in results] == [
        (0, None, None, None), (1, None, None, None), (2, None, None, None), (3, [], None, {"w": "d"})]


def test_a_rank_writes_its_warmup_file_in_place_of_a_planted_link_not_through_it(tmp_path, monkeypatch):
    from neuron_args import envs
    from pytest_neuron_args.ranks import read_warmups, warmup_file, write_warmup

    monkeypatch.setattr(envs, "RANK", 1)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    warmup_file(tmp_path, 1).symlink_to(victim)
    write_warmup(tmp_path, {"error": "boom", "rank": 7})
    assert victim.read_text() == "the user's file"
    assert not warmup_file(tmp_path, 1).is_symlink()
    assert read_warmups(tmp_path, 2)[1]["error"] == "boom" and read_warmups(tmp_path, 2)[1]["rank"] == 1
