"""The fixtures a model developer's tests use. They need one fixture from the user: ``neuron_model``.

Tests that get the same model object (a ``neuron_model`` wider than function scope) and settings share one
runner, so a graph type is warmed up once per session; a second warmup of it replays the first one's counts
into ``neuron_compile_counter`` blocks, so counts do not depend on test order.
"""
from __future__ import annotations

import contextlib
import inspect
import shlex
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neuron_args import envs
from neuron_args.activity import tally
from neuron_args.cache import CacheStats, CompileCache
from neuron_args.deferred.parallel_compile import ParallelCompileError
from neuron_args.errors import NeuronArgsError, TraceError
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.manifest.emit import emit_engines
from neuron_args.manifest.engine import MANIFEST_DIR_ENV
from neuron_args.text import first_line
from neuron_args.untrusted import MANIFEST_LIMIT, read_json
from pytest_neuron_args import gc_policy, ranks, trace_log
from pytest_neuron_args.assertions import CompileCounter, ManifestView
from pytest_neuron_args.baseline import Baseline, baseline_path
from pytest_neuron_args.markers import ALLOW_BREAKS, check_graph_types, marked_graph_types
from pytest_neuron_args.options import RANK_SERVE_OPTION, RANK_WORKER_OPTION, NeuronSettings, given_options, ini_folder
from pytest_neuron_args.report import add_properties, serve_properties, warmup_properties
from pytest_neuron_args.state import NeuronSession, get_session, safe_name

USER_FIXTURE = "neuron_model"
#: the fixtures that need the user's model (a graph_type marker is checked against it only when one is used)
MODEL_FIXTURES = frozenset({"neuron_runner", "neuron_compiler_args", "neuron_warmup", "neuron_served",
                            "neuron_manifest"})
PROGRESS_KEY = pytest.StashKey[list]()
CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def neuron_model(request: pytest.FixtureRequest) -> Any:
    """The user's model. This default, which any ``neuron_model`` of a conftest overrides, only explains itself."""
    users = [name for name in request.fixturenames if name in MODEL_FIXTURES] or ["this test"]
    marked = marked_graph_types(request.node)
    how = f" (with @pytest.mark.graph_type({', '.join(map(repr, marked))}))" if marked else ""
    pytest.fail(
        f"{users[0]}{how} needs a `{USER_FIXTURE}` fixture: define one in your conftest.py that returns "
        "your model (an nn.Module whose neuron_graphs() returns its GraphSpec list); scope='session' shares one "
        "warmup between tests", pytrace=False)


def model_fixturedef_of(item: pytest.Item) -> Any:
    """The ``neuron_model`` fixture definition an item would get (None when unknown: the model is per-test)."""
    try:
        defs = item.session._fixturemanager.getfixturedefs(USER_FIXTURE, item)
    except Exception:  # another pytest's private API
        return None
    return defs[-1] if defs else None


def _progress_writer(config: pytest.Config, node: pytest.Item) -> Any:
    """Warmup progress lines (an xdist worker's go in the test's report, for the controller); none under -q."""
    session = get_session(config)
    if config.get_verbosity() < 0 or session.is_rank_worker:
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(event: Any) -> None:
        prefix = "neuron-args parallel compile " if hasattr(event, "graph") else "neuron-args: "
        line = prefix + event.line()
        if session.is_worker or reporter is None:
            node.stash.setdefault(PROGRESS_KEY, []).append(line)
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(line)

    return write


def _neuron_args(config: pytest.Config) -> list[str]:
    """This run's ``--neuron-*`` arguments (but ``--neuron-update-baseline``), for a copy-paste command."""
    return [arg for given in given_options(config) if given[0] != "--neuron-update-baseline" for arg in given]


@pytest.fixture(autouse=True)
def _neuron_graph_type_check(request: pytest.FixtureRequest) -> None:
    """A ``graph_type`` marker naming a type the model does not declare fails the test at setup (only where a
    fixture needs the model: on other tests the marker is documentation)."""
    marked = marked_graph_types(request.node)
    if marked and MODEL_FIXTURES & set(request.fixturenames):
        check_graph_types(request.node.nodeid, request.getfixturevalue(USER_FIXTURE), marked)


@pytest.fixture(scope="session")
def neuron_settings(pytestconfig: pytest.Config) -> NeuronSettings:
    """What the ``--neuron-*`` options resolved to."""
    return get_session(pytestconfig).settings


