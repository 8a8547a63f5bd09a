"""Start data-parallel engines of tensor-parallel ranks on one host (a small torchrun for CPU CI): each engine
its own ``NEURON_VISIBLE_DEVICES`` window (so its own manifest) and rendezvous port.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuron_args import envs

ENGINE_ENV = "NEURON_ARGS_ENGINE"
DP_ENV = "NEURON_ARGS_DP"


@dataclass(frozen=True)
class WorkerInfo:
    """Where this process sits: its rank in the engine's TP group and which engine."""

    rank: int
    world_size: int
    engine: int
    dp: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def worker_info() -> WorkerInfo:
    return WorkerInfo(envs.RANK, envs.WORLD_SIZE, envs.NEURON_ARGS_ENGINE, envs.NEURON_ARGS_DP)


def device_window(engine: int, cores_per_engine: int) -> str:
    first = engine * cores_per_engine
    return f"{first}-{first + cores_per_engine - 1}" if cores_per_engine > 1 else str(first)


def launch(
    argv: Sequence[str],
    *,
    tp: int = 1,
    dp: int = 1,
    cores_per_engine: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> int:
    """Run ``python <argv>`` as ``dp`` engines x ``tp`` ranks; return the worst exit code."""
    cores = cores_per_engine or max(tp, 2)
    procs = []
    for engine in range(dp):
        with socket.socket() as s:  # a free rendezvous port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for rank in range(tp):
            child_env = {
                **envs.snapshot(), **(env or {}),
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(tp),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "NEURON_VISIBLE_DEVICES": device_window(engine, cores),
                ENGINE_ENV: str(engine), DP_ENV: str(dp), "OMP_NUM_THREADS": "1",
            }
            procs.append(subprocess.Popen([sys.executable, *argv], env=child_env, cwd=cwd))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return max((abs(c) for c in codes), default=0)
