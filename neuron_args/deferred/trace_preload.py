"""Everything a trace child needs, imported once: torch, Dynamo, aot_autograd, the capture seam, jax and torchax.

Imported for its effect by the process trace children start from: the caller before it forks
them, or the fork server ``parallel_trace`` starts once jax's client exists in the caller.
Importing jax creates no client, so a process that imported this still forks safely.

Beyond the seam's own imports, it loads what Dynamo imports lazily on its first compile (the
registered backends, aot_autograd, torch.export's tracer) and the MLIR dialects the lowering
emits: otherwise each child imports them again in its first job (measured 0.3-0.4 s of its
0.6-0.7 s first trace on a 2-core machine).
"""
import jaxlib.mlir.dialects.mhlo  # noqa: F401
import torch._dynamo
import torch._dynamo.backends.common  # noqa: F401
import torch._functorch.aot_autograd  # noqa: F401
import torch.export._trace  # noqa: F401

from neuron_args.lowering import hlo  # noqa: F401
from neuron_args.lowering.torchax_compat import import_torchax
from neuron_args.seams import backends  # noqa: F401

import_torchax()
torch._dynamo.list_backends(exclude_tags=())  # imports every registered backend module (Dynamo does on first use)
