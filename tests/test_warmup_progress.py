"""A warmup's progress lines say what happened to each bucket: "compiling" only when its compiler starts,
"loaded ... from the cache" when the cache held the graph (they once said "compiling" for both)."""
from __future__ import annotations

import torch

from neuron_args.runner import WarmupProgress
from tests.test_runner import _fresh, make_runner  # noqa: F401  (autouse: a fresh Dynamo, records and STATS per test)


def _lines(cache_dir, **warmup) -> list[str]:
    events: list[WarmupProgress] = []
    torch._dynamo.reset()
    make_runner(cache_dir).warmup(progress=events.append, emit=False, **warmup)
    return [e.line() for e in events]


def test_progress_says_compiling_on_a_cold_cache_and_loaded_on_a_warm_one(tmp_path):
    assert _lines(tmp_path) == ["compiling prefill b4 (1/2)\u2026", "compiling decode b1 (2/2)\u2026"]
    assert _lines(tmp_path) == ["loaded prefill b4 (1/2) from the cache", "loaded decode b1 (2/2) from the cache"]
    # one graph type rebuilt (its entry removed): only it compiles
    (decode,) = [e for e in make_runner(tmp_path).cache.entries() if e.metadata().get("graph_type") == "decode"]
    for f in decode.path.iterdir():
        f.unlink()
    decode.path.rmdir()
    assert _lines(tmp_path) == ["loaded prefill b4 (1/2) from the cache", "compiling decode b1 (2/2)\u2026"]
