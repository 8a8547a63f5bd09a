"""Dynamo's recompile limit, never silent for a neuron backend, and raised in a runner's calls.

Past its limit Dynamo runs a frame in eager PyTorch (on a Neuron host: the host CPU, while tests pass); for a
neuron seam's frame :func:`install` records it and raises or warns (:func:`mode`).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.errors import NeuronArgsError, OptionsError
from neuron_args.scope import current_graph_type

log = logging.getLogger("neuron_args.eager_fallback")

MODE_ENV = "NEURON_ARGS_EAGER_FALLBACK"
MODES = ("error", "warn")

# Every bucket is a static graph (one recompile per shape): Dynamo's limits (8 per code object, 256 per process)
# would fall back to eager in a session serving many buckets or models of one class. Raised in a runner's calls
# only (:func:`runner_call`): other torch.compile users of the process keep theirs.
RECOMPILE_LIMIT = 256
ACCUMULATED_RECOMPILE_LIMIT = 1 << 16

_error_by_default = [False]  # the pytest plugin's default
#: True inside :func:`runner_call`
IN_RUNNER_CALL = contextvars.ContextVar("neuron_args_runner_call", default=False)


class EagerFallbackError(NeuronArgsError):
    """Dynamo's recompile limit stopped compiling a frame whose backend is a neuron seam."""


class EagerFallbackWarning(UserWarning):
    """A frame compiled by a neuron backend runs in eager PyTorch from now on (``NEURON_ARGS_EAGER_FALLBACK=warn``)."""


def error_by_default(on: bool = True) -> bool:
    """Make a fallback an error unless the variable says ``warn`` (the pytest plugin does); returns the previous."""
    previous, _error_by_default[0] = _error_by_default[0], on
    return previous


@contextlib.contextmanager
def runner_call() -> Iterator[None]:
    """A ``NeuronRunner`` call: Dynamo's recompile limits raised in this context (its config is context-local; the
    closure patcher costs a few us, ``config.patch`` tens), a fallback an error unless the variable says ``warn``;
    the code Dynamo generates here skips its profiler bookkeeping (~2 us a call the fast path replays)."""
    import torch

    config = torch._dynamo.config
    restore = config._make_closure_patcher(
        recompile_limit=max(config.recompile_limit, RECOMPILE_LIMIT), record_runtime_overhead=False,
        accumulated_recompile_limit=max(config.accumulated_recompile_limit, ACCUMULATED_RECOMPILE_LIMIT))()
    token = IN_RUNNER_CALL.set(True)
    try:
        yield
    finally:
        IN_RUNNER_CALL.reset(token)
        restore()


def mode() -> str:
    """``error`` or ``warn``: ``$NEURON_ARGS_EAGER_FALLBACK`` when set, else ``error`` under the pytest plugin,
    under ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` or in :func:`runner_call`, else ``warn``."""
    from neuron_args.cache import assert_cache_hit_enabled

    given = envs.text(MODE_ENV).lower()
    if given not in ("", *MODES):
        raise OptionsError(f"{MODE_ENV}={given!r} is not one of {', '.join(MODES)}: give error or warn, or unset it")
    return given or ("error" if _error_by_default[0] or IN_RUNNER_CALL.get() or assert_cache_hit_enabled() else "warn")


def message(frame: str, limit_type: str, limit: int, seam: str, graph_type: str | None) -> str:
    where = f"graph type {graph_type!r}" if graph_type else f"torch.compile(backend={seam!r})"
    return (
        f"{where}: Dynamo's {limit_type.replace('_', ' ')} ({limit}) was reached for {frame}, so Dynamo stops "
        f"calling the {seam} backend for it: this call and every later new shape of that frame would run in "
        "eager PyTorch on the host (no compile, no cache entry, no manifest line).\n"
        "  fix: call torch._dynamo.reset() between models; or raise "
        f"torch._dynamo.config.{limit_type} (or torch.compile(..., recompile_limit=N)) to the number of shapes "
        "the frame serves; or bucket the inputs so fewer shapes reach the compiler "
        f"({MODE_ENV}=warn lets it run eager with a warning)")


def _compile_frame(frame: FrameType | None) -> FrameType | None:
    """Dynamo's ``_compile`` frame (the caller of the limit check): it holds ``compiler_fn`` and ``code``."""
    for _ in range(4):
        if frame is None or "compiler_fn" in frame.f_locals:
            return frame
        frame = frame.f_back
    return None


def _on_limit(frame: FrameType | None, limit_type: str, seam_of: Callable[[Any], str | None]) -> None:
    import torch
    from torch._dynamo.eval_frame import innermost_backend

    caller = _compile_frame(frame)
    if caller is None:
        return
    local = caller.f_locals
    fn = innermost_backend(local.get("compiler_fn"))
    seam = seam_of(innermost_backend(getattr(fn, "compiler_fn", fn)))  # torch._TorchCompileWrapper (options=)
    if seam is None:
        return  # another backend's frame: Dynamo's own warning stands
    code = local.get("code")
    where = f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})" if code is not None else "a frame"
    limit = getattr(torch._dynamo.config, limit_type, "?")
    text = message(where, limit_type, limit, seam, current_graph_type())
    # with fullgraph=True (or fail_on_recompile_limit_hit) Dynamo raises anyway: raise the error that says why
    fails = bool(local.get("one_graph")) or torch._dynamo.config.fail_on_recompile_limit_hit
    how = "error" if fails else mode()
    ACTIVITY.eager_fallbacks[f"{where} ({seam}, {limit_type} {limit})"] = how
    if how == "error":
        raise EagerFallbackError(text)
    log.warning("%s", text)
    warnings.warn(text, EagerFallbackWarning, stacklevel=2)


def install(seam_of: Callable[[Any], str | None]) -> None:
    """Wrap Dynamo's limit check once per process; ``seam_of(backend)`` names a neuron seam, else None."""
    import torch._dynamo.convert_frame as convert_frame

    original = convert_frame.exceeds_recompile_limit
    if getattr(original, "_neuron_args", False):
        return

    def exceeds_recompile_limit(*args: Any, **kwargs: Any) -> tuple[bool, str]:
        exceeded, limit_type = original(*args, **kwargs)
        if exceeded:
            _on_limit(sys._getframe(1), limit_type, seam_of)
        return exceeded, limit_type

    exceeds_recompile_limit._neuron_args = True  # type: ignore[attr-defined]
    convert_frame.exceeds_recompile_limit = exceeds_recompile_limit
