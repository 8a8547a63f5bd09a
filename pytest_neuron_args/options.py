"""Command-line options, their ini keys, and the resolved settings every fixture reads: command line > ini file >
default, relative paths relative to where they were given. No torch import: every pytest session loads this.
"""
from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from neuron_args import envs
from neuron_args.cache import cache_root
from neuron_args.compilers import COMPILER_CHOICES as COMPILERS
from neuron_args.deferred import FLOWS
from neuron_args.errors import CompilerArgsError
from neuron_args.flags import OPT_LEVELS, CompilerArgs, warn_repeated_options
from neuron_args.manifest.engine import MANIFEST_DIR_ENV, manifest_root
from neuron_args.remote_cache import is_remote
from neuron_args.target import DEFAULT_TARGET
from neuron_args.target import KNOWN_TARGETS as TARGETS
from neuron_args.target import TARGET_ENV, Target, given_or_default

DEFAULT_FLOW = FLOWS[0]

RANK_WORKER_OPTION = "--neuron-rank-worker"  # internal: a --neuron-tp rank process (see fixtures.tp_warmup)
RANK_SERVE_OPTION = "--neuron-rank-serve"  # internal: that rank process runs the test itself (fixtures.tp_serve)

#: option -> addoption keywords; an option has an ini key, named as its dest (``--neuron-target``: ``neuron_target``),
#: exactly where its help names it, and the ini key's help is the option's. Options appear in ``--help`` in this order.
_OPTIONS: dict[str, dict[str, Any]] = {
    # no argparse choices: the option, its ini key and every other route share the target's one message
    "--neuron-target": {"metavar": "{" + ",".join(TARGETS) + "}",
                        "help": f"compile target, one of {', '.join(TARGETS)} (default ${TARGET_ENV}, else "
                                f"{DEFAULT_TARGET}; ini: neuron_target)"},
    "--neuron-compiler": {"choices": COMPILERS,
                          "help": "compiler: neuronx-cc, local (XLA:CPU) or auto (neuronx-cc when on PATH); "
                                  "default: $NEURON_ARGS_COMPILER, else auto (ini: neuron_compiler)"},
    "--neuron-cache-dir": {"metavar": "DIR",
                           "help": "compile cache directory or s3://bucket/prefix, kept across runs (default: a fresh "
                                   "directory per session under pytest's base temp; ini: neuron_cache_dir, relative "
                                   "to its file)"},
    "--neuron-manifest-dir": {"metavar": "DIR",
                              "help": "VLLM_NEURON_MANIFEST_DIR for the session (restored after; default: that "
                                      "variable as the session starts): the session writes "
                                      "<DIR>/<engine-id>/manifest.json with every graph it compiled or loaded, merged "
                                      "across xdist workers (ini: neuron_manifest_dir, relative to its file)"},
    "--neuron-optimization-level": {"type": int, "metavar": "N",
                                    "help": "explicit caller -O level (1, 2 or 3): every graph gets it and model "
                                            "compiler_args_for policies are disabled"},
    "--neuron-compiler-args": {"metavar": "ARGS",
                               "help": "base neuronx-cc arguments at the caller level, e.g. '-O1 --auto-cast=none' "
                                       "(default: $NEURON_CC_FLAGS; ini: neuron_compiler_args)"},
    "--neuron-flow": {"choices": FLOWS, "help": f"warmup flow of the neuron_served / neuron_manifest fixtures, one of "
                                                f"{', '.join(FLOWS)} (default {DEFAULT_FLOW}; ini: neuron_flow)"},
    "--neuron-baseline": {"metavar": "PATH",
                          "help": "manifest baseline: a .json file, or a directory of <test>.json files (default "
                                  "<rootdir>/.neuron-baseline/; ini: neuron_baseline, relative to its file)"},
    "--neuron-update-baseline": {"action": "store_true", "default": False,
                                 "help": "write the neuron_baseline files instead of comparing against them"},
    "--neuron-tp": {"type": int, "metavar": "N",
                    "help": "run each warmup in N tensor-parallel rank processes (gloo on CPU, the launcher of "
                            "scripts/main.sh --tp), so the manifest lists ranks 0..N-1 (default 1; ini: neuron_tp)"},
    "--neuron-allow-graph-breaks": {"action": "store_true",
                                    "help": "let Dynamo split a graph type into several graphs (default: a graph "
                                            "break fails the warmup; per test: @pytest.mark.neuron_allow_graph_breaks;"
                                            " ini: neuron_allow_graph_breaks)"},
    "--neuron-compile-timeout": {"type": float, "metavar": "SECONDS",
                                 "help": "give up on one graph's compile after SECONDS (compile option "
                                         "compile_timeout; ini: neuron_compile_timeout)"},
    "--neuron-report": {"metavar": "PATH",
                        "help": "write a JSON report of the session: settings, one record per graph (graph type, key, "
                                "compiler args, shapes, status, compile seconds, size, serve hits/misses) and totals, "
                                "merged across xdist workers (ini: neuron_report, relative to its file)"},
    RANK_WORKER_OPTION: {"help": argparse.SUPPRESS},
    "--neuron-rank-graph-types": {"help": argparse.SUPPRESS},
    RANK_SERVE_OPTION: {"action": "store_true", "default": False, "help": argparse.SUPPRESS},
    "--neuron-allow-eager-outputs": {"action": "store_true",
                                     "help": "where NEFFs cannot run (no torch-neuronx runtime binding), take graph "
                                             "outputs from eager PyTorch instead of failing; compiling, cache and "
                                             "manifest checks still run (ini: neuron_allow_eager_outputs)"},
}
_INI_HELP = {key: text for key, text in ((flag.removeprefix("--").replace("-", "_"), options["help"])
                                          for flag, options in _OPTIONS.items()) if f"ini: {key}" in text}
