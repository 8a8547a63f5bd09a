"""Helpers of the fault suite: a fake neuronx-cc's pending entries, a reaper of child processes,
polling with a bound, filling a file system."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_CC = REPO / "tests" / "fakes" / "neuronx_cc.py"
#: the fake's `--version` (tests/fakes/neuronx_cc.py): a capture records the compiler version its key hashed
FAKE_CC_VERSION = "2.21.33363.0+82d8b54d"
ENV_TO_CLEAR = ("VLLM_NEURON_MANIFEST_DIR", "NEURON_CC_FLAGS", "NEURON_ARGS_COMPILER", "NEURON_ARGS_TARGET",
                "NEURON_LIBTORCH_ASSERT_CACHE_HIT", "NEURON_LIBTORCH_CACHE_DIR", "NEURON_ARGS_COMPILE_TIMEOUT",
                "NEURON_ARGS_COMPILE_WORKERS", "NEURON_VISIBLE_DEVICES")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait for a busy init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` exists and is not a zombie (a killed group's members die one by one)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def wait_until(predicate, seconds: float, what: str) -> None:
    """Poll ``predicate`` up to ``seconds``; fail naming ``what``. A bound, not a speed measurement."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds:g} s: {what}")


class Reaper:
    """Starts the test's child processes and kills whatever is left of them when the test ends.

    Leftovers are found three ways: the process groups this reaper started, the pids the fake
    compiler wrote into its pid folder, and (for those) a check that the process still carries
    this test's marker in its environment, so an unrelated process that reused a pid is never hit.
    """

    def __init__(self, marker: str, pid_dir: Path) -> None:
        self.marker = marker
        self.pid_dir = pid_dir
        self.procs: list[subprocess.Popen] = []

    def popen(self, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kw)
        self.procs.append(proc)
        return proc

    def compiler_pids(self) -> list[int]:
        return sorted(int(p.name.split(".")[0]) for p in self.pid_dir.iterdir())

    def _ours(self, pid: int) -> bool:
        try:
            return self.marker.encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False

    def cleanup(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)
        for pid in self.compiler_pids() if self.pid_dir.is_dir() else []:
            if alive(pid) and self._ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def key_of(i: int) -> str:
    return f"{i:04x}" + "c0ffee" * 4 + "abcd"


def make_pending(root: Path, n: int, *, graph_type: str = "decode") -> list[str]:
    """``n`` captured (pending) entries for neuronx-cc, as the capture seam writes them."""
    keys = []
    for i in range(n):
        key = key_of(i)
        entry = root / key
        entry.mkdir(parents=True)
        (entry / "graph.hlo").write_bytes(b"hlo module %d" % i)
        (entry / "metadata.json").write_text(json.dumps({
            "metadata_version": 1, "key": key, "status": "pending", "seam": "neuron_libtorch_graph_capture",
            "graph_type": f"{graph_type}{i}", "compiler_args": ["-O1"], "target": "trn2",
            "compiler": {"name": "neuronx-cc", "version": FAKE_CC_VERSION, "format": "neff"},
        }))
        keys.append(key)
    return keys


COMPILE_SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from neuron_args.deferred.parallel_compile import parallel_compile
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else None
    report = parallel_compile(sys.argv[1], workers=int(sys.argv[2]), quiet=True, compile_timeout=timeout)
    print("DONE", " ".join(f"{g.key}={g.status}" for g in report.graphs), flush=True)
""")


def compile_script(tmp_path: Path) -> Path:
    path = tmp_path / "run_parallel_compile.py"
    path.write_text(COMPILE_SCRIPT)
    return path


def fill(path: Path) -> Path:
    """Fill the file system holding ``path`` until not one more byte fits; returns the filler file."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 16, 4096, 1):
            while True:
                try:
                    f.write(b"\0" * chunk)
                except OSError:
                    break
    return filler
