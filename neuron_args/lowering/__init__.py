"""FX graph -> HLO. ``register_lowering`` adds a jax lowering for an op that has none."""
from neuron_args.lowering.ops import register_lowering

__all__ = ["register_lowering"]
