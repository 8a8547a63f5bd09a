"""pytest plugin for neuron-args (the ``pytest11`` entry point is :mod:`pytest_neuron_args.plugin`; fixtures in
:mod:`pytest_neuron_args.fixtures`)."""
from __future__ import annotations

from pytest_neuron_args.assertions import CompileCounter, Expectation, ManifestView
from pytest_neuron_args.baseline import Baseline
from pytest_neuron_args.options import NeuronSettings

__all__ = ["Baseline", "CompileCounter", "Expectation", "ManifestView", "NeuronSettings"]