#: the options that take no value (``--neuron-tp 2`` takes the next argument, ``--neuron-allow-graph-breaks`` not)
FLAG_OPTIONS = frozenset(flag for flag, options in _OPTIONS.items() if options.get("action") == "store_true")
#: the options whose value is a path (see plugin._warn_split_path_options)
PATH_OPTIONS = frozenset(flag for flag, options in _OPTIONS.items() if options.get("metavar") in ("DIR", "PATH"))


def given_options(config: pytest.Config) -> list[tuple[str, ...]]:
    """This run's ``--neuron-*`` arguments as given: ``(flag=value,)``, ``(flag,)`` or ``(flag, value)`` (split)."""
    args = [str(a) for a in config.invocation_params.args]
    return [tuple(args[i:i + (1 if "=" in arg or arg in FLAG_OPTIONS else 2)])
            for i, arg in enumerate(args) if arg.startswith("--neuron-")]


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--neuron-*`` options and their ini keys."""
    group = parser.getgroup("neuron-args", "neuron-args: per-graph compiler arguments, compile cache, manifest")
    for flag, options in _OPTIONS.items():
        group.addoption(flag, **{"default": None, **options})
    for key, text in _INI_HELP.items():
        parser.addini(key, text, default="")


@dataclass(frozen=True)
class NeuronSettings:
    """What the ``--neuron-*`` options resolved to for this session."""

    target: Target = DEFAULT_TARGET
    compiler: str | None = None  # None: $NEURON_ARGS_COMPILER, else auto
    compiler_source: str = ""  # where ``compiler`` came from, for errors: the option or the ini key
    cache_dir: Path | None = None  # None: a fresh directory per session
    manifest_dir: Path | None = None
    manifest_dir_source: str = ""  # the option, the ini key or $VLLM_NEURON_MANIFEST_DIR, for errors
    optimization_level: int | None = None
    flow: str = DEFAULT_FLOW
    baseline: Path | None = None
    update_baseline: bool = False
    report: Path | None = None
    compiler_args: str | None = None  # None: $NEURON_CC_FLAGS
    compiler_args_source: str = ""  # where the base list came from, for errors: an option, an ini key or the env
    tp: int = 1
    allow_graph_breaks: bool = False
    compile_timeout: float | None = None
    allow_eager_outputs: bool = False  # NEFFs without a runtime binding: eager outputs instead of an error
    rank_worker: Path | None = None  # set in a --neuron-tp rank process: where it reports its warmup
    rank_serve: bool = False  # that rank process runs a serving test's body against its shard

    @functools.cached_property
    def base_args(self) -> CompilerArgs | None:
        """``compiler_args`` parsed once for every runner (:meth:`check_compiler_args` reports its error)."""
        return None if self.compiler_args is None else CompilerArgs.parse(self.compiler_args)

    def runner_key(self) -> tuple[Any, ...]:
        """The settings a runner is built from (runners are shared by tests with equal keys)."""
        return (self.target, self.compiler, self.cache_dir, self.optimization_level, self.compiler_args,
                self.compile_timeout, self.allow_eager_outputs)

    def baseline_variant(self) -> str:
        """The name part of a baseline file for settings that change the compiled set ('' for the defaults)."""
        parts = []
        if self.optimization_level is not None:
            parts.append(f"O{self.optimization_level}")
        if self.target != DEFAULT_TARGET:
            parts.append(self.target)
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        if self.compiler_args_source and not self.compiler_args_source.startswith("ini"):
            import hashlib

            parts.append("args-" + hashlib.sha256((self.compiler_args or "").encode()).hexdigest()[:8])
        return "-".join(parts)

    @classmethod
    def from_config(cls, config: pytest.Config) -> NeuronSettings:
        compiler, compiler_source = _choice(config, "neuron_compiler", COMPILERS)
        level = config.getoption("neuron_optimization_level")
        if level is not None and level not in OPT_LEVELS:
            raise pytest.UsageError(
                f"--neuron-optimization-level {level}: use one of {', '.join(map(str, OPT_LEVELS))} "
                "(the -O level every graph gets; it disables model compiler_args_for policies)"
            )
        args, source = _raw(config, "neuron_compiler_args")
        if args is None and envs.is_set("NEURON_CC_FLAGS"):
            args, source = envs.text("NEURON_CC_FLAGS"), "NEURON_CC_FLAGS"
        tp_text = _raw(config, "neuron_tp")[0] or "1"
        if not (tp_text.isascii() and tp_text.isdigit() and int(tp_text) >= 1):  # envs.count's rule for a count
            raise pytest.UsageError(f"--neuron-tp {tp_text}: give the number of tensor-parallel ranks, 1 or more")
        timeout_text = _raw(config, "neuron_compile_timeout")[0]
        timeout = None if timeout_text is None else envs.as_seconds(timeout_text)  # the one rule for seconds
        if timeout_text is not None and timeout is None:
            raise pytest.UsageError(f"--neuron-compile-timeout {timeout_text}: give a number of seconds above 0")
        manifest_dir, manifest_dir_source = _path(config, "neuron_manifest_dir")
        # else $VLLM_NEURON_MANIFEST_DIR as the session starts (a conftest may set it): the session manifest's
        # folder, so its ledger lines end in a manifest, not left behind
        if manifest_dir is None and (env_root := manifest_root()) is not None:
            manifest_dir, manifest_dir_source = env_root.absolute(), f"${MANIFEST_DIR_ENV}"
        try:  # --neuron-target, its ini key, $NEURON_ARGS_TARGET or the default: a usage error with the one message
            target = given_or_default(*_raw(config, "neuron_target"))
        except CompilerArgsError as exc:
            raise pytest.UsageError(str(exc)) from None
        worker = config.getoption("neuron_rank_worker")
        settings = cls(
            target=target, compiler=compiler, compiler_source=compiler_source, optimization_level=level,
            flow=_choice(config, "neuron_flow", FLOWS)[0] or DEFAULT_FLOW, compiler_args=args,
            compiler_args_source=source, tp=int(tp_text), compile_timeout=timeout, manifest_dir=manifest_dir,
            manifest_dir_source=manifest_dir_source,
            **{name: _path(config, f"neuron_{name}")[0] for name in ("cache_dir", "baseline", "report")},
            **{name: _switch(config, f"neuron_{name}") for name in ("allow_graph_breaks", "allow_eager_outputs")},
            update_baseline=bool(config.getoption("neuron_update_baseline")),
            rank_worker=Path(worker) if worker else None,
            rank_serve=bool(worker) and bool(config.getoption("neuron_rank_serve", False)),
        )
        # the base arguments are checked where they enter; a repeated option is told once, by the controller
        # (an xdist worker only notes it as told)
        xdist_worker = getattr(config, "workerinput", None) is not None
        settings.check_compiler_args(warn=(lambda w: None) if xdist_worker else
                                     functools.partial(config_warning, config))
        return settings

    def check_compiler_args(self, warn: Callable[[Warning], None] | None = None) -> None:
        """A malformed base list is one usage error at start-up naming where it came from; an option given
        twice with different values is one warning (``warn``) saying which value compiles."""
        source = self.compiler_args_source or "the base compiler arguments"
        try:
            args = self.base_args or CompilerArgs()
        except CompilerArgsError as exc:
            detail = str(exc).removeprefix("compiler args: ")
            raise pytest.UsageError(
                f"{source} = {self.compiler_args!r}: {detail} "
                "(these are the base arguments of every graph, at the caller level)") from None
        given = args.value("--target")
        if given is not None and given != self.target:
            raise pytest.UsageError(
                f"{source} = {self.compiler_args!r}: --target "
                f"{given} disagrees with the session's compile target {self.target!r} (--neuron-target, ini "
                f"neuron_target, ${TARGET_ENV}, default {DEFAULT_TARGET}); remove --target from the base arguments "
                f"(the plugin gives the compiler its target) or run with --neuron-target={given}")
        warn_repeated_options(args, source=source, warn=warn, once=False)

    def check_compiler(self) -> None:
        """A compiler that cannot run here (neuronx-cc not on PATH, an unknown name) is one usage error at
        start-up naming where it was asked for, not the same error in every test that warms a graph."""
        import shutil

        from neuron_args.compilers import COMPILER_ENV

        name, source = self.compiler, self.compiler_source or "--neuron-compiler"
        if name is None:
            name, source = envs.text(COMPILER_ENV), f"${COMPILER_ENV}"
            if not name:
                return
            if name.lower() not in COMPILERS:
                raise pytest.UsageError(f"{source}={name!r}: use one of {', '.join(COMPILERS)} (or unset it: auto "
                                        "picks neuronx-cc when it is on PATH, else the local compiler)")
            name = name.lower()
        if name == "neuronx-cc" and shutil.which("neuronx-cc") is None:
            fix = "unset it or set it to local (or auto)" if source.startswith("$") else (
                "use --neuron-compiler=local (or auto)")
            raise pytest.UsageError(
                f"{source} neuronx-cc: neuronx-cc is not on PATH. On a Neuron host activate the environment that has "
                f"it (pip install neuronx-cc from the Neuron repository); elsewhere {fix}")

    def check_directories(self) -> None:
        """An unusable cache or manifest folder is one usage error at start-up (not a test error per test)."""
        from neuron_args.atomic import directory_problem

        for option, path, writable, fix in (
            ("--neuron-cache-dir", self.cache_dir, False, "a directory (a read-only one serves its complete entries)"),
            ("--neuron-manifest-dir", self.manifest_dir, True, "a writable directory"),
        ):
            problem = None if path is None else directory_problem(path, writable=writable)
            if problem:
                ini = option.removeprefix("--").replace("-", "_")
                where = f"{option} (ini {ini}, else ${MANIFEST_DIR_ENV})" if writable else f"{option} (ini {ini})"
                if writable and self.manifest_dir_source.startswith("$"):  # nothing given to the plugin: the env's
                    raise pytest.UsageError(
                        f"{self.manifest_dir_source}={path} (the session manifest's folder when no {option} or ini "
                        f"{ini} is given) {problem}; point it at {fix}, give {option}=DIR, or unset it")
                raise pytest.UsageError(f"{where} {path} {problem}; give {fix}, or leave the option out")


def config_warning(config: pytest.Config, warning: Warning) -> None:
    """A start-up warning in pytest's summary; under ``-W error`` (or ``filterwarnings = error``) a usage error
    with its text, not pytest's INTERNALERROR traceback."""
    try:
        config.issue_config_time_warning(warning, stacklevel=3)
    except Warning as exc:
        raise pytest.UsageError(f"{type(exc).__name__} (an error under your warning filters): {exc}") from None


