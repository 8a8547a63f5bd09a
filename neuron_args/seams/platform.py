"""From the compile settings (torch.compile options, typed) to the concrete compile request of one graph.

The order is the design's: the scope first (``apply_scoped_compiler_args``), then the platform
arguments (the target), then the key. ``--target``/``--framework`` are set by the compiler
driver, so they live in ``target`` and never twice in the argument list.
"""
from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neuron_args import envs
from neuron_args.errors import CompilerArgsError
from neuron_args.flags import CompilerArgs, manifest_compiler_flags, warn_repeated_options
from neuron_args.scope import current_compiler_args
from neuron_args.settings import CompileSettings
from neuron_args.target import DEFAULT_TARGET, TARGET_ENV, Target, env_target
from neuron_args.text import graph_label

NEURON_CC_FLAGS_ENV = "NEURON_CC_FLAGS"


@dataclass(frozen=True)
class PlatformArgs:
    """The resolved arguments of one graph: what the compiler gets besides its fixed argv part."""

    compiler_args: CompilerArgs  # validated, without --target/--framework (the driver's)
    target: Target

    def compiler_flags(self) -> str:
        """The manifest form: every flag the compiler sees, machine-specific paths removed."""
        return manifest_compiler_flags(["--framework", "XLA", "--target", self.target, *self.compiler_args])


def base_compiler_args(given: str | Sequence[str] | None, *, graph_type: str | None = None,
                       source: str | None = None) -> CompilerArgs:
    """``given`` (``options["compiler_args"]``), else ``$NEURON_CC_FLAGS`` (split shell-style), else none.

    An option given twice with different values is a warning naming where the list came from
    (``source``: the caller's name for ``given``, when it has one)."""
    args = CompilerArgs.of(given) if given is not None else _env_compiler_args(envs.text(NEURON_CC_FLAGS_ENV) or None)
    named = source if source is not None and given is not None else _args_source(given)
    warn_repeated_options(args, source=named, graph_type=graph_type)
    return args


@functools.lru_cache(maxsize=8)
def _env_compiler_args(text: str | None) -> CompilerArgs:
    """``$NEURON_CC_FLAGS`` as a value, split (and, on first use, validated) once per distinct value."""
    try:
        return CompilerArgs(text)
    except CompilerArgsError as exc:  # an unclosed quote: say where the string came from
        raise CompilerArgsError(f"{exc} (these arguments come from ${NEURON_CC_FLAGS_ENV})") from None


def _args_source(given: Sequence[str] | None) -> str:
    if given is None:
        return f"${NEURON_CC_FLAGS_ENV}"
    scoped = current_compiler_args()
    if scoped is not None and tuple(scoped) == tuple(given):
        return "scoped_compiler_args(...)"
    return "options['compiler_args']"


def apply_platform_compiler_args(settings: CompileSettings, *, graph_type: str | None = None) -> PlatformArgs:
    """Resolve the target (options, else ``--target`` in the arguments, else the environment, else the default)
    and strip the options the driver sets itself. Each target was checked where it entered."""
    given = settings.compiler_args
    # validated once per value (a --target in it too); here the error can say where the list came from
    args = base_compiler_args(given, graph_type=graph_type).checked(graph_type=graph_type, source=_args_source(given))
    in_args = args.value("--target")
    if in_args is not None and settings.target is not None and in_args != settings.target:
        raise CompilerArgsError(
            f"{graph_label(graph_type)}: {_args_source(given)} say --target {in_args} but options['target'] "
            f"is {settings.target!r}. Fix: set the target in one place: drop --target from {_args_source(given)}, or "
            f"make options['target'] (or ${TARGET_ENV}) {in_args!r} too (pytest: --neuron-target={in_args})."
        )
    target = settings.target or (Target(in_args) if in_args is not None else None) or env_target() or DEFAULT_TARGET
    return PlatformArgs(args.without(["--target", "--framework"]), target)


def resolve_request(settings: CompileSettings, graph_type: str | None) -> PlatformArgs:
    """The seam's access point: scope (its arguments replace the base ones), then platform arguments."""
    scoped = current_compiler_args()
    if scoped is not None:
        settings = settings.with_compiler_args(scoped)
    return apply_platform_compiler_args(settings, graph_type=graph_type)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=None)
def lowering_tool_versions() -> tuple[tuple[str, str], ...]:
    """Versions of everything that shapes the HLO (read from package metadata: no import)."""
    return tuple((d, _version(d)) for d in ("torch", "torchax", "jax", "jaxlib", "neuron-args")) + (("jax_x64", "off"),)


def tool_versions(compiler_info: Any) -> dict[str, str]:
    return {**dict(lowering_tool_versions()), "compiler": f"{compiler_info.name} {compiler_info.version}"}


def input_spec_pairs(specs: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(s.shape), s.dtype) for s in specs]
