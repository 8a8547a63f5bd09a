"""The scope a backward graph compiles under: its own forward call's, carried on that call's autograd node.

A forward may run under several scopes before any ``backward()``, which runs outside them all: so the scope is
set on aot_autograd's node of each call and read back from the node autograd is running.
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
    """Set ``scope`` on the aot_autograd node of the call that returned ``outputs`` (one tagged is an earlier call's)."""
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    stack = [(o.grad_fn, 0) for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if node is None or id(node) in seen or depth > _DEPTH:
            continue
        seen.add(id(node))
        if hasattr(getattr(node, "_forward_cls", None), "_aot_id"):  # aot_autograd's CompiledFunction node (its ctx)
            if not hasattr(node, _ATTRIBUTE):
                setattr(node, _ATTRIBUTE, scope)
            continue
        stack.extend((n, depth + 1) for n, _ in node.next_functions)


def running_forward_scope() -> Scope | None:
    """The scope of the forward call whose backward autograd is running now, else None."""
    node = torch._C._current_autograd_node()
    return getattr(node, _ATTRIBUTE, None) if node is not None else None
