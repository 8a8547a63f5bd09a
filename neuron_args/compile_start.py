"""Who wants to know that a graph really starts compiling (a warmup's progress line says "compiling" only then)."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

__all__ = ["compile_starting", "on_compile_start"]

Listener = Callable[[str | None, str], None]
_listener: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("neuron_args_compile_start", default=None)


def compile_starting(graph_type: str | None, key: str) -> None:
    """A compiler is about to build ``key`` in this context (called by the one place that starts compilers)."""
    listener = _listener.get()
    if listener is not None:
        listener(graph_type, key)


@contextlib.contextmanager
def on_compile_start(listener: Listener) -> Iterator[None]:
    """Call ``listener(graph_type, key)`` for each compile this context starts inside the block."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)
