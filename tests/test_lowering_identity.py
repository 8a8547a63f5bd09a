"""The built-in lowerings digest the same in every process (no memory address in the trace memo's fingerprint), so a
fresh process uses the memo another wrote: a ``functools.partial`` bound to a function is digested by its ``repr``."""
import functools

from neuron_args.lowering import ops
from neuron_args.seams import trace_memo


def test_every_builtin_lowering_digests_without_a_memory_address():
    builtin = {name: fn for name, fn in ops.LOWERINGS.items()
               if getattr(fn.func if isinstance(fn, functools.partial) else fn, "__module__", "").startswith(
                   "neuron_args.lowering")}
    assert len(builtin) > 80  # every family's lowerings, not an empty selection
    digests = {name: trace_memo._callable_digest(fn) for name, fn in builtin.items()}
    assert {name: digest for name, digest in digests.items() if " at 0x" in digest} == {}
