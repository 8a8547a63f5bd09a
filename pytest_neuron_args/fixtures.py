"""The fixtures a model developer's tests use. They need one fixture from the user: ``neuron_model``.

``neuron_model`` returns the model: an ``nn.Module`` whose ``neuron_graphs()`` lists its
``GraphSpec(graph_type, entry, buckets)`` and that may define a ``compiler_args_for`` policy.

Each ``neuron_runner`` starts from a reset ``torch._dynamo``: otherwise a later test's runner
reuses the compiled graphs of an earlier one, so it resolves nothing from the cache, writes no
ledger line (an empty manifest) and its counts depend on test order. The reset costs one trace
and lowering per graph and test; the compiled executables stay in the (session) cache.
"""
from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_neuron_args.assertions import CompileCounter, ManifestView
from pytest_neuron_args.baseline import Baseline, baseline_path
from pytest_neuron_args.markers import check_graph_types, marked_graph_types
from pytest_neuron_args.options import NeuronSettings
from pytest_neuron_args.state import MANIFEST_DIR_ENV, get_session, safe_name

USER_FIXTURE = "neuron_model"


def _user_model(request: pytest.FixtureRequest, wanted_by: str) -> Any:
    try:
        return request.getfixturevalue(USER_FIXTURE)
    except pytest.FixtureLookupError:
        pytest.fail(
            f"{wanted_by} needs a `{USER_FIXTURE}` fixture: define one in your conftest.py that returns "
            "your model (an nn.Module whose neuron_graphs() returns its GraphSpec list)", pytrace=False)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _progress_writer(config: pytest.Config) -> Any:
    """Route parallel-compile progress lines to the terminal (not under -q, not on xdist workers)."""
    if get_session(config).is_worker or config.get_verbosity() < 0:
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None

    def write(event: Any) -> None:
        line = f"neuron-args parallel compile {event.line()}"
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(line)

    return write


def _neuron_args(config: pytest.Config) -> list[str]:
    """This run's ``--neuron-*`` arguments (but ``--neuron-update-baseline``), for a copy-paste command."""
    args = [str(a) for a in config.invocation_params.args]
    out: list[str] = []
    for i, arg in enumerate(args):
        if not arg.startswith("--neuron-") or arg == "--neuron-update-baseline":
            continue
        out.append(arg)
        if "=" not in arg and i + 1 < len(args):
            out.append(args[i + 1])
    return out


@pytest.fixture(autouse=True)
def _neuron_graph_type_check(request: pytest.FixtureRequest) -> None:
    """A ``graph_type`` marker naming a type the model does not declare fails the test at setup."""
    marked = marked_graph_types(request.node)
    if marked:
        check_graph_types(request.node.nodeid, _user_model(request, f"@pytest.mark.graph_type{tuple(marked)!r}"),
                          marked)


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
    from neuron_args.cache import CompileCache

    return CompileCache(get_session(pytestconfig).cache_dir())


