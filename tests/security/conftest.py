"""Shared pieces of the untrusted-input tests: a cache with built entries, a clean process state."""
from __future__ import annotations

import pytest

from neuron_args.activity import ACTIVITY, LedgerActivity
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache, new_metadata
from neuron_args.cache_key import create_cache_hash
from neuron_args.signing import SIGNING_KEY_ENV

#: Nested far past the interpreter's recursion limit: ``json`` raises RecursionError on it.
DEEP_JSON = "[" * 200_000 + "]" * 200_000


def make_key(graph="HloModule decode", shape=(4,)):
    return create_cache_hash(graph_text=graph, input_specs=[(shape, "float32")], compiler_args=["-O1"],
                             target="trn2", tool_versions={"compiler": "fake 1"})


def builder(key, executable=b"exe-bytes"):
    """A build that writes what a compiler's build writes: graph, executable, metadata with size and sha256."""
    from neuron_args.cache import executable_fields

    def build(entry):
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(executable)
        entry.write_metadata(new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"],
                                          target="trn2", status="compiled", **executable_fields(entry.executable_path)))
    return build


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in (ASSERT_CACHE_HIT_ENV, SIGNING_KEY_ENV, "VLLM_NEURON_MANIFEST_DIR", "NEURON_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    ACTIVITY.reset()
    monkeypatch.setattr(ACTIVITY, "ledger", LedgerActivity())


@pytest.fixture
def built(tmp_path):
    """A cache holding one complete entry: ``(cache, key, entry)``."""
    cache, key = CompileCache(tmp_path / "cache"), make_key()
    entry, hit = cache.get_or_build(key, builder(key))
    assert not hit and entry.status == "complete"
    return cache, key, entry
