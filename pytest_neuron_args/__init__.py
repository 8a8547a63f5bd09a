"""pytest plugin for neuron-args (registered through the ``pytest11`` entry point).

Options ``--neuron-*``, markers ``graph_type`` / ``neuron_hardware``, fixtures ``neuron_runner``,
``neuron_served``, ``neuron_manifest``, ``neuron_baseline``, ``neuron_compile_counter`` and friends
(see :mod:`pytest_neuron_args.fixtures`), a report header and a summary table of the session's graphs.
"""
from __future__ import annotations

from pytest_neuron_args.assertions import CompileCounter, Expectation, ManifestView
from pytest_neuron_args.baseline import Baseline
from pytest_neuron_args.options import NeuronSettings

__all__ = ["Baseline", "CompileCounter", "Expectation", "ManifestView", "NeuronSettings"]
