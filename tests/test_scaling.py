"""Costs per graph that must not grow with the number of graphs or workers (benchmarks/bench_orchestration.py
and bench_scale.py measure them; here each is checked by what it does: calls, imports, files read)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_args.compilers.process import run_compiler

REPO = Path(__file__).resolve().parents[1]
FAKE_SOURCE = Path(__file__).parent / "fakes" / "neuronx_cc.py"


def test_a_compile_ends_when_its_compiler_exits_not_at_the_next_poll(tmp_path, monkeypatch):
    # Popen.wait(timeout) polls, sleeping up to 50 ms between looks: ~25 ms late per graph
    sleeps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (sleeps.append(s), real_sleep(s))[1])
    out = tmp_path / "graph.neff"
    tmp = tmp_path / ".graph.partial.neff"
    argv = ["/bin/sh", "-c", f"sleep 0.3; printf NEFF > {tmp}"]
    result = run_compiler(compiler="stand-in", argv=argv, recorded_argv=argv, tmp_output=tmp, output_path=out,
                          workdir=tmp_path, log_path=tmp_path / "log-neuron-cc.txt", graph_type="decode",
                          key="k" * 32, timeout=30)
    assert out.read_bytes() == b"NEFF" and result.output_size == 4
    assert sleeps == []


@pytest.mark.slow
def test_a_process_pool_worker_does_not_import_dask(tmp_path):
    # run_compile_task looks for a Dask task to watch; a pool worker that imported distributed for that spent
    # ~1 s of CPU before its first compile (8 workers on 2 cores: seconds of a 16 s parallel_compile)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SOURCE.read_text())
    exe.chmod(0o755)
    code = (
        "import sys\n"
        "from neuron_args.deferred.farm import CompileTask, run_compile_task\n"
        "from neuron_args.compilers.neuronx_cc import lookup_version\n"
        "task = CompileTask(key='a' * 32, graph_type='decode', hlo=b'HloModule m', compiler_args=('-O1',),\n"
        "                   target='trn2', compiler='neuronx-cc', compiler_version=lookup_version())\n"
        "outcome = run_compile_task(task)\n"
        "print(outcome.status, outcome.error, 'distributed' in sys.modules)\n")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["compiled", "None", "False"], proc.stdout + proc.stderr
