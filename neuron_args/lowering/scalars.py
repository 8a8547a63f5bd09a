"""Tensor values read into Python scalars (``.item()``) and used only as values (an ``arange`` offset, a ``max``, a
scalar operand) stay traced 0-d arrays: one static graph. A size taken from the value still fails."""
from __future__ import annotations

import operator
from typing import Any

import torch

aten = torch.ops.aten


class NotAValue(ValueError):
    """A value read from a tensor that the graph uses as more than a value; ``node`` is that use (its line is the
    user's, where the read may be a library's)."""

    def __init__(self, use: str, node: torch.fx.Node) -> None:
        super().__init__(f"the value read is used as more than a value (a size, a slice bound, a branch): {use}")
        self.node = node


#: Python arithmetic on a read scalar (Dynamo records it as these FX targets): its result is a traced scalar too
_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.neg, operator.floordiv, operator.mod,
                         torch.sym_max, torch.sym_min})
_COMPARISONS = frozenset({operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge})


def _used_as_value(read: torch.fx.Node) -> tuple[str, torch.fx.Node] | None:
    """None if every use of ``read``'s value is a value use (arithmetic, a pointwise op's scalar operand, an ``arange``
    bound, a runtime check); else the first other use (a size, a slice bound, a branch), named, and its node."""
    pending, seen, misuses = [read], {read}, []
    while pending:
        for user in pending.pop().users:
            if user in seen:
                continue
            seen.add(user)
            target = user.target
            if target in _ARITHMETIC:
                pending.append(user)
            elif target in _COMPARISONS or target in TRACED or target is aten._assert_scalar.default:
                if target in _COMPARISONS and any(u.target is not aten._assert_scalar.default for u in user.users):
                    misuses.append((f"FX node {user.name!r} (a comparison: a branch on the value)", user))
            elif not (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags):
                misuses.append((f"FX node {user.name!r} ({getattr(target, '__name__', target)})", user))
    if not misuses:
        return None
    order = {node: i for i, node in enumerate(read.graph.nodes)}
    return min(misuses, key=lambda misuse: order[misuse[1]])


def _arange(node: torch.fx.Node, start: Any, end: Any = None, step: Any = 1, **_: Any) -> Any:
    """``aten.arange.start{,_step}`` with a traced bound: ``start + step * iota(n)``, ``n`` the length torch traced."""
    val = node.meta["val"]
    n = val.shape[0]
    if not isinstance(n, int):
        raise ValueError(f"arange's length {n} depends on tensor values; keep end - start a constant")
    start = start if isinstance(start, torch.Tensor) else torch.full((), start, dtype=val.dtype)
    return (start.to(val.dtype) + torch.arange(n, dtype=val.dtype) * step).to(val.dtype)


def _scalar_tensor(node: torch.fx.Node, value: Any, **_: Any) -> Any:
    """``aten.scalar_tensor`` of a traced scalar: the value as a 0-d tensor of the dtype torch traced."""
    return value.to(node.meta["val"].dtype)


def _extremum(pick: Any) -> Any:
    def lower(node: torch.fx.Node, a: Any, b: Any) -> Any:
        like = a if isinstance(a, torch.Tensor) else b
        a, b = (x if isinstance(x, torch.Tensor) else torch.full((), x, dtype=like.dtype) for x in (a, b))
        return pick(a, b)
    return lower


#: FX targets that take or make a traced scalar, and their lowering ``(node, *args, **kwargs)``; used when an
#: argument is traced (or always, for the read itself)
TRACED: dict[Any, Any] = {
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
    aten.scalar_tensor.default: _scalar_tensor,
    torch.sym_max: _extremum(torch.maximum),
    torch.sym_min: _extremum(torch.minimum),
}


def lower(target: Any, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
    """The lowering of ``target`` when it reads or takes a traced scalar, else ``NotImplemented``."""
    if target is aten._local_scalar_dense.default:  # the value as a traced 0-d array, if used as a value only
        misuse = _used_as_value(node)
        if misuse is not None:
            raise NotAValue(*misuse)
        return args[0].reshape(())
    if target in TRACED and any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
        return TRACED[target](node, *args, **kwargs)
    return NotImplemented
