"""Trace jobs: ``(model, kwargs, compiler_args)``, resolved before the fork (the design's ``_build_trace_job``)."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from neuron_args import envs
from neuron_args.cache_key import AUTOGRAD_MODES


class TraceJob(tuple):
    """The design's tuple ``(model, kwargs, compiler_args)``, carrying its graph-type label and the autograd
    mode it is traced in (None: the ``parallel_trace`` call's)."""

    graph_type: str | None
    autograd: str | None

    def __new__(cls, model: Any, kwargs: Mapping[str, Any], compiler_args: Sequence[str] | None,
                graph_type: str | None = None, autograd: str | None = None) -> TraceJob:
        if autograd is not None and autograd not in AUTOGRAD_MODES:
            raise ValueError(f"trace job autograd mode {autograd!r} is not one of {', '.join(AUTOGRAD_MODES)}")
        job = super().__new__(cls, (model, dict(kwargs), None if compiler_args is None else list(compiler_args)))
        job.graph_type = graph_type
        job.autograd = autograd
        return job

    def __reduce__(self) -> tuple[Any, ...]:
        return (TraceJob, (self[0], self[1], self[2], self.graph_type, self.autograd))


def build_trace_job(resolver: Any, target_model: Any, kwargs: Mapping[str, Any], graph_type: str | None,
                    autograd: str | None = None) -> TraceJob:
    """Resolve the graph's arguments now, in the parent, so no model code runs in the child."""
    return TraceJob(target_model, kwargs, resolver.resolve_graph_compiler_args(graph_type), graph_type, autograd)


def workers_from_env(name: str, n_jobs: int) -> int:
    """``$name`` (a positive count), else the CPU count capped at ``n_jobs``; a bad value is an OptionsError."""
    given = envs.count(name, hint=" (default: the CPU count)")
    return max(1, min(os.cpu_count() or 1, n_jobs)) if given is None else given


def normalize_job(job: Sequence[Any], autograd: str | None = None) -> TraceJob:
    """Accept ``(model, kwargs)`` (no per-graph override: the native path) or ``(model, kwargs, args)``; a job
    that records no autograd mode gets ``autograd`` (the ``parallel_trace`` call's)."""
    if isinstance(job, TraceJob):
        return job if job.autograd is not None or autograd is None else TraceJob(*job, job.graph_type, autograd)
    if not isinstance(job, (tuple, list)) or len(job) not in (2, 3):
        raise TypeError(f"a trace job is (model, kwargs) or (model, kwargs, compiler_args), got {job!r}")
    return TraceJob(job[0], job[1], job[2] if len(job) == 3 else None, autograd=autograd)
