"""The sha256 of a file, read in chunks: the cache's integrity check and the remote cache's upload listing."""
from __future__ import annotations

import hashlib
import os

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
