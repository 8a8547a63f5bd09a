"""Which keys each trace job resolved last time: lets ``parallel_trace`` skip children on a warm cache.

A job's keys are known only after tracing it, so ``<cache>/.trace-record.json`` maps a job's *fingerprint*
(model, inputs, arguments, mode, options) to the keys its last trace resolved. Only a prediction: such a job
is traced in the caller asserting a hit, and a changed model misses there and goes to a child.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from neuron_args.cache import CompileCache
from neuron_args.deferred.jobs import TraceJob
from neuron_args.settings import CompileSettings
from neuron_args.untrusted import RECORD_LIMIT, read_json

log = logging.getLogger("neuron_args.deferred")

RECORD_NAME = ".trace-record.json"
RECORD_VERSION = 1
#: the record keeps the newest jobs only (one line per job shape: small even for large models)
MAX_JOBS = 4096
# options that name this process or the record's own folder, not the graph
_NOT_FINGERPRINTED = ("runner", "cache_dir")


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype)]
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _describe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return repr(value)


def _model_description(model: Any) -> list[Any]:
    model = getattr(model, "_orig_mod", model)
    kind = type(model)
    out: list[Any] = [f"{kind.__module__}.{kind.__qualname__}"]
    if hasattr(model, "named_parameters") and hasattr(model, "named_buffers"):
        out.append(repr(model))  # the module tree with each module's sizes
        out.append([(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()])
        out.append([(n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()])
    return out


def fingerprint(job: TraceJob, settings: CompileSettings) -> str:
    """A job's description for the record (not a cache key: see the module docstring)."""
    opts = {k: v for k, v in settings.as_options().items() if k not in _NOT_FINGERPRINTED}
    described = {"model": _model_description(job[0]), "kwargs": _describe(job[1]), "compiler_args": job[2],
                 "graph_type": job.graph_type, "autograd": job.autograd, "options": _describe(opts)}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


class TraceRecord:
    """The record of one cache directory."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        self.cache = CompileCache(cache_dir)
        self.path = Path(self.cache.root) / RECORD_NAME

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_json(self.path, RECORD_LIMIT)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # a damaged record only costs children: trace as if cold
            log.warning("trace record %s is unreadable (%s); tracing every job in a child", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or not isinstance(data.get("jobs"), dict):
            return {}
        return data["jobs"]

    def complete_keys(self, fingerprints: Iterable[str]) -> dict[str, list[str]]:
        """The recorded keys of each fingerprint whose every recorded key has a complete entry."""
        jobs = self.read()
        keys = {fp: _listed_keys(jobs.get(fp)) for fp in fingerprints}
        return {fp: ks for fp, ks in keys.items() if self._complete(ks)}

    def all_complete(self) -> bool:
        """True when the record lists jobs and each of their keys is complete: a warmup likely compiles nothing."""
        return self._complete([k for job in self.read().values() for k in _listed_keys(job)])

    def _complete(self, keys: list[Any]) -> bool:
        return bool(keys) and all(isinstance(k, str) and self.cache.entry(k).is_complete for k in keys)

    def note(self, resolved: Mapping[str, tuple[str | None, list[str]]]) -> None:
        """Record ``{fingerprint: (graph_type, keys)}`` (merged with what other processes recorded)."""
        if not resolved:
            return
        jobs = self.read()
        new = {fp: {"graph_type": graph_type, "keys": sorted(set(keys))}
               for fp, (graph_type, keys) in resolved.items() if keys}
        changed = {fp: line for fp, line in new.items() if jobs.get(fp) != line}
        if not changed:
            return
        # the changed lines go last: the newest stay when the record is trimmed
        jobs = {fp: line for fp, line in jobs.items() if fp not in changed} | changed
        kept = dict(list(jobs.items())[-MAX_JOBS:])
        try:
            write_atomic(self.path, json.dumps({"version": RECORD_VERSION, "jobs": kept}, indent=0))
        except OSError as exc:  # the record is an optimisation: a read-only cache still traces
            log.warning("could not write the trace record %s (%s); the next run traces in children again",
                        self.path, exc)


def _listed_keys(job: Any) -> list[Any]:
    """A record line's keys (untrusted: a line or keys of another shape list none)."""
    keys = job.get("keys") if isinstance(job, dict) else None
    return list(keys) if isinstance(keys, list) else []
