"""pytest plugin entry point (``pytest11``): the hooks. Importing it must stay cheap (no torch): pytest loads it in
every session of an environment that has neuron-args installed.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_args import eager_fallback, envs
from pytest_neuron_args import fixtures, gc_policy, markers, ranks
from pytest_neuron_args.fixtures import (CALL_FAILED, MODEL_FIXTURES, PROGRESS_KEY, baseline_location,
                                         model_fixturedef_of, tp_serve)
from pytest_neuron_args.options import (PATH_OPTIONS, NeuronSettings, add_options, config_warning, given_options,
                                        ini_folder)
from pytest_neuron_args.baseline import BASELINE_DIRNAME, covers, name_parts, tidy_session
from pytest_neuron_args.report import header_line, write_json_report, write_step_summary, write_summary
from pytest_neuron_args.state import STASH_KEY, WORKEROUTPUT_KEY, NeuronSession, get_session, safe_name
from pytest_neuron_args.trace_log import TRACE_LOG


#: The name pytest's entry-point autoload registers this module under (``pytest11`` in pyproject.toml).
ENTRY_POINT_NAME = "neuron_args"


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    """This module has two names, its entry point's (``-p neuron_args``) and its path (``pytest_plugins``, usual
    where ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` is set): registered under one, the other is blocked, so naming it
    again is a no-op instead of pluggy's "Plugin already registered under a different name" crash."""
    if plugin is not sys.modules[__name__]:
        return
    for name in {ENTRY_POINT_NAME, __name__} - {manager.get_name(plugin)}:
        if manager.get_plugin(name) is None:
            manager.set_blocked(name)


pytest_addoption = add_options


def pytest_configure(config: pytest.Config) -> None:
    # the fixtures a test uses, as a plugin's (pytest_plugins would warn: this module imports them, so pytest
    # cannot rewrite their asserts)
    config.pluginmanager.register(fixtures, "neuron_args_fixtures")
    markers.register(config)
    settings = NeuronSettings.from_config(config)  # its compiler arguments checked as they entered
    settings.check_compiler()
    settings.check_directories()
    session = NeuronSession(config, settings)
    config.stash[STASH_KEY] = session
    if session.is_rank_worker:
        _join_tp_group(session)
    if not session.is_worker:
        _warn_split_path_options(config)
    session.start()
    # a recompile-limit fallback fails the test
    session.at_stop.callback(eager_fallback.error_by_default, eager_fallback.error_by_default(True))
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(session, "neuron_args_xdist")  # it merges the workers' exports
    # torch's structured-trace logger (DEBUG, not propagating) would fill each failing test's captured log with
    # empty "DEBUG torch.__trace" lines under pytest >= 9: dropped unless TORCH_TRACE is set (by a filter of this
    # session: a pytester run inside keeps ours)
    if not envs.is_set("TORCH_TRACE"):
        drop: Callable[[logging.LogRecord], bool] = lambda record: False
        logging.getLogger(TRACE_LOG).addFilter(drop)
        session.at_stop.callback(logging.getLogger(TRACE_LOG).removeFilter, drop)


def _warn_split_path_options(config: pytest.Config) -> None:
    """pytest finds its ini file before it knows plugin options, so in ``--neuron-cache-dir PATH`` an existing PATH
    is a test path that can move the rootdir (an xdist worker, started after the directories exist, is hit too)."""
    for flag, value in (given for given in given_options(config) if len(given) == 2):
        if flag in PATH_OPTIONS and Path(config.invocation_params.dir, value).exists():
            config_warning(config, pytest.PytestConfigWarning(
                f"write {flag}={value} (with '='): pytest looks for its ini file before it knows plugin "
                f"options and takes the existing path {value} for a test path; rootdir is {config.rootpath}, "
                f"ini file {config.inipath or '(none found)'}"))


def _join_tp_group(session: NeuronSession) -> None:
    """A ``--neuron-tp`` rank process joins the launcher's gloo group (until the session stops) and tells the ledger."""
    world = envs.WORLD_SIZE
    if world <= 1:
        return
    import torch.distributed as dist

    from neuron_args.manifest.ledger import register_tp_group

    rank = envs.RANK
    if not dist.is_initialized():
        import datetime

        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    session.at_stop.callback(lambda: dist.is_initialized() and dist.destroy_process_group())
    register_tp_group(list(range(world)), rank)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(STASH_KEY, None)
    if session is not None:
        session.at_stop.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers.skip_without_device(items)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        get_session(items[0].config).collection_complete = False


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A module or folder skipped at collection (``importorskip`` in it or its conftest): its tests exist."""
    report = yield
    if report.skipped and getattr(collector, "path", None) is not None:
        get_session(collector.config).skipped_collectors.append(Path(collector.path).resolve())
    return report


def _skipped_prefixes(state: NeuronSession, anchors: set[Path]) -> list[str]:
    """The test-part prefixes (as baseline files name tests) of the skipped modules and folders below ``anchors``."""
    out = set()
    for path in state.skipped_collectors:
        for anchor in (a.resolve() for a in anchors):
            if path == anchor or path in anchor.parents:
                out.add("")  # the whole folder skipped: every baseline there is kept
            elif anchor in path.parents:
                out.add(safe_name(path.relative_to(anchor).as_posix()))
    return sorted(out)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    state = get_session(config)
    if not config.option.collectonly and any(MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
                                             for item in session.items):
        gc_policy.freeze(collect=True)  # imports and items live as long as the session
        from neuron_args.runner import prestart_compile_worker  # the first compile's worker starts during the traces
        from neuron_args.settings import CompileSettings

        prestart_compile_worker(CompileSettings(compiler=state.settings.compiler, cache_dir=str(state.cache_dir())),
                                unless_warm=True)
    if state.is_rank_worker:
        return
    s = state.settings
    # a selection (-k, -m, even one that happens to select everything), a module that does not import
    # (collection errors count in testsfailed) or --lf: tests may exist that were not collected
    if session.testsfailed or config.getoption("lf", False) or config.getoption("keyword", "") \
            or config.getoption("markexpr", ""):
        state.collection_complete = False
    args = [str(Path(config.invocation_params.dir, a)) if "::" not in a else a for a in config.args]
    source = getattr(config, "args_source", None)
    if source is not None and source.name == "TESTPATHS" and config.inipath is not None:
        args.append(str(config.inipath.parent))  # no arguments: the ini file's testpaths are its whole suite
    anchors: dict[str, set[Path]] = {}
    tests: dict[str, set[str]] = {}
    for item in (i for i in session.items if "neuron_baseline" in getattr(i, "fixturenames", ())):
        path, anchor = baseline_location(config, item, model_fixturedef_of(item), s)
        anchors.setdefault(str(path.parent), set()).add(anchor)
        tests.setdefault(str(path.parent), set()).add(name_parts(path)[0])
    default_anchor = ini_folder(config).resolve()
    default_folder = (s.baseline if s.baseline is not None else default_anchor / BASELINE_DIRNAME).resolve()
    anchors.setdefault(str(default_folder), set()).add(default_anchor)
    state.baseline_inventory = {
        folder: {"tests": sorted(tests.get(folder, ())),
                 "covered": state.collection_complete and all(covers(args, a) for a in folder_anchors),
                 "skipped": _skipped_prefixes(state, folder_anchors)}
        for folder, folder_anchors in anchors.items()}


def pytest_report_header(config: pytest.Config) -> str:
    return header_line(get_session(config))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Under ``--neuron-tp``: a rank process runs a test's fixtures (its warmup), not the test itself, unless the
    test serves; the pytest process runs a serving test in every rank process instead of here (no shard here)."""
    session = get_session(pyfuncitem.config)
    if session.is_rank_worker:
        return None if session.settings.rank_serve else True
    if session.settings.tp > 1 and "neuron_served" in pyfuncitem.fixturenames:
        tp_serve(pyfuncitem, session)
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if call.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    session = get_session(item.config)
    out = session.settings.rank_worker
    if report.failed and out is not None and not ranks.warmup_file(out, envs.RANK).exists():
        ranks.write_warmup(out, {"error": str(report.longrepr)})  # a failure before the warmup reported: say what
    if session.settings.rank_serve and out is not None:
        ranks.note_phase(out, report, session.export())
    lines = item.stash.get(PROGRESS_KEY, None)
    if lines:  # an xdist worker's warmup progress, printed by the controller (pytest_runtest_logreport)
        report.neuron_progress = list(lines)
        lines.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    lines = getattr(report, "neuron_progress", None)
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker it came from
    config = getattr(node, "config", None)
    if not lines or config is None or get_session(config).is_worker:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        worker = getattr(getattr(node, "gateway", None), "id", "worker")
        for line in lines:
            reporter.write_line(f"[{worker}] {line}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = get_session(session.config)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKEROUTPUT_KEY] = state.export()
    elif not state.is_rank_worker:  # the controller's (or a plain run's) outputs
        state.interrupted = session.exitstatus == pytest.ExitCode.INTERRUPTED
        state.emit_manifests()
        tidy_session(state)
        state.report_written = write_json_report(state)
        write_step_summary(state)
        # a manifest --neuron-manifest-dir asked for, or the report or summary CI reads, is missing
        if (state.manifest_failures or state.output_failures) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if state.runners_made:  # pytest's collections and the interpreter's at exit skip the warmed-up heap
        from neuron_args.deferred.parallel_trace import close_kept_children

        close_kept_children()  # the runners' idle trace children leave with the session
        gc_policy.freeze(collect=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not get_session(config).is_worker:
        write_summary(terminalreporter, get_session(config))
