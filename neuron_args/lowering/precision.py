"""A graph computing in float64 or complex128 is refused, naming the tensor: jax x64 is off and Neuron devices have no
64-bit float arithmetic (it would silently be float32). Moving values through float64 stays allowed: it is exact."""
from __future__ import annotations

from typing import Any

import torch

WIDE = (torch.float64, torch.complex128)

aten = torch.ops.aten
#: ops that move a 64-bit value without arithmetic (a conversion to or from float64 is exact, or rounds once to
#: the narrower type as eager does)
EXACT: frozenset[Any] = frozenset({
    aten._to_copy.default, torch.ops.prims.convert_element_type.default, aten.clone.default, aten.copy.default,
    aten.copy_.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.t.default, aten.transpose.int, aten.expand.default, aten.slice.Tensor, aten.select.int,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.alias.default,
    aten.detach.default, aten.cat.default, aten.stack.default, aten.lift_fresh_copy.default,
    aten.view_as_real.default, aten.view_as_complex.default, aten.real.default, aten.imag.default,
})
#: ops that make a constant: a 0-dim float64 one is torch's own (``linalg.matrix_rank``'s tolerance), not a request
CONSTANTS: frozenset[Any] = frozenset({
    aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default, aten.full_like.default,
    aten.zeros_like.default, aten.ones_like.default,
})


def _wide(val: Any) -> torch.dtype | None:
    """The 64-bit float dtype among ``val``'s tensors (a node's ``meta["val"]``), or None."""
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return next((v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype in WIDE), None)


def refusal(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, ValueError, str] | None:
    """The first node computing a float64/complex128 value the caller asked for (an input, a conversion up, a
    non-scalar constant, ``dtype=``, or computed from those; not torch's own 0-dim constants), why, and the fix."""
    asked: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        dtype = _wide(val)
        if dtype is None or n.op not in ("placeholder", "call_function"):
            continue
        if n.op == "placeholder":
            asked.add(n)
            continue
        inputs = n.all_input_nodes
        requested = any(i in asked for i in inputs) or n.kwargs.get("dtype") in WIDE
        if n.target in CONSTANTS and not any(i in asked for i in inputs):
            if getattr(val, "dim", lambda: 0)() > 0:
                asked.add(n)
        elif n.target in EXACT:
            if requested or any(_wide(i.meta.get("val")) is None for i in inputs):  # a conversion up
                asked.add(n)
        elif requested:
            narrow = "float32" if dtype is torch.float64 else "complex64"
            why = (f"it computes a {str(dtype).removeprefix('torch.')} tensor, which a Neuron graph cannot run: Neuron "
                   f"devices have no 64-bit float arithmetic, and the graph would silently compute it in {narrow}")
            return n, ValueError(why), (f"compute in {narrow} (.float(), dtype=torch.{narrow} where the tensor is "
                                        f"made, torch.set_default_dtype(torch.{narrow})), or compute that part outside "
                                        "the compiled graph")
    return None
