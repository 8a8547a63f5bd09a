"""pytest-xdist support: the controller hands its cache directory to the workers and merges their results.

Registered only when xdist is loaded, so the plugin works without it. Workers put plain builtins
into ``config.workeroutput`` in ``pytest_sessionfinish`` (see ``plugin.py``); the controller reads
them in ``pytest_testnodedown``. Workers share one compile cache safely (per-key file locks; the
second builder of a key finds it complete) and append to the session's one ledger; the controller
writes the per-engine manifests at the end (see ``NeuronSession.emit_manifests``).
"""
from __future__ import annotations

from typing import Any

import pytest

from pytest_neuron_args.state import WORKER_CACHE_KEY, NeuronSession

WORKEROUTPUT_KEY = "neuron_args"


class XdistHooks:
    """The controller's side of the merge."""

    def __init__(self, session: NeuronSession) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # a fresh per-session cache must be one directory for all workers, not one per worker
        node.workerinput[WORKER_CACHE_KEY] = str(self.session.cache_dir())
        self.session.workers_started.add(_worker_id(node, self.session))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", None) or {}
        data = output.get(WORKEROUTPUT_KEY)
        if isinstance(data, dict):
            self.session.workers[_worker_id(node, self.session)] = data


def _worker_id(node: Any, session: NeuronSession) -> str:
    return getattr(getattr(node, "gateway", None), "id", None) or str(len(session.workers))


__all__ = ["WORKEROUTPUT_KEY", "XdistHooks"]
