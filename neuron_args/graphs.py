"""How a model declares the graphs it runs (read by the runner and the pytest plugin)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class GraphSpec:
    """One graph type: the module it runs through and the example inputs of each bucket.

    ``entry`` is the ``nn.Module`` torch.compile wraps (one compile per entry per backend; several
    graph types may share an entry). ``buckets`` maps a bucket name (e.g. ``"s16"``) to a
    zero-argument callable returning the keyword arguments of one call; each bucket is a static
    shape and so its own graph and cache entry.
    """

    graph_type: str
    entry: torch.nn.Module
    buckets: Mapping[str, Callable[[], Mapping[str, Any]]] = field(default_factory=dict)
