"""The one start thread of long-lived children (``lifetime.start_on_lifetime_thread``).

``PR_SET_PDEATHSIG`` follows the thread that started a child, so warm compile workers and trace children
are all started on one thread that lives as long as the process, whichever short-lived thread asks.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

from neuron_args.compilers.lifetime import start_on_lifetime_thread


def test_children_asked_for_by_short_lived_threads_start_on_one_thread_that_outlives_them():
    started: list[threading.Thread] = []

    def ask() -> None:
        start_on_lifetime_thread(lambda: started.append(threading.current_thread()), lambda _: None)

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for asker in askers:
        asker.start()
        asker.join()
    start_on_lifetime_thread(lambda: started.append(threading.current_thread()), lambda _: None)
    assert len(started) == 3 and len(set(started)) == 1
    assert started[0].name.startswith("neuron-args-start") and started[0].is_alive()
    assert not any(asker.is_alive() for asker in askers) and started[0] not in askers


def test_a_child_started_for_an_interrupted_caller_is_abandoned_not_left_behind():
    abandoned: list[str] = []
    done = threading.Event()

    def slow_start() -> str:
        time.sleep(0.5)
        return "child"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            start_on_lifetime_thread(slow_start, lambda child: (abandoned.append(child), done.set()))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert done.wait(10) and abandoned == ["child"]


def test_an_error_of_the_start_reaches_its_caller():
    def fails() -> None:
        raise OSError("no such program")

    with pytest.raises(OSError, match="no such program"):
        start_on_lifetime_thread(fails, lambda _: None)
