"""pytest plugin for neuron-args (registered through the ``pytest11`` entry point)."""
