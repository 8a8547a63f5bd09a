"""The environment table (neuron_args/envs.py): one boolean parser, every read through it, README in step."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from neuron_args import envs
from neuron_args.errors import OptionsError

REPO = Path(__file__).resolve().parents[1]


def _readers():
    """Each boolean variable and the function of the module that reads it."""
    from neuron_args import cache, executables, fastpath, xla_cpu
    from neuron_args.compilers import workers
    from neuron_args.seams import dispatch, trace_memo
    from pytest_neuron_args import gc_policy

    def direct_call_on() -> bool:
        return dispatch.inputs_need_aot([], torch.nn.Module()) != f"{dispatch.ENV}=0"

    def async_client() -> bool:
        seen = []
        real = (xla_cpu.cpu_client, xla_cpu.sync_client)
        xla_cpu.cpu_client, xla_cpu.sync_client = (lambda: seen.append(True)), (lambda: seen.append(False))
        try:
            xla_cpu.runtime_client()
        finally:
            xla_cpu.cpu_client, xla_cpu.sync_client = real
        return seen[0]

    return {
        "NEURON_LIBTORCH_ASSERT_CACHE_HIT": cache.assert_cache_hit_enabled,
        "NEURON_ARGS_ALLOW_EAGER_OUTPUTS": executables.allow_eager_outputs,
        "NEURON_ARGS_WARM_WORKERS": workers.enabled,
        "NEURON_ARGS_FAST_PATH": lambda: fastpath.FastPath().enabled,
        "NEURON_ARGS_DIRECT_CALL": direct_call_on,
        "NEURON_ARGS_TRACE_MEMO": trace_memo.enabled,
        "NEURON_ARGS_GC_FREEZE": gc_policy.enabled,
        "NEURON_ARGS_XLA_CPU_ASYNC": async_client,
    }


BOOLEANS = sorted(v.name for v in envs.VARIABLES if v.kind == "bool")


def test_every_boolean_variable_has_a_reader_here():
    assert sorted(_readers()) == BOOLEANS


@pytest.mark.parametrize("name", BOOLEANS)
def test_every_boolean_reads_the_same_words_the_same_way(name, monkeypatch):
    read = _readers()[name]
    for word, expected in [("false", False), ("OFF", False), ("no", False), ("0", False),
                           ("true", True), ("Yes", True), ("on", True), ("1", True)]:
        monkeypatch.setenv(name, word)
        assert read() is expected, (name, word)
    monkeypatch.setenv(name, "")
    assert read() is envs.variable(name).default
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(OptionsError) as info:
        read()
    assert f"{name}='maybe' is not a boolean" in str(info.value)
    assert "1, true, yes, on, y, t (true) or 0, false, no, off, n, f (false)" in str(info.value)


def test_fast_path_false_turns_it_off_as_trace_memo_false_does(monkeypatch):
    from neuron_args import fastpath
    from neuron_args.seams import trace_memo

    monkeypatch.setenv("NEURON_ARGS_FAST_PATH", "false")
    monkeypatch.setenv("NEURON_ARGS_TRACE_MEMO", "false")
    assert fastpath.FastPath().enabled is False
    assert trace_memo.enabled() is False


def test_a_secret_is_never_shown_in_an_error(monkeypatch):
    var = envs.variable("NEURON_ARGS_CACHE_SIGNING_KEY")
    assert var.secret and var.doc.startswith("HMAC key for a signed cache") and "Sharing a cache safely" in var.doc
    with pytest.raises(OptionsError, match="<secret>"):
        envs.parse_bool(var.name, "hunter2", False)


def test_reading_an_undeclared_variable_is_refused():
    with pytest.raises(KeyError, match="not declared in neuron_args/envs.py"):
        envs.text("NEURON_ARGS_NOT_A_VARIABLE")


def test_readme_table_is_the_envs_table_both_ways():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == envs.markdown_table()
    documented = {v.name for v in envs.VARIABLES if v.documented}
    assert set(re.findall(r"^\| `([A-Z_]+)`", table, re.M)) == documented


def test_the_environment_is_touched_in_envs_alone():
    """`os.environ` / `os.getenv` appear in at most two library files (envs.py and one more)."""
    hits = sorted(str(p.relative_to(REPO)) for pkg in ("neuron_args", "pytest_neuron_args")
                  for p in (REPO / pkg).rglob("*.py")
                  if re.search(r"os\.environ|os\.getenv", p.read_text(encoding="utf-8")))
    assert hits == ["neuron_args/envs.py"]


def test_numbers_are_validated_once_where_they_enter(monkeypatch):
    import importlib

    trace = importlib.import_module("neuron_args.deferred.parallel_trace")
    jobs = importlib.import_module("neuron_args.deferred.jobs")
    from neuron_args.compilers import workers

    monkeypatch.setenv(trace.IDLE_ENV, "0")
    assert trace.idle_seconds() == 0.0
    monkeypatch.setenv(trace.IDLE_ENV, "-5")  # was taken as 0 without a word
    with pytest.raises(OptionsError, match=r"NEURON_ARGS_TRACE_IDLE_SECONDS='-5' is not a number of seconds: give a "
                                           r"non-negative number \(0 keeps no child idle\), or unset it \(default 30\)"):
        trace.idle_seconds()
    monkeypatch.setenv(workers.IDLE_ENV, "0")
    with pytest.raises(OptionsError, match="give a positive number"):
        workers.idle_seconds()
    monkeypatch.setenv("NEURON_ARGS_TRACE_WORKERS", "two")
    with pytest.raises(OptionsError, match="NEURON_ARGS_TRACE_WORKERS='two' is not a count"):
        jobs.workers_from_env("NEURON_ARGS_TRACE_WORKERS", 4)
    monkeypatch.setenv("NEURON_ARGS_TRACE_WORKERS", "3")
    assert jobs.workers_from_env("NEURON_ARGS_TRACE_WORKERS", 8) == 3


@pytest.mark.parametrize("value, zero_ok, expected", [
    ("5", False, 5.0), (" 2.5 ", False, 2.5), (3, False, 3.0), ("0", False, None), ("0", True, 0.0), ("-1", True, None),
    ("nan", False, None), ("inf", False, None), ("x", False, None), (True, False, None), (None, False, None)])
def test_one_rule_for_seconds(value, zero_ok, expected) -> None:
    assert envs.as_seconds(value, zero_ok=zero_ok) == expected
