"""A seam's error, handed to Dynamo as a graph that raises it.

A malformed option (see :class:`neuron_args.settings.CompileSettings`) or any other
:class:`NeuronArgsError` must reach the user as itself, not as torch's ``BackendCompilerFailed``.
Dynamo wraps whatever a backend raises while it compiles, so the seams catch it and hand Dynamo a
graph that raises it when called: the user's call raises the error itself (see :func:`deferred_raise`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_args.errors import NeuronArgsError


def deferred_raise(error: NeuronArgsError) -> Callable[..., Any]:
    """A compiled graph that raises ``error`` when called, so it reaches the caller as itself."""

    def raise_error(*args: Any) -> Any:
        raise error.with_traceback(None)

    raise_error._neuron_args_error = error  # type: ignore[attr-defined]
    return raise_error
