"""Everything a trace child needs, imported once: torch, Dynamo, aot_autograd, the capture seam, jax and torchax.

Imported by the process trace children fork from (importing jax creates no client, so forking stays safe);
:data:`FIRST_COMPILE_IMPORTS` are the lazy imports of a first compile, which each child would repeat.
"""
import contextlib
import importlib

import torch._dynamo

from neuron_args.lowering import hlo  # noqa: F401
from neuron_args.lowering.torchax_compat import import_torchax
from neuron_args.seams import backends  # noqa: F401

#: Modules the first torch.compile + lowering of a graph imports (torch 2.13, jax 0.10); absent ones are skipped.
FIRST_COMPILE_IMPORTS = (
    "torch._dynamo.backends.common",
    "torch._dynamo.repro.after_aot",
    "torch._functorch.aot_autograd",
    "torch._higher_order_ops.passes.inline_invoke_subgraph",
    "torch._inductor.async_compile",
    "torch._inductor.scheduler",
    "torch.distributed.tensor.experimental",
    "torch.export._trace",
    "torch.fx.experimental.validator",
    "torch.nn.attention.flex_attention",
    "jaxlib.mlir.dialects.builtin",
    "jaxlib.mlir.dialects.mhlo",
)

import_torchax()
for _name in FIRST_COMPILE_IMPORTS:
    with contextlib.suppress(ImportError):  # another torch/jax build: that child imports what it needs itself
        importlib.import_module(_name)
torch._dynamo.list_backends(exclude_tags=())  # imports every registered backend module (Dynamo does on first use)