@pytest.fixture(scope="session")
def neuron_target(neuron_settings: NeuronSettings) -> str:
    """The compile target (``--neuron-target``, default trn2)."""
    return neuron_settings.target


@pytest.fixture(scope="session")
def neuron_cache(pytestconfig: pytest.Config) -> Any:
    """The session's :class:`neuron_args.cache.CompileCache` (``--neuron-cache-dir`` or a fresh one)."""
    return CompileCache(get_session(pytestconfig).cache_dir())


def _warmup(session: NeuronSession, runner: Any, graph_types: list[str] | None, progress: Any = None) -> Any:
    """``runner.warmup`` as the plugin runs one (GC paused, no manifest: the session emits it); its report noted."""
    keep = any(r is runner for r in session.runners.values())  # the session keeps it (its model outlives a test)
    with gc_policy.paused(keep=keep), trace_log.detached():
        report = runner.warmup(graph_types=graph_types, flow=session.settings.flow, progress=progress, emit=False)
    session.add_compile_report(report.compile_report)
    return report


@pytest.fixture
def neuron_runner(request: pytest.FixtureRequest, pytestconfig: pytest.Config, neuron_model: Any) -> Iterator[Any]:
    """A NeuronRunner for ``neuron_model`` with the session's options, one per model object and settings (a new one
    per test for a per-test model); while the test runs its graphs go to the session's ledger, so a warmup the test
    calls itself is in the manifest a later ``neuron_manifest`` reads."""
    import torch

    from neuron_args.runner import NeuronRunner

    session = get_session(pytestconfig)
    s = session.settings
    fullgraph = not (s.allow_graph_breaks or request.node.get_closest_marker(ALLOW_BREAKS) is not None)
    fixturedef = model_fixturedef_of(request.node)
    shared = fixturedef is not None and fixturedef.scope != "function"
    key = (id(neuron_model), fullgraph, s.runner_key())
    runner = session.runners.get(key) if shared else None
    if runner is None or runner.model is not neuron_model:
        # Dynamo's frame caches grow with every runner (and hold their graphs): start each new runner from
        # a clean Dynamo; the session's other runners retrace on their next call (loads, never compiles)
        torch._dynamo.reset()
        try:
            runner = NeuronRunner(neuron_model, compiler_args=s.base_args, target=s.target, compiler=s.compiler,
                                  cache_dir=session.cache_dir(), optimization_level=s.optimization_level,
                                  fullgraph=fullgraph, compile_timeout=s.compile_timeout,
                                  allow_eager_outputs=s.allow_eager_outputs or None,
                                  manifest_config={"topology": {"world_size": s.tp, "tensor_parallel_size": s.tp,
                                                                "has_collectives": s.tp > 1}})
        except NeuronArgsError as exc:
            pytest.fail(f"{USER_FIXTURE} ({type(neuron_model).__name__}): {exc}", pytrace=False)
        runner.emit_manifests = False  # the session writes the manifest once, at its end
        session.runners_made += 1
        if shared:
            session.runners[key] = runner
    runner.origin = request.node.nodeid
    with envs.overridden({MANIFEST_DIR_ENV: str(session.ledger_root())}):
        yield runner


def _ours(request: pytest.FixtureRequest, name: str, value: Any, kind: str) -> Any:
    """``value`` of the plugin fixture ``name`` as another plugin fixture needs it; one of the project's own of that
    name (it overrides the plugin's for every test below its conftest) fails the test naming where it is defined."""
    from neuron_args import runner

    if isinstance(value, getattr(runner, kind)):  # a subclass of the project's own is fine
        return value
    try:
        func = request._fixturemanager.getfixturedefs(name, request.node)[-1].func
        where = f"{inspect.getsourcefile(func)}:{inspect.getsourcelines(func)[1]}"
    except Exception:  # another pytest's private API, or no source
        where = "a conftest or test module"
    pytest.fail(f"{request.fixturename} needs the neuron-args plugin's `{name}` fixture (a {kind}), but this test gets "
                f"the one defined at {where}, which returned {type(value).__name__}: it overrides the plugin's of that "
                f"name. Rename that fixture (the plugin's fixtures are named neuron_*), or return a {kind} from it",
                pytrace=False)


