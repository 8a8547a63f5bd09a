"""Importing the lowerings imports no jax: the lowering modules take jax's modules from ``lowering.lazy_jax``,
which imports each on first use, so a process that lowers no graph (cache and trace memo hits) never pays for it."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_PROBE = """
import sys
from neuron_args.lowering import ops
print(sorted(m for m in ("jax", "jax.numpy", "torchax") if m in sys.modules))
import numpy as np
angle = ops.LOWERINGS["aten::angle"]
print(angle(np.array([-1.0, 2.0], np.float32)).tolist(), "jax.numpy" in sys.modules)
"""


def test_importing_every_lowering_imports_no_jax_until_one_runs():
    run = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    imported, after = run.stdout.strip().splitlines()
    assert imported == "[]"
    assert after == "[3.1415927410125732, 0.0] True"
