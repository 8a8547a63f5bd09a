"""README promises the examples pass with the default settings and with ``--neuron-optimization-level=2``.

Each setting that changes the compiled set has its own baseline file (``<test>[O2].json``), so an
example added without one fails here at collection, before anyone runs the examples with it.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the settings README says the examples pass with (name -> pytest arguments)
PROMISED = {"default": [], "O2": ["--neuron-optimization-level=2"]}


class _BaselineFiles:
    """A plugin for an in-process collection: the baseline file of every collected test that checks one."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_neuron_args.fixtures import baseline_location, model_fixturedef_of
        from pytest_neuron_args.state import get_session

        settings = get_session(session.config).settings
        for item in session.items:
            if "neuron_baseline" in getattr(item, "fixturenames", ()):
                path, _ = baseline_location(session.config, item, model_fixturedef_of(item), settings)
                self.files[item.nodeid] = path


@pytest.mark.parametrize("setting", sorted(PROMISED))
def test_every_example_baseline_exists_for_each_promised_setting(setting: str) -> None:
    pytest.importorskip("transformers", reason="the HF example is collected only with transformers installed")
    found = _BaselineFiles()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-c",
                        str(ROOT / "pyproject.toml"), str(ROOT / "examples"), *PROMISED[setting]], plugins=[found])
    assert code == pytest.ExitCode.OK
    assert any("hf_llama" in nodeid for nodeid in found.files) and any("tiny_vlm" in n for n in found.files), found.files
    missing = {nodeid: str(path.relative_to(ROOT)) for nodeid, path in found.files.items() if not path.is_file()}
    assert not missing, (f"example tests without a baseline for {setting} ({shlex.join(PROMISED[setting])}); write it "
                         f"with `pytest examples {shlex.join(PROMISED[setting])} --neuron-update-baseline`: {missing}")


@pytest.mark.slow
def test_the_examples_pass_with_optimization_level_2(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the HF example runs only with transformers installed")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "examples", *PROMISED["O2"], f"--neuron-cache-dir={tmp_path / 'cache'}", "-rs"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    skipped = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("neuron_hardware" in line or "Neuron device" in line for line in skipped), skipped
