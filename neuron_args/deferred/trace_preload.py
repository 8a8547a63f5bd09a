"""Everything a trace child needs, imported once: torch, Dynamo, the capture seam, jax and torchax.

Imported for its effect by the process trace children start from: the caller before it forks
them, or the fork server ``parallel_trace`` starts once jax's client exists in the caller.
Importing jax creates no client, so a process that imported this still forks safely.
"""
from neuron_args.lowering import hlo  # noqa: F401
from neuron_args.lowering.torchax_compat import import_torchax
from neuron_args.seams import backends  # noqa: F401

import_torchax()
