"""Random draws torchax does not lower in their functional forms (``exponential``, ``cauchy``, ``log_normal``,
``normal``; ``torch.normal(..., dtype=)``), from the graph's key input as dropout does: repeatable per torch seed,
not eager's numbers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuron_args.lowering import environments


def _draw(sample: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """A lowering ``(x, *params, generator=None)``: ``sample(jax.random, key, x.shape, *params)`` in ``x``'s dtype."""
    def lowering(x: Any, *params: Any, generator: Any = None) -> Any:
        import jax

        key = environments.current().get_and_rotate_prng_key(generator)
        return sample(jax.random, key, x.shape, *params).astype(x.dtype)

    return lowering


def _exponential(rng: Any, key: Any, shape: Any, lambd: float = 1.0) -> Any:
    return rng.exponential(key, shape) / lambd


def _cauchy(rng: Any, key: Any, shape: Any, median: float = 0.0, sigma: float = 1.0) -> Any:
    return median + sigma * rng.cauchy(key, shape)


def _log_normal(rng: Any, key: Any, shape: Any, mean: float = 1.0, std: float = 2.0) -> Any:
    import jax.numpy as jnp

    return jnp.exp(mean + std * rng.normal(key, shape))


def _normal(rng: Any, key: Any, shape: Any, mean: float = 0.0, std: float = 1.0) -> Any:
    return mean + std * rng.normal(key, shape)


exponential, cauchy, log_normal, normal = _draw(_exponential), _draw(_cauchy), _draw(_log_normal), _draw(_normal)


def normal_of_size(mean: float, std: float, size: Any, *, generator: Any = None, **factory: Any) -> Any:
    """``aten.normal.float_float`` (``torch.normal(mean, std, size)``): float32 draws; the graph casts them to the
    ``dtype`` asked for (the other factory arguments mean nothing in a graph)."""
    import jax

    return _normal(jax.random, environments.current().get_and_rotate_prng_key(generator), tuple(size), mean, std)
