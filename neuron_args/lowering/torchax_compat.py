"""Import torchax 0.0.13 on torch 2.13.0+cpu and jax 0.10.2 without breaking the rest of the process: imported as-is,
torchax fails or leaves torch state that breaks every other ``torch.compile``. :func:`import_torchax` works around:

1. torchax names 22 named-tensor overloads torch 2.13 removed: a missing one resolves, during the
   import only, to a placeholder that raises if called (ATen graphs never contain them).
2. torchax renames privateuse1 to ``"jax"`` and registers a device module that is available: Dynamo
   then asks that accelerator for a stream and every torch.compile fails (the rename also raises when
   ``neuron`` owns privateuse1, and breaks ``torch.distributed.barrier()``). Neither is let through.
3. torchax tensors report device ``jax:0``, which torch cannot parse then: they report ``cpu``, the
   device the aot graph was traced on, so decompositions build helper tensors as they did while tracing.
4. torchax turns the ``torch.backends.mha`` fast path off process-wide: restored, so traced graphs
   (and keys) do not depend on whether a graph was lowered earlier.

It imports jax but creates no jax client, so it is fork-safe until the first lowering.
"""
from __future__ import annotations

import functools
import threading
from types import ModuleType
from typing import Any

#: Overload names torchax asked for that this torch does not have (problem 1), for diagnostics.
MISSING_OVERLOADS: list[str] = []
#: The environments our lowerings are installed in (the last: the current one), for a lowering that reaches it (a
#: backward's forward op, a random draw) without importing the registry (:mod:`~neuron_args.lowering.ops`).
INSTALLED: list[Any] = []

_lock = threading.Lock()


def _missing_overload(name: str, *args: Any, **kwargs: Any) -> Any:
    """Stands in (bound to ``name``) for an overload torch removed; only fails if a graph really calls it."""
    raise NotImplementedError(f"{name} does not exist in this torch version")


def import_torchax() -> ModuleType:
    """Import torchax (and the op tables its Environment loads) once; return the module."""
    with _lock:  # one thread imports, the others wait for it
        return _import()


@functools.cache
def _import() -> ModuleType:
    import torch
    import torch._ops as ops

    orig_getattr = ops.OpOverloadPacket.__getattr__
    orig_rename = torch.utils.rename_privateuse1_backend
    orig_register = torch._register_device_module
    fastpath = torch.backends.mha.get_fastpath_enabled()

    def getattr_or_placeholder(self: Any, key: str) -> Any:  # problem 1
        try:
            return orig_getattr(self, key)
        except AttributeError:
            if key.startswith("_") or key == "default":
                raise
            MISSING_OVERLOADS.append(f"{self._qualified_op_name}.{key}")
            return functools.partial(_missing_overload, MISSING_OVERLOADS[-1])

    ops.OpOverloadPacket.__getattr__ = getattr_or_placeholder
    # problem 2: torchax must not rename or register privateuse1 (whoever owns it, or nobody)
    torch.utils.rename_privateuse1_backend = lambda name: None
    torch._register_device_module = lambda name, mod: None
    try:
        import torchax
        import torchax.decompositions  # noqa: F401  (what Environment.load_ops imports)
        import torchax.ops.jaten  # noqa: F401
        import torchax.ops.jc10d  # noqa: F401
        import torchax.ops.jtorch  # noqa: F401
        import torchax.ops.jtorchvision_nms  # noqa: F401
    finally:
        ops.OpOverloadPacket.__getattr__ = orig_getattr
        torch.utils.rename_privateuse1_backend = orig_rename
        torch._register_device_module = orig_register
        torch.backends.mha.set_fastpath_enabled(fastpath)  # problem 4
    import torchax.device_module
    import torchax.tensor
    import torchax.view

    torchax.device_module.is_available = lambda: False  # problem 2: accelerator stays off
    device = torch.device("cpu")  # problem 3: the one place a torchax device is named
    torchax.tensor.Tensor.device = property(lambda self: device)
    torchax.view.View.device = property(lambda self: device)
    return torchax
