"""Thin access to jaxlib's XLA:CPU PJRT client: compile an HloModuleProto, (de)serialize, execute.

The embedded local compiler (a subprocess) compiles with it; the runtime loads and runs what it
wrote. jax is imported on first use only: its client starts threads, and a process that forks
after that gets children that hang (see DESIGN.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_client_cache: list[Any] = []


def cpu_client() -> Any:
    """The process's XLA:CPU client (created on first call)."""
    if not _client_cache:
        import jax

        _client_cache.append(jax.devices("cpu")[0].client)
    return _client_cache[0]


def jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def compile_options(env_overrides: Sequence[tuple[str, Any]] = ()) -> Any:
    from jax._src.lib import xla_client as xc

    opts = xc.CompileOptions()
    opts.env_option_overrides = list(env_overrides)
    return opts


def _device_list(client: Any) -> Any:
    from jax._src.lib import xla_client as xc

    return xc.DeviceList(tuple(client.devices()[:1]))


def compile_hlo(hlo_module_proto: bytes, env_overrides: Sequence[tuple[str, Any]] = ()) -> bytes:
    """Compile HloModuleProto bytes for XLA:CPU and return the serialized executable."""
    from jax._src.lib import xla_client as xc

    client = cpu_client()
    mlir = xc._xla.mlir.hlo_to_stablehlo(hlo_module_proto)
    exe = client.compile_and_load(mlir, _device_list(client), compile_options(env_overrides))
    return client.serialize_executable(exe)


def deserialize_executable(blob: bytes) -> Any:
    """Load a serialized executable written by :func:`compile_hlo`."""
    client = cpu_client()
    return client.deserialize_executable(blob, _device_list(client), compile_options())


def execute(executable: Any, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a loaded executable on host arrays; outputs are read-only views of runtime buffers.

    Arrays go to the device through jaxlib's ``batched_device_put`` with a cached abstract
    value per (shape, dtype): ``jax.device_put`` costs ~90 us of Python per array, this ~13 us.
    """
    device = executable.local_devices()[0]
    put = _placers.get(device) or _placer(device)
    result = executable.execute_sharded([put(a) for a in arrays])
    return [np.asarray(out[0]) for out in result.disassemble_into_single_device_arrays()]


_placers: dict[Any, Any] = {}


def _placer(device: Any) -> Any:
    """``put(array) -> device buffer`` for one device, jax.device_put semantics without its cost."""
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

    _placers[device] = put
    return put
