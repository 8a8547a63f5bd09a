"""The compiler's environment misbehaving: a neuronx-cc whose ``--version`` fails or prints bytes that are not
UTF-8, a compiler that leaves a helper running, a $NEURON_CC_FLAGS that does not parse."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.compilers.lifetime import supervised_argv
from neuron_args.settings import CompileSettings

pytestmark = pytest.mark.usefixtures("fresh_activity")


def test_a_neuronx_cc_whose_version_output_is_not_utf8_has_an_unknown_version(tmp_path):
    """A wrapper printing non-UTF-8 bytes for ``--version`` made every compile a Dynamo BackendCompilerFailed
    (UnicodeDecodeError) before anything was compiled."""
    from neuron_args.compilers.neuronx_cc import lookup_version

    exe = tmp_path / "neuronx-cc"
    exe.write_text("#!/bin/sh\nprintf 'NeuronX Compiler version 2.21\\377\\376\\n'\n")
    exe.chmod(0o755)
    ACTIVITY.reset()  # the version is memoized per process
    assert lookup_version(str(exe)) == "2.21"


def test_a_helper_the_compiler_leaves_running_is_killed_when_it_exits(tmp_path):
    """A compiler exiting 0 while a helper it started runs on: the helper was left with ppid 1, in the cache entry's
    folder (seen with a neuronx-cc stand-in that forks)."""
    pid_file = tmp_path / "helper.pid"
    done = subprocess.run(supervised_argv(["/bin/sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 3"], reap=True),
                          timeout=30, start_new_session=True)
    assert done.returncode == 3  # the compiler's own status, unchanged
    helper = int(pid_file.read_text())
    try:
        os.kill(helper, 0)
    except ProcessLookupError:
        return  # killed and reaped by the supervisor
    os.kill(helper, signal.SIGKILL)
    pytest.fail(f"the compiler's helper {helper} outlived it")


def test_an_unclosed_quote_in_neuron_cc_flags_names_the_variable(monkeypatch):
    """Every other bad $NEURON_CC_FLAGS says where it came from; an unclosed quote did not."""
    from neuron_args.errors import CompilerArgsError
    from neuron_args.settings import apply_platform_compiler_args

    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 '--auto-cast=none")
    with pytest.raises(CompilerArgsError) as info:
        apply_platform_compiler_args(CompileSettings.from_options({}, "test"))
    assert "No closing quotation" in str(info.value) and "(these arguments come from $NEURON_CC_FLAGS)" in str(info.value)


def test_a_neuronx_cc_version_probe_that_fails_says_so_once_with_what_it_costs(tmp_path, caplog):
    """A failing `neuronx-cc --version` (a broken install, a license check) silently put 'unknown' into every key:
    a warm cache missed everything and compiled again with no word why."""
    from neuron_args.compilers.neuronx_cc import lookup_version

    exe = tmp_path / "neuronx-cc"
    exe.write_text("#!/bin/sh\necho 'ERROR: libneuronxla not found' >&2\nexit 3\n")
    exe.chmod(0o755)
    ACTIVITY.reset()
    assert lookup_version(str(exe)) == lookup_version(str(exe)) == "unknown"
    (record,) = [r for r in caplog.records if "--version` gave no version" in r.getMessage()]
    assert f"`{exe} --version` gave no version (exit status 3: ERROR: libneuronxla not found)" in record.getMessage()
    assert "carry compiler version 'unknown'" in record.getMessage() and "fix: check that" in record.getMessage()
