"""Fixtures of the fault suite: a fake neuronx-cc on PATH, a reaper that kills every process a test
started (even when it fails), and a tiny tmpfs for the full-disk cases."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.faults.fault_helpers import ENV_TO_CLEAR, FAKE_CC, REPO, Reaper


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake ``neuronx-cc`` first on PATH (also for this process), its pid folder and a child environment."""
    for name in ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    bin_dir, pid_dir = tmp_path / "bin", tmp_path / "compiler-pids"
    bin_dir.mkdir()
    pid_dir.mkdir()
    exe = bin_dir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_CC.read_text())
    exe.chmod(0o755)
    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NEURONX_CC_PIDS", str(pid_dir))
    monkeypatch.setenv("FAKE_NEURONX_CC_RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    env = dict(os.environ)
    return SimpleNamespace(env=env, pid_dir=pid_dir, record=record, marker=str(pid_dir))


@pytest.fixture
def reaper(fake_env: SimpleNamespace) -> Iterator[Reaper]:
    r = Reaper(fake_env.marker, fake_env.pid_dir)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for this test (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the full-disk test mounts a tiny tmpfs, which needs root; this run is not root")
    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN in this container?): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture
def fresh_activity(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process starts over as a new one would (counters, memoized versions, verified entries), with no
    cache-hit assert and no $NEURON_CC_FLAGS; Dynamo's compiled code and the counters are dropped afterwards."""
    import torch

    from neuron_args.activity import ACTIVITY
    from neuron_args.cache import ASSERT_CACHE_HIT_ENV

    monkeypatch.delenv(ASSERT_CACHE_HIT_ENV, raising=False)
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    ACTIVITY.reset()
    yield
    torch._dynamo.reset()
    ACTIVITY.reset()
