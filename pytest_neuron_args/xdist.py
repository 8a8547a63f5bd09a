"""pytest-xdist support: the controller hands its cache directory to the workers and merges their results.

Registered only when xdist is loaded. Workers put plain builtins into ``config.workeroutput`` at session finish;
they share one compile cache (per-key file locks) and one ledger, and the controller writes the manifests.
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
