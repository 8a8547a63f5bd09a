"""The Python functions a call enters, for tests that assert what a hot path runs (never how long it takes)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def python_calls(fn: Callable[[], Any]) -> list[tuple[str, str]]:
    """``(source file, qualified name)`` of each Python function ``fn()`` calls, in order (``sys.setprofile``)."""
    seen: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            seen.append((frame.f_code.co_filename, frame.f_code.co_qualname))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen
