"""What the remote-cache tests share: the bucket, a host's view of an ``s3://`` cache, a key and a builder."""
from __future__ import annotations

import hashlib
import socket

from neuron_args.cache import CompileCache, new_metadata
from neuron_args.cache_key import create_cache_hash
from neuron_args.remote_cache import COPY_ENV

BUCKET = "neuron-cache"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host(monkeypatch, tmp_path, name: str, url: str) -> CompileCache:
    """The cache ``url`` as host ``name`` sees it: its own local copy."""
    monkeypatch.setenv(COPY_ENV, str(tmp_path / name))
    return CompileCache(url)


def make_key(text="HloModule decode"):
    return create_cache_hash(graph_text=text, input_specs=[((4,), "float32")], compiler_args=["-O1"],
                             target="trn2", tool_versions={"compiler": "fake 1"})


def builder(key, calls, exe=b"neff bytes"):
    def build(entry):
        calls.append(entry.root)
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(exe)
        entry.write_metadata(new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"],
                                          target="trn2", status="compiled", executable_size=len(exe),
                                          executable_sha256=hashlib.sha256(exe).hexdigest()))
    return build


def remote_objects(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))
