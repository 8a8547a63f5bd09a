"""The per-graph compiler-argument scope (libtorch-neuronx-lite's ``compile/compiler_args.py`` in the design).

The runner opens it around the call that compiles a graph; every seam reads it (:func:`resolve_request`) before
the cache key. ``graph_type`` is a label for errors, metadata and the manifest, never part of the key.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from neuron_args.flags import CompilerArgs
from neuron_args.settings import CompileSettings, PlatformArgs, apply_platform_compiler_args

_scoped_compiler_args: contextvars.ContextVar[CompilerArgs | None] = contextvars.ContextVar(
    "neuron_args_scoped_compiler_args", default=None
)
_scoped_graph_type: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "neuron_args_scoped_graph_type", default=None
)


def _checked(compiler_args: Sequence[str] | None) -> CompilerArgs | None:
    if compiler_args is None:
        return None
    try:
        if isinstance(compiler_args, (str, bytes)):  # a scope holds the resolved list, not a string to split
            raise TypeError(f"got {type(compiler_args).__name__} {compiler_args!r}")
        return CompilerArgs.of(compiler_args)
    except TypeError as exc:
        raise TypeError(f"scoped_compiler_args expects None or a sequence of str (e.g. ['-O3']): {exc}") from None


@contextlib.contextmanager
def scoped_compiler_args(
    compiler_args: Sequence[str] | None, *, graph_type: str | None = None
) -> Iterator[None]:
    """Set the concrete args for the graph compiled in this scope (``None`` = no override)."""
    token = _scoped_compiler_args.set(_checked(compiler_args))
    label_token = _scoped_graph_type.set(graph_type)
    try:
        yield
    finally:
        _scoped_graph_type.reset(label_token)
        _scoped_compiler_args.reset(token)


def current_compiler_args() -> CompilerArgs | None:
    """The scoped argument list, or ``None`` outside any scope (or inside a ``None`` scope)."""
    return _scoped_compiler_args.get()


def current_graph_type() -> str | None:
    """The graph-type label of the innermost scope, if the runner gave one."""
    return _scoped_graph_type.get()


def apply_scoped_compiler_args(options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``options`` with the scoped ``compiler_args`` applied (a new dict inside a scope; never mutated)."""
    options = options if options is not None else {}
    scoped = _scoped_compiler_args.get()
    return options if scoped is None else {**options, "compiler_args": list(scoped)}


def resolve_request(settings: CompileSettings, graph_type: str | None) -> PlatformArgs:
    """The seam's access point: the scope (its arguments replace the base ones), then the platform arguments."""
    scoped = current_compiler_args()
    if scoped is None:
        return apply_platform_compiler_args(settings, graph_type=graph_type)
    return apply_platform_compiler_args(dataclasses.replace(settings, compiler_args=scoped), graph_type=graph_type,
                                        source="scoped_compiler_args(...)")
