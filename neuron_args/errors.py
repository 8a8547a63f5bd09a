"""The errors a user of neuron-args can cause or catch: one ``except NeuronArgsError`` catches them all."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NeuronArgsError(Exception):
    """Base of every error neuron-args raises on purpose."""


class CompilerArgsError(NeuronArgsError, ValueError):
    """A neuronx-cc argument list is malformed or holds an unknown flag."""


class CompilerArgsWarning(UserWarning):
    """A neuronx-cc argument list that is likely a mistake (an option twice with different values)."""


class OptionsError(NeuronArgsError, ValueError):
    """A torch.compile option or environment setting of neuron-args is malformed."""


class PolicyError(NeuronArgsError):
    """A model's ``compiler_args_for`` policy raised, returned a wrong type, or is not deterministic."""


class CacheMissError(NeuronArgsError):
    """A graph was not in the compile cache while ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` was set."""


class CorruptEntryError(NeuronArgsError):
    """A cache entry cannot be used as recorded (moved aside and rebuilt); ``problem`` says why, without its name."""

    def __init__(self, message: str, *, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem or message


class CacheKeyArgsConflict(NeuronArgsError):
    """One cache key (native seam: graph and shapes only) was compiled with two argument sets."""


class CompileError(NeuronArgsError):
    """The compiler (neuronx-cc or the embedded local compiler) failed for one graph."""


class LoweringError(NeuronArgsError):
    """An FX graph could not be lowered to HLO (symbolic shapes, an unsupported op...)."""


class TraceError(NeuronArgsError):
    """A parallel-trace child crashed, hung or raised; ``results`` holds every job's ``TraceResult`` in order."""

    def __init__(self, message: str, results: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.results = list(results)
