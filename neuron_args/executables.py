"""Load a cache entry's executable, once per process, with the loader its recorded format names.

A NEFF with no runtime binding is an error naming what to install, unless eager outputs are allowed
(``allow_eager_outputs``, ``--neuron-allow-eager-outputs``, ``NEURON_ARGS_ALLOW_EAGER_OUTPUTS=1``): the graph is still
compiled, cached and recorded, its outputs come from eager PyTorch, and :func:`eager_output_graphs` lists it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.cache import CacheEntry
from neuron_args.entry_metadata import corrupt
from neuron_args.compilers.local import FORMAT as XLA_CPU_FORMAT
from neuron_args.compilers.neuronx_cc import FORMAT as NEFF_FORMAT
from neuron_args.tensors import TensorSpec
from neuron_args.text import graph_label

log = logging.getLogger("neuron_args.executables")

FORMATS = (XLA_CPU_FORMAT, NEFF_FORMAT)
ALLOW_EAGER_ENV = "NEURON_ARGS_ALLOW_EAGER_OUTPUTS"

_loaded = ACTIVITY.loaded
_eager = ACTIVITY.eager_outputs


def allow_eager_outputs(value: bool | None = None) -> bool:
    """``value`` (``options["allow_eager_outputs"]``) when given, else ``$NEURON_ARGS_ALLOW_EAGER_OUTPUTS``."""
    return bool(value) if value is not None else envs.flag(ALLOW_EAGER_ENV)


def load_executable(entry: CacheEntry, *, graph_type: str | None, allow_eager: bool) -> Callable[..., Any] | None:
    """The executable of a complete entry, loaded once per process; None: run the graph eagerly."""
    exe = _loaded.get(entry.key)
    if exe is not None:
        return exe
    if entry.key in _eager:
        return None
    md = entry.info()
    fmt = md.executable_format
    if fmt not in FORMATS:  # a damaged metadata.json, or another neuron-args's: the seam moves it aside, rebuilds
        raise corrupt(entry.key, graph_type,
                      f"metadata.json records executable format {fmt!r}; this neuron-args runs {', '.join(FORMATS)}")
    if md.input_specs is None or md.output_specs is None:  # an older or another neuron-args's: rebuilt
        raise corrupt(entry.key, md.graph_type, "metadata.json records no valid input_specs/output_specs")
    inputs, outputs = [TensorSpec(*s) for s in md.input_specs], [TensorSpec(*s) for s in md.output_specs]
    if fmt == XLA_CPU_FORMAT:
        from neuron_args.runtime import LoadedExecutable

        exe = LoadedExecutable.from_bytes(entry.executable_bytes(graph_type), inputs, outputs)
    else:
        exe = _load_neff(entry, inputs, outputs, graph_type=graph_type, allow_eager=allow_eager)
        if exe is None:
            return None
    _loaded[entry.key] = exe
    return exe


def _load_neff(entry: CacheEntry, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
               graph_type: str | None, allow_eager: bool) -> Callable[..., Any] | None:
    from neuron_args.neuron_runtime import INSTALL_HINT, NeffExecutable, RuntimeBindingError, load_binding

    try:
        binding = load_binding()
    except RuntimeBindingError as exc:
        if not allow_eager:
            raise RuntimeBindingError(
                f"{graph_label(graph_type)} (key {entry.key}) compiled to a NEFF, and this process has no Neuron "
                f"runtime binding to execute it: {exc}.\n  fix: {INSTALL_HINT}; or, to check compiler "
                f"arguments, cache and manifest with outputs from eager PyTorch, pass --neuron-allow-eager-outputs "
                f"(NeuronRunner(allow_eager_outputs=True), {ALLOW_EAGER_ENV}=1)") from exc
        if not _eager:
            log.warning(
                "NEFFs are compiled, keyed, cached and recorded, but this process has no Neuron runtime binding "
                "(%s): graph outputs come from eager PyTorch, as allowed by allow_eager_outputs", exc)
        _eager[entry.key] = graph_type
        return None
    return NeffExecutable.load(entry.executable_bytes(graph_type), inputs, outputs, binding=binding,
                               path=entry.executable_path)


def eager_output_graphs() -> dict[str, str | None]:
    """NEFFs of this process whose outputs came from eager PyTorch (key -> graph type)."""
    return dict(_eager)


def eager_outputs_notice(eager: Mapping[str, str | None]) -> str | None:
    """The line a session summary opens with when NEFF outputs came from eager PyTorch (None: they did not); ``eager``
    is :func:`eager_output_graphs` merged across processes (xdist workers) by the caller."""
    if not eager:
        return None
    types = sorted({str(g) for g in eager.values() if g is not None})
    named = f" (graph types {', '.join(types)})" if types else ""
    return (f"NEFF OUTPUTS NOT EXECUTED: {len(eager)} graph{'s' * (len(eager) != 1)}{named} compiled to NEFFs but "
            "their outputs came from eager PyTorch (no torch-neuronx runtime binding; allowed by "
            "--neuron-allow-eager-outputs)")


__all__ = ["ALLOW_EAGER_ENV", "FORMATS", "NEFF_FORMAT", "XLA_CPU_FORMAT", "allow_eager_outputs",
           "eager_output_graphs", "eager_outputs_notice", "load_executable"]
