"""CompileSettings: torch.compile's options typed and checked once where they enter, read as fields behind."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from neuron_args.activity import ACTIVITY
from neuron_args.cache import CompileCache
from neuron_args.deferred.jobs import TraceJob
from neuron_args.deferred.trace_record import fingerprint
from neuron_args.errors import CompilerArgsError, OptionsError
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner
from neuron_args.scope import resolve_request, scoped_compiler_args
from neuron_args.settings import KNOWN_OPTIONS, CompileSettings


class OneGraphModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def neuron_graphs(self):
        return [GraphSpec("decode", self.linear, {"b1": lambda: {"input": torch.ones(1, 4)}})]


def test_options_are_parsed_once_into_typed_fields():
    settings = CompileSettings.from_options(
        {"compiler_args": "--auto-cast=none '-O2'", "target": "trn1", "compiler": "local", "cache_dir": Path("/c"),
         "compile_timeout": "90", "allow_eager_outputs": 1, "runner": "r1"}, "test")
    assert settings == CompileSettings(cache_dir=Path("/c"), compiler="local", target="trn1",
                                       compiler_args=("--auto-cast=none", "-O2"), compile_timeout=90.0,
                                       allow_eager_outputs=True, runner="r1")
    assert settings.as_options() == {"cache_dir": Path("/c"), "compiler": "local", "target": "trn1",
                                     "compiler_args": ["--auto-cast=none", "-O2"], "compile_timeout": 90.0,
                                     "allow_eager_outputs": True, "runner": "r1"}
    assert CompileSettings.from_options(settings.as_options(), "again") == settings  # the way back is lossless
    assert CompileSettings.from_options(settings, "passed on") is settings  # settings are not checked twice
    assert CompileSettings.from_options(None, "none") == CompileSettings() and CompileSettings().as_options() == {}


@pytest.mark.parametrize(("options", "error", "message"), [
    (["-O1"], OptionsError, "seam: options must be a dict, got list ['-O1']"),
    ({"compiler_args": 3}, CompilerArgsError,
     "seam: options['compiler_args'] must be a list of neuronx-cc arguments (or one string split shell-style), got int 3"),
    ({"target": 2}, OptionsError, "seam: options['target'] must be a string, got int 2"),
    ({"compiler": ["local"]}, OptionsError, "seam: options['compiler'] must be a string, got list ['local']"),
    ({"cache_dir": 7}, OptionsError, "seam: options['cache_dir'] must be a path (str or os.PathLike), got int 7"),
    ({"compile_timeout": -1}, OptionsError, "options['compile_timeout']=-1 is not a compile timeout"),
])
def test_a_malformed_option_names_the_option_and_the_seam(options, error, message):
    with pytest.raises(error) as caught:
        CompileSettings.from_options(options, "seam")
    assert str(caught.value).startswith(message)


def test_an_unknown_option_is_reported_once_and_left_out(caplog, monkeypatch):
    monkeypatch.setattr(ACTIVITY, "said", set())
    with caplog.at_level(logging.WARNING, logger="neuron_args.seams"):
        first = CompileSettings.from_options({"targte": "trn1"}, "seam")
        CompileSettings.from_options({"targte": "trn1"}, "seam")
    assert first == CompileSettings() and "targte" not in first.as_options()
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"seam: unknown option 'targte' is ignored; the options are {', '.join(KNOWN_OPTIONS)}"]


def test_the_scope_replaces_the_base_arguments_of_the_settings():
    settings = CompileSettings(compiler_args=("--auto-cast=none", "-O1"), target="trn2")
    assert resolve_request(settings, "decode").compiler_args == ("--auto-cast=none", "-O1")
    with scoped_compiler_args(["--auto-cast=none", "-O3"], graph_type="decode"):
        assert resolve_request(settings, "decode").compiler_args == ("--auto-cast=none", "-O3")
    with scoped_compiler_args(["--no-such-flag"], graph_type="decode"), pytest.raises(CompilerArgsError) as caught:
        resolve_request(settings, "decode")
    assert str(caught.value).endswith("(these arguments come from scoped_compiler_args(...))")


def test_a_public_entry_still_takes_a_dict(tmp_path):
    assert CompileCache.from_options({"cache_dir": str(tmp_path)}).root == tmp_path.resolve()
    with pytest.raises(OptionsError, match=r"options\['cache_dir'\] must be a path"):
        CompileCache.from_options({"cache_dir": 5})


def test_a_runner_fingerprints_its_jobs_as_parallel_trace_does(tmp_path):
    """The runner keeps typed settings and hands torch.compile (and parallel_trace) their options: both
    sides must describe a job alike, or a warm cache's trace record never matches."""
    runner = NeuronRunner(OneGraphModel(), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                          cache_dir=tmp_path, compile_timeout=12, allow_eager_outputs=False)
    assert runner.options["compile_timeout"] == 12.0 and runner.options["compiler_args"] == ["--auto-cast=none", "-O1"]
    assert CompileSettings.from_options(runner.options, "parallel_trace") == runner.settings
    job = TraceJob(runner.model, {"input": torch.ones(1, 4)}, ["-O1"], "decode")
    assert fingerprint(job, runner.settings) == fingerprint(job, CompileSettings.from_options(runner.options, "t"))
