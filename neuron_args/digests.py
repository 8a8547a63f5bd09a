"""The sha256 of a file, read in chunks: the cache's integrity check and the remote cache's upload listing."""
from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return stream_sha256(f)


def stream_sha256(f: BinaryIO) -> str:
    """The sha256 of what is left to read in ``f`` (an open file: the remote cache hashes what it uploads)."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()
