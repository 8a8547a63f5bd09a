"""The typed metadata of a cache entry: read and written by the cache alone, the file's bytes unchanged, and a
field of another type found once, where the file is read, as a corrupt entry naming the key and the field."""
from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from neuron_args.cache import CompileCache, EntryStatus, new_metadata
from neuron_args.cache_key import CacheKey, create_cache_hash
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CorruptEntryError
from tests.security.security_helpers import executable_fields

LIBRARY = [Path(__file__).resolve().parents[1] / name for name in ("neuron_args", "pytest_neuron_args")]


def _key() -> CacheKey:
    return create_cache_hash(graph_text="HloModule decode", input_specs=[((2, 3), "float32")], compiler_args=["-O1"],
                             target="trn2", tool_versions={"compiler": "local 1"})


def _complete(root: Path, **fields) -> tuple:
    key = _key()
    entry = CompileCache(root).entry(key)
    entry.path.mkdir(parents=True)
    entry.executable_path.write_bytes(b"executable")
    md = new_metadata(key, seam="neuron_libtorch", graph_type="decode", compiler_args=["-O1"], target="trn2",
                      status="compiled", input_specs=[{"shape": [2, 3], "dtype": "float32"}], input_shapes=["[2,3]"],
                      **executable_fields(entry.executable_path))
    entry.write_metadata({**md.doc, **fields} if fields else md)
    entry.mark_complete()
    return entry, md


def test_metadata_is_read_typed_and_written_back_byte_for_byte(tmp_path):
    entry, written = _complete(tmp_path)
    before = entry.metadata_path.read_bytes()
    md = entry.info()
    assert (md.key, md.graph_type, md.compiler_args, md.target) == (entry.key, "decode", ("-O1",), "trn2")
    assert md.input_specs == (((2, 3), "float32"),) and md.input_shapes == ("[2,3]",)
    assert md.executable_size == len(b"executable") and md.doc == json.loads(before)
    entry.write_metadata(md)
    assert entry.metadata_path.read_bytes() == before  # the document, not the type, is what is written
    built = md.compiled(compiler_args=["-O1"], command=["cc"], seconds=1.5, compiler={"name": "local", "format": "x"},
                        executable={})
    assert (built.status, built.compile_seconds, built.compiler_name, built.executable_format) == (
        "compiled", 1.5, "local", "x")
    assert {k: v for k, v in built.doc.items() if k not in ("command", "compiled", "compile_seconds", "compiler")} \
        == {**written.doc, "status": "compiled"}


@pytest.mark.parametrize("field, value, said", [
    ("compiler_args", "-O1", "not a list of strings"),
    ("input_specs", [{"shape": ["2", 3], "dtype": "float32"}], 'not a list of {"shape": [int, ...], "dtype": str}'),
    ("graph_type", 7, "not a string"),
    ("compile_timeout", "soon", "not a number of seconds"),
])
def test_a_field_of_another_type_is_a_corrupt_entry_naming_key_and_field(tmp_path, field, value, said):
    entry, _ = _complete(tmp_path)
    doc = {**entry.metadata(), field: value}
    entry.metadata_path.write_text(json.dumps(doc))
    with pytest.raises(CorruptEntryError) as info:
        entry.info()
    label = "graph type 'decode'" if field != "graph_type" else "a graph with no graph type"
    assert f"cache entry {entry.key} ({label}): metadata.json field {field!r} is {value!r}, {said}" in str(info.value)
    assert info.value.problem.startswith(f"metadata.json field {field!r}")
    assert entry.problem() == info.value.problem and entry.status is EntryStatus.CORRUPT  # found when verified


@pytest.mark.parametrize("field", [f.name for f in fields(EntryMetadata) if f.name != "doc"])
def test_every_typed_field_is_checked_where_the_document_is_read(field):
    """Each field's type picks its parser: a field added to EntryMetadata is checked with no second list to edit."""
    key = "ab" * 16
    with pytest.raises(CorruptEntryError) as info:
        EntryMetadata.parse({"key": key, field: [[1]]}, key)
    assert info.value.problem.startswith(f"metadata.json field {field!r} is [[1]], not ")


def test_an_absent_or_unreadable_document_is_empty_metadata_not_an_error(tmp_path):
    entry = CompileCache(tmp_path).entry(_key())
    assert not entry.info() and entry.info() == EntryMetadata() and not entry.has_metadata
    entry.path.mkdir(parents=True)
    entry.metadata_path.write_text("[1, 2]")
    assert not entry.info() and entry.info().graph_type is None


def test_only_the_cache_reads_metadata_documents():
    """Every other library module reads the typed fields (``CacheEntry.info()``), never the document's keys."""
    readers = sorted(str(p.relative_to(p.parents[1])) for root in LIBRARY for p in root.rglob("*.py")
                     if p.name != "cache.py" and re.search(r"\.metadata\(\)|\bmd\.get\(|\bmd\[", p.read_text()))
    assert readers == []


def test_the_build_target_is_the_recorded_one_checked_or_the_default() -> None:
    from neuron_args.errors import CompilerArgsError
    from neuron_args.target import DEFAULT_TARGET

    key = "ab" * 16
    assert EntryMetadata.parse({"key": key}, key).build_target == DEFAULT_TARGET
    assert EntryMetadata.parse({"key": key, "target": "trn1"}, key).build_target == "trn1"
    tampered = EntryMetadata.parse({"key": key, "target": "trn2 --evil", "graph_type": "decode"}, key)
    with pytest.raises(CompilerArgsError, match=f"unknown compile target 'trn2 --evil' \\(from metadata.json of "
                                                f"cache entry {key} \\(graph type 'decode'\\)\\)"):
        tampered.build_target
