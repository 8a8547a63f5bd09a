"""How a compiled graph's call is dispatched: straight to the graph when aot_autograd's wrapper adds nothing.

The wrapper's per-call work (aliases, tokens, subclasses, RNG, autograd) is wasted on an inference decode step,
which needs only the copy-back of mutated inputs; :func:`plan` says whether a graph is that *plain*.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from neuron_args import envs

log = logging.getLogger("neuron_args.seams")

#: set to 0 to keep aot_autograd's runtime wrapper for every graph
ENV = "NEURON_ARGS_DIRECT_CALL"
# aot_autograd's output types it returns as the graph computed them (no alias regenerated)
OWNED = frozenset({"non_alias", "unsafe_view_alias", "custom_function_view"})


class NotPlain(Exception):
    """aot_autograd's wrapper does more for this graph than copy mutated inputs back; the reason says what."""


@dataclass(frozen=True)
class Plan:
    """A graph's plain runtime needs (the trace memo keeps them too): outputs ``[:n_mutated]`` update mutated inputs."""

    n_args: int
    n_outputs: int  # user outputs, after the mutated ones
    mutated: tuple[tuple[int, int, bool], ...]  # (argument index, output index, leaf: detach before copy)
    kinds: tuple[str, ...]  # per user output: aot_autograd's output type (``non_alias``, ``is_input``, ...)

    @property
    def n_mutated(self) -> int:
        return len(self.mutated)


def plan(md: Any, n_args: int) -> Plan:
    """A graph's plain plan from aot_autograd's metadata (or the memo's :class:`Plan`), else :class:`NotPlain`."""
    if md is None:
        raise NotPlain("aot_autograd's metadata was not recorded for the graph")
    if isinstance(md, Plan):
        if md.n_args != n_args:
            raise NotPlain(f"the graph takes {md.n_args} arguments in its recorded plan, {n_args} here")
        return md
    if len(md.input_info) != n_args:
        raise NotPlain(f"the graph takes {len(md.input_info)} arguments in aot_autograd's metadata, "
                       f"{n_args} here (lifted parameters or deduplicated inputs)")
    if md.num_intermediate_bases or md.tokens or md.is_rng_op_functionalized or md.num_outputs_rng_offset:
        raise NotPlain("the graph returns intermediate bases, effect tokens or RNG state")
    if any(not isinstance(m, int) and type(m).__name__ != "PlainTensorMeta"
           for m in (*md.subclass_inp_meta, *md.subclass_fw_graph_out_meta)):
        raise NotPlain("the graph takes or returns tensor subclasses")
    if md.grad_enabled_mutation is not None or md.dynamic_outputs:
        raise NotPlain("the graph changes grad mode or returns dynamic shapes")
    if any(s is not None for s in md.mutated_inp_stream_indices or ()):
        raise NotPlain("the graph mutates an input on a user stream")
    mutated = []
    for j, i in enumerate(md.mutated_inp_runtime_indices):
        info = md.input_info[i]
        if info.mutates_metadata or info.mutates_storage_metadata or not info.mutates_data:
            raise NotPlain(f"graph input {i} has a metadata mutation (as_strided_/set_)")
        mutated.append((i, j, bool(info.is_leaf)))
    if any(info.mutates_data and i not in md.mutated_inp_runtime_indices for i, info in enumerate(md.input_info)):
        raise NotPlain("a mutation is kept inside the graph")
    kinds = tuple(o.output_type.name for o in md.output_info)
    for k, kind in enumerate(kinds):
        if kind not in OWNED:  # aot_autograd regenerates aliases of inputs/intermediates itself
            raise NotPlain(f"graph output {k} aliases ({kind}) rather than owns its data")
    return Plan(n_args=n_args, n_outputs=len(md.output_info), mutated=tuple(mutated), kinds=kinds)


def inputs_need_aot(example_inputs: Sequence[Any], gm: torch.fx.GraphModule) -> str | None:
    """What of the trace itself needs aot's runtime wrapper (None: nothing); asked before aot_autograd runs."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not envs.flag(ENV):
        return f"{ENV}=0"
    tracing = torch._guards.TracingContext.try_get()
    if tracing is not None and getattr(tracing, "fakify_first_call", False):
        return "the first call returns fake outputs (fakify_first_call)"
    if torch._C._is_any_autocast_enabled():
        return "autocast is on"
    if not all(isinstance(x, torch.Tensor) and not is_traceable_wrapper_subclass(x) for x in example_inputs):
        return "an input is not a plain tensor"
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        return "the graph needs autograd"
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return "the graph module holds parameters or buffers aot_autograd lifts"
    if len({StorageWeakRef(x.untyped_storage()) for x in example_inputs}) != len(example_inputs):
        return "two inputs are the same tensor or share storage (aot deduplicates them or makes a synthetic base)"
    return None


def direct_call(graph: Any, plan_: Plan) -> Callable[..., Any]:
    """Dynamo's unboxed call of the boxed ``graph``: grad off (as aot does), then aot's epilogue as straight-line
    ``copy_`` of each new value into its mutated input (a leaf that requires grad through ``detach``)."""
    n, total = plan_.n_mutated, plan_.n_mutated + plan_.n_outputs
    lines = [
        "def direct(*args):",
        "    if is_grad_enabled():",
        "        set_grad_enabled(False)",
        "        try:",
        "            outs = graph(args)",
        "        finally:",
        "            set_grad_enabled(True)",
        "    else:",
        "        outs = graph(args)",
        f"    if len(outs) != {total}:",
        f"        raise AssertionError(f'the compiled graph returned {{len(outs)}} outputs, not {total}')",
    ]
    for i, j, leaf in plan_.mutated:
        lines += ([f"    t = args[{i}]", f"    (t.detach() if t.requires_grad else t).copy_(outs[{j}])"] if leaf
                  else [f"    args[{i}].copy_(outs[{j}])"])
    lines.append(f"    return outs[{n}:]" if n else "    return outs")
    namespace = {"graph": graph, "is_grad_enabled": torch.is_grad_enabled,
                 "set_grad_enabled": torch._C._set_grad_enabled}
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<neuron_args.seams.dispatch direct>", "exec"), namespace)  # noqa: S102 - generated here
    direct = namespace["direct"]
    direct.graph = graph  # type: ignore[attr-defined]
    direct.plan = plan_  # type: ignore[attr-defined]
    return direct


def direct_plan(graphs: Sequence[Any], gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Plan | None:
    """The plan for :func:`direct_call` of ``graphs[0]`` (None: keep aot's wrapper); inside Dynamo's tracing context."""
    why = (f"aot_autograd compiled {len(graphs)} graphs (a forward and backward)" if len(graphs) != 1
           else inputs_need_aot(example_inputs, gm))
    if why is None:
        try:
            return plan(graphs[0].fw_metadata, len(example_inputs))
        except NotPlain as exc:
            why = str(exc)
    log.debug("graph keeps aot_autograd's runtime wrapper: %s", why)
    return None
