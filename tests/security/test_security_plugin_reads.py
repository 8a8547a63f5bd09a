"""The plugin reads manifests and baselines as untrusted input: deep nesting, a FIFO or a huge file is an
error naming the file, never a RecursionError, a hang or a memory blow-up."""
from __future__ import annotations

import os

import pytest

from neuron_args.untrusted import UntrustedFileError
from pytest_neuron_args.assertions import ManifestView
from pytest_neuron_args.baseline import Baseline
from tests.security.security_helpers import DEEP_JSON


def test_a_deeply_nested_manifest_is_an_untrusted_file_error_naming_it(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(DEEP_JSON)
    with pytest.raises(UntrustedFileError, match=f"{path} is not JSON \\(nested too deeply\\)"):
        ManifestView.load(path)


def test_a_manifest_that_is_a_fifo_is_refused_at_once(tmp_path):
    path = tmp_path / "manifest.json"
    os.mkfifo(path)
    with pytest.raises(UntrustedFileError, match="is not a regular file \\(a FIFO\\)"):
        ManifestView.load(path)


def test_a_deeply_nested_baseline_fails_the_check_as_unreadable_with_the_fix(tmp_path):
    path = tmp_path / "t.py__test_a.json"
    path.write_text(DEEP_JSON)
    baseline = Baseline(path, nodeid="t.py::test_a", update=False, update_hint="pytest t.py --neuron-update-baseline")
    with pytest.raises(AssertionError) as failed:
        baseline.check({"manifest_version": "1", "graphs": []})
    message = str(failed.value)
    assert f"manifest baseline {path} is unreadable (UntrustedFileError" in message
    assert "nested too deeply" in message and "pytest t.py --neuron-update-baseline" in message
