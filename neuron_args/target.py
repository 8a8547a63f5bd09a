"""The compile target, checked once where it enters (:func:`parse_target`, one message naming the source)."""
from __future__ import annotations

from neuron_args import envs
from neuron_args.errors import CompilerArgsError

KNOWN_TARGETS: tuple[str, ...] = ("inf2", "trn1", "trn1n", "trn2", "trn3")
TARGET_ENV = "NEURON_ARGS_TARGET"


class Target(str):
    """A known neuronx-cc target (a ``str``: keys, JSON and messages hold it as the plain name)."""

    __slots__ = ()


#: the environment table's default for ``$NEURON_ARGS_TARGET`` is the default everywhere
DEFAULT_TARGET = Target(envs.variable(TARGET_ENV).default)


def target_problem(value: object, source: str) -> str | None:
    """The one text for a value that is no known target (``None`` for a known one)."""
    if isinstance(value, str) and value in KNOWN_TARGETS:
        return None
    return f"unknown compile target {value!r} (from {source}); the known targets are {', '.join(KNOWN_TARGETS)}"


def parse_target(value: object, source: str) -> Target:
    """``value`` as a :class:`Target` (itself when it is one); :class:`CompilerArgsError` naming ``source``."""
    if isinstance(value, Target):
        return value
    problem = target_problem(value, source)
    if problem is not None:
        raise CompilerArgsError(problem)
    return Target(value)


def env_target() -> Target | None:
    """``$NEURON_ARGS_TARGET``, read as the compile asks (a later call sees a later value); ``None`` when unset."""
    value = envs.text(TARGET_ENV)
    return parse_target(value, f"${TARGET_ENV}") if value else None


def given_or_default(value: object, source: str) -> Target:
    """``value`` parsed (naming ``source``) when given; else ``$NEURON_ARGS_TARGET``, else :data:`DEFAULT_TARGET`."""
    return parse_target(value, source) if value is not None else env_target() or DEFAULT_TARGET


__all__ = ["DEFAULT_TARGET", "KNOWN_TARGETS", "TARGET_ENV", "Target", "env_target", "given_or_default",
           "parse_target", "target_problem"]
