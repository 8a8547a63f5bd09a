"""Engine identity and the feature gate of the compile-artifact manifest, read from the environment at call time:
an engine narrows ``NEURON_VISIBLE_DEVICES`` to its core window after this package is imported.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from neuron_args import envs

__all__ = [
    "MANIFEST_DIR_ENV",
    "VISIBLE_DEVICES_ENV",
    "get_server_prefix",
    "manifest_root",
    "manifest_root_str",
    "parse_visible_devices",
]

MANIFEST_DIR_ENV = "VLLM_NEURON_MANIFEST_DIR"
VISIBLE_DEVICES_ENV = "NEURON_VISIBLE_DEVICES"
NO_DEVICE_PREFIX = "nodev"
#: Highest device index accepted (a guard against a typo such as "0-99999999" expanding forever).
MAX_DEVICE_INDEX = 65535
_INDEX_RE = re.compile(r"[0-9]+\Z")  # ASCII digits only: "²" or "٣" are not device indices


def manifest_root_str() -> str | None:
    """:func:`manifest_root` as a plain string (the ledger's per-line fast path)."""
    value = envs.text(MANIFEST_DIR_ENV)
    if not value or value.isspace():
        return None
    return os.path.expanduser(value) if value.startswith("~") else value


def manifest_root() -> Path | None:
    """The manifest directory, or None when the feature is off (unset or empty: no default)."""
    value = manifest_root_str()
    return None if value is None else Path(value)


def _device(text: str, spec: str) -> int:
    text = text.strip()
    if not _INDEX_RE.match(text) or int(text) > MAX_DEVICE_INDEX:
        raise ValueError(
            f"{VISIBLE_DEVICES_ENV}={spec!r}: {text!r} is not a device index (0..{MAX_DEVICE_INDEX}); "
            "write indices and ranges like '0-7', '0,1,2,3' or '0-1,4-5'"
        )
    return int(text)


def parse_visible_devices(value: str) -> list[int]:
    """Device indices of a ``NEURON_VISIBLE_DEVICES`` value (``"3"``, ``"0-7"``, ``"0-1,4-5"``) in order;
    ValueError on anything else (empty items, reversed ranges, repeated devices)."""
    if not isinstance(value, str):
        raise ValueError(f"{VISIBLE_DEVICES_ENV} must be a string, got {type(value).__name__}")
    devices: list[int] = []
    for item in (part.strip() for part in value.split(",")):
        if "-" in item:
            first_text, _, last_text = item.partition("-")
            first, last = _device(first_text, value), _device(last_text, value)
            if last < first:
                raise ValueError(
                    f"{VISIBLE_DEVICES_ENV}={value!r}: range {item!r} runs backwards; "
                    f"write '{last}-{first}'"
                )
            devices.extend(range(first, last + 1))
        else:
            devices.append(_device(item, value))
    if len(set(devices)) != len(devices):
        raise ValueError(f"{VISIBLE_DEVICES_ENV}={value!r} names a device more than once")
    return devices


def get_server_prefix() -> str:
    """``dev{first}_{last}`` over ``NEURON_VISIBLE_DEVICES`` (``nodev`` when unset): the same value scopes the
    compile cache's per-rank folders, so a manifest named by it matches the cache it describes."""
    value = envs.text(VISIBLE_DEVICES_ENV)
    if not value.strip():
        return NO_DEVICE_PREFIX
    devices = parse_visible_devices(value)
    return f"dev{devices[0]}_{devices[-1]}"
