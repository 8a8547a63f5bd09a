"""The torch.compile ``options`` of the three seams, checked once per backend call.

A malformed option must reach the user as a :class:`NeuronArgsError` that names the option and
the fix, not as torch's ``BackendCompilerFailed`` nor as a raw ``TypeError``/``FileExistsError``
from deep inside a compile. Dynamo wraps whatever a backend raises while it compiles, so the
seams check here and, on an error, hand Dynamo a graph that raises it when called: the user's
call raises the error itself (see :func:`deferred_raise`).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from neuron_args.activity import ACTIVITY
from neuron_args.compilers.lifetime import resolve_compile_timeout
from neuron_args.errors import CompilerArgsError, NeuronArgsError, OptionsError
from neuron_args.flags import split_compiler_args

log = logging.getLogger("neuron_args.seams")

#: The options the seams read; anything else is reported once (a typo is silently ignored otherwise).
#: ``allow_eager_outputs``: NEFFs without a runtime binding run eagerly (neuron_args.executables);
#: ``runner``: the runner's own id, which keeps its torch.compile options (and so Dynamo frames) apart.
KNOWN_OPTIONS = ("cache_dir", "compiler_args", "target", "compiler", "compile_timeout", "allow_eager_outputs",
                 "runner")


def check_options(options: Mapping[str, Any] | None, seam: str) -> dict[str, Any]:
    """A copy of ``options`` after checking each one; raises a :class:`NeuronArgsError` subclass."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise OptionsError(f"{seam}: options must be a dict, got {type(options).__name__} {options!r}")
    opts = dict(options)
    unknown = sorted(str(k) for k in opts if k not in KNOWN_OPTIONS)
    for name in unknown:
        if ACTIVITY.say_once(f"unknown option {name}"):
            log.warning("%s: unknown option %r is ignored; the options are %s", seam, name, ", ".join(KNOWN_OPTIONS))
    if opts.get("compiler_args") is not None:
        try:
            split_compiler_args(opts["compiler_args"])
        except TypeError as exc:
            raise CompilerArgsError(
                f"{seam}: options['compiler_args'] must be a list of neuronx-cc arguments (or one string "
                f"split shell-style), got {type(opts['compiler_args']).__name__} {opts['compiler_args']!r}: {exc}"
            ) from None
    for name in ("target", "compiler"):
        value = opts.get(name)
        if value is not None and not isinstance(value, str):
            raise OptionsError(f"{seam}: options[{name!r}] must be a string, got {type(value).__name__} {value!r}")
    cache_dir = opts.get("cache_dir")
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise OptionsError(
            f"{seam}: options['cache_dir'] must be a path (str or os.PathLike), got {type(cache_dir).__name__} "
            f"{cache_dir!r}")
    resolve_compile_timeout(opts, "local")  # type and range only; the compiler default comes later
    return opts


def deferred_raise(error: NeuronArgsError) -> Callable[..., Any]:
    """A compiled graph that raises ``error`` when called, so it reaches the caller as itself."""

    def raise_error(*args: Any) -> Any:
        raise error.with_traceback(None)

    raise_error._neuron_args_error = error  # type: ignore[attr-defined]
    return raise_error
