"""The production driver: AWS ``neuronx-cc`` on a Neuron host, run in the cache entry so the files it drops in
its working directory stay with their graph."""
from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
import sys

from neuron_args.activity import cleared_on_reset
from neuron_args.compilers.base import Compiler, CompilerInfo
from neuron_args.compilers.lifetime import kill_group, supervised_argv

log = logging.getLogger("neuron_args.compilers")

NAME = "neuronx-cc"
FORMAT = "neff"

_VERSION_RE = re.compile(r"version\s*:?\s*v?(\d+(?:\.\d+)+[0-9A-Za-z.+_-]*)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)*[0-9A-Za-z.+_-]*)")


def parse_version(text: str) -> str:
    """The version number in ``neuronx-cc --version`` output, or ``"unknown"``."""
    match = _VERSION_RE.search(text) or _NUMBER_RE.search(text)
    return match.group(1) if match else "unknown"


def lookup_version(executable: str = NAME, timeout: float = 60.0) -> str:
    """Run ``<executable> --version`` once per process and resolved path; ``"unknown"`` if that fails."""
    return _version_of(shutil.which(executable) or executable, timeout)


@cleared_on_reset
@functools.cache
def _version_of(resolved: str, timeout: float) -> str:
    try:  # its own process group, killed whole on timeout: a helper holding the pipe cannot hang us
        proc = subprocess.Popen(supervised_argv([resolved, "--version"], reap=True), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)  # a wrapper printing non-UTF-8 bytes is no version, not a crash
    except OSError:
        proc = None
    why = ""
    try:
        out, err = proc.communicate(timeout=timeout) if proc else ("", "")
    except BaseException:  # a timeout, or Ctrl-C: never leave the probe running
        kill_group(proc)
        proc.communicate()
        if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
            raise
        out, err, why = "", "", f"no answer within {timeout:g} s"
    ok = proc is not None and proc.returncode == 0
    version = parse_version(out + "\n" + err) if ok else "unknown"
    if version == "unknown":  # once per process and path (memoized): every key of this run carries it
        why = why or ("it could not start" if proc is None else f"exit status {proc.returncode}" if not ok
                      else "no version number in its output")
        tail = (err or out).strip().splitlines()[-1:]
        log.warning("`%s --version` gave no version (%s%s): the cache keys of this run carry compiler version "
                    "'unknown', so entries built with a known neuronx-cc version miss (and compile again). "
                    "fix: check that this neuronx-cc runs (`%s --version`) and run again", resolved, why,
                    f": {tail[0][:200]}" if tail else "", resolved)
    return version


class NeuronxCcCompiler(Compiler):
    """Compile with ``neuronx-cc`` (found on PATH unless ``executable`` says otherwise)."""

    name = NAME
    display_name = "neuronx-cc"

    def __init__(self, executable: str = NAME) -> None:
        self.executable = executable
        self.program = [executable]

    @property
    def info(self) -> CompilerInfo:
        return CompilerInfo(NAME, lookup_version(self.executable), FORMAT)
