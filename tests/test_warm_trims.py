"""A warmup's Dynamo traces skip work only a debug log reads: the function names of traced lines."""
from __future__ import annotations

import logging

import torch
from torch._dynamo import funcname_cache, symbolic_convert

from pytest_neuron_args import trace_log


def _traced_source_files(monkeypatch, *, log_at_debug: bool) -> set[str]:
    tokenized: list[str] = []
    real = funcname_cache._add_file
    monkeypatch.setattr(funcname_cache, "_add_file", lambda f: (tokenized.append(f), real(f))[1])
    funcname_cache.clearcache()
    log = symbolic_convert.trace_call_log
    monkeypatch.setattr(log, "level", logging.DEBUG if log_at_debug else logging.NOTSET)
    log._cache.clear()

    def f(x):
        return torch.sin(x) + 1

    torch._dynamo.reset()
    with trace_log.detached():
        torch.compile(f, backend="eager")(torch.ones(3))
    torch._dynamo.reset()
    log._cache.clear()
    return set(tokenized)


def test_a_trace_in_a_warmup_names_no_function_unless_its_debug_log_is_on(monkeypatch):
    assert _traced_source_files(monkeypatch, log_at_debug=False) == set()
    assert __file__ in _traced_source_files(monkeypatch, log_at_debug=True)  # TORCH_LOGS=trace_call: named
    assert symbolic_convert.get_funcname is funcname_cache.get_funcname  # put back after the block
