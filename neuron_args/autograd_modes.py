"""The autograd mode a graph is traced in, as a key names it: ``grad``, ``no_grad`` or ``inference_mode``
(aot_autograd traces another graph for each, so the key carries it: ``cache_key.AUTOGRAD_MODES``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from neuron_args.cache_key import AUTOGRAD_MODES


def current_autograd_mode() -> str:
    """This thread's autograd mode: ``inference_mode`` over ``no_grad`` over ``grad``."""
    if torch.is_inference_mode_enabled():
        return "inference_mode"
    return "grad" if torch.is_grad_enabled() else "no_grad"


@contextlib.contextmanager
def autograd_mode(mode: str) -> Iterator[None]:
    """Run the block in ``mode`` (one of :data:`~neuron_args.cache_key.AUTOGRAD_MODES`)."""
    if mode not in AUTOGRAD_MODES:
        raise ValueError(f"autograd mode {mode!r} is not one of {', '.join(AUTOGRAD_MODES)}")
    with torch.inference_mode(mode == "inference_mode"), torch.set_grad_enabled(mode == "grad"):
        yield
