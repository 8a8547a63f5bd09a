"""Per-graph compiler arguments from the runner to the seams: :class:`CompilerArgsResolver` runs the model's
``compiler_args_for`` policy eagerly, :func:`scoped_compiler_args` carries the list, every seam reads it
(:func:`resolve_request`) before the key; ``graph_type`` labels errors and records, never the key."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from neuron_args.errors import CompilerArgsError, PolicyError
from neuron_args.flags import CompilerArgs, warn_repeated_options
from neuron_args.settings import CompileSettings, PlatformArgs, apply_platform_compiler_args

#: The innermost scope: ``(compiler args or None, graph-type label or None)``, set and read as one pair.
_SCOPE: contextvars.ContextVar[tuple[CompilerArgs | None, str | None]] = contextvars.ContextVar(
    "neuron_args_scope", default=(None, None))


@contextlib.contextmanager
def scoped_compiler_args(
    compiler_args: Sequence[str] | None, *, graph_type: str | None = None
) -> Iterator[None]:
    """Set the concrete args for the graph compiled in this scope (``None`` = no override)."""
    try:
        if isinstance(compiler_args, (str, bytes)):  # a scope holds the resolved list, not a string to split
            raise TypeError(f"got {type(compiler_args).__name__} {compiler_args!r}")
        scoped = None if compiler_args is None else CompilerArgs.of(compiler_args)
    except TypeError as exc:
        raise TypeError(f"scoped_compiler_args expects None or a sequence of str (e.g. ['-O3']): {exc}") from None
    token = _SCOPE.set((scoped, graph_type))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_compiler_args() -> CompilerArgs | None:
    """The scoped argument list, or ``None`` outside any scope (or inside a ``None`` scope)."""
    return _SCOPE.get()[0]


def current_graph_type() -> str | None:
    """The graph-type label of the innermost scope, if the runner gave one."""
    return _SCOPE.get()[1]


def apply_scoped_compiler_args(options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``options`` with the scoped ``compiler_args`` applied (a new dict inside a scope; never mutated)."""
    options = options if options is not None else {}
    scoped = _SCOPE.get()[0]
    return options if scoped is None else {**options, "compiler_args": list(scoped)}


def resolve_request(settings: CompileSettings, graph_type: str | None) -> PlatformArgs:
    """The seam's access point: the scope (its arguments replace the base ones), then the platform arguments."""
    scoped = current_compiler_args()
    if scoped is None:
        return apply_platform_compiler_args(settings, graph_type=graph_type)
    return apply_platform_compiler_args(dataclasses.replace(settings, compiler_args=scoped), graph_type=graph_type,
                                        source="scoped_compiler_args(...)")


Policy = Callable[[str, Any, list[str]], Sequence[str]]

BASE_ARGS_ATTR = "_neuron_base_compiler_args"


class CompilerArgsResolver:
    """Resolve a graph type to its concrete neuronx-cc argument list, or ``None`` (base args apply)."""

    def __init__(
        self,
        base_args: str | Sequence[str] | None,
        policy: Policy | None = None,
        explicit_optimization_level: int | None = None,
        *,
        owner: str | None = None,
    ) -> None:
        base = CompilerArgs.of(base_args)
        if explicit_optimization_level is not None:
            base = base.with_level(explicit_optimization_level)
        self.base_args: CompilerArgs = base
        self.explicit_optimization_level = explicit_optimization_level
        self.per_graph: bool = explicit_optimization_level is None and policy is not None
        self.policy: Policy | None = policy if self.per_graph else None
        self.owner = owner or _owner_name(policy)
        self._resolved: dict[str, CompilerArgs] = {}

    @classmethod
    def from_model(
        cls,
        model: Any,
        base_args: str | Sequence[str] | None,
        explicit_optimization_level: int | None = None,
    ) -> CompilerArgsResolver:
        """Wire a model's ``compiler_args_for`` policy; stamp the base list on the model when enabled."""
        policy = getattr(model, "compiler_args_for", None)
        resolver = cls(
            base_args, policy, explicit_optimization_level, owner=type(model).__name__
        )
        if resolver.per_graph:
            setattr(model, BASE_ARGS_ATTR, list(resolver.base_args))
        return resolver

    def resolve_graph_compiler_args(self, graph_type: str | None) -> list[str] | None:
        """The concrete list for ``graph_type``; ``None`` means "no per-graph override"."""
        args = self.args_for(graph_type)
        return None if args is None else args.argv

    def args_for(self, graph_type: str | None) -> CompilerArgs | None:
        """:meth:`resolve_graph_compiler_args` as the checked value a scope takes without parsing it again."""
        if not self.per_graph or graph_type is None:
            return None
        assert self.policy is not None
        try:
            result = self.policy(graph_type, None, list(self.base_args))
        except Exception as exc:
            raise PolicyError(
                f"{self.owner}.compiler_args_for raised for graph type {graph_type!r}: "
                f"{type(exc).__name__}: {exc}. Fix the policy; it must return a list of str."
            ) from exc
        previous = self._resolved.get(graph_type)
        # the same answer as before is that checked value (validated once per graph type)
        args = previous if previous is not None and previous == result else self._checked(graph_type, result)
        previous = self._resolved.setdefault(graph_type, args)
        if previous != args:
            raise PolicyError(
                f"{self.owner}.compiler_args_for is not deterministic for graph type {graph_type!r}: "
                f"first {previous.argv!r}, now {args.argv!r}. The same graph type must always give the same "
                "arguments, or warmup and serve compile different cache keys."
            )
        return args

    def _checked(self, graph_type: str, result: Any) -> CompilerArgs:
        if isinstance(result, (str, bytes)) or not isinstance(result, (list, tuple)):
            raise PolicyError(
                f"{self.owner}.compiler_args_for({graph_type!r}, ...) returned "
                f"{type(result).__name__} {result!r}; it must return a list of str "
                "(e.g. with_optimization_level(base, 3))."
            )
        try:
            args = CompilerArgs.parse(result, graph_type=graph_type)
        except TypeError as exc:  # an item that is not a str
            raise PolicyError(f"{self.owner}.compiler_args_for({graph_type!r}, ...) returned non-str items: {exc}; "
                              "every argument must be a str.") from None
        except CompilerArgsError as exc:
            raise PolicyError(f"{self.owner}.compiler_args_for: {exc}") from exc
        warn_repeated_options(args, source=f"{self.owner}.compiler_args_for", graph_type=graph_type,
                              hint="to replace a base option, return with_optimization_level(base, N) or "
                                   "remove_options(base, [name]) + [new]")
        return args


def _owner_name(policy: Any) -> str:
    owner = getattr(policy, "__self__", None)
    if owner is not None:
        return type(owner).__name__
    return getattr(policy, "__qualname__", "policy") if policy is not None else "runner"
