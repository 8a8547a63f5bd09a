"""The ``graph_type`` and ``neuron_hardware`` markers: registration and the checks behind them."""
from __future__ import annotations

import glob
from collections.abc import Iterable
from typing import Any

import pytest

GRAPH_TYPE = "graph_type"
HARDWARE = "neuron_hardware"
ALLOW_BREAKS = "neuron_allow_graph_breaks"
#: What "a Neuron device is visible" means; module-level so the plugin's own tests can point it elsewhere.
DEVICE_GLOB = "/dev/neuron*"
NO_DEVICE_REASON = "needs a Neuron device (no /dev/neuron* visible)"


def register(config: pytest.Config) -> None:
    """Declare the markers, so ``--strict-markers`` accepts them."""
    for line in (f"{GRAPH_TYPE}(*graph_types): the graph types (e.g. 'decode') this test is about; "
                 "neuron_compiler_args resolves them and neuron_served / neuron_manifest warm up only them. "
                 "A type the neuron_model does not declare fails the test at setup.",
                 f"{HARDWARE}: needs a Neuron device; skipped where no {DEVICE_GLOB} is visible.",
                 f"{ALLOW_BREAKS}: this test's runner lets Dynamo split a graph type into several graphs "
                 "(by default a graph break fails the warmup, naming Dynamo's reason and the line)."):
        config.addinivalue_line("markers", line)


def skip_without_device(items: Iterable[pytest.Item]) -> None:
    """Mark ``neuron_hardware`` tests skipped (reported at the test's own line) when no device is visible."""
    marked = [item for item in items if item.get_closest_marker(HARDWARE) is not None]
    if marked and not glob.glob(DEVICE_GLOB):
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=NO_DEVICE_REASON))


def marked_graph_types(node: pytest.Item) -> list[str]:
    """The graph types of every ``graph_type`` marker on ``node``, closest first, each once."""
    found: list[str] = []
    for marker in node.iter_markers(GRAPH_TYPE):
        if not marker.args:
            pytest.fail(f"{node.nodeid}: @pytest.mark.{GRAPH_TYPE}() needs at least one graph type, "
                        f"e.g. @pytest.mark.{GRAPH_TYPE}('decode')", pytrace=False)
        for name in marker.args:
            if not isinstance(name, str):
                pytest.fail(f"{node.nodeid}: @pytest.mark.{GRAPH_TYPE}({name!r}): a graph type is a str "
                            f"such as 'decode', got {type(name).__name__}", pytrace=False)
            if name not in found:
                found.append(name)
    return found


def check_graph_types(nodeid: str, model: Any, marked: Iterable[str]) -> None:
    """Fail (at setup) when a marked graph type is not one the model declares, naming those it does; the model's
    ``neuron_graphs()`` is checked as the runner checks it."""
    from neuron_args.errors import NeuronArgsError
    from neuron_args.graphs import declared_graphs  # imports torch: not at plugin load

    try:
        declared = [g.graph_type for g in declared_graphs(model)]
    except NeuronArgsError as exc:
        pytest.fail(f"neuron_model ({type(model).__name__}): {exc}", pytrace=False)
    unknown = [g for g in marked if g not in declared]
    if unknown:
        pytest.fail(
            f"{nodeid}: @pytest.mark.{GRAPH_TYPE}({', '.join(map(repr, unknown))}): "
            f"{type(model).__name__} does not declare graph type{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; declared graph types: {', '.join(map(repr, declared)) or '(none)'}",
            pytrace=False,
        )


__all__ = ["ALLOW_BREAKS", "GRAPH_TYPE", "HARDWARE", "NO_DEVICE_REASON", "check_graph_types",
           "marked_graph_types", "register", "skip_without_device"]
