"""Cache keys from named components, and explanations of how two keys differ."""
from __future__ import annotations

import pytest

from neuron_args.cache_key import create_cache_hash, explain_components, graph_digest

VERSIONS = {"torch": "2.13.0", "jaxlib": "0.10.2", "compiler": "local 1"}
SPECS = [((4, 16), "float32"), ((4,), "int64")]


def key(**over):
    kw = dict(graph_text="HloModule m\nENTRY e { ROOT p = f32[4] parameter(0) }", input_specs=SPECS,
              compiler_args=["--auto-cast=none", "-O3"], target="trn2", tool_versions=VERSIONS)
    kw.update(over)
    return create_cache_hash(**kw)


def test_key_is_stable_and_32_hex():
    a, b = key(), key()
    assert a.key == b.key
    assert len(a.key) == 32 and int(a.key, 16) >= 0


@pytest.mark.parametrize("same", [
    dict(compiler_args=["-O3", "--auto-cast=none"]),             # canonical order
    dict(compiler_args=["--auto-cast", "none", "--optlevel=3"]),  # other spellings
    dict(compiler_args=["--auto-cast=none", "-O3", "--logfile=/tmp/x.log"]),  # machine-specific path
])
def test_equivalent_arguments_key_the_same(same):
    assert key(**same).key == key().key


@pytest.mark.parametrize("change, expected", [
    (dict(compiler_args=["--auto-cast=none", "-O1"]), ["compiler_args: changed -O3 -> -O1"]),
    (dict(compiler_args=["-O3"]), ["compiler_args: removed --auto-cast=none"]),
    (dict(compiler_args=["--auto-cast=none", "-O3", "--enable-saturate-infinity"]),
     ["compiler_args: added --enable-saturate-infinity"]),
    (dict(input_specs=[((8, 16), "float32"), ((4,), "int64")]), ["input_specs: input 0 float32[4, 16] -> float32[8, 16]"]),
    (dict(target="trn1"), ["target: trn2 -> trn1"]),
    (dict(tool_versions={**VERSIONS, "jaxlib": "0.10.3"}), ["tool_versions: jaxlib 0.10.2 -> 0.10.3"]),
])
def test_each_component_changes_the_key_and_is_explained(change, expected):
    base, other = key(), key(**change)
    assert base.key != other.key
    assert explain_components(base.components.as_dict(), other.components.as_dict()) == expected


def test_graph_change_is_explained():
    a, b = key(), key(graph_text="HloModule m2")
    lines = explain_components(a.components.as_dict(), b.components.as_dict())
    assert len(lines) == 1 and lines[0].startswith("graph: different graph content")


def test_args_left_out_for_native_key():
    a = key(compiler_args=None)
    assert a.components.compiler_args is None
    assert a.key != key().key
    assert explain_components(a.components.as_dict(), key().components.as_dict())[0].startswith("compiler_args: None ->")


def test_graph_digest_or_text_give_the_same_key():
    text = "HloModule m"
    assert create_cache_hash(graph_sha256=graph_digest(text), input_specs=SPECS, compiler_args=[], target="trn2",
                             tool_versions=VERSIONS).key == key(graph_text=text, compiler_args=[]).key
    with pytest.raises(TypeError):
        create_cache_hash(input_specs=SPECS, compiler_args=[], target="trn2", tool_versions=VERSIONS)


def test_graph_digest_of_a_large_text_equals_hashing_its_utf8_bytes():
    import hashlib

    text = "ENTRY %main { ROOT c = f32[] constant(1) } // \u00e9\n" * 50_000  # > 1 MiB, non-ASCII across slices
    assert graph_digest(text) == hashlib.sha256(text.encode()).hexdigest() == graph_digest(text.encode())
