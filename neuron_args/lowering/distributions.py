"""Random draws torchax does not lower in their functional forms (``exponential``, ``cauchy``, ``log_normal``,
``normal``; ``torch.normal(..., dtype=)``), from the graph's key input as dropout does: repeatable per torch seed,
not eager's numbers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_args.lazy_modules import jax
from neuron_args.lowering.torchax_compat import INSTALLED


def _draw(sample: Callable[..., Any]) -> Callable[..., Any]:
    """A lowering ``(x, *params, generator=None)``: ``sample(jax, key, x.shape, *params)`` in ``x``'s dtype."""
    def lowering(x: Any, *params: Any, generator: Any = None) -> Any:
        key = INSTALLED[-1].get_and_rotate_prng_key(generator)
        return sample(jax, key, x.shape, *params).astype(x.dtype)

    return lowering


def _normal(jax: Any, key: Any, shape: Any, mean: float = 0.0, std: float = 1.0) -> Any:
    return mean + std * jax.random.normal(key, shape)


normal = _draw(_normal)
exponential = _draw(lambda jax, key, shape, lambd=1.0: jax.random.exponential(key, shape) / lambd)
cauchy = _draw(lambda jax, key, shape, median=0.0, sigma=1.0: median + sigma * jax.random.cauchy(key, shape))
log_normal = _draw(lambda jax, key, shape, mean=1.0, std=2.0: jax.numpy.exp(_normal(jax, key, shape, mean, std)))


def normal_of_size(mean: float, std: float, size: Any, *, generator: Any = None, **factory: Any) -> Any:
    """``aten.normal.float_float`` (``torch.normal(mean, std, size)``): float32 draws; the graph casts them to the
    ``dtype`` asked for (the other factory arguments mean nothing in a graph)."""
    return _normal(jax, INSTALLED[-1].get_and_rotate_prng_key(generator), tuple(size), mean, std)
