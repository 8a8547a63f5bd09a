"""GraphOutcome: the one record of a graph, from a seam's record to the plugin's summary, report and JUnit properties."""
from __future__ import annotations

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.report import graph_record
from neuron_args.seams import records
from pytest_neuron_args.report import warmup_properties
from pytest_neuron_args.options import NeuronSettings
from pytest_neuron_args.state import NeuronSession

KEY = "cd" * 16


@pytest.fixture
def session(pytestconfig: pytest.Config) -> NeuronSession:
    s = NeuronSession(pytestconfig, NeuronSettings.from_config(pytestconfig))
    s._records_before, s._stats_before = dict(ACTIVITY.records), ACTIVITY.stats.snapshot()  # as start() takes it
    return s


def test_a_worker_row_of_the_wrong_type_fails_naming_the_graph_and_field(session: NeuronSession) -> None:
    # a worker's row is untrusted: "3" loads was shown as 3 in the table, and summed with another row's as text
    session.workers = {"gw0": {"rows": [{"key": KEY, "graph_type": "decode", "loads": "3"}]}}
    with pytest.raises(ValueError, match=rf"graph {KEY}: loads must be int, got '3'"):
        session.merged()


def test_an_older_row_with_flags_only_merges_with_a_counted_one(session: NeuronSession) -> None:
    old = {"key": KEY, "graph_type": "decode", "input_shapes": ["1, 8"], "compiler_args": ["-O3"], "compiled": True,
           "captured": False, "compile_seconds": 0.5, "executable_size": 100, "loads": 1, "serve_hits": None,
           "serve_misses": None}
    new = GraphOutcome(KEY, "decode", loads=2, serve_hits=4, serve_misses=0).to_json()
    session.workers = {"gw0": {"rows": [old]}, "gw1": {"rows": [new]}}
    (row,) = session.merged()["rows"]
    assert (row["compiles"], row["compiled"], row["loads"], row["serve_hits"], row["serve_misses"]) == (1, True, 3, 4, 0)
    assert (row["input_shapes"], row["compile_seconds"], row["executable_size"]) == (["1, 8"], 0.5, 100)
    assert graph_record(row, "compiled") == {
        "graph_type": "decode", "key": KEY, "compiler_args": ["-O3"], "input_shapes": ["1, 8"], "status": "compiled",
        "compile_seconds": 0.5, "executable_size": 100, "serve_hits": 4, "serve_misses": 0, "error": None}


def test_a_copy_of_the_records_is_a_snapshot_a_later_record_leaves_alone() -> None:
    # records used to be merged in place, so a copy of ACTIVITY.records changed under the plugin's "before"
    records.RECORDS.pop(KEY, None)
    try:
        records.record(GraphOutcome(KEY, "decode", ["1, 8"], ["-O1"], compiles=1, compile_seconds=0.2))
        before = dict(ACTIVITY.records)
        records.record(GraphOutcome(KEY, "decode", ["1, 8"], ["-O1"], loads=1))
        records.RECORDS[KEY] = records.RECORDS[KEY].served_once()
        now = records.RECORDS[KEY]
        assert (before[KEY].loads, before[KEY].serve_hits) == (0, 0)
        assert (now.compiles, now.loads, now.serve_hits, now.compile_seconds) == (1, 1, 1, 0.2)
        delta = now.since(before[KEY])
        assert (delta.compiles, delta.loads, delta.serve_hits, delta.compile_seconds, delta.status) == (
            0, 1, 1, None, "loaded")
    finally:
        records.RECORDS.pop(KEY, None)


def test_json_round_trip_and_what_from_json_refuses() -> None:
    warmed = GraphOutcome(KEY, "decode", ["1, 8"], ["-O2"], 2, seam="neuron_libtorch", target="trn2", compiles=1,
                          bucket="b1", how="compiled", counts={"misses": 1, "compiles": 1}, origin="t.py::test")
    assert GraphOutcome.from_json(warmed.to_json()) == warmed
    for bad, field in [({"key": KEY, "input_shapes": "1, 8"}, "input_shapes"), ({"key": KEY, "compiles": True}, "compiles"),
                       ({"key": KEY, "counts": {"hits": "1"}}, "counts")]:
        with pytest.raises(ValueError, match=rf"graph {KEY}: {field} must"):
            GraphOutcome.from_json(bad)
    with pytest.raises(ValueError, match="no key"):
        GraphOutcome.from_json({"graph_type": "decode"})


