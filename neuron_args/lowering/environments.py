"""The torchax environments our lowerings are installed in: a leaf, so a lowering can reach the current one
(the last installed) without importing the registry (:mod:`~neuron_args.lowering.ops`) that imports it."""
from __future__ import annotations

from typing import Any

INSTALLED: list[Any] = []
