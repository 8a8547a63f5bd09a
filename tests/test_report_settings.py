"""`report compare` names the run settings that differ (tp, target, -O level, compiler) before the graph diff."""
from __future__ import annotations

import json

from neuron_args.cli import main
from neuron_args.report import build_report, compare, graph_record


def _report(**settings) -> dict:
    row = {"key": "d" * 32, "graph_type": "decode", "input_shapes": ["1, 1"], "compiler_args": ["-O3"],
           "compile_seconds": 2.0, "executable_size": 1000, "serve_hits": 1, "serve_misses": 0}
    base = {"target": "trn2", "tp": 1, "optimization_level": None, "compiler_args": None,
            "compiler": {"name": "local", "version": "0.1"}}
    return build_report({**base, **settings}, [graph_record(row, "compiled")])


def test_a_tp1_and_a_tp2_report_of_the_same_graphs_are_not_no_change(tmp_path, capsys):
    old, new = _report(), _report(tp=2, target="trn1", optimization_level=2,
                                  compiler={"name": "neuronx-cc", "version": "2.19"})
    result = compare(old, new)
    assert result.lines() == ["~ settings tp: 1 -> 2", "~ settings target: trn2 -> trn1",
                              "~ settings optimization level: - -> 2",
                              "~ settings compiler: local 0.1 -> neuronx-cc 2.19"]
    paths = []
    for name, doc in (("old", old), ("new", new)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    main(["report", "compare", *map(str, paths)])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "~ settings tp: 1 -> 2" and "no change" not in out
    main(["report", "compare", *map(str, paths), "--json"])
    assert json.loads(capsys.readouterr().out)["settings"][0] == "tp: 1 -> 2"


def test_same_settings_say_nothing_about_settings():
    assert compare(_report(), _report()).lines() == ["no change"]
    assert compare(_report(tp=None), _report(tp=1)).settings == []  # an older report without tp ran one rank
