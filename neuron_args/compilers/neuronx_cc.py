"""The production driver: AWS ``neuronx-cc`` on a Neuron host (installed from the Neuron repository).

``neuronx-cc compile graph.hlo --framework XLA --target <t> --output graph_<key>.neff
--logfile log-neuron-cc.txt <args>``, run in the cache entry so the files it drops in its working
directory stay with the graph they belong to.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from neuron_args.compilers.base import CompilerInfo, SubprocessCompiler

NAME = "neuronx-cc"
FORMAT = "neff"

#: ``neuronx-cc --version`` per resolved executable path (one lookup per process).
_versions: dict[str, str] = {}

_VERSION_RE = re.compile(r"version\s*:?\s*v?(\d+(?:\.\d+)+[0-9A-Za-z.+_-]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)*[0-9A-Za-z.+_-]*)")


def parse_version(text: str) -> str:
    """The version number in ``neuronx-cc --version`` output, or ``"unknown"``."""
    match = _VERSION_RE.search(text) or _NUMBER_RE.search(text)
    return match.group(1) if match else "unknown"


def lookup_version(executable: str = NAME, timeout: float = 60.0) -> str:
    """Run ``<executable> --version`` once per process; ``"unknown"`` if that fails."""
    resolved = shutil.which(executable) or executable
    if resolved not in _versions:
        try:
            done = subprocess.run(
                [resolved, "--version"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            out = done.stdout + "\n" + done.stderr
            _versions[resolved] = parse_version(out) if done.returncode == 0 else "unknown"
        except (OSError, subprocess.SubprocessError):
            _versions[resolved] = "unknown"
    return _versions[resolved]


class NeuronxCcCompiler(SubprocessCompiler):
    """Compile with ``neuronx-cc`` (found on PATH unless ``executable`` says otherwise)."""

    name = NAME
    display_name = "neuronx-cc"

    def __init__(self, executable: str = NAME) -> None:
        self.executable = executable

    @property
    def info(self) -> CompilerInfo:
        return CompilerInfo(NAME, lookup_version(self.executable), FORMAT)

    def build_argv(
        self,
        *,
        hlo_path: Path,
        output_path: Path,
        target: str,
        compiler_args: Sequence[str],
        log_path: Path,
    ) -> list[str]:
        return [
            self.executable, "compile", str(hlo_path),
            "--framework", "XLA",
            "--target", target,
            "--output", str(output_path),
            "--logfile", str(log_path),
            *compiler_args,
        ]  # fmt: skip
