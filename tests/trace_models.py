"""Models for parallel-trace tests; importable, so spawn-started children can unpickle them."""
from __future__ import annotations

import os
import signal
import time

import torch


class Crashing(torch.nn.Module):
    """Kills its own process in forward (a trace child that crashes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGSEGV)
        return x


class Hanging(torch.nn.Module):
    """Never returns (a trace child that hangs until its deadline)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(3600)
        return x


class Raising(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad bucket")


class Unpicklable(torch.nn.Module):
    """Holds a lambda, so it cannot be pickled to a spawned trace child."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = lambda x: x * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x)


def _refuse_to_unpickle() -> None:
    raise RuntimeError("this model refuses to unpickle")


class FailsToUnpickle(torch.nn.Module):
    """Pickles, but unpickling it (in a spawned trace child) raises."""

    def __reduce__(self) -> tuple:
        return (_refuse_to_unpickle, ())


def fork_server() -> str:
    """The ``start_method`` of the tests' in-process trace children: a fork server that imported the lowering stack.

    Once an earlier test ran a graph in the pytest process (jax's client exists), forking is unsafe and a plain
    ``parallel_trace`` falls back to spawn: every child a fresh interpreter importing torch, jax and torchax again
    (several seconds each). Children from the fork server (the path a runner takes then) get the same pickled jobs,
    options and environment; the fork and spawn paths keep fresh-process tests of their own.
    """
    import multiprocessing

    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["neuron_args.deferred.trace_preload", "tests.models", "tests.trace_models"])  # until the server starts
    return "forkserver"
