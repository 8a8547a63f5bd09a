"""Thin access to jaxlib's XLA:CPU PJRT clients: compile an HloModuleProto, (de)serialize.

Executables run on a synchronous client of our own (2.3-6x faster here, ``benchmarks/bench_serve.py``); jax is
imported on first use only: a process that forks after its clients started threads gets children that hang.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from neuron_args import envs
from neuron_args.lazy_modules import jax, xla_client

#: set to 1 to execute on jax's asynchronous CPU client instead of the synchronous one
ASYNC_ENV = "NEURON_ARGS_XLA_CPU_ASYNC"

@functools.cache
def cpu_client() -> Any:
    """jax's XLA:CPU client (created on first call); the local compiler compiles on it."""
    return jax.devices("cpu")[0].client


@functools.cache
def sync_client() -> Any:
    """A synchronous XLA:CPU client of our own (created on first call): executables run on the calling thread."""
    return jax._src.lib.xla_client.make_cpu_client(asynchronous=False, num_devices=1)  # imports jax: its arrays


def clients_created() -> bool:
    """True once this process created a client: forking is unsafe from then on (children would hang)."""
    return bool(cpu_client.cache_info().currsize or sync_client.cache_info().currsize)


def is_sync_client(client: Any) -> bool:
    """True for :func:`sync_client` (without creating it)."""
    return bool(sync_client.cache_info().currsize) and client is sync_client()


def runtime_client() -> Any:
    """The client executables are loaded on and run by: synchronous unless ``NEURON_ARGS_XLA_CPU_ASYNC=1``."""
    return cpu_client() if envs.flag(ASYNC_ENV) else sync_client()


def _placement(client: Any, env_overrides: Sequence[tuple[str, Any]] = ()) -> tuple[Any, Any]:
    """What compiling and loading on ``client`` take: its first device, and options with jax's overrides."""
    opts = xla_client.CompileOptions()
    opts.env_option_overrides = list(env_overrides)
    return xla_client.DeviceList(tuple(client.devices()[:1])), opts


def compile_hlo(hlo_module_proto: bytes, env_overrides: Sequence[tuple[str, Any]] = (), client: Any = None) -> bytes:
    """HloModuleProto bytes compiled for XLA:CPU on ``client`` (default :func:`cpu_client`), serialized."""
    client = client if client is not None else cpu_client()
    mlir = xla_client._xla.mlir.hlo_to_stablehlo(hlo_module_proto)
    exe = client.compile_and_load(mlir, *_placement(client, env_overrides))
    return client.serialize_executable(exe)


def deserialize_executable(blob: bytes, client: Any = None) -> Any:
    """Load a serialized executable written by :func:`compile_hlo` (on :func:`runtime_client` by default)."""
    client = client if client is not None else runtime_client()
    if b"lapack_" in blob:
        _initialize_lapack()
    return client.deserialize_executable(blob, *_placement(client))


@functools.cache
def _initialize_lapack() -> None:
    """Fill jaxlib's LAPACK function table, as jax's lowering of a linalg op does: an executable calling LAPACK
    crashes (SIGSEGV) in a serving process that never lowered one."""
    from jaxlib.lapack import _lapack

    _lapack.initialize()
