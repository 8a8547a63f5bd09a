"""The manifest folder's locks never make a process wait for itself or for the pytest session it runs in."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuron_args.manifest.folder_lock import held_here, hold_engine, lock_folder, unlock_folder


def test_a_second_hold_in_the_same_process_does_not_wait(tmp_path):
    first = hold_engine(tmp_path, "nodev")
    assert len(first.fds) == 2 and held_here(tmp_path) and held_here(tmp_path / "nodev")
    assert hold_engine(tmp_path, "nodev").fds == []  # this process holds it: one ledger file, nothing to guard
    first.release()
    assert not held_here(tmp_path) and not held_here(tmp_path / "nodev")


def test_a_pytest_sessions_exclusive_hold_covers_its_own_emit(tmp_path):
    session = lock_folder(tmp_path)  # what the plugin takes at start-up
    try:
        hold = hold_engine(tmp_path, "dev0_1")
        assert len(hold.fds) == 1 and held_here(tmp_path / "dev0_1")  # the engine folder only
        hold.release()
    finally:
        unlock_folder(session)


@pytest.mark.slow  # a child process
def test_a_sessions_child_process_does_not_wait_for_the_session(tmp_path):
    """An xdist worker or rank process writes into the folder its parent session holds: it must not wait for it."""
    session = lock_folder(tmp_path)
    code = ("import json, sys; from pathlib import Path; from neuron_args.manifest.folder_lock import hold_engine; "
            "h = hold_engine(Path(sys.argv[1]), 'nodev'); print(json.dumps([fd is None for fd in h.fds]))")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    finally:
        unlock_folder(session)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [True, False]  # no hold of the session's folder; its engine folder held
