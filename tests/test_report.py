"""The JSON run report (--neuron-report) and `neuron-args report compare`."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from neuron_args.cli import main
from neuron_args.report import Thresholds, build_report, compare, graph_record, read_report, write_report


def row(graph_type, shapes, args, seconds=2.0, size=200_000, key="a" * 32, hits=3, misses=0):
    return {"key": key, "graph_type": graph_type, "input_shapes": shapes, "compiler_args": args,
            "compile_seconds": seconds, "executable_size": size, "serve_hits": hits, "serve_misses": misses}


def night(**over) -> dict:
    graphs = [graph_record(row("decode", ["1, 1"], ["-O3"], key="d" * 32), "compiled"),
              graph_record(row("prefill", ["1, 16"], [], key="p" * 32), "loaded")]
    report = build_report({"target": "trn2"}, graphs)
    for g in report["graphs"]:
        g.update(over.get(g["graph_type"], {}))
    return report


def test_build_report_totals_and_round_trip(tmp_path):
    report = night()
    assert report["report_version"] == "1"
    assert report["totals"] == {"graphs": 2, "compiled": 1, "loaded": 1, "captured": 0, "missed": 0, "seen": 0,
                                "compile_seconds": 4.0, "executable_bytes": 400_000, "serve_hits": 6,
                                "serve_misses": 0, "eager_output_graphs": 0}
    path = write_report(tmp_path / "r" / "report.json", report)
    assert read_report(path) == report


def test_compare_same_night_is_no_regression():
    result = compare(night(), night())
    assert not result.regression and result.lines() == ["no change"]


def test_compare_names_added_removed_and_changed_graphs():
    old, new = night(), night(decode={"compiler_args": ["-O2"], "compile_seconds": 30.0})
    new["graphs"] = [g for g in new["graphs"] if g["graph_type"] != "prefill"]
    new["graphs"].append(graph_record(row("jf", ["1, 4"], ["-O2"]), "compiled"))
    result = compare(old, new)
    assert result.regression
    assert result.lines() == [
        "+ jf (1, 4): new graph (-O2)",
        "- prefill (1, 16): gone",
        "! decode (1, 1): flags '-O3' -> '-O2'",
        "! decode (1, 1): compile 2.0s -> 30.0s",
    ]


def test_changes_under_either_threshold_are_not_regressions():
    small = compare(night(), night(decode={"compile_seconds": 6.5}))  # +4.5 s: under the 5 s floor
    assert not small.regression and small.lines() == ["no change"]
    bigger = compare(night(), night(decode={"executable_size": 300_000}), Thresholds(size_ratio=0.1))
    assert bigger.regression and "executable 200000 -> 300000 bytes" in bigger.lines()[0]
    faster = compare(night(), night(decode={"compile_seconds": 0.5, "executable_size": 100_000}),
                     Thresholds(seconds_abs=1.0))
    assert not faster.regression
    assert faster.lines() == ["~ decode (1, 1): compile 2.0s -> 0.5s (faster)",
                              "~ decode (1, 1): executable 200000 -> 100000 bytes (smaller)"]


def test_new_serve_misses_are_a_regression():
    assert compare(night(), night(prefill={"serve_misses": 2})).regression


def test_cli_compare_exit_status_and_json(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_report(old, night())
    write_report(new, night())
    assert main(["report", "compare", str(old), str(new)]) == 0
    assert capsys.readouterr().out.splitlines() == ["no change", "no regression"]
    write_report(new, night(decode={"compiler_args": ["-O1"]}))
    assert main(["report", "compare", str(old), str(new), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["regression"] is True and doc["changed"][0]["changes"] == ["flags '-O3' -> '-O1'"]
    (tmp_path / "bad.json").write_text("{}")
    assert main(["report", "compare", str(old), str(tmp_path / "bad.json")]) == 2
    assert "not a neuron-args report" in capsys.readouterr().err


def test_plugin_writes_the_session_report(neuron_project: pytest.Pytester, tmp_path: Path):
    neuron_project.makepyfile(test_served="""
        import torch

        def test_served(neuron_served):
            neuron_served.run("decode", {"x": torch.ones(1, 8)})
    """)
    path = tmp_path / "night" / "neuron-report.json"
    result = neuron_project.runpytest(f"--neuron-report={path}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"report written: {path}"])
    report = read_report(path)
    assert report["settings"]["target"] == "trn2" and report["settings"]["compiler"]["name"] == "local"
    by_type = {g["graph_type"]: g for g in report["graphs"]}
    assert sorted(by_type) == ["decode", "prefill"]
    assert by_type["decode"]["compiler_args"][-1] == "-O3" and by_type["decode"]["input_shapes"] == ["1, 8"]
    assert {g["status"] for g in report["graphs"]} <= {"loaded", "compiled"}
    assert by_type["decode"]["serve_hits"] >= 1 and report["totals"]["serve_misses"] == 0
    again = copy.deepcopy(report)
    assert not compare(report, again).regression