def _raw(config: pytest.Config, dest: str) -> tuple[str | None, str]:
    """``(value, where it came from)`` for errors: the option, else the ini key (with its file); ``(None, "")``."""
    value = config.getoption(dest)
    if value is not None and value is not False:
        return str(value), "--" + dest.replace("_", "-")
    ini = config.getini(dest) if dest in _INI_HELP else ""
    if isinstance(ini, str) and ini.strip():
        return ini.strip(), f"ini key {dest} ({config.inipath})"
    return None, ""


def _switch(config: pytest.Config, dest: str) -> bool:
    """A switch: its option given, else its ini key in the one boolean spelling of the environment variables."""
    value, where = _raw(config, dest)
    if value is None or value.lower() in envs.FALSE_VALUES:
        return False
    if value.lower() in envs.TRUE_VALUES:
        return True
    raise pytest.UsageError(f"{where} = {value!r}: give {envs.BOOLEAN_HELP}")


def _choice(config: pytest.Config, dest: str, choices: tuple[str, ...]) -> tuple[str | None, str]:
    value, where = _raw(config, dest)
    if value is not None and value not in choices:
        raise pytest.UsageError(f"ini option {dest} = {value!r}: use one of {', '.join(choices)}")
    return value, where


def ini_folder(config: pytest.Config) -> Path:
    """The ini file's folder, else the rootdir: where an ini value's relative path and the default baseline live."""
    return config.inipath.parent if config.inipath is not None else config.rootpath


def _path(config: pytest.Config, dest: str) -> tuple[Path | None, str]:
    value, where = _raw(config, dest)
    if value is None:
        return None, where
    if dest == "neuron_cache_dir" and is_remote(value):  # s3://bucket/prefix: its local read-through copy
        return cache_root(value), where
    path = Path(os.path.expanduser(value))
    if not path.is_absolute():
        path = Path(config.invocation_params.dir if where.startswith("--") else ini_folder(config)) / path
    return path, where


__all__ = ["COMPILERS", "FLOWS", "NeuronSettings", "TARGETS", "add_options", "given_options"]
