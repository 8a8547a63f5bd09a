"""The process's activity: one object, started over in place by reset()."""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from neuron_args import cache
from neuron_args.activity import ACTIVITY
from neuron_args.compilers import local
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.seams import records

KEY = "ab" * 16


def _record(**counts: int) -> GraphOutcome:
    return records.record(GraphOutcome(key=KEY, seam="neuron_libtorch", graph_type="decode", input_shapes=["1, 8"],
                                       compiler_args=["-O1"], optimization_level=1, target="trn2", **counts))


def _snapshot() -> dict:
    """A copy of what the activity holds, in plain builtins."""
    return {"stats": ACTIVITY.stats.snapshot(), "records": {key: rec.to_json() for key, rec in ACTIVITY.records.items()},
            "serving": ACTIVITY.serving is not None}


def test_public_names_are_the_activity_and_stay_valid_across_a_reset():
    ACTIVITY.reset()
    _record(compiles=1)
    cache.STATS.misses += 1
    ACTIVITY.verified.add(("/cache", KEY))
    ACTIVITY.ledger.recorded.add(("/ledger", KEY, 0))
    snap = _snapshot()
    assert snap["stats"] == {"hits": 0, "misses": 1, "compiles": 0, "captures": 0}
    assert snap["records"][KEY]["compiled"] is True and snap["serving"] is False
    ACTIVITY.reset()
    assert cache.STATS is ACTIVITY.stats and records.RECORDS is ACTIVITY.records  # emptied, not replaced
    assert records.records() == [] and cache.STATS.snapshot() == {"hits": 0, "misses": 0, "compiles": 0, "captures": 0}
    assert not ACTIVITY.verified and not ACTIVITY.ledger.recorded
    assert snap["records"][KEY]["compiles"] == 1  # a snapshot is a copy


def test_reset_clears_what_was_said_and_the_registered_caches(monkeypatch):
    ACTIVITY.reset()
    first = local.local_version()
    monkeypatch.setattr(metadata, "version", lambda name: "9.9")
    assert local.local_version() == first  # once per process
    assert ACTIVITY.say_once("a warning") and not ACTIVITY.say_once("a warning")
    ACTIVITY.reset()
    assert local.local_version().startswith("local-xla-cpu/9.9 ") and ACTIVITY.say_once("a warning")
    ACTIVITY.reset()  # the real version again once the patch is gone


@pytest.mark.slow
def test_the_plugin_reads_the_activity_without_importing_torch():
    code = ("import sys, pytest_neuron_args.plugin, pytest_neuron_args.assertions\n"
            "from pytest_neuron_args.assertions import CompileCounter\n"
            "print(CompileCounter().counts, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split("}")[-1].split() == ["False"], done.stderr
    assert done.stdout.startswith("{'compiles': 0, 'misses': 0, 'hits': 0, 'captures': 0}"), done.stdout
