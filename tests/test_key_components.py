"""The key's contract: named components, each hashed on its own, output specs and autograd mode among them."""
from __future__ import annotations

import hashlib
import json

import pytest

from neuron_args.cache_key import COMPONENT_ORDER, create_cache_hash, explain_components

FIELDS = dict(graph_text="HloModule m", input_specs=[((4,), "float32")], output_specs=[((4,), "float32")],
              autograd="inference_mode", compiler_args=["-O1"], target="trn2", tool_versions={"compiler": "local 1"})


def test_the_key_is_the_hash_of_its_named_component_hashes():
    key = create_cache_hash(**FIELDS)
    parts = key.components.as_dict()
    assert list(parts) == list(COMPONENT_ORDER) == ["graph", "input_specs", "output_specs", "autograd",
                                                    "compiler_args", "target", "tool_versions"]
    assert parts["output_specs"] == [{"shape": [4], "dtype": "float32"}] and parts["autograd"] == "inference_mode"
    lines = "".join(
        f"{name}={hashlib.sha256((value if name == 'graph' else json.dumps(value, sort_keys=True)).encode()).hexdigest()}\n"
        for name, value in ((n, parts[n]) for n in COMPONENT_ORDER))
    assert key.key == hashlib.sha256(lines.encode()).hexdigest()[:32]


@pytest.mark.parametrize("change, expected", [
    (dict(output_specs=[((4,), "float64")]), ["output_specs: output 0 float32[4] -> float64[4]"]),
    (dict(output_specs=[((4,), "float32"), ((), "int64")]),
     ["output_specs: 1 outputs -> 2 outputs"]),
    (dict(output_specs=None), ["output_specs: 1 outputs -> unrecorded"]),
    (dict(autograd="grad"), ["autograd: inference_mode -> grad"]),
])
def test_output_specs_and_autograd_change_the_key_and_are_explained(change, expected):
    base, other = create_cache_hash(**FIELDS), create_cache_hash(**{**FIELDS, **change})
    assert base.key != other.key
    assert explain_components(base.components.as_dict(), other.components.as_dict()) == expected


def test_damaged_specs_in_a_metadata_json_are_explained_not_raised():
    good = create_cache_hash(**FIELDS).components.as_dict()
    assert explain_components({**good, "output_specs": [7]}, good) == [
        "output_specs: output 0 7 -> float32[4]"]
    assert explain_components({**good, "output_specs": "x"}, good) == ["output_specs: 'x' -> 1 outputs"]


@pytest.mark.parametrize("field, damaged, said", [
    ("compiler_args", [1, 2], "compiler_args: [1, 2] -> ['-O1']"),
    ("compiler_args", "-O1", "compiler_args: '-O1' -> ['-O1']"),
    ("tool_versions", [1, 2], "tool_versions: [1, 2] -> {'compiler': 'local 1'}"),
    ("tool_versions", "local 1", "tool_versions: 'local 1' -> {'compiler': 'local 1'}"),
])
def test_damaged_arguments_and_tool_versions_in_a_metadata_json_are_explained_not_raised(field, damaged, said):
    """Key components read back from a metadata.json are untrusted: a field of another shape is one line saying what
    it holds (it raised, or compared a string's characters as flags)."""
    good = create_cache_hash(**FIELDS).components.as_dict()
    assert explain_components({**good, field: damaged}, good) == [said]
