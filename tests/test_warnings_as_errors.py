"""Every module of the package compiles under ``-W error``: ``filterwarnings = error`` is common in users' ini
files, where a warning at import (an invalid escape in a docstring) is an error in their conftest."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_imports_under_warnings_as_errors() -> None:
    """``filterwarnings = error`` (or ``-W error``) is common in users' ini files: an invalid escape in a docstring
    is a SyntaxError there, so ``from neuron_args.hf import StaticCausalLM`` failed in their conftest."""
    bad = []
    for package in ("neuron_args", "pytest_neuron_args"):
        for path in sorted((ROOT / package).rglob("*.py")):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    compile(path.read_text(encoding="utf-8"), str(path), "exec")
                except SyntaxError as exc:
                    bad.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert bad == []



@pytest.mark.slow
def test_a_session_under_warnings_as_errors_starts_and_gets_the_plugin_fixtures(neuron_project) -> None:
    """Naming the fixtures module in the plugin's ``pytest_plugins`` warned at every start-up (the plugin had imported
    it, so pytest could not rewrite its asserts): under ``-W error`` no session got to its first test. A fresh
    interpreter: in this one the outer session has loaded both modules already."""
    neuron_project.makepyfile(test_plain="def test_settings(neuron_settings):\n    assert neuron_settings.tp == 1\n")
    result = neuron_project.runpytest_subprocess("-W", "error")
    result.assert_outcomes(passed=1)
    assert "Warning" not in result.stdout.str() + result.stderr.str()
