"""``neuron-args``: inspect manifests and compile caches from a shell or CI step (:data:`_COMMANDS`; exit statuses:
:mod:`neuron_args.exit_codes`; ``--json`` changes only what is printed). Imports neither torch nor jax."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from neuron_args.cache import (CACHE_DIR_ENV, DEFAULT_CACHE_DIR, QUARANTINE_DIR, CacheEntry, CompileCache, EntryStatus,
                               cache_root)
from neuron_args import remote_cache
from neuron_args.cache_key import explain_components
from neuron_args.errors import CorruptEntryError, OptionsError
from neuron_args.exit_codes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_REMOTE, EXIT_USAGE
from neuron_args.farm_cli import add_compile_command
from neuron_args.manifest.diff import diff_manifests
from neuron_args.manifest.ledger import ledger_engines
from neuron_args.manifest.schema import validate_manifest
from neuron_args.manifest.show import (CacheEntryInfo, cache_entries, cache_entry_dict, cache_table, is_baseline,
                                      manifest_graph_rows, manifest_graphs, manifest_table, neuron_config,
                                      numbered_graphs, opt_level, recorded_cache_dir, status_counts, validate_baseline)
from neuron_args.report import PlotUnavailable, Thresholds, compare, plot_trend, read_report
from neuron_args.seams.memo_files import prune
from neuron_args.untrusted import MANIFEST_LIMIT, UntrustedFileError, read_json

__all__ = ["EXIT_REMOTE", "main"]


class _Usage(Exception):
    """A usage error or unreadable input: message to stderr, exit status 2."""


def _load_manifest(path: str) -> dict:
    """A manifest file, its ``<engine-id>/`` folder, or a manifest dir holding one engine's folder."""
    target = Path(path).expanduser()
    if target.is_dir():
        engines = [] if (target / "manifest.json").exists() else sorted(target.glob("*/manifest.json"))
        if len(engines) > 1:
            raise _Usage(f"{target} holds the manifests of {len(engines)} engines; name one: "
                         + ", ".join(str(e) for e in engines))
        target = engines[0] if engines else target / "manifest.json"
    try:
        doc = read_json(target, MANIFEST_LIMIT)
    except UntrustedFileError as exc:  # not a regular file, too large, not JSON
        raise _Usage(f"cannot read manifest {target}: {exc}") from None
    except OSError as exc:
        given = Path(path).expanduser()
        pending = ledger_engines(given) if given.is_dir() else []
        hint = (f"; {given} holds ledger lines of engine(s) {', '.join(pending)} that no process emitted yet: "
                "an engine emits at its end (NeuronRunner.emit_manifest(), neuron_args.manifest.emit_manifest), or run "
                f"pytest with --neuron-manifest-dir={shlex.quote(str(given))}") if pending else ""
        raise _Usage(f"cannot read manifest {target}: {exc.strerror or exc}{hint}") from None
    if not isinstance(doc, dict):
        raise _Usage(f"{target} holds a JSON {type(doc).__name__}, not a manifest object")
    return doc


def _cache_dir_for(doc: Mapping, given: str | None) -> tuple[Path | None, str | None]:
    """``--cache-dir``, else the recorded cache (or its remote's local copy), and a note when neither is here."""
    if given is not None and not remote_cache.is_remote(given):
        path = Path(given).expanduser()
        if not path.is_dir():
            raise _Usage(f"--cache-dir {given}: no such directory")
        return path, None
    recorded = None if given is not None else recorded_cache_dir(doc)
    if recorded is not None and recorded.is_dir():
        return recorded, None
    remote = given if given is not None else neuron_config(doc).get("remote_cache")  # s3://bucket/prefix
    if remote_cache.is_remote(remote):
        return _open_cache(remote)[0], None
    return None, None if recorded is None else (f"note: recorded cache dir {recorded} is not on this machine; "
                                                "cache not checked")


def _cache_arg(args: argparse.Namespace) -> str | None:
    """The cache directory given as the positional ``DIR`` or ``--cache-dir`` (the same place if both)."""
    positional, option = getattr(args, "dir", None), getattr(args, "cache_dir", None)
    if positional and option and Path(positional).expanduser().resolve() != Path(option).expanduser().resolve():
        raise _Usage(f"cache {args.command}: the directory {positional} and --cache-dir {option} differ; give one")
    return positional or option


