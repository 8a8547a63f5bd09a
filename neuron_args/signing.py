"""The signed cache: an HMAC-SHA256 over each entry's metadata (so over its executable's sha256), since checksums
catch corruption, not a writer of a shared cache rewriting them; with the key set, an unsigned entry is corrupt."""
from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from neuron_args import envs
from neuron_args.entry_metadata import EntryMetadata

SIGNING_KEY_ENV = "NEURON_ARGS_CACHE_SIGNING_KEY"
SIGNATURE_FIELD = "signature"
_SCHEME = "hmac-sha256:"


def signing_key() -> bytes | None:
    """The secret of ``NEURON_ARGS_CACHE_SIGNING_KEY`` (None when unset or blank): signing is on when set."""
    value = envs.environ().get(SIGNING_KEY_ENV, "")  # taken as given: a secret is not stripped
    return value.encode() if value.strip() else None


def _digest(metadata: Mapping[str, Any], secret: bytes) -> str:
    unsigned = {k: v for k, v in metadata.items() if k != SIGNATURE_FIELD}
    payload = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return _SCHEME + hmac.new(secret, payload, hashlib.sha256).hexdigest()


def signed(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with its signature when signing is on, else without one (a stale one would lie)."""
    out = {k: v for k, v in metadata.items() if k != SIGNATURE_FIELD}
    secret = signing_key()
    if secret is not None:
        out[SIGNATURE_FIELD] = _digest(out, secret)
    return out


def signature_matches(doc: Mapping[str, Any]) -> bool:
    """Whether ``doc`` (a trace memo) carries the signature of this secret; True when signing is off."""
    secret = signing_key()
    given = doc.get(SIGNATURE_FIELD)
    return secret is None or (isinstance(given, str) and hmac.compare_digest(given, _digest(doc, secret)))


def signature_problem(metadata: EntryMetadata, key: str) -> str | None:
    """Why the metadata of the complete entry ``key`` is not trusted when signing is on, or None."""
    secret = signing_key()
    if secret is None:
        return None
    fix = (f"fix: rebuild it with the same {SIGNING_KEY_ENV} as this run (a run that can write the cache moves it "
           "aside and rebuilds it), or let only writers you trust, holding that key, write the cache")
    if not isinstance(metadata.doc.get(SIGNATURE_FIELD), str):
        return f"it is not signed while {SIGNING_KEY_ENV} is set (written without the key, or tampered with); {fix}"
    if not signature_matches(metadata.doc):
        return (f"its signature does not match its metadata under this {SIGNING_KEY_ENV} (tampered with, or signed "
                f"with another key); {fix}")
    if metadata.key != key:
        return f"its signed metadata is entry {metadata.key!r}'s (copied from another entry); {fix}"
    if metadata.executable_sha256 is None:
        return f"its signed metadata records no executable sha256, so the executable is not vouched for; {fix}"
    return None
