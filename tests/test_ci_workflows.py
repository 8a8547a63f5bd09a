"""The CI workflow files run exactly the README's commands (parsed from both, never copied into this test)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
README = (REPO / "README.md").read_text()


def commands(script: str) -> list[str]:
    """Shell commands of a script, one per logical line (backslash continuations joined, blanks squeezed)."""
    joined = re.sub(r"\\\n", " ", script)
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def readme_blocks(heading: str) -> list[str]:
    """The ```sh code blocks of one README section (up to the next heading of the same or a higher level)."""
    level = heading.split()[0]
    start = README.index(heading + "\n")
    rest = README[start + len(heading):]
    stop = re.search(rf"^#{{1,{len(level)}}} ", rest, flags=re.M)
    section = rest[:stop.start()] if stop else rest
    return re.findall(r"^```sh\n(.*?)^```", section, flags=re.M | re.S)


def opening_blocks() -> list[str]:
    """The ```sh code blocks the README opens with: between its title and its first section heading."""
    first_section = re.search(r"^## ", README, flags=re.M)
    return re.findall(r"^```sh\n(.*?)^```", README[:first_section.start()], flags=re.M | re.S)


def workflow(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(wf: dict[str, Any]) -> dict[str, Any]:
    return wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True


def steps(wf: dict[str, Any]) -> list[dict[str, Any]]:
    (job,) = wf["jobs"].values()
    return job["steps"]


def run_commands(wf: dict[str, Any]) -> list[str]:
    return [c for step in steps(wf) if "run" in step for c in commands(step["run"])]


def test_readme_opens_with_its_two_commands():
    blocks = opening_blocks()
    assert [commands(b) for b in blocks] == [["bash scripts/main.sh"], ["bash scripts/test.sh"]]


def test_ci_runs_the_readme_test_command_on_a_cpu_runner():
    wf = workflow("ci.yml")
    (job,) = wf["jobs"].values()
    assert str(job["runs-on"]).startswith("ubuntu-") and "self-hosted" not in str(job["runs-on"])
    assert {"push", "pull_request"} <= set(triggers(wf))
    test_command = commands(opening_blocks()[1])
    assert run_commands(wf) == test_command
    assert "download.pytorch.org/whl/cpu" in job["env"]["PIP_EXTRA_INDEX_URL"]  # a CPU torch, not CUDA


def test_nightly_runs_the_readme_commands_in_order_on_trn2():
    wf = workflow("nightly-trn2.yml")
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "trn2"]
    (schedule,) = triggers(wf)["schedule"]
    assert len(schedule["cron"].split()) == 5
    readme = [c for block in readme_blocks("### Run it nightly on trn2") for c in commands(block)]
    ran = run_commands(wf)
    positions = [ran.index(c) if c in ran else pytest.fail(f"nightly-trn2.yml does not run the README's {c!r}")
                 for c in readme]
    assert positions == sorted(positions), "the workflow runs the README's commands in another order"


def test_nightly_pytest_command_writes_report_junit_with_a_persistent_cache_and_the_baseline():
    readme = [c for block in readme_blocks("### Run it nightly on trn2") for c in commands(block)]
    install = next(c for c in readme if "pip install" in c)
    assert "'.[neuron]'" in install and "--extra-index-url=https://pip.repos.neuron.amazonaws.com" in install
    argv = shlex.split(next(c for c in readme if c.startswith("pytest ")))
    assert all("=" in a for a in argv if a.startswith("--neuron-")), "README spells plugin options --opt=value"
    options = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert options["--neuron-compiler"] == "neuronx-cc" and options["--neuron-target"] == "trn2"
    assert Path(options["--neuron-cache-dir"]).is_absolute()  # kept across nights, outside the checkout
    assert options["--neuron-report"] == "neuron-report.json" and options["--junitxml"] == "junit.xml"
    assert not options["--neuron-baseline"].startswith("/")  # committed in the repository
    compare = shlex.split(next(c for c in readme if c.startswith("neuron-args report compare")))
    assert compare[-1] == options["--neuron-report"] and compare[-2].startswith("previous/")


def test_nightly_uploads_manifests_report_junit_and_failed_compile_logs():
    wf = workflow("nightly-trn2.yml")
    uploads = [s for s in steps(wf) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads and all(s.get("if") == "always()" for s in uploads)
    paths = {p.strip() for s in uploads for p in s["with"]["path"].splitlines() if p.strip()}
    assert {"manifests/", "neuron-report.json", "junit.xml", "failed-compiles/"} <= paths
    collect = next(s for s in steps(wf) if "failed-compiles" in s.get("run", "") and "cache logs" in s["run"])
    assert collect.get("if") == "always()"  # tests/test_nightly_workflow.py runs it on a failed entry
    # the previous night's report comes from the artifact this workflow uploads under that name
    (report,) = [s for s in uploads if s["with"]["path"].strip() == "neuron-report.json"]
    fetch = next(s for s in steps(wf) if "gh run download" in s.get("run", ""))
    assert f"--name {report['with']['name']} --dir previous" in fetch["run"]
    assert "nightly-trn2.yml" in fetch["run"]
