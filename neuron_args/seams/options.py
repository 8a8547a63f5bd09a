"""A seam's error, handed to Dynamo as a graph that raises it, so the user sees the
:class:`NeuronArgsError` itself rather than Dynamo's ``BackendCompilerFailed`` wrapper.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_args.errors import NeuronArgsError


def deferred_raise(error: NeuronArgsError) -> Callable[..., Any]:
    """A compiled graph that raises ``error`` when called, so it reaches the caller as itself."""

    def raise_error(*args: Any) -> Any:
        raise error.with_traceback(None)

    return raise_error
