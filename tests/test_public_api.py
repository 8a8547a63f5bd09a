"""The seed's public names are importable from the package, and importing it stays light."""
from __future__ import annotations

import subprocess
import sys

import neuron_args

SEED_NAMES = ["scoped_compiler_args", "apply_scoped_compiler_args", "with_optimization_level", "create_cache_hash",
              "parallel_trace", "parallel_compile", "_assert_cache_key_args", "CompilerArgsResolver",
              "CacheMissError", "CacheKeyArgsConflict", "CompileError", "NeuronArgsError"]


def test_seed_names_are_importable():
    for name in SEED_NAMES:
        assert callable(getattr(neuron_args, name)), name
    assert neuron_args.NEURON_LIBTORCH_ASSERT_CACHE_HIT == "NEURON_LIBTORCH_ASSERT_CACHE_HIT"
    assert neuron_args.VLLM_NEURON_MANIFEST_DIR == "VLLM_NEURON_MANIFEST_DIR"
    assert issubclass(neuron_args.CacheMissError, neuron_args.NeuronArgsError)
    assert issubclass(neuron_args.CacheKeyArgsConflict, neuron_args.NeuronArgsError)


def test_import_loads_neither_torch_nor_jax():
    code = "import sys, neuron_args; print(sorted(m for m in ('torch', 'jax', 'torchax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_backends_are_discoverable_by_name_without_importing_neuron_args():
    code = ("import torch; from torch._dynamo.backends.registry import lookup_backend;"
            "print([type(lookup_backend(n)).__name__ for n in "
            "('neuron_libtorch', 'neuron_libtorch_graph_capture', 'neuron_native_lite')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['NeuronBackend', 'NeuronBackend', 'NeuronBackend']"