def test_junit_properties_read_outcomes_as_they_read_json_forms() -> None:
    graphs = [GraphOutcome("p" * 32, "prefill", ["1, 16"], ["-O1"], 1, how="compiled"),
              GraphOutcome("d" * 32, "decode", ["1, 8"], ["--x", "-O3"], 3, how="loaded")]
    assert warmup_properties(graphs) == warmup_properties([g.to_json() for g in graphs])
    assert warmup_properties(graphs)[0] == ("neuron_graph", f"graph_type=decode inputs=(1, 8) key={'d' * 32} "
                                                            "level=-O3 how=loaded")


def test_junit_levels_are_the_typed_level_the_summary_table_shows() -> None:
    """The JUnit level was parsed again from the argument list: a graph whose list is unknown (an older worker's
    row) or says no -O showed '-' though its typed level (what the compile got, and the table's -O) was known."""
    from neuron_args.seams.records import table_rows

    graphs = [GraphOutcome("d" * 32, "decode", ["1, 8"], None, 2, how="loaded"),
              GraphOutcome("p" * 32, "prefill", ["1, 16"], ["--x"], 1, how="compiled")]
    props = dict(p for p in warmup_properties(graphs) if p[0] != "neuron_graph")
    assert props["neuron_optimization_levels"] == "decode=-O2 prefill=-O1"
    assert [f"level=-O{cells[2]}" in v for (_, v), cells in zip(warmup_properties(graphs)[:2],
                                                                 table_rows(graphs)[1])] == [True, True]


def test_a_compile_report_serializes_its_outcomes_as_the_compile_cli_always_printed_them() -> None:
    from neuron_args.deferred import CompileReport

    built = GraphOutcome(KEY, "decode", compiler_args=["-O2"], how="compiled", compile_seconds=1.5, executable_size=10,
                         used_base_args=True)
    (graph,) = CompileReport([built], seconds=2.0).as_dict()["graphs"]
    assert list(graph.items()) == [("key", KEY), ("graph_type", "decode"), ("compiler_args", ["-O2"]),
                                   ("status", "compiled"), ("seconds", 1.5), ("executable_size", 10),
                                   ("used_base_args", True), ("error", None)]


def test_a_graph_one_worker_compiled_and_another_failed_to_is_listed_compiled(session: NeuronSession) -> None:
    from neuron_args.deferred import CompileReport

    failed = NeuronSession(session.config, session.settings)
    failed._records_before = dict(ACTIVITY.records)  # as start() takes it
    failed.add_compile_report(CompileReport([GraphOutcome(KEY, "decode", compiler_args=["-O3"], how="failed",
                                                          error="killed\nfix: more memory")]))
    session.workers = {"gw0": {"rows": [r.to_json() for r in failed.local_rows()]},
                       "gw1": {"rows": [GraphOutcome(KEY, "decode", compiles=1).to_json()]}}
    (row,) = session.merged()["rows"]
    assert (GraphOutcome.from_json(row).status, row["error"], row["serve_hits"]) == ("compiled", "killed", 0)


def test_a_failed_parallel_compile_lists_the_first_line_that_says_something(session: NeuronSession) -> None:
    """An error starting with a blank line (a compiler's output) was listed as failed with an empty error."""
    from neuron_args.deferred import CompileReport

    session.add_compile_report(CompileReport([GraphOutcome(KEY, "decode", how="failed", error="\n  killed  \nfix: x"),
                                              GraphOutcome("ef" * 16, "decode", how="failed", error=None)]))
    assert [(g.key, g.failures, g.error) for g in session.parallel_compiled.values()] == [
        (KEY, 1, "killed"), ("ef" * 16, 1, "failed")]


def test_the_json_form_holds_plain_str_that_xdist_can_send() -> None:
    from execnet.gateway_base import dumps

    from neuron_args.target import parse_target

    outcome = GraphOutcome(key="k" * 32, graph_type="decode", target=parse_target("trn2", "a test"))
    data = outcome.to_json()
    assert type(data["target"]) is str and data["target"] == "trn2"
    dumps(data)  # execnet refuses a str subclass: the xdist controller would get no worker output
