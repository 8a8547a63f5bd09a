"""The torchax environments our lowerings are installed in (one per process, in practice).

A leaf module: the registry (:mod:`~neuron_args.lowering.ops`) adds each environment it installs
into, and a lowering that lowers another op the graph's way (:func:`~neuron_args.lowering.gradients.lowered_op`)
takes the newest, without importing the registry that imports it.
"""
from __future__ import annotations

from typing import Any

INSTALLED: list[Any] = []


def current() -> Any:
    """The environment installed last."""
    return INSTALLED[-1]
