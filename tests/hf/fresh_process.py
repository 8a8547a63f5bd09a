"""Run each architecture's first no-cache forward in a fresh process under the cache-hit assert.

    python -m tests.hf.fresh_process CACHE_DIR ARCH [ARCH ...]

Prints one JSON object: per architecture the keys it resolved, how many it compiled, the largest
difference from eager, or the error. Run with ``NEURON_LIBTORCH_ASSERT_CACHE_HIT=1``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    from neuron_args.seams import records
    from tests.hf.architectures import ARCHITECTURES
    from tests.hf.cells import compile_options, first_forward

    cache_dir, names = Path(argv[0]), argv[1:]
    result = {}
    for name in names:
        torch._dynamo.reset()
        records.clear()
        model = ARCHITECTURES[name].build()
        compiled = torch.compile(model, backend="neuron_libtorch", options=compile_options(cache_dir), dynamic=False,
                                 fullgraph=True)
        try:
            out, ref = first_forward(ARCHITECTURES[name], compiled, model)
            result[name] = {"keys": sorted(r.key for r in records.records()),
                            "compiles": sum(r.compiles for r in records.records()),
                            "diff": (out - ref).abs().max().item()}
        except Exception as e:  # reported to the parent test, which fails with it
            while e.__cause__ is not None:
                e = e.__cause__
            result[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
