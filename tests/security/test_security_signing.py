"""The signed cache (item 8): with NEURON_ARGS_CACHE_SIGNING_KEY, an entry whose executable was swapped (and
its size and sha256 rewritten to match) is never loaded; without it, the swap goes undetected, as documented."""
from __future__ import annotations

import json

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, CompileCache, QUARANTINE_DIR
from neuron_args.errors import CacheMissError

from tests.security.security_helpers import builder, executable_fields, make_key

SIGNING = "NEURON_ARGS_CACHE_SIGNING_KEY"


def _two_entries(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    a, b = make_key("HloModule a"), make_key("HloModule b")
    entry_a, _ = cache.get_or_build(a, builder(a, b"executable of A"))
    entry_b, _ = cache.get_or_build(b, builder(b, b"executable of B, another graph"))
    return cache, a, entry_a, entry_b


def _swap_b_into_a(entry_a, entry_b):
    """The tampering: B's executable copied into A's folder, A's size and sha256 rewritten (signature kept)."""
    entry_a.executable_path.write_bytes(entry_b.executable_path.read_bytes())
    md = json.loads(entry_a.metadata_path.read_text())
    md.update(executable_fields(entry_a.executable_path))
    entry_a.metadata_path.write_text(json.dumps(md))
    ACTIVITY.reset()  # a later process: nothing verified yet


def test_swapped_executable_is_undetected_without_signing(tmp_path):
    """Documents the threat model: integrity checks catch corruption, not a writer who rewrites the metadata."""
    cache, a, entry_a, entry_b = _two_entries(tmp_path)
    _swap_b_into_a(entry_a, entry_b)
    assert cache.verified(entry_a) is None
    entry, hit = cache.get_or_build(a, builder(a))
    assert hit and entry.executable_path.read_bytes() == b"executable of B, another graph"


def test_swapped_executable_is_detected_when_signing_is_on(tmp_path, monkeypatch):
    monkeypatch.setenv(SIGNING, "team-secret")
    cache, a, entry_a, entry_b = _two_entries(tmp_path)
    assert json.loads(entry_a.metadata_path.read_text())["signature"].startswith("hmac-sha256:")
    _swap_b_into_a(entry_a, entry_b)
    problem = cache.verified(entry_a)
    assert problem is not None and "signature does not match" in problem and SIGNING in problem
    monkeypatch.setenv(ASSERT_CACHE_HIT_ENV, "1")
    with pytest.raises(CacheMissError, match=f"cache entry {a.key} .*signature does not match.*fix:"):
        cache.get_or_build(a, builder(a))
    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV)
    entry, hit = cache.get_or_build(a, builder(a, b"executable of A"))  # a miss: moved aside, rebuilt, signed
    assert not hit and entry.executable_path.read_bytes() == b"executable of A"
    assert len(list((cache.root / QUARANTINE_DIR).iterdir())) == 1
    ACTIVITY.reset()
    assert cache.verified(entry) is None


def test_unsigned_or_otherwise_signed_entries_are_not_loaded(tmp_path, monkeypatch):
    cache, a, entry_a, _ = _two_entries(tmp_path)  # written without a key: unsigned
    monkeypatch.setenv(SIGNING, "team-secret")
    ACTIVITY.reset()
    assert "not signed" in cache.verified(entry_a)
    assert entry_a.status == "corrupt"
    entry, hit = cache.get_or_build(a, builder(a))
    assert not hit
    monkeypatch.setenv(SIGNING, "another-secret")
    ACTIVITY.reset()
    assert "signature does not match" in cache.verified(entry)



def test_trace_memo_not_signed_with_the_key_is_ignored(monkeypatch):
    """A memo chooses which entry a call loads: under a key, only memos signed with it are used."""
    from neuron_args.seams.dispatch import Plan
    from neuron_args.seams.trace_memo import TraceMemo
    from neuron_args.tensors import TensorSpec

    spec = (TensorSpec((4,), "float32"),)
    memo = TraceMemo("a" * 64, spec, spec, Plan(1, 1, (), ("non_alias",)))
    unsigned = memo.as_json("fp")
    monkeypatch.setenv(SIGNING, "team-secret")
    with pytest.raises(ValueError, match="not signed"):
        TraceMemo.from_json(unsigned, "fp")
    signed = memo.as_json("fp")
    assert TraceMemo.from_json(signed, "fp") == memo
    monkeypatch.setenv(SIGNING, "another-secret")
    with pytest.raises(ValueError, match="not signed"):
        TraceMemo.from_json(signed, "fp")
