"""Work a warm pytest session no longer does: pytest's capture off torch's trace log, deepdiff for equal baselines,
ml_dtypes 0.7's numpy promoter registration."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_neuron_args import trace_log

REPO = Path(__file__).resolve().parents[1]


def test_detached_takes_every_handler_off_the_trace_log_without_torch_trace_and_puts_them_back(monkeypatch):
    log = logging.getLogger(trace_log.TRACE_LOG)
    shared, own = logging.NullHandler(), logging.NullHandler()
    logging.getLogger().addHandler(shared)
    log.addHandler(shared)
    log.addHandler(own)  # e.g. torch's own TORCH_TRACE handler: not the root logger's
    try:
        before = list(log.handlers)
        monkeypatch.delenv("TORCH_TRACE", raising=False)
        with trace_log.detached() as taken:
            assert log.handlers == [] and shared in taken and own in taken
        assert log.handlers == before
        monkeypatch.setenv("TORCH_TRACE", "/tmp/trace")  # the trace file is wanted: only pytest's handlers leave
        with trace_log.detached() as taken:
            assert shared in taken and own not in taken and own in log.handlers and shared not in log.handlers
        assert sorted(map(id, log.handlers)) == sorted(map(id, before))
    finally:
        logging.getLogger().removeHandler(shared)
        log.removeHandler(shared)
        log.removeHandler(own)


def test_a_dynamo_trace_inside_detached_builds_no_structured_trace_records(monkeypatch):
    """pytest attached its capture to torch's trace log, so Dynamo builds each artifact's record (the plugin's
    filter drops it afterwards): not inside ``detached``."""
    log = logging.getLogger(trace_log.TRACE_LOG)
    assert log.handlers
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    built: list[logging.LogRecord] = []
    monkeypatch.setattr(log, "handle", built.append)  # every record the logger made, before any filter

    def f(x):
        return torch.sin(x) + 1

    torch._dynamo.reset()
    torch.compile(f, backend="eager")(torch.ones(3))
    assert built  # what a warmup paid for without the detach
    built.clear()
    torch._dynamo.reset()
    with trace_log.detached():
        torch.compile(f, backend="eager")(torch.ones(4))
    torch._dynamo.reset()
    assert built == []


def test_detached_skips_dynamo_guard_latency_timing_unless_the_trace_or_the_guards_log_wants_it(monkeypatch):
    from torch._dynamo import guards

    timed: list[object] = []
    real = guards.profile_guard_manager
    monkeypatch.setattr(guards, "profile_guard_manager", lambda *a: timed.append(a) or real(*a))
    monkeypatch.delenv("TORCH_TRACE", raising=False)

    def f(x):
        return torch.cos(x) * 2

    def trace(n: int) -> None:
        torch._dynamo.reset()
        torch.compile(f, backend="eager")(torch.ones(n))
        torch._dynamo.reset()

    trace(3)
    assert len(timed) == 1  # Dynamo times each graph's guards once after building them
    with trace_log.detached():
        trace(4)
    assert len(timed) == 1
    assert guards.profile_guard_manager is not real  # our counting wrapper is back after the block
    monkeypatch.setattr(guards.guards_log, "isEnabledFor", lambda level: True)  # TORCH_LOGS=guards
    with trace_log.detached():
        trace(5)
    assert len(timed) == 2
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_TRACE", "/tmp/trace-unused")
    with trace_log.detached():
        assert guards.profile_guard_manager is real


EQUAL_BASELINE = """
import sys
from neuron_args.manifest.diff import _value_changes, _value_line
assert _value_changes({"a": [1, {"b": "x"}]}, {"a": [1, {"b": "x"}]}, "config", ignore_paths=True) == []
print("deepdiff" in sys.modules)
print([_value_line(c) for c in _value_changes({"a": 1}, {"a": 2}, "config", ignore_paths=True)])
"""


@pytest.mark.slow
def test_equal_values_are_compared_without_importing_deepdiff_and_changes_still_are_found():
    run = subprocess.run([sys.executable, "-c", EQUAL_BASELINE], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["False", "['config.a: 1 -> 2']"]


def test_the_installed_ml_dtypes_is_one_whose_import_does_not_scan_numpys_loops_for_each_promoter():
    """jax imports ml_dtypes in a warm session (the runtime's first call): 0.7.0 spends ~0.45 s of CPU there, each
    of its numpy promoters added by a scan of every loop added before it (``PyUFunc_AddLoop``), 0.6.0 ~4 ms."""
    from importlib.metadata import version

    installed = version("ml_dtypes")
    assert tuple(int(p) for p in installed.split(".")[:2]) < (0, 7), (
        f"ml_dtypes {installed} is installed; pyproject.toml pins ml_dtypes<0.7: run `bash scripts/setup.sh`")