#: The statuses of an entry whose build did not end in an executable (``cache logs``' default).
UNBUILT = (EntryStatus.FAILED, EntryStatus.CRASHED, EntryStatus.INTERRUPTED)
#: What ``cache logs`` copies of an entry: what a compile left to read.
ENTRY_LOG_FILES = ("log-neuron-cc.txt", "command.txt", "metadata.json")


def _statuses(text: str | None, default: Sequence[EntryStatus] | None) -> set[EntryStatus] | None:
    """``--status failed,crashed``, parsed once: an unknown name is a usage error listing the statuses."""
    if text is None:
        return None if default is None else set(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {s.value: s for s in EntryStatus}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise _Usage(f"--status {text!r}: {', '.join(map(repr, unknown)) or 'no status'} is not an entry status; "
                     f"give a comma-separated list of {', '.join(known)}")
    return {known[n] for n in names}


REMOTE_READERS = 8  # `cache ls` of an s3:// cache: markers read at once


def _remote_row(store: remote_cache.S3Store, key: str, modified: str | None, local: str | None) -> CacheEntryInfo:
    try:
        marker = store.marker(key)
    except ValueError:
        return CacheEntryInfo(key, None, "-", EntryStatus.CORRUPT, None, None, None, modified, True, local)
    if marker is None:  # removed between the listing and the read
        return CacheEntryInfo(key, None, "-", EntryStatus.MISSING, None, None, None, modified, True, local)
    return CacheEntryInfo(key, marker.graph_type, opt_level(marker.compiler_args), EntryStatus.COMPLETE, None,
                          marker.size, marker.compiler_args, marker.created or modified, True, local)


def list_remote(cache: CompileCache, store: remote_cache.S3Store) -> list[CacheEntryInfo]:
    """Every remote entry (from its marker) and every local-only one, by graph type then key."""
    local = {info.key: info for info in cache_entries(cache)}
    with store.reachable():
        markers = store.markers()
        with ThreadPoolExecutor(REMOTE_READERS) as pool:
            rows = list(pool.map(lambda km: _remote_row(store, km[0], km[1], local[km[0]].status.value
                                                        if km[0] in local else None), markers))
    listed = {row.key for row in rows}
    rows += [replace(info, remote=False, local_status=info.status.value) for info in local.values()
             if info.key not in listed]
    return sorted(rows, key=lambda r: (r.graph_type is None, r.graph_type or "", r.key))


def fetch_named(cache: CompileCache, prefix: str) -> CacheEntry:
    """The one entry whose key starts with ``prefix`` (:meth:`CompileCache.find`); of an ``s3://`` cache downloaded
    and checked when missing (said on stderr, as the sync of :func:`_open_cache`); KeyError when none or several
    match or the remote entry does not check out."""
    store = remote_cache.store_for(cache.root)
    if store is None:
        return cache.find(prefix)
    with store.reachable():
        entry = cache.find(prefix, remote=store)
        pulled = not entry.is_complete and cache.pull(entry)
    if not (pulled or entry.is_complete):
        raise KeyError(f"cache entry {entry.key}: the remote entry {store.loc.entry_url(entry.key)} did not check out "
                       "on download (the log says why) and the local copy has no complete entry; nothing to explain")
    how = (f"downloaded from {store.loc.url} and checked (size and sha256 from its marker, the metadata, the "
           "executable's sha256, the signature when signing is on)" if pulled else
           "the local copy's entry (not downloaded again)")
    print(f"remote compile cache {store.loc.url}: {entry.key}: {how}", file=sys.stderr)
    return entry


@dataclass
class SyncReport:
    """What :func:`_open_cache` did to an ``s3://`` cache: entries listed, copied now, those that did not check out."""

    url: str
    listed: int = 0
    copied: int = 0
    not_loaded: list[str] = field(default_factory=list)


def _open_cache(path: str | None, *, sync: bool = True) -> tuple[Path, SyncReport | None]:
    """The cache folder; of an ``s3://`` cache, its local copy, with ``sync`` brought up to date first: every complete
    remote entry it lacks downloaded and checked (and what that did, said on stderr)."""
    root = cache_root(path)
    if not root.is_dir():
        hint = "" if path else f" (set {CACHE_DIR_ENV} or pass --cache-dir DIR)"
        raise _Usage(f"no compile cache at {root}{hint}")
    cache, store = CompileCache(root), remote_cache.store_for(root)
    if store is None or not sync:
        return root, None
    report = SyncReport(store.loc.url)
    with store.reachable():
        keys = [key for key, _ in store.markers()]
        report.listed = len(keys)
        for key in keys:
            entry = cache.entry(key)
            if entry.is_complete:
                continue
            if cache.pull(entry):
                report.copied += 1
            elif store.down is None:
                report.not_loaded.append(key)
    bad = report.not_loaded
    print(f"remote cache {report.url}: {report.listed} complete entr{'y' if report.listed == 1 else 'ies'} listed, "
          f"{report.copied} downloaded to the local copy now, each checked on download (size and sha256 from its "
          "marker, then the cache's own check)"
          + (f", {len(bad)} not loaded (corrupt or unreadable, see the log): {', '.join(bad)}" if bad else "")
          + f"; local copy {root}", file=sys.stderr)
    return root, report


def _output(args: argparse.Namespace, doc: Callable[[], Mapping[str, object]], lines: Callable[[], Iterable[str]],
            status: int = EXIT_OK) -> int:
    """``--json`` prints ``doc()``, else ``lines()`` (only the one asked for is built: a 10,000-entry listing is
    not formatted twice); what is printed changes, never the exit status."""
    if args.json:
        print(json.dumps(doc(), indent=2, sort_keys=True, default=str))
    else:
        print(*lines(), sep="\n")
    return status


def _manifest_show(args: argparse.Namespace) -> int:
    doc = _load_manifest(args.path)
    cache, note = _cache_dir_for(doc, args.cache_dir)
    lookup = CompileCache(cache).lookup if cache is not None else lambda key: None
    found = [lookup(g["graph_hash"]) for g in manifest_graphs(doc) if isinstance(g.get("graph_hash"), str)]
    types: dict[str, str | None] = {entry.key: entry.graph_type for entry in found if entry is not None}
    return _output(args, lambda: {
        "path": args.path,
        "kind": "baseline" if is_baseline(doc, args.path) else "manifest",
        "manifest_version": doc.get("manifest_version"),
        "config": doc.get("config"),
        "cache_dir": str(cache) if cache is not None else None,
        "note": note,
        "graphs": manifest_graph_rows(doc, types),
    }, lambda: [manifest_table(doc, types), *filter(None, [note])])


def cross_check(doc: Mapping, cache: Path) -> list[str]:
    """Problems between a manifest and the cache it names: missing files, NEFF size mismatch."""
    problems = []
    root = cache.resolve()
    for index, graph in numbered_graphs(doc):
        where = f"graphs[{index}] ({str(graph.get('graph_hash'))[:12]})"
        for name in ("hlo_path", "neff_path"):
            rel = graph.get(name)
            if not isinstance(rel, str):
                continue
            path = (root / rel).resolve()
            if root not in path.parents:
                problems.append(f"{where}.{name}: {rel!r} points outside the cache {cache}")
            elif not path.is_file():
                problems.append(f"{where}.{name}: {rel} not found in the cache {cache}")
            elif name == "neff_path" and isinstance(graph.get("neff_size"), int) and (
                    actual := path.stat().st_size) != graph["neff_size"]:
                problems.append(f"{where}.neff_size: manifest says {graph['neff_size']} bytes, {rel} has {actual} "
                                "(recompiled or replaced since the manifest was written)")
    return problems


def _manifest_validate(args: argparse.Namespace) -> int:
    """A manifest against schema v1 and its cache; a baseline against the baseline form (it names no files)."""
    doc = _load_manifest(args.path)
    kind = "baseline" if is_baseline(doc, args.path) else "manifest"
    if kind == "baseline":
        cache = None
        note = "note: a baseline names no cache files; --cache-dir not used" if args.cache_dir is not None else None
        problems = validate_baseline(doc)
    else:
        cache, note = _cache_dir_for(doc, args.cache_dir)
        problems = validate_manifest(doc)
        if cache is not None:
            problems += cross_check(doc, cache)
    count = len(doc["graphs"]) if isinstance(doc.get("graphs"), list) else 0
    if problems:
        text = [f"INVALID: {args.path}: {len(problems)} problem{'s' if len(problems) != 1 else ''} "
                f"(checked as a {kind})", *(f"  - {problem}" for problem in problems)]
    elif kind == "baseline":
        text = [f"OK: {args.path} is a manifest baseline (the plugin's --neuron-baseline form), valid, "
                f"v{doc.get('manifest_version')} ({count} graphs; environment, NEFF sizes, timestamps "
                "and cache paths are left out by design)"]
    else:
        checked = f"; files checked against {cache}" if cache is not None else ""
        text = [f"OK: {args.path} is a valid manifest v{doc.get('manifest_version')} ({count} graphs{checked})"]
    return _output(args, lambda: {"path": args.path, "kind": kind, "valid": not problems,
                                  "manifest_version": doc.get("manifest_version"), "graphs": count,
                                  "cache_dir": str(cache) if cache is not None else None, "note": note,
                                  "problems": problems},
                   lambda: [*filter(None, [note]), *text], EXIT_FAIL if problems else EXIT_OK)


def _manifest_diff(args: argparse.Namespace) -> int:
    old, new = _load_manifest(args.old), _load_manifest(args.new)
    result = diff_manifests(old, new, include_environment=args.include_environment)
    return _output(args, result.as_dict, lambda: ["no differences"] if result.empty else result.lines(),
                   EXIT_OK if result.empty else EXIT_FAIL)


def _cache_ls(args: argparse.Namespace) -> int:
    """The entries (of an ``s3://`` cache: from the remote's markers, nothing downloaded, and the local copy's)."""
    root = _open_cache(_cache_arg(args), sync=False)[0]
    wanted = _statuses(args.status, None)
    cache, store = CompileCache(root), remote_cache.store_for(root)
    rows = [r for r in (cache_entries(cache) if store is None else list_remote(cache, store))
            if wanted is None or r.status in wanted]
    counted = rows if store is None else [r for r in rows if r.remote]  # of an s3:// cache: its remote entries
    url = None if store is None else store.loc.url
    head = (f"compile cache {root}" if url is None else
            f"remote compile cache {url}: listed from its markers (nothing downloaded); local copy {root}")
    return _output(args, lambda: {"cache_dir": str(root), **({} if url is None else {"remote_cache": url}),
                                  "entries": [cache_entry_dict(r) for r in rows],
                                  "counts": status_counts([r.status for r in counted]),
                                  "total_size": sum(r.size or 0 for r in counted)},
                   lambda: [head, cache_table(rows) if rows else "no entries"])


def _copy_regular(source: Path, target: Path) -> bool:
    """Copy ``source`` when it is a regular file (a cache is untrusted: a symlink is not followed)."""
    try:
        if not source.is_file() or source.is_symlink():
            return False
        shutil.copyfile(source, target, follow_symlinks=False)
    except OSError:
        return False
    return True


def _cache_logs(args: argparse.Namespace) -> int:
    """Copy what unbuilt entries' compiles left into ``OUT/<key>/``: what CI uploads after failed compiles."""
    root = _open_cache(_cache_arg(args), sync=False)[0]
    wanted = _statuses(args.status, UNBUILT)
    out = Path(args.out).expanduser()
    collected = []
    for info in [i for i in cache_entries(CompileCache(root)) if i.status in wanted]:
        folder = out / info.key
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _Usage(f"cache logs: cannot create {folder}: {exc.strerror or exc}") from None
        files = [name for name in ENTRY_LOG_FILES if _copy_regular(root / info.key / name, folder / name)]
        collected.append({"key": info.key, "graph_type": info.graph_type, "status": info.status.value,
                          "folder": str(folder), "files": files})
    statuses = ",".join(sorted(s.value for s in wanted))
    return _output(args, lambda: {"cache_dir": str(root), "out": str(out), "statuses": statuses.split(","),
                                  "entries": collected}, lambda: [
        f"compile cache {root}: {len(collected)} entr{'y' if len(collected) == 1 else 'ies'} {statuses}"
        + (f", logs copied to {out}" if collected else ""),
        *(f"  {item['status']} {item['key']} (graph type {item['graph_type'] or '-'}): "
          f"{', '.join(item['files']) or 'no log left'}" for item in collected)])


def _cache_verify(args: argparse.Namespace) -> int:
    root, synced = _open_cache(_cache_arg(args))
    cache = CompileCache(root)
    entries = cache.entries()
    found, statuses, text = [], [], [f"compile cache {root}: {len(entries)} entries checked"]
    remote_bad = [] if synced is None else [{"key": k, "remote": f"{synced.url}/{k}/"} for k in synced.not_loaded]
    for entry in entries:
        problem = entry.problem() if entry.is_complete else None  # the full check: the status's skips the sha256
        statuses.append(EntryStatus.CORRUPT if problem is not None else entry.status)
        if problem is None:
            continue
        label = entry.graph_type
        try:
            moved = cache.quarantine(entry, problem) if args.fix else None
        except OSError as exc:  # a read-only or full cache: its lock file or the move
            raise _Usage(f"cannot move corrupt entry {entry.key} (graph type {label!r}) aside in {root}: "
                         f"{exc.strerror or exc}; make {root} writable and run again (a corrupt entry is never "
                         "loaded meanwhile)") from None
        found.append({"key": entry.key, "graph_type": label, "problem": problem,
                      "moved_to": str(moved) if moved else None})
        done = ("; moved to " + str(moved) if moved else "; already replaced") if args.fix else ""
        text.append(f"  corrupt {entry.key} (graph type {label!r}): {problem}{done}")
    counts = status_counts(statuses)
    ok = (not found or bool(args.fix)) and not remote_bad
    text.append("  " + ", ".join(f"{n} {s}" for s, n in counts.items()) if counts else "  no entries")
    text += [f"  corrupt remote entry {item['remote']}: not loaded (the log says why); the next build of the key "
             "replaces it" for item in remote_bad]
    if found and not args.fix:
        text.append(f"fix: rerun the warmup (it moves corrupt entries to {root / QUARANTINE_DIR} and rebuilds them), "
                    "or run this command with --fix")
    return _output(args, lambda: {"cache_dir": str(root), "checked": len(entries), "counts": counts, "corrupt": found,
                          "fixed": bool(args.fix), "ok": ok, **({} if synced is None else {
                              "remote_cache": synced.url, "remote_listed": synced.listed,
                              "remote_downloaded": synced.copied, "remote_not_loaded": remote_bad})},
                   lambda: text, EXIT_OK if ok else EXIT_FAIL)


def _cache_explain(args: argparse.Namespace) -> int:
    """Why two entries' keys differ, component by component (unique key prefixes accepted)."""
    operands = args.operands
    if not (len(operands) == 3 or len(operands) == 2 and not Path(operands[0]).expanduser().is_dir()):
        raise _Usage(f"cache explain takes DIR KEY_A KEY_B (or KEY_A KEY_B with --cache-dir DIR or "
                     f"${CACHE_DIR_ENV}), got {' '.join(map(shlex.quote, operands)) or 'nothing'}")
    args.dir = operands[0] if len(operands) == 3 else None
    root = _open_cache(_cache_arg(args), sync=False)[0]
    cache = CompileCache(root)
    keys, metadata = [], []
    for prefix in operands[-2:]:  # an s3:// cache: only the named entries are downloaded (and checked)
        try:
            entry = fetch_named(cache, prefix)
            md = entry.info()
        except KeyError as exc:
            raise _Usage(exc.args[0]) from None
        except CorruptEntryError as exc:
            raise _Usage(f"{exc}; `neuron-args cache verify --fix` moves it aside") from None
        if md.key_components is None:
            raise _Usage(f"cache entry {entry.key} has no key_components in its metadata.json "
                         "(written before keys recorded their components, or unreadable); recompile it")
        keys.append(entry.key)
        metadata.append(md)
    lines = explain_components(metadata[0].key_components, metadata[1].key_components)
    return _output(args, lambda: {"cache_dir": str(root), "key_a": keys[0], "key_b": keys[1],
                                  "graph_types": [md.graph_type for md in metadata], "identical": not lines,
                                  "differences": lines},
                   lambda: [f"{keys[0]} vs {keys[1]}",
                            *(f"  {line}" for line in lines or ["identical key components"])])


def _cache_prune_memo(args: argparse.Namespace) -> int:
    if args.older_than is not None and args.older_than < 0:
        raise _Usage(f"cache prune-memo: --older-than must be >= 0 days, got {args.older_than}")
    root = _open_cache(_cache_arg(args))[0]  # an s3:// cache: the remote's entries keep their memos
    pruned = prune(CompileCache(root), older_than_days=args.older_than, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    return _output(args, lambda: {"cache_dir": str(root), "dry_run": bool(args.dry_run),
                          "pruned": [{"file": p.path.name, "reason": p.reason} for p in pruned]},
                   lambda: [f"compile cache {root}: {verb} {len(pruned)} trace-memo file(s)",
                    *(f"  {p.path.name} ({p.reason})" for p in pruned)])


def _report_compare(args: argparse.Namespace) -> int:
    thresholds = Thresholds(seconds_ratio=args.seconds_ratio, seconds_abs=args.seconds_abs,
                            size_ratio=args.size_ratio, size_abs=args.size_abs)
    try:
        result = compare(read_report(args.old), read_report(args.new), thresholds)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    return _output(args, result.as_dict,
                   lambda: [*result.lines(), "regression" if result.regression else "no regression"],
                   EXIT_FAIL if result.regression else EXIT_OK)


def _report_plot(args: argparse.Namespace) -> int:
    try:
        out = plot_trend(args.reports, args.output, title=args.title)
    except (ValueError, PlotUnavailable) as exc:
        raise _Usage(str(exc)) from None
    print(f"trend written: {out}")
    return EXIT_OK


_CACHE_DIR_HELP = ("cache directory or s3://bucket/prefix (default: $" + CACHE_DIR_ENV + ", else "
                   f"$XDG_CACHE_HOME/neuron-args/compile-cache, else {DEFAULT_CACHE_DIR})")
_JSON = ("--json", {"action": "store_true", "help": "machine-readable output"})
_DIR = ("dir", {"nargs": "?", "metavar": "DIR", "help": _CACHE_DIR_HELP + "; same as --cache-dir"})
_CACHE_DIR = ("--cache-dir", {"metavar": "DIR", "help": _CACHE_DIR_HELP})
_MANIFEST_PATH = ("path", {"help": "manifest.json, or the <engine-id> folder holding it"})

#: group -> (help, {command: (handler, help, description, usage, [(name or names, add_argument keywords)])})
_COMMANDS = {
    "manifest": ("show, validate or diff manifest.json files", {
        "show": (_manifest_show, "a table of the graphs in a manifest", None, None, [
            _MANIFEST_PATH,
            ("--cache-dir", {"help": "compile cache to read graph types from "
                                     "(default: config.neuron_config.cache_dir when recorded)"}), _JSON]),
        "validate": (_manifest_validate, "check a manifest against schema v1 and its compile cache",
                     "Exit 0 when valid, 1 when invalid, 2 when it cannot be read. A manifest baseline "
                     "(.neuron-baseline/*.json) is recognised and checked as one.", None, [
            _MANIFEST_PATH,
            ("--cache-dir", {"help": "compile cache to cross-check files and sizes "
                                     "against (default: config.neuron_config.cache_dir when recorded)"}), _JSON]),
        "diff": (_manifest_diff, "what changed between two manifests",
                 "Exit 0 when nothing that matters changed, 1 when something did.", None, [
            ("old", {}), ("new", {}), _JSON,
            ("--include-environment", {"action": "store_true", "help": "also compare installed package versions"})]),
    }),
    "cache": ("list, verify or explain compile-cache entries, collect failed compiles' logs; prune the trace memo", {
        "ls": (_cache_ls, "entries with graph type, -O level, status, size",
               "STATUS: complete, corrupt (executable missing or not the recorded size), pending "
               "(captured, not compiled), compiling (pid N) (a live process holds the key's lock), "
               "failed (the compiler failed), interrupted (Ctrl-C stopped its build), crashed (its build's process "
               "died). A rebuild of the key replaces the last three.", None, [
            _DIR, _CACHE_DIR,
            ("--status", {"metavar": "S,S", "help": "only entries of these statuses (comma-separated)"}), _JSON]),
        "logs": (_cache_logs, "copy the compiler logs of entries whose build failed, crashed or was interrupted",
                 "Copies log-neuron-cc.txt, command.txt and metadata.json of each chosen entry into OUT/<key>/ "
                 "(regular files only). Exit 0, whether or not an entry matched.", None, [
            _DIR, _CACHE_DIR,
            ("--out", {"required": True, "metavar": "OUT", "help": "folder to copy into (created)"}),
            ("--status", {"metavar": "S,S",
                          "help": f"entry statuses to collect (default: {','.join(s.value for s in UNBUILT)})"}),
            _JSON]),
        "verify": (_cache_verify, "check every entry's executable against its recorded size and sha256",
                   "Exit 0 when no entry is corrupt (or --fix moved them aside), 1 otherwise.", None, [
            _DIR, _CACHE_DIR,
            ("--fix", {"action": "store_true",
                       "help": "move corrupt entries aside (to <cache>/.corrupt/) so the next run rebuilds them"}),
            _JSON]),
        "explain": (_cache_explain, "why two keys differ (key components)",
                    "DIR KEY_A KEY_B, or KEY_A KEY_B with --cache-dir DIR (else $" + CACHE_DIR_ENV + "). "
                    "A key may be a unique prefix.", "%(prog)s [DIR] KEY_A KEY_B [--cache-dir DIR] [--json]", [
            ("operands", {"nargs": "+", "metavar": "[DIR] KEY", "help": "the cache directory, then two keys"}),
            _CACHE_DIR, _JSON]),
        "prune-memo": (_cache_prune_memo, "remove trace-memo files (<cache>/.trace-memo/) no entry can use",
                       "A trace-memo file lets a warm re-trace skip aot_autograd and the lowering; it is used only "
                       "while an entry with its graph digest exists. Removed: files whose digest no entry has, "
                       "unreadable ones, and with --older-than DAYS those no trace read for that long. Removing "
                       "a memo costs at most one full trace of its graph. Exit 0.", None, [
            _DIR, _CACHE_DIR,
            ("--older-than", {"type": float, "metavar": "DAYS", "help": "also remove memos not read for DAYS days"}),
            ("--dry-run", {"action": "store_true", "help": "list what would be removed, remove nothing"}), _JSON]),
    }),
    "report": ("compare run reports (pytest --neuron-report=PATH)", {
        "compare": (_report_compare, "per-graph changes between two reports (e.g. last night's and tonight's)",
                    "Graphs are matched by graph type and input shapes. Exit 1 on a regression: a graph gone, "
                    "changed flags, a compile slower or an executable larger beyond both thresholds, new serve "
                    "misses; 0 otherwise (new graphs and improvements are listed).", None, [
            ("old", {}), ("new", {}), _JSON,
            ("--seconds-ratio", {"type": float, "default": 0.25, "help": "relative compile-time growth (0.25)"}),
            ("--seconds-abs", {"type": float, "default": 5.0, "help": "absolute compile-time growth, s (5)"}),
            ("--size-ratio", {"type": float, "default": 0.10, "help": "relative executable growth (0.10)"}),
            ("--size-abs", {"type": int, "default": 65536, "help": "absolute executable growth, bytes (65536)"})]),
        "plot": (_report_plot, "draw compile seconds and executable sizes per graph over runs (needs the plot extra)",
                 "Reports are ordered by their creation time; graphs are matched as in compare.", None, [
            ("reports", {"nargs": "+", "metavar": "REPORT"}),
            (("-o", "--output"), {"default": "trend.png", "help": "image to write (default trend.png)"}),
            ("--title", {"help": "figure title"})]),
    }),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-args",
        description="Inspect compile-artifact manifests and neuron-args compile caches.",
    )
    groups = parser.add_subparsers(dest="group", metavar="{manifest,cache,compile,report}", required=True)
    for group, (group_help, commands) in _COMMANDS.items():
        subparsers = groups.add_parser(group, help=group_help).add_subparsers(
            dest="command", metavar="{" + ",".join(commands) + "}", required=True)
        for name, (run, help_, description, usage, arguments) in commands.items():
            command = subparsers.add_parser(name, help=help_, description=description, usage=usage)
            for flags, options in arguments:
                command.add_argument(*(flags if isinstance(flags, tuple) else (flags,)), **options)
            command.set_defaults(run=run)
    add_compile_command(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): keep main() a plain function
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.run(args)
    except (_Usage, OptionsError) as exc:  # a RemoteCacheError (an OptionsError): the remote refused or is unreachable
        print(f"neuron-args: {exc}", file=sys.stderr)
        return EXIT_REMOTE if isinstance(exc, remote_cache.RemoteCacheError) else EXIT_USAGE
    except KeyboardInterrupt:  # every command, before a RemoteCacheError a remote gone down meanwhile would raise
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `neuron-args cache ls | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