@pytest.fixture
def neuron_compiler_args(request: pytest.FixtureRequest, neuron_runner: Any) -> Any:
    """The arguments the marked graph type compiles with (a list; a dict ``{graph_type: list}`` for several): its
    per-graph list, else the base list; platform arguments (``--target``) are not included."""
    neuron_runner = _ours(request, "neuron_runner", neuron_runner, "NeuronRunner")
    marked = marked_graph_types(request.node)
    if not marked:
        pytest.fail("neuron_compiler_args resolves the graph type(s) of the test's marker: add "
                    "@pytest.mark.graph_type('decode') (or several types) to the test", pytrace=False)
    resolver = neuron_runner.resolver
    resolved = {g: list(args if (args := resolver.resolve_graph_compiler_args(g)) is not None else resolver.base_args)
                for g in marked}
    return resolved[marked[0]] if len(marked) == 1 else resolved


@pytest.fixture
def neuron_compile_counter() -> CompileCounter:
    """Compile-cache counts since setup, and ``expect(compiles=..., misses=..., hits=...)`` blocks."""
    return CompileCounter()


@pytest.fixture
def neuron_warmup(request: pytest.FixtureRequest, neuron_runner: Any, pytestconfig: pytest.Config,
                  tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Warm up the marked graph types (all declared ones without a marker) with ``--neuron-flow`` (under
    ``--neuron-tp N`` in N rank processes); the ``WarmupReport``."""
    neuron_runner = _ours(request, "neuron_runner", neuron_runner, "NeuronRunner")
    session = get_session(pytestconfig)
    s = session.settings
    graph_types = marked_graph_types(request.node) or None
    if session.is_rank_worker:
        return _rank_worker_warmup(request, session, neuron_runner, graph_types)
    chosen = graph_types or list(neuron_runner.graphs)
    _fail_if_failed_before(session, neuron_runner, chosen)
    try:
        with tally() as warming:
            if s.tp > 1:
                report = tp_warmup(request, session, neuron_runner, graph_types, tmp_path_factory)
            else:
                with envs.overridden({MANIFEST_DIR_ENV: str(session.ledger_root())}):
                    report = _warmup(session, neuron_runner, graph_types, _progress_writer(pytestconfig, request.node))
                session.deferred_counts.update(report.deferred_counts.snapshot())  # loads here: in ACTIVITY.stats
    except BaseException as exc:
        # what a failed parallel warmup built before it raised (a ParallelCompileError's report; the parallel_compile
        # a trace failure, a graph break or Ctrl-C cut short): those graphs were compiled by this session
        for built in [exc.report] if isinstance(exc, ParallelCompileError) else warming.compile_reports:
            session.add_compile_report(built)
            n = sum(g.status == "compiled" for g in built.graphs)
            session.deferred_counts.update(misses=n, compiles=n, captures=n)
        if isinstance(exc, Exception):
            _note_failed_warmup(session, neuron_runner, chosen, request.node.nodeid, exc)
        raise
    finally:  # a failed warmup's graphs are in the manifest too: with the model, target and graph types
        session.note_manifest_config(neuron_runner.manifest_config_block())
        session.note_runner_cache(neuron_runner.cache_dir, request.node.nodeid)
    add_properties(request.node, warmup_properties(report.graphs))
    return report


def _first_line(text: object) -> str:
    """An error's first line, with the next one when it ends in ':' (the source line a graph break names)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")


def _note_failed_warmup(session: NeuronSession, runner: Any, chosen: list[str], nodeid: str, exc: Exception) -> None:
    """Note the graph types a failed warmup failed on, each with its error's first line: a parallel warmup's failed
    graphs, else the first one not warmed (the in-process flow stops at the error)."""
    from neuron_args.runner import GraphBreakError

    named: dict[str, str] = {}
    if isinstance(exc, GraphBreakError) and exc.graph_type is not None:
        named[exc.graph_type] = _first_line(exc)
    for g in exc.failures if isinstance(exc, ParallelCompileError) else ():
        named.setdefault(g.graph_type, _first_line(g.error))
    for r in exc.results if isinstance(exc, TraceError) else ():
        if r.status == "failed":
            raised = first_line("\n".join(reversed(str(r.error or exc).splitlines())))  # a traceback's last line
            named.setdefault(r.graph_type, f"trace of graph type {r.graph_type!r} failed: {raised}")
    named = {g: line for g, line in named.items() if g in chosen} or {
        g: _first_line(exc) for g in [g for g in chosen if g not in runner.warmed][:1]}
    failed = session.failed_warmups.setdefault(runner, {})
    for graph_type, line in named.items():
        if graph_type not in failed:
            failed[graph_type] = (nodeid, f"{type(exc).__name__}: {line}")
            session.warmup_failures.append({"graph_type": graph_type, "test": nodeid, "error": failed[graph_type][1]})


def _fail_if_failed_before(session: NeuronSession, runner: Any, chosen: list[str]) -> None:
    """A graph type whose warmup failed earlier in the session fails at once, as pytest's higher-scoped fixtures
    do: compiling it again for each test would repeat the same error (a neuronx-cc compile can take an hour)."""
    failed = session.failed_warmups.get(runner) or {}
    for graph_type in chosen:
        if graph_type in failed and graph_type not in runner.warmed:
            nodeid, error = failed[graph_type]
            pytest.fail(
                f"graph type {graph_type!r} failed its warmup in {nodeid}, so it is not warmed up again in this "
                f"session: {error}\n  fix: what that test's error names (it shows the whole "
                "error and its fix), then rerun: the next session builds the failed graph again", pytrace=False)


@pytest.fixture
def neuron_served(request: pytest.FixtureRequest, neuron_runner: Any, neuron_warmup: Any,
                  pytestconfig: pytest.Config) -> Iterator[Any]:
    """The runner after warmup, serving: a call that misses the cache raises ``CacheMissError``, and one that
    matches no declared bucket ``UndeclaredGraphError`` (the environment is left alone). Under ``--neuron-tp N``
    the test runs in each of N rank processes against its shard and passes only when every rank passed."""
    neuron_runner = _ours(request, "neuron_runner", neuron_runner, "NeuronRunner")
    session = get_session(pytestconfig)
    if session.is_rank_worker and not session.settings.rank_serve or not session.is_rank_worker and session.settings.tp > 1:
        # a rank's warmup-only run; or the pytest process under --neuron-tp, which holds no shard: the test's body
        # runs in every rank process, serving there (tp_serve, from pytest_pyfunc_call)
        yield neuron_runner
        return
    with neuron_runner.serve() as served:
        yield neuron_runner
    session.add_serve(served.calls, served.counts.misses)
    add_properties(request.node, serve_properties(served.calls, served.counts.misses))
    if served.undeclared and not request.node.stash.get(CALL_FAILED, False):
        pytest.fail("while serving, " + f"{len(served.undeclared)} call(s) matched no declared graph (the test caught "
                    "the UndeclaredGraphError):\n" + "\n".join(f"  {m}" for m in served.undeclared)
                    + "\n(a test that expects the error on purpose: call neuron_served.serving.undeclared.clear() after "
                    "catching it)", pytrace=False)


@pytest.fixture
def neuron_manifest(request: pytest.FixtureRequest, neuron_warmup: Any, neuron_runner: Any,
                    pytestconfig: pytest.Config, tmp_path: Path) -> ManifestView:
    """This test's view of the session manifest (``<tmp_path>/neuron-manifest/<engine-id>/manifest.json``): the
    graphs its warmup covers, with every rank that built them."""
    session = get_session(pytestconfig)
    if session.is_rank_worker:
        return None  # type: ignore[return-value]
    neuron_runner = _ours(request, "neuron_runner", neuron_runner, "NeuronRunner")
    neuron_warmup = _ours(request, "neuron_warmup", neuron_warmup, "WarmupReport")
    paths = emit_engines(session.ledger_root(), tmp_path / "neuron-manifest", cache_dir=neuron_runner.cache_dir,
                         config=neuron_runner.manifest_config_block(), keys=neuron_warmup.keys)
    if not paths:
        pytest.fail(f"the warmup of {neuron_warmup.graph_types} left no ledger lines for its {len(neuron_warmup.keys)} "
                    "graph(s), so there is no manifest (look for 'manifest ledger write failed' warnings of the "
                    f"neuron_args.manifest logger in the captured log)", pytrace=False)
    path = max(paths, key=lambda p: len(read_json(p, MANIFEST_LIMIT).get("graphs", [])))
    expected = {g: len(neuron_runner.spec(g).buckets) for g in neuron_warmup.graph_types}
    return ManifestView.load(path, cache_dir=neuron_runner.cache_dir, expected_graphs=expected,
                             rank_weights=session.tp_weights.get(neuron_runner),
                             single_rank_layout=ranks.weights_digest(neuron_runner.model)["layout"]
                             if session.settings.tp > 1 else None)


@pytest.fixture
def neuron_baseline(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Baseline:
    """``check(manifest)``: compare with this test's baseline (``<test>[variant].json``, see
    :func:`baseline_location`), or write it under ``--neuron-update-baseline``."""
    session = get_session(pytestconfig)
    s = session.settings
    nodeid = request.node.nodeid
    hint = shlex.join(["pytest", nodeid, *_neuron_args(pytestconfig), "--neuron-update-baseline"])
    path, _ = baseline_location(pytestconfig, request.node, model_fixturedef_of(request.node), s)
    return Baseline(path, nodeid=nodeid,
                    update=s.update_baseline, update_hint=hint, on_check=session.baseline_checks.append)


def baseline_location(config: pytest.Config, node: pytest.Item, model_fixturedef: Any,
                      settings: NeuronSettings) -> tuple[Path, Path]:
    """A test's baseline file and its anchor, the folder ``.neuron-baseline/`` lives in by default: by the ini file
    of the conftest defining ``neuron_model``, found from that conftest (pytest's rootdir can move with a split
    ``--neuron-cache-dir PATH``); else the ini file or rootdir."""
    model_fixture = getattr(model_fixturedef, "func", None)
    try:
        source = inspect.getsourcefile(model_fixture) if model_fixture is not None else None
    except TypeError:
        source = None
    folder = Path(source).resolve().parent if source else None
    anchor = (_ini_dir(folder) or folder) if folder is not None else ini_folder(config)
    nodeid = node.nodeid
    try:  # named from the anchor too, so neither the folder nor the name moves with the rootdir
        test_id = Path(node.path).resolve().relative_to(anchor).as_posix() + (
            nodeid[nodeid.index("::"):] if "::" in nodeid else "")
    except ValueError:
        test_id = nodeid
    variant = settings.baseline_variant()
    name = safe_name(test_id) + (f"[{variant}]" if variant else "")
    return baseline_path(settings.baseline, anchor, name), anchor


_INI_FILES = (("pytest.ini", None), (".pytest.ini", None), ("pyproject.toml", "[tool.pytest.ini_options]"),
              ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]"))


def _ini_dir(start: Path) -> Path | None:
    """The folder of the nearest pytest ini file at or above ``start`` (how pytest finds it from a test path)."""
    for folder in (start, *start.parents):
        for name, section in _INI_FILES:
            path = folder / name
            if path.is_file():
                with contextlib.suppress(OSError):
                    if section is None or section in path.read_text(encoding="utf-8", errors="replace"):
                        return folder
    return None


def _launch_ranks(node: pytest.Item, session: NeuronSession, out: Path, graph_types: list[str], *extra: str) -> int:
    """Run ``node`` in the ``--neuron-tp`` rank processes, each reporting into ``out``; their exit status."""
    from neuron_args.launch import launch

    config = node.config
    s = session.settings
    nodeid = node.nodeid
    target = f"{node.path}{nodeid[nodeid.index('::'):]}" if "::" in nodeid else str(node.path)
    argv = ["-m", "pytest", target, "-q", "--no-header", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-p", "pytest_neuron_args.plugin",  # also where PYTEST_DISABLE_PLUGIN_AUTOLOAD is set
            f"--rootdir={config.rootpath}", f"{RANK_WORKER_OPTION}={out}"]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    if config.pluginmanager.hasplugin("xdist"):
        argv += ["-n", "0"]
    argv += [f"--neuron-{flag}={value}" for flag, value in (
        ("rank-graph-types", ",".join(graph_types)), ("tp", s.tp), ("cache-dir", session.cache_dir()),
        ("manifest-dir", session.ledger_root()), ("target", s.target), ("flow", s.flow), ("compiler", s.compiler),
        ("compiler-args", s.compiler_args), ("optimization-level", s.optimization_level),
        ("compile-timeout", s.compile_timeout)) if value is not None]
    if s.allow_graph_breaks:
        argv.append("--neuron-allow-graph-breaks")
    return launch([*argv, *extra], tp=s.tp, cwd=str(config.invocation_params.dir))


def tp_warmup(request: pytest.FixtureRequest, session: NeuronSession, runner: Any, graph_types: list[str] | None,
              tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``--neuron-tp N``: warm up in N rank processes (gloo on CPU), each running this test's fixtures (its
    ``neuron_model`` built after ``torch.distributed`` is up) but not the test, and reporting what it warmed."""
    from neuron_args.runner import WarmupReport

    s = session.settings
    chosen = list(graph_types or runner.graphs)
    done = session.tp_warmups.setdefault(runner, {})
    todo = [g for g in chosen if g not in done]
    t0 = time.monotonic()
    if todo:
        out = tmp_path_factory.mktemp("neuron-tp")
        code = _launch_ranks(request.node, session, out, todo)
        results = ranks.read_warmups(out, s.tp)
        errors = [f"rank {r['rank']}:\n{r['error']}" for r in results if r["error"]]
        missing = [r["rank"] for r in results if r["graphs"] is None and not r["error"]]
        # what the ranks compiled, loaded or failed on: the session's table lists it
        session.rank_parts += [r["export"] for r in results if r["export"]]
        if code or errors or missing:
            pytest.fail(f"--neuron-tp {s.tp}: the warmup of {todo} failed in the rank processes (exit status {code})"
                        + ("".join(f"\n{e}" for e in errors) or
                           f"; ranks {missing} reported nothing (their output is in the captured stdout)"),
                        pytrace=False)
        weights = session.tp_weights.setdefault(runner, {})
        for result in results:
            if result["weights"] is not None:
                weights[result["rank"]] = {k: str(v) for k, v in result["weights"].items()}
            graphs = [GraphOutcome.from_json(d) for d in result["graphs"]]
            for g in todo:
                known = {d.key for d in done.setdefault(g, [])}
                done[g] += [d for d in graphs if d.graph_type == g and d.key not in known]
        session.note_manifest_config(results[0].get("config"))
    graphs = [d for g in chosen for d in done[g]]
    return WarmupReport(s.flow, chosen, round(time.monotonic() - t0, 3), CacheStats(), graphs=graphs,
                        reused=[g for g in chosen if g not in todo])


def tp_serve(item: pytest.Function, session: NeuronSession) -> None:
    """``--neuron-tp N``, a test using ``neuron_served``: run it whole in N rank processes, each serving its shard;
    it passes only when every rank passed with no cache miss, and fails naming each rank that did not."""
    s = session.settings
    warmup = item.funcargs.get("neuron_warmup")
    graph_types = list(getattr(warmup, "graph_types", None) or marked_graph_types(item) or [])
    out = item.config._tmp_path_factory.mktemp("neuron-tp-serve")
    code = _launch_ranks(item, session, out, graph_types, RANK_SERVE_OPTION)
    results = ranks.read_serves(out, s.tp)
    session.rank_parts += [r.pop("export") for r in results]
    session.tp_serves.append({"test": item.nodeid, "tp": s.tp, "exit_status": code, "ranks": results})
    problems = ranks.serve_problems(results)
    if not problems and code:
        problems = [f"the rank processes exited with status {code} although every rank reported a pass"]
    if problems:
        pytest.fail(f"--neuron-tp {s.tp}: the test ran in each rank process against its shard; "
                    + "\n".join(problems), pytrace=False)
    if all(r["outcome"] == "skipped" for r in results):
        pytest.skip(f"--neuron-tp {s.tp}: skipped in every rank: {results[0].get('error')}")


def _rank_worker_warmup(request: pytest.FixtureRequest, session: NeuronSession, runner: Any,
                        graph_types: list[str] | None) -> Any:
    """In a rank process: warm up the graph types the pytest process asked for and report them."""
    s = session.settings
    assert s.rank_worker is not None
    asked = request.config.getoption("neuron_rank_graph_types")
    chosen = asked.split(",") if asked else graph_types
    result: dict[str, Any] = {"error": None}  # write_warmup adds the rank
    try:
        report = _warmup(session, runner, chosen)
        result.update(graphs=[g.to_json() for g in report.graphs], export=session.export(),
                      weights=ranks.weights_digest(runner.model),
                      config=runner.manifest_config_block())  # write_warmup's JSON takes any value as its str
        return report
    except BaseException:
        result["error"] = traceback.format_exc()
        with contextlib.suppress(Exception):  # the graphs it got to (a failed compile's too) for the summary
            result["export"] = session.export()
        raise
    finally:
        ranks.write_warmup(s.rank_worker, result)


__all__ = [
    "neuron_baseline", "neuron_cache", "neuron_model", "neuron_compile_counter", "neuron_compiler_args", "neuron_manifest",
    "neuron_runner", "neuron_served", "neuron_settings", "neuron_target", "neuron_warmup", "tp_serve",
]
