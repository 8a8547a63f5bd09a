"""Shared pieces of the untrusted-input tests: a cache with built entries, a clean process state."""
from __future__ import annotations

import pytest

from neuron_args.activity import ACTIVITY, LedgerActivity
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache
from neuron_args.signing import SIGNING_KEY_ENV
from tests.security.security_helpers import builder, make_key


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
