"""Every module of the package compiles under ``-W error``: ``filterwarnings = error`` is common in users' ini
files, where a warning at import (an invalid escape in a docstring) is an error in their conftest."""
from __future__ import annotations

import warnings
from pathlib import Path

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