@pytest.fixture
def neuron_runner(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Any:
    """A :class:`neuron_args.runner.NeuronRunner` for ``neuron_model`` with the session's options."""
    model = _user_model(request, "neuron_runner")
    import torch

    from neuron_args.runner import NeuronRunner

    session = get_session(pytestconfig)
    s = session.settings
    torch._dynamo.reset()  # see the module docstring
    return NeuronRunner(model, compiler_args=s.compiler_args, target=s.target, compiler=s.compiler,
                        cache_dir=session.cache_dir(), optimization_level=s.optimization_level)


@pytest.fixture
def neuron_compiler_args(request: pytest.FixtureRequest, neuron_runner: Any) -> Any:
    """The arguments the marked graph type compiles with (a list); a dict ``{graph_type: list}`` for several.

    That is the resolver's per-graph list, or the base list when no per-graph override applies
    (``resolve`` returned None: no policy, or an explicit ``--neuron-optimization-level``, which
    the base list then carries). Platform arguments (``--target``) are not included.
    """
    marked = marked_graph_types(request.node)
    if not marked:
        pytest.fail("neuron_compiler_args resolves the graph type(s) of the test's marker: add "
                    "@pytest.mark.graph_type('decode') (or several types) to the test", pytrace=False)
    base = list(neuron_runner.resolver.base_args)
    resolved = {}
    for graph_type in marked:
        args = neuron_runner.resolve(graph_type)
        resolved[graph_type] = list(args) if args is not None else list(base)
    return resolved[marked[0]] if len(marked) == 1 else resolved


@pytest.fixture
def neuron_compile_counter() -> CompileCounter:
    """Compile-cache counts since setup, and ``expect(compiles=..., misses=..., hits=...)`` blocks."""
    return CompileCounter()


@pytest.fixture
def neuron_warmup(request: pytest.FixtureRequest, neuron_runner: Any, pytestconfig: pytest.Config,
                  tmp_path: Path) -> Any:
    """Warm up the marked graph types (all declared ones without a marker) with ``--neuron-flow``.

    The manifest of the warmup goes to a folder of this test's own (under ``--neuron-manifest-dir``,
    else under ``tmp_path``), so no other test's graphs end up in it. Returns the ``WarmupReport``.
    """
    session = get_session(pytestconfig)
    root = session.manifest_root()
    manifest_dir = root / safe_name(request.node.nodeid) if root is not None else tmp_path / "neuron-manifest"
    flow = session.settings.flow
    progress = _progress_writer(pytestconfig) if flow == "parallel" else None
    with _env(MANIFEST_DIR_ENV, str(manifest_dir)):
        report = neuron_runner.warmup(graph_types=marked_graph_types(request.node) or None, flow=flow,
                                      progress=progress)
    if report.compile_report is not None:
        session.add_compile_report(report.compile_report)
    return report


@pytest.fixture
def neuron_served(neuron_runner: Any, neuron_warmup: Any, pytestconfig: pytest.Config) -> Iterator[Any]:
    """The runner after warmup, serving: a call that misses the cache raises ``CacheMissError``.

    ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` is set for the test's duration; the error names the graph
    type, the key, the closest warmed-up entry and the components that differ.
    """
    with neuron_runner.serve() as served:
        yield neuron_runner
    get_session(pytestconfig).add_serve(served.calls, served.counts.misses)


@pytest.fixture
def neuron_manifest(neuron_warmup: Any, neuron_runner: Any) -> ManifestView:
    """The manifest the warmup emitted, with ``assert_complete(...)`` and ``assert_ranks(...)``."""
    path = neuron_warmup.manifest_path
    if path is None:
        pytest.fail("warmup wrote no manifest (emit is best-effort: look for the 'manifest emit failed' "
                    "warning of the neuron_args.manifest logger in the captured log)", pytrace=False)
    expected = {g: len(neuron_runner.spec(g).buckets) for g in neuron_warmup.graph_types}
    return ManifestView.load(path, cache_dir=neuron_runner.cache_dir, expected_graphs=expected)


@pytest.fixture
def neuron_baseline(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Baseline:
    """``check(manifest)``: compare with this test's baseline, or write it under ``--neuron-update-baseline``."""
    session = get_session(pytestconfig)
    s = session.settings
    nodeid = request.node.nodeid
    hint = shlex.join(["pytest", nodeid, *_neuron_args(pytestconfig), "--neuron-update-baseline"])
    return Baseline(baseline_path(s.baseline, pytestconfig.rootpath, safe_name(nodeid)), nodeid=nodeid,
                    update=s.update_baseline, update_hint=hint, on_write=session.baselines_written.append)


__all__ = [
    "neuron_baseline", "neuron_cache", "neuron_compile_counter", "neuron_compiler_args", "neuron_manifest",
    "neuron_runner", "neuron_served", "neuron_settings", "neuron_target", "neuron_warmup",
]
