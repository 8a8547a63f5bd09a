"""A forward compiler that lowers a graph and runs it on XLA:CPU in this process, as the local compiler would."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
