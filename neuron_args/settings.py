"""torch.compile's ``options`` dict typed and checked once where it enters (:meth:`CompileSettings.from_options`),
so no other module knows the keys; unset ones fall back to the environment, then the default."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.errors import CompilerArgsError, OptionsError
from neuron_args.flags import CompilerArgs, manifest_compiler_flags, warn_repeated_options
from neuron_args.target import DEFAULT_TARGET, TARGET_ENV, Target, env_target, parse_target
from neuron_args.text import graph_label

log = logging.getLogger("neuron_args.seams")

NEURON_CC_FLAGS_ENV = "NEURON_CC_FLAGS"
COMPILE_TIMEOUT_ENV = "NEURON_ARGS_COMPILE_TIMEOUT"
#: Default compile timeout in seconds per compiler name: neuronx-cc builds of large graphs at -O3
#: take tens of minutes; the embedded XLA:CPU compiler takes seconds.
DEFAULT_TIMEOUTS = {"neuronx-cc": 7200.0, "local": 1800.0}
_TIMEOUT_FIX = " of seconds (e.g. 3600); the defaults are " + ", ".join(
    f"{k} {v:g} s" for k, v in DEFAULT_TIMEOUTS.items())


def check_timeout(value: Any, source: str) -> float:
    """``value`` as positive finite seconds; :class:`OptionsError` naming ``source`` otherwise."""
    return envs.checked_seconds(value, source, what="a compile timeout", fix=_TIMEOUT_FIX)


def resolve_compile_timeout(given: Any, compiler_name: str) -> float:
    """``given`` (``options["compile_timeout"]``), else ``$NEURON_ARGS_COMPILE_TIMEOUT``, else the compiler default."""
    if given is not None:
        return check_timeout(given, "options['compile_timeout']")
    env = envs.text(COMPILE_TIMEOUT_ENV)
    if env:
        return check_timeout(env, COMPILE_TIMEOUT_ENV)
    return DEFAULT_TIMEOUTS.get(compiler_name, max(DEFAULT_TIMEOUTS.values()))


def base_compiler_args(given: str | Sequence[str] | None, *, graph_type: str | None = None,
                       source: str | None = None) -> CompilerArgs:
    """``given``, else ``$NEURON_CC_FLAGS``, else none: validated; errors and warnings name ``source``."""
    source = _args_source(given, source)
    try:  # an unclosed quote in $NEURON_CC_FLAGS too: say where the string came from
        args = _env_compiler_args(envs.text(NEURON_CC_FLAGS_ENV) or None) if given is None else CompilerArgs.of(given)
        warn_repeated_options(args, source=source, graph_type=graph_type)
        return args.checked(graph_type=graph_type)  # a checked value returns at once
    except CompilerArgsError as exc:
        raise CompilerArgsError(f"{exc} (these arguments come from {source})") from None


def _args_source(given: object, source: str | None) -> str:
    """What messages call a base list: ``source`` (else ``options['compiler_args']``), or the variable it came from."""
    return f"${NEURON_CC_FLAGS_ENV}" if given is None else source or "options['compiler_args']"


#: ``$NEURON_CC_FLAGS`` as a value, split (and, on first use, validated) once per distinct value.
_env_compiler_args = functools.lru_cache(maxsize=8)(CompilerArgs)


@dataclass(frozen=True)
class CompileSettings:
    """What the torch.compile options ask for; ``None`` leaves the choice to the environment or default."""

    cache_dir: str | os.PathLike[str] | None = None
    compiler: str | None = None
    #: a known target, checked where it entered (``None``: ``--target`` in the arguments, the environment, default)
    target: Target | None = None
    #: the base compiler arguments, split shell-style (``None``: ``$NEURON_CC_FLAGS``)
    compiler_args: CompilerArgs | None = None
    #: seconds, checked positive (``None``: ``$NEURON_ARGS_COMPILE_TIMEOUT`` or the compiler default)
    compile_timeout: float | None = None
    #: NEFFs without a runtime binding run eagerly (neuron_args.executables)
    allow_eager_outputs: bool | None = None
    #: the runner's own id, which keeps its torch.compile options (and so Dynamo frames) apart
    runner: str | None = None

    def __post_init__(self) -> None:  # a tuple, list or str given to the constructor becomes the value type here
        if self.compiler_args is not None and not isinstance(self.compiler_args, CompilerArgs):
            object.__setattr__(self, "compiler_args", CompilerArgs(self.compiler_args))
        if self.target is not None:
            object.__setattr__(self, "target", parse_target(self.target, "CompileSettings(target=...)"))

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | CompileSettings | None, seam: str) -> CompileSettings:
        """The settings of ``options`` after checking each one; raises a :class:`NeuronArgsError` subclass."""
        if isinstance(options, CompileSettings):
            return options
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise OptionsError(f"{seam}: options must be a dict, got {type(options).__name__} {options!r}")
        for name in sorted(str(k) for k in options if k not in KNOWN_OPTIONS):
            if ACTIVITY.say_once(f"unknown option {name}"):
                log.warning("%s: unknown option %r is ignored; the options are %s", seam, name,
                            ", ".join(KNOWN_OPTIONS))
        args = options.get("compiler_args")
        if args is not None:
            try:
                args = CompilerArgs.of(args)
            except TypeError as exc:
                raise CompilerArgsError(
                    f"{seam}: options['compiler_args'] must be a list of neuronx-cc arguments (or one string "
                    f"split shell-style), got {type(args).__name__} {args!r}: {exc}"
                ) from None
        for name, kinds, what in _TYPED_OPTIONS:
            value = options.get(name)
            if value is not None and not isinstance(value, kinds):
                raise OptionsError(f"{seam}: options[{name!r}] must be {what}, got {type(value).__name__} {value!r}")
        target, timeout, eager = (options.get(name) for name in ("target", "compile_timeout", "allow_eager_outputs"))
        return cls(cache_dir=options.get("cache_dir"), compiler=options.get("compiler"),
                   target=None if target is None else parse_target(target, "options['target']"), compiler_args=args,
                   compile_timeout=None if timeout is None else check_timeout(timeout, "options['compile_timeout']"),
                   allow_eager_outputs=None if eager is None else bool(eager), runner=options.get("runner"))

    def as_options(self) -> dict[str, Any]:
        """The torch.compile options these settings came from (the given ones, lists as lists)."""
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


#: The options whose type ``from_options`` checks before it reads them: (name, types, what the message asks for).
_TYPED_OPTIONS = (("target", str, "a string"), ("compiler", str, "a string"),
                  ("cache_dir", (str, os.PathLike), "a path (str or os.PathLike)"))
#: The options the seams read (the fields above); anything else is reported once (a typo is ignored otherwise).
KNOWN_OPTIONS = tuple(f.name for f in dataclasses.fields(CompileSettings))


@dataclass(frozen=True)
class PlatformArgs:
    """The resolved arguments of one graph: what the compiler gets besides its fixed argv part."""

    compiler_args: CompilerArgs  # validated, without --target/--framework (the driver's)
    target: Target

    def compiler_flags(self) -> str:
        """The manifest form: every flag the compiler sees, machine-specific paths removed."""
        return manifest_compiler_flags(["--framework", "XLA", "--target", self.target, *self.compiler_args])


def apply_platform_compiler_args(settings: CompileSettings, *, graph_type: str | None = None,
                                 source: str | None = None) -> PlatformArgs:
    """Resolve the target (options, else ``--target`` in the arguments, else the environment, else the default)
    and strip the options the driver sets itself. Each target was checked where it entered; ``source`` names
    ``settings.compiler_args`` in errors (see :func:`base_compiler_args`)."""
    args = base_compiler_args(settings.compiler_args, graph_type=graph_type, source=source)  # a --target in it too
    in_args = args.value("--target")
    if in_args is not None and settings.target is not None and in_args != settings.target:
        named = _args_source(settings.compiler_args, source)
        raise CompilerArgsError(
            f"{graph_label(graph_type)}: {named} say --target {in_args} but options['target'] "
            f"is {settings.target!r}. Fix: set the target in one place: drop --target from {named}, or "
            f"make options['target'] (or ${TARGET_ENV}) {in_args!r} too (pytest: --neuron-target={in_args})."
        )
    target = settings.target or (Target(in_args) if in_args is not None else None) or env_target() or DEFAULT_TARGET
    return PlatformArgs(args.without(["--target", "--framework"]), target)
