"""Per-session plugin state: the cache and manifest directories, and what the session compiled and served.

One :class:`NeuronSession` per ``pytest.Config``; ``ACTIVITY`` is read as differences from its snapshot at session
start (an in-process ``pytester`` run shares it), and exported as builtins for xdist's ``workeroutput``.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from neuron_args import envs
from neuron_args.activity import ACTIVITY
from neuron_args.graph_outcome import COUNTERS, GraphOutcome
from neuron_args.manifest.config import merge_configs
from neuron_args.manifest.engine import MANIFEST_DIR_ENV
from neuron_args.manifest.folder_lock import folder_lock_holder, lock_folder, unlock_folder
from neuron_args.manifest.ledger import LEDGER_DIRNAME
from neuron_args.manifest.schema import MANIFEST_FILENAME
from neuron_args.text import first_line
from neuron_args.untrusted import MANIFEST_LIMIT, read_json
from pytest_neuron_args import gc_policy
from pytest_neuron_args.options import NeuronSettings


def _graphs_without_executable(path: Path, other_caches: Iterable[str] = ()) -> tuple[int, int, dict[str, int]] | None:
    """(graphs without an executable in the cache, graphs, {a project runner's own cache: how many it holds}) of a
    written manifest, when some lack it (a manifest names one cache, so graphs built elsewhere lack their NEFF)."""
    from neuron_args.cache import CompileCache

    try:
        graphs = read_json(path, MANIFEST_LIMIT).get("graphs") or []
        missing = [g.get("graph_hash") for g in graphs if not g.get("neff_path")]
    except (OSError, ValueError, AttributeError):
        return None
    elsewhere: dict[str, int] = {}
    for root in other_caches:
        cache = CompileCache(root)
        found = [k for k in missing if isinstance(k, str) and (e := cache.lookup(k)) is not None and e.is_complete]
        if found:
            elsewhere[root] = len(found)
            missing = [k for k in missing if k not in found]
    return (len(missing), len(graphs), elsewhere) if missing or elsewhere else None


#: xdist: the controller's cache directory in a worker's workerinput, and a worker's export() in its workeroutput
WORKER_CACHE_KEY = "neuron_args_cache_dir"
WORKEROUTPUT_KEY = "neuron_args"
STASH_KEY = pytest.StashKey["NeuronSession"]()


def get_session(config: pytest.Config) -> NeuronSession:
    """The session ``pytest_configure`` set up (a historic hook: a plugin registered later is configured too)."""
    return config.stash[STASH_KEY]


def safe_name(nodeid: str) -> str:
    """A file-name-safe, still readable form of a test id (``tests/t.py::test_a[x]`` -> ``tests_t.py__test_a_x_``)."""
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in nodeid).strip("._")
    return out[:180] or "test"


class NeuronSession:
    """What the plugin knows about this pytest session (controller, worker or plain run)."""

    def __init__(self, config: pytest.Config, settings: NeuronSettings) -> None:
        self.config = config
        self.settings = settings
        self.report_written: Path | None = None  # --neuron-report's file, once written
        self._workerinput: dict[str, Any] = dict(getattr(config, "workerinput", None) or {})
        self.is_worker = self._workerinput.get("workerid") is not None  # an xdist worker
        self.is_rank_worker = settings.rank_worker is not None  # a --neuron-tp rank process
        self._cache_dir: Path | None = None
        #: what pytest_unconfigure undoes: process-wide settings, the manifest folder's lock, the environment
        self.at_stop = contextlib.ExitStack()
        #: a session run inside another one of this process on the same manifest folder: the outer one emits
        self.inner_session = False
        self._records_before: dict[str, GraphOutcome] = {}
        self._stats_before: dict[str, int] = {}
        self._corrupt_before: dict[str, str] = {}
        self.serve_calls: dict[str, int] = {}
        self.serve_misses = 0
        self.serve_sessions = 0
        self.parallel_compiled: dict[str, GraphOutcome] = {}  # what parallel compiles built or failed
        self.deferred_counts: Counter[str] = Counter()  # cache counts of parallel warmups' other processes
        self.baseline_checks: list[dict[str, Any]] = []  # every neuron_baseline.check (see baseline.Baseline)
        self.baseline_inventory: dict[str, dict[str, Any]] | None = None  # set where tests were collected
        self.collection_complete = True  # no -k/-m/--deselect/node-id selection, no collection error (see covered)
        #: set by the controller at session end (baseline.tidy): baseline files unused, unchecked (their test exists but
        #: was skipped...) and removed
        self.baselines_tidied: dict[str, list[str]] = {}
        #: modules and folders whose collection was skipped (an importorskip): their tests exist
        self.skipped_collectors: list[Path] = []
        self.workers: dict[str, dict[str, Any]] = {}
        self.workers_started: set[str] = set()  # xdist workers the controller configured (all report, unless stopped)
        self.rank_parts: list[dict[str, Any]] = []  # what --neuron-tp rank processes compiled or loaded
        self.runners: dict[tuple[Any, ...], Any] = {}  # (model identity, settings) -> NeuronRunner
        self.runners_made = 0  # shared or per-test
        #: runner -> graph type -> (test id, error line) of a warmup that failed: not retried for the next tests
        self.failed_warmups: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, str]]] = \
            weakref.WeakKeyDictionary()
        #: every graph type whose warmup failed ({graph_type, test, error}): the summary names those with no key
        self.warmup_failures: list[dict[str, str]] = []
        #: --neuron-tp: runner -> graph type -> the graphs its rank processes warmed; runner -> rank -> weight digests
        self.tp_warmups: weakref.WeakKeyDictionary[Any, dict[str, list[GraphOutcome]]] = weakref.WeakKeyDictionary()
        self.tp_weights: weakref.WeakKeyDictionary[Any, dict[int, dict[str, str]]] = weakref.WeakKeyDictionary()
        self.tp_serves: list[dict[str, Any]] = []  # serving tests run in the rank processes: each rank's result
        self.manifest_config: dict[str, Any] | None = None  # this process's runners' config blocks (see merged)
        self.manifests_written: list[str] = []
        #: manifest -> (graphs with no executable, graphs, {another cache: graphs built there})
        self.manifest_gaps: dict[str, tuple[int, int, dict[str, int]]] = {}
        #: caches other than the session's that runners of the session warmed into (a project's own neuron_runner)
        #: -> the first test that did
        self.other_caches: dict[str, str] = {}
        self.manifests_not_ours: list[str] = []  # other engines' manifests in the folder, from earlier sessions
        self.interrupted = False  # Ctrl-C (or pytest.exit): the manifest holds only what the warmups reached
        self.manifest_failures: list[str] = []  # why an engine's manifest could not be written (a full disk...)
        self.output_failures: list[str] = []  # why the --neuron-report file or the step summary could not be written
        self._ledger_root: Path | None = None

    def cache_dir(self) -> Path:
        """The session's compile cache: the given one, the controller's (xdist), or a fresh one."""
        if self._cache_dir is None:
            if self.settings.cache_dir is not None:
                path = self.settings.cache_dir
            elif self._workerinput.get(WORKER_CACHE_KEY):
                path = Path(self._workerinput[WORKER_CACHE_KEY])
            else:  # under -p no:tmpdir, a temporary folder
                base = self._basetemp()
                path = base / "neuron-cache" if base is not None else Path(tempfile.mkdtemp(prefix="neuron-cache-"))
            path.mkdir(parents=True, exist_ok=True)
            self._cache_dir = path.resolve()
        return self._cache_dir

    def ledger_root(self) -> Path:
        """Where warmups write their ledger lines: the manifest dir, else a private folder of this process."""
        root = self.settings.manifest_dir
        if root is not None:
            return root
        if self._ledger_root is None:
            # a unique name: the ledger writes one line per graph and *directory* per process, and a basetemp
            # (hence a numbered name in it) repeats across sessions run inside one process (pytester)
            self._ledger_root = Path(tempfile.mkdtemp(prefix="neuron-ledger-", dir=self._basetemp()))
        return self._ledger_root

    def _basetemp(self) -> Path | None:
        factory = getattr(self.config, "_tmp_path_factory", None)  # None under -p no:tmpdir
        return factory.getbasetemp() if factory is not None else None

    def start(self) -> None:
        gc_policy.session_started()
        self.at_stop.callback(gc_policy.session_stopped)
        root = self.settings.manifest_dir  # every process's VLLM_NEURON_MANIFEST_DIR; the controller emits at the end
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
            if not self.is_worker and not self.is_rank_worker:
                self.inner_session = not self._hold_manifest_dir(root)
                if not self.inner_session:  # a crashed session's lines are not ours
                    shutil.rmtree(root / LEDGER_DIRNAME, ignore_errors=True)
            self.at_stop.enter_context(envs.overridden({MANIFEST_DIR_ENV: str(root)}))
        self._records_before, self._stats_before = dict(ACTIVITY.records), ACTIVITY.stats.snapshot()
        self._corrupt_before = dict(ACTIVITY.corrupt)

    def _hold_manifest_dir(self, root: Path) -> bool:
        """Hold the manifest folder for this session (False: this process's outer session holds it); a second
        session on it is a usage error, since each would delete the other's ledger lines."""
        try:
            self.at_stop.callback(unlock_folder, lock_folder(root))  # releases the folder's flock
        except BlockingIOError:
            pid = folder_lock_holder(root)
            if pid == os.getpid():  # a session run inside this one (pytester, pytest.main): the outer one's lines
                return False
            raise pytest.UsageError(
                f"manifest folder {root} is in use by another pytest session (pid {pid or 'unknown'}): two sessions "
                "there would delete each other's ledger lines and overwrite each other's manifest.json. Give each "
                "session its own --neuron-manifest-dir (ini neuron_manifest_dir, else $VLLM_NEURON_MANIFEST_DIR), or "
                "run them one after the other") from None
        return True

    # the controller's side of pytest-xdist (the session is registered as a plugin when xdist is loaded)
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # a fresh per-session cache must be one directory for all workers, not one per worker
        node.workerinput[WORKER_CACHE_KEY] = str(self.cache_dir())
        self.workers_started.add(self._worker_id(node))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        data = (getattr(node, "workeroutput", None) or {}).get(WORKEROUTPUT_KEY)
        if isinstance(data, dict):
            self.workers[self._worker_id(node)] = data

    def _worker_id(self, node: Any) -> str:
        return getattr(getattr(node, "gateway", None), "id", None) or str(len(self.workers))

    def note_manifest_config(self, config: dict[str, Any] | None) -> None:
        """A runner's config block (as builtins), into this process's; ``merged`` unites the processes' ones."""
        if config is not None:
            config = json.loads(json.dumps(config, default=str))
            self.manifest_config = config if self.manifest_config is None else merge_configs(self.manifest_config, config)

    def emit_manifests(self) -> list[Path]:
        """The session manifest: one ``<DIR>/<engine-id>/manifest.json`` per engine that wrote ledger lines."""
        root = self.settings.manifest_dir
        if root is None or self.inner_session:
            return []
        from neuron_args.manifest.emit import emit_engines

        merged = self.merged()  # xdist workers' runners: their models too
        written = emit_engines(root, root, cache_dir=self.cache_dir(), config=merged["manifest_config"],
                               failures=self.manifest_failures)
        graphs = {row["key"] for row in merged["rows"]}
        if graphs and not written and not self.manifest_failures:  # every ledger write failed (logged once each)
            self.manifest_failures.append(f"none of the {len(graphs)} graph(s) of this session reached the ledger "
                                          f"in {root} (its writes failed: a full disk or an unwritable folder)")
        self.manifests_written = [str(p) for p in written]
        self.manifest_gaps = {str(p): gap for p in written
                              if (gap := _graphs_without_executable(p, merged["other_caches"])) is not None}
        self.manifests_not_ours = sorted(str(p) for p in root.glob(f"*/{MANIFEST_FILENAME}") if p not in written)
        with contextlib.suppress(OSError):
            (root / LEDGER_DIRNAME).rmdir()  # every engine's ledger was consumed
        return written

    def note_runner_cache(self, cache_dir: Any, nodeid: str) -> None:
        """A runner warmed up into ``cache_dir``: remembered when it is not the session's cache."""
        path = str(Path(cache_dir).resolve())
        if path != str(self.cache_dir()):
            self.other_caches.setdefault(path, nodeid)

    def add_serve(self, calls: dict[str, int], misses: int) -> None:
        self.serve_sessions += 1
        self.serve_misses += int(misses)
        for graph_type, n in calls.items():
            self.serve_calls[graph_type] = self.serve_calls.get(graph_type, 0) + int(n)

    def add_compile_report(self, report: Any) -> None:
        """What a parallel warmup (or its part before it raised) compiled or failed: the records are the workers'."""
        for g in getattr(report, "graphs", None) or []:
            # compiled elsewhere: not served here; its status comes from the counts, as every row's
            unseen = replace(g, how=None, serve_hits=None, serve_misses=None)
            if g.status == "compiled":
                self.parallel_compiled[g.key] = replace(unseen, compiles=1)
            elif g.status == "failed" and g.key not in self.parallel_compiled:
                error = first_line(str(g.error or "")) or "failed"
                self.parallel_compiled[g.key] = replace(unseen, failures=1, error=error)

    def local_rows(self) -> list[GraphOutcome]:
        """One outcome per graph this process compiled, captured or loaded during the session."""
        rows: dict[str, GraphOutcome] = {}
        for key, now in list(ACTIVITY.records.items()):
            before = self._records_before.get(key)
            row = now.since(before)
            if before is None or any(getattr(row, n) for n in COUNTERS):
                rows[key] = row
        for key, built in self.parallel_compiled.items():
            rows[key] = rows[key].merged(built) if key in rows else built
        return [_with_size(row, self._cache_dir) for row in rows.values()]

    def export(self) -> dict[str, Any]:
        """This process's contribution, as builtins (the xdist ``workeroutput`` payload)."""
        now = ACTIVITY.stats.snapshot()
        stats = Counter({k: max(0, now[k] - self._stats_before.get(k, 0)) for k in now})  # a test may reset STATS
        stats.update(self.deferred_counts)  # what parallel-flow children and workers did
        return {
            "rows": [row.to_json() for row in self.local_rows()],
            "stats": dict(stats),
            **{name: copy.copy(getattr(self, name)) for name in _EXPORTED},
            "eager_outputs": dict(ACTIVITY.eager_outputs),  # NEFFs whose outputs came from eager PyTorch
            "eager_fallbacks": dict(ACTIVITY.eager_fallbacks),  # frames Dynamo's recompile limit stopped compiling
            # cache entries this session found corrupt, moved aside and rebuilt: key -> why
            "corrupt": {k: why for k, why in ACTIVITY.corrupt.items() if self._corrupt_before.get(k) != why},
        }

    def merged(self) -> dict[str, Any]:
        """This process's data merged with every xdist worker's (the controller's view)."""
        ranks = [*self.rank_parts, *(r for w in self.workers.values() for r in w.get("rank_parts") or [])]
        parts = [self.export(), *self.workers.values(), *ranks]
        rows: dict[str, GraphOutcome] = {}
        calls: Counter[str] = Counter()
        stats: Counter[str] = Counter()
        config: dict[str, Any] | None = None  # the session manifest's: the first runner's, naming every model
        inventory: dict[str, dict[str, Any]] = {}  # baseline folder -> its tests, where collected (not in ranks)
        for part in parts:
            for row in map(GraphOutcome.from_json, part.get("rows", [])):
                rows[row.key] = rows[row.key].merged(row) if row.key in rows else row
            calls.update(part.get("serve_calls", {}))
            stats.update(part.get("stats", {}))
            if part.get("manifest_config"):
                config = part["manifest_config"] if config is None else merge_configs(config, part["manifest_config"])
            for folder, info in (part.get("baseline_inventory") or {}).items():
                into = inventory.setdefault(folder, {"tests": [], "covered": True, "skipped": []})
                for name in ("tests", "skipped"):
                    into[name] = sorted(set(into[name]) | set(info.get(name, [])))
                into["covered"] = into["covered"] and bool(info.get("covered"))
        return {
            "rows": [row.to_json() for row in sorted(rows.values(), key=lambda row: row.sort_key)],
            "serve_calls": dict(calls),
            **{name: sum(p.get(name, 0) for p in parts) for name in ("serve_misses", "serve_sessions")},
            **{name: [x for p in parts for x in p.get(name) or []] for name in _CONCATENATED},
            "baselines_written": [c["path"] for p in parts for c in p.get("baseline_checks") or []
                                  if c["status"] in ("written", "updated")],
            **{name: {k: v for p in parts for k, v in (p.get(name) or {}).items()} for name in _UNITED},
            **{name: list(paths) for name, paths in self.baselines_tidied.items()},
            "stats": dict(stats),
            "workers": sorted(self.workers),
            "workers_silent": sorted(self.workers_started - set(self.workers)),
            "rank_processes": len(ranks),
            "manifests_written": list(self.manifests_written),
            "other_caches": {c: t for p in reversed(parts) for c, t in (p.get("other_caches") or {}).items()},
            "manifest_config": config,
            "baseline_inventory": inventory if any(p.get("baseline_inventory") is not None for p in parts) else None,
        }


#: the session's own fields an export carries (copies): an xdist worker's --neuron-tp rank processes among them,
#: for the controller
_EXPORTED = ("serve_calls", "serve_misses", "serve_sessions", "baseline_checks", "baseline_inventory",
             "manifest_config", "rank_parts", "tp_serves", "warmup_failures", "other_caches")
#: export fields merged by concatenating the parts' lists, and by uniting their dicts
_CONCATENATED = ("baseline_checks", "warmup_failures", "tp_serves")
_UNITED = ("eager_outputs", "eager_fallbacks", "corrupt")


def _with_size(row: GraphOutcome, cache_dir: Path | None) -> GraphOutcome:
    """A graph with no executable size (built by a ``parallel_compile``): its size from the session cache."""
    from neuron_args.cache import CompileCache

    entry = None if row.executable_size or cache_dir is None else CompileCache(cache_dir).lookup(row.key)
    with contextlib.suppress(OSError):  # no executable
        return row if entry is None else replace(row, executable_size=entry.executable_path.stat().st_size)
    return row


__all__ = ["MANIFEST_DIR_ENV", "WORKEROUTPUT_KEY", "NeuronSession", "get_session", "safe_name"]
