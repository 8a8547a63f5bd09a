"""Importing the lowerings imports no jax, importing ``neuron_args.hf`` no transformers: they take those modules from
``lazy_modules``, which imports each on first use, so a process that lowers no graph (cache and trace memo hits) or
builds no Hugging Face cache never pays for them."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_PROBE = """
import sys
from neuron_args import hf
from neuron_args.lowering import ops
print(sorted(m for m in ("jax", "jax.numpy", "torchax", "transformers") if m in sys.modules))
import numpy as np
angle = ops.LOWERINGS["aten::angle"]
print(angle(np.array([-1.0, 2.0], np.float32)).tolist(), "jax.numpy" in sys.modules)
print(hf.positioned_cache_class().__mro__[1].__name__, "transformers" in sys.modules)
"""


def test_importing_the_lowerings_and_hf_imports_neither_jax_nor_transformers_until_used():
    run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    imported, lowered, cache = run.stdout.strip().splitlines()
    assert imported == "[]"
    assert lowered == "[3.1415927410125732, 0.0] True"
    assert cache == "StaticCache True"
