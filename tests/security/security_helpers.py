"""Helpers of the untrusted-input tests: a key, a build writing what a compiler's build writes, deep JSON."""
from __future__ import annotations

import hashlib

from neuron_args.cache import new_metadata
from neuron_args.cache_key import create_cache_hash

#: Nested far past the interpreter's recursion limit: ``json`` raises RecursionError on it.
DEEP_JSON = "[" * 200_000 + "]" * 200_000


def executable_fields(path):
    """``executable_size`` and ``executable_sha256`` of a built executable, as a build records them in metadata.json."""
    return {"executable_size": path.stat().st_size, "executable_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def make_key(graph="HloModule decode", shape=(4,)):
    return create_cache_hash(graph_text=graph, input_specs=[(shape, "float32")], compiler_args=["-O1"],
                             target="trn2", tool_versions={"compiler": "fake 1"})


def builder(key, executable=b"exe-bytes"):
    """A build that writes what a compiler's build writes: graph, executable, metadata with size and sha256."""
    def build(entry):
        entry.hlo_path.write_bytes(b"hlo")
        entry.executable_path.write_bytes(executable)
        entry.write_metadata(new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"],
                                          target="trn2", status="compiled", **executable_fields(entry.executable_path)))
    return build
