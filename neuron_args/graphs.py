"""How a model declares the graphs it runs (read by the runner and the pytest plugin)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_args.errors import NeuronArgsError
from neuron_args.text import clip

DECLARE_HINT = ("define neuron_graphs(self) returning a list of "
                "neuron_args.graphs.GraphSpec(graph_type, entry_module, {bucket_name: lambda: {kwarg: tensor, ...}})")


@dataclass(frozen=True)
class GraphSpec:
    """One graph type: the ``nn.Module`` torch.compile wraps (graph types may share one) and, per bucket (a static
    shape: its own graph and cache entry), a zero-argument callable returning one call's keyword arguments."""

    graph_type: str
    entry: torch.nn.Module
    buckets: Mapping[str, Callable[[], Mapping[str, Any]]] = field(default_factory=dict)


def declared_graphs(model: Any) -> list[GraphSpec]:
    """``model.neuron_graphs()``, checked: a model that declares nothing usable says what to return."""
    name = type(model).__name__
    method = getattr(model, "neuron_graphs", None)
    if not callable(method):
        raise NeuronArgsError(f"{name} has no neuron_graphs() method, so there are no graphs to warm up: {DECLARE_HINT}")
    specs = method()
    if isinstance(specs, GraphSpec):
        specs = [specs]
    if not isinstance(specs, (list, tuple)) or not specs:
        raise NeuronArgsError(f"{name}.neuron_graphs() returned {specs!r}: {DECLARE_HINT}")
    for spec in specs:
        if not isinstance(spec, GraphSpec):
            raise NeuronArgsError(f"{name}.neuron_graphs() returned a {type(spec).__name__} ({spec!r}) among its "
                                  f"graphs: {DECLARE_HINT}")
        if not isinstance(spec.entry, torch.nn.Module):
            raise NeuronArgsError(f"{name}.neuron_graphs(): graph type {spec.graph_type!r} has entry "
                                  f"{type(spec.entry).__name__}, not an nn.Module: give the submodule whose forward "
                                  "runs this graph")
        if not isinstance(spec.buckets, Mapping) or not spec.buckets or not all(callable(m) for m in spec.buckets.values()):
            raise NeuronArgsError(f"{name}.neuron_graphs(): graph type {spec.graph_type!r} needs buckets: a dict of "
                                  "bucket name -> zero-argument callable returning the call's keyword arguments, "
                                  "e.g. {'b1': lambda: {'x': torch.ones(1, 8)}}")
    return list(specs)


def bucket_kwargs(graph_type: str, bucket: str, value: Any) -> dict[str, Any]:
    """A bucket factory's result, checked: a dict of keyword arguments for the entry's forward."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise NeuronArgsError(
            f"graph type {graph_type!r}, bucket {bucket!r}: the bucket factory returned {type(value).__name__} "
            f"({clip(repr(value), 80)}); it must return a dict of keyword arguments for the entry module's forward, "
            "e.g. lambda: {'x': torch.ones(1, 8)} (wrap a positional tensor as {'x': t})")
    return dict(value)


__all__ = ["GraphSpec", "bucket_kwargs", "declared_graphs"]
