"""The scope a backward graph compiles under: its own forward call's, carried on that call's autograd node.

A forward graph may run under several scopes before any ``loss.backward()`` (``-O1`` for one batch, ``-O3`` for
the next), and the backward usually runs outside them all. So the scope is not a property of the graph but of
one forward call: right after the call, it is set on the autograd node aot_autograd made for that call (the
``ctx`` of its ``CompiledFunction``, which the outputs' ``grad_fn`` reaches), and the backward graph reads it from
the node autograd is running (``torch._C._current_autograd_node()``).
"""
from __future__ import annotations

from typing import Any

import torch

#: a scope as a variant picks it: the scoped compiler args (None: none) and the scope's graph type
Scope = tuple[tuple[str, ...] | None, str | None]

#: the attribute of aot_autograd's backward node (its ctx) that holds its forward call's scope
_ATTRIBUTE = "_neuron_args_forward_scope"
#: autograd nodes between an output and aot's node (views and aliases aot's runtime wrapper regenerates)
_DEPTH = 4


def tag_backward_node(outputs: Any, scope: Scope) -> None:
    """Set ``scope`` on the aot_autograd backward node the call that returned ``outputs`` created.

    Each path from an output stops at the first aot node; a node already tagged belongs to an earlier call (every
    call tags its own as it returns), so only this call's node is set.
    """
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    stack = [(o.grad_fn, 0) for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if node is None or id(node) in seen or depth > _DEPTH:
            continue
        seen.add(id(node))
        if _is_aot_node(node):
            if not hasattr(node, _ATTRIBUTE):
                setattr(node, _ATTRIBUTE, scope)
            continue
        stack.extend((n, depth + 1) for n, _ in node.next_functions)


def _is_aot_node(node: Any) -> bool:
    """``node`` is the backward node of an aot_autograd ``CompiledFunction`` call (its ``ctx``)."""
    return hasattr(getattr(node, "_forward_cls", None), "_aot_id")


def running_forward_scope() -> Scope | None:
    """The scope of the forward call whose backward autograd is running now; None outside such a backward
    (compiled autograd, a backward graph called by hand)."""
    node = torch._C._current_autograd_node()
    return getattr(node, _ATTRIBUTE, None) if node is not None else None
