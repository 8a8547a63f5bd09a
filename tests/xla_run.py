"""A forward compiler that lowers a graph and runs it on XLA:CPU in this process, as the local compiler would; and
numpy arrays through a loaded executable (tests and benchmarks: the library runs torch tensors, ``runtime.py``)."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from neuron_args import xla_cpu
from neuron_args.compilers.local_xla import FIDELITY_OPTIONS
from neuron_args.lowering.hlo import LoweredGraph, lower_fx_graph
from neuron_args.runtime import LoadedExecutable, graph_call


def executable_runner(lowered: LoweredGraph) -> Callable[..., list[torch.Tensor]]:
    """Compile ``lowered`` with the local compiler's XLA options; a runner aot_autograd can call."""
    exe = LoadedExecutable.from_bytes(xla_cpu.compile_hlo(lowered.hlo_module_proto, list(FIDELITY_OPTIONS)),
                                      lowered.input_specs, lowered.output_specs)
    call = graph_call(exe, lowered)

    def run(*args: torch.Tensor) -> list[torch.Tensor]:
        return call(*args)

    run._boxed_call = False  # type: ignore[attr-defined]
    return run


def run_on_xla_cpu(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., list[torch.Tensor]]:
    return executable_runner(lower_fx_graph(gm, example_inputs))


def execute(executable: Any, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a loaded executable on host arrays; outputs are read-only views of runtime buffers."""
    put = placer(executable.local_devices()[0])
    result = executable.execute_sharded([put(a) for a in arrays])
    return [np.asarray(out[0]) for out in result.disassemble_into_single_device_arrays()]


@functools.cache
def placer(device: Any) -> Callable[[Any], Any]:
    """``put(host array) -> device buffer`` for one device: jax.device_put (~90 us per array) in ~2.5 us, with a
    cached abstract value per (shape, dtype). A dense aligned array is aliased, not copied."""
    from jax import dtypes
    from jax._src import core
    from jax._src.lib import xla_client as xc
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    devices = [device]
    avals: dict[tuple[Any, ...], tuple[Any, Any]] = {}
    batched_device_put = xc.batched_device_put

    def put(a: Any) -> Any:
        if type(a) is not np.ndarray:
            a = np.asarray(a)
        entry = avals.get((a.shape, a.dtype))
        if entry is None:
            # jax x64 off: int64/float64 host arrays become 32-bit, as jax.device_put does
            canonical = np.dtype(dtypes.canonicalize_dtype(a.dtype))
            cast = None if canonical == a.dtype else canonical
            entry = avals[(a.shape, a.dtype)] = (core.ShapedArray(a.shape, canonical), cast)
        aval, cast = entry
        if cast is not None:
            a = a.astype(cast)
        return batched_device_put(aval, sharding, [a], devices, True)

    return put
