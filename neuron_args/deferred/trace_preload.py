"""Everything a trace child needs, imported once: torch, Dynamo, aot_autograd, the capture seam, jax and torchax.

Imported for its effect by the process trace children start from: the caller before it forks
them, or the fork server ``parallel_trace`` starts once jax's client exists in the caller.
Importing jax creates no client, so a process that imported this still forks safely.

Beyond the seam's own imports it loads what Dynamo, aot_autograd and the lowering import lazily
during their first compile (:data:`FIRST_COMPILE_IMPORTS`, found by listing ``sys.modules``
around a child's first trace); otherwise every child imports them again in its first job.
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
