"""The design's public names are importable from the package, and importing it stays light."""
from __future__ import annotations

import subprocess
import sys

import pytest

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


@pytest.mark.slow
def test_import_loads_neither_torch_nor_jax():
    code = "import sys, neuron_args; print(sorted(m for m in ('torch', 'jax', 'torchax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def python_prints(code: str) -> str:
    """What ``python -c code`` prints in a fresh process (which must succeed)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.slow
def test_the_deferred_build_imports_neither_torch_nor_the_seams():
    assert python_prints("import sys, neuron_args.deferred.parallel_compile, neuron_args.compilers.base;"
                         "print(sorted(m for m in ('torch', 'jax', 'neuron_args.seams.backends') if m in sys.modules))"
                         ) == "[]"


@pytest.mark.slow
def test_torch_compile_finds_a_seam_by_name_in_a_fresh_process(tmp_path):
    """The entry points are the only registration: importing the seams writes nothing into torch's registry,
    and ``backend="neuron_libtorch"`` works in a process that never imported neuron_args itself; each of the
    three seams is then found by name through ``lookup_backend`` (the registry held only the one compiled with,
    so the other two come from the entry points). One fresh process for both: each costs an import of torch."""
    assert python_prints(
        "import torch; from torch._dynamo.backends import registry;"
        "f = torch.compile(lambda x: x.sin() + 1, backend='neuron_libtorch',"
        f"  options={{'cache_dir': {str(tmp_path)!r}, 'compiler': 'local'}});"
        "x = torch.arange(4.0); torch.testing.assert_close(f(x), x.sin() + 1);"
        "import neuron_args.seams.backends as b;"
        "print(type(registry._COMPILER_FNS['neuron_libtorch']).__name__,"
        "  sorted(n for n in b.SEAMS if n in registry._COMPILER_FNS),"
        "  [type(registry.lookup_backend(n)).__name__ for n in "
        "   ('neuron_libtorch', 'neuron_libtorch_graph_capture', 'neuron_native_lite')])"
    ) == "NeuronBackend ['neuron_libtorch'] ['NeuronBackend', 'NeuronBackend', 'NeuronBackend']"
    assert len(neuron_args.CompileCache(tmp_path).entries()) == 1
    assert python_prints(
        "import neuron_args.seams.backends as b; from torch._dynamo.backends import registry;"
        "print(sorted(n for n in b.SEAMS if n in registry._COMPILER_FNS or n in registry._BACKENDS),"
        "  registry.lookup_backend('neuron_native_lite') is b.neuron_native_lite)") == "[] True"
