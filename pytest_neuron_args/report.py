"""What a session tells its user: the header line and the terminal summary of the graphs it compiled or loaded,
``--neuron-report``'s JSON, and what CI systems read: per test, the graphs ``neuron_warmup`` covered and what
``neuron_served`` served as ``user_properties`` (``--junitxml``); at session end, the summary as markdown appended
to ``$GITHUB_STEP_SUMMARY``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from neuron_args import envs
from neuron_args.cache import ASSERT_CACHE_HIT_ENV, QUARANTINE_DIR, assert_cache_hit_enabled
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.seams import records
from neuron_args.text import format_shapes
from pytest_neuron_args.ranks import rank_line
from pytest_neuron_args.state import NeuronSession

SUMMARY_TITLE = "neuron-args: graphs of this session"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def _compiler_info(compiler: str | None) -> tuple[Any, str | None]:
    """The selected compiler's info, else None and the first line of why; the header and the report must not break
    a session over it (the fixtures report the error)."""
    try:
        from neuron_args.compilers import select_compiler

        return select_compiler(compiler).info, None
    except Exception as exc:
        return None, (str(exc).splitlines() or [type(exc).__name__])[0]


def compiler_description(compiler: str | None) -> str:
    """``local local-xla-cpu/0.10.2 ...``: name and version (for auto, of the one it picks); never raises."""
    info, error = _compiler_info(compiler)
    if info is None:
        return f"{compiler or 'auto'} (unavailable: {error})"
    how = "" if compiler not in (None, "auto") else " (auto)"
    if info.version == "unknown" and info.name == "neuronx-cc":  # every graph would fail to compile: say it first
        import shutil

        return (f"neuronx-cc{how}, version unknown: `{shutil.which('neuronx-cc') or 'neuronx-cc'} --version` failed, "
                "so compiles will likely fail too (fix that environment, or use --neuron-compiler=local)")
    return f"{info.name} {info.version}{how}"


def header_line(session: NeuronSession) -> str:
    s = session.settings
    cache = f"{session.cache_dir()}" + (" (fresh per session)" if s.cache_dir is None else "")
    parts = [f"target {s.target}", f"compiler {compiler_description(s.compiler)}", f"cache {cache}",
             f"manifest dir {s.manifest_dir or 'off'}", f"flow {s.flow}"]
    if s.optimization_level is not None:
        parts.append(f"explicit -O{s.optimization_level} (model policies off)")
    if s.update_baseline:
        parts.append("updating baselines")
    return "neuron-args: " + ", ".join(parts)


def _rows(data: Mapping[str, Any]) -> list[GraphOutcome]:
    return [GraphOutcome.of(row) for row in data.get("rows") or []]


def footer_line(data: dict[str, Any], cache_dir: str) -> str:
    hows = [r.status for r in _rows(data)]
    failed = f", {hows.count('failed')} failed" if "failed" in hows else ""
    parts = [f"{len(hows)} graph{'s' if len(hows) != 1 else ''}: {hows.count('compiled')} compiled, "
             f"{hows.count('loaded')} loaded, {hows.count('captured')} captured{failed}; session cache {cache_dir}"]
    stats = data.get("stats") or {}
    if any(stats.values()):
        parts.append("cache activity: " + ", ".join(f"{stats.get(n, 0)} {n}" for n in ("hits", "misses", "compiles", "captures")))
    calls = data.get("serve_calls", {})
    if data.get("serve_sessions"):
        per_type = ", ".join(f"{g} {n}" for g, n in sorted(calls.items(), key=lambda kv: str(kv[0])))
        parts.append(f"serve: {sum(calls.values())} call(s) in {data['serve_sessions']} serve block(s)"
                     + (f" ({per_type})" if per_type else "") + f", {data.get('serve_misses', 0)} miss(es)")
    if data.get("workers"):
        parts.append(f"merged from {len(data['workers'])} xdist workers")
    if data.get("rank_processes"):
        parts.append(f"with {data['rank_processes']} --neuron-tp rank process report(s)")
    return "; ".join(parts)


_CONTENT = ("rows", "serve_sessions", "baselines_written", "manifests_written", "corrupt", "warmup_failures",
            "eager_fallbacks", "baseline_checks", "baselines_unused", "baselines_removed", "baselines_unchecked",
            "tp_serves")


def _has_content(data: dict[str, Any], session: NeuronSession | None = None) -> bool:
    return any(data.get(name) for name in _CONTENT) or (
        session is not None and bool(session.output_failures or session.manifest_failures))


#: baseline files by fate: the merged data's list, its ``baseline_counts`` label (but written: from checks), its line
_BASELINE_LINES = (("baselines_written", "written", "baseline written"),
                   ("baselines_removed", "removed", "baseline removed (its test no longer exists)"),
                   ("baselines_unused", "unused", "baseline unused"),
                   ("baselines_unchecked", "not checked", "baseline not checked (its test exists but was skipped, "
                                                          "failed before its check or did not run)"))


def write_summary(terminalreporter: Any, session: NeuronSession) -> None:
    from neuron_args.executables import eager_outputs_notice

    data = session.merged()
    if not _has_content(data, session):
        return
    write, cache_dir = terminalreporter.write_line, session.cache_dir()
    terminalreporter.write_sep("=", SUMMARY_TITLE)
    notice = eager_outputs_notice(data.get("eager_outputs") or {})
    if notice:
        write(notice, red=True, bold=True)
    fallbacks = data.get("eager_fallbacks") or {}
    if fallbacks:  # frames of a neuron backend Dynamo's recompile limit stopped compiling
        ran = sum(how == "warn" for how in fallbacks.values())
        write(f"eager fallbacks: {ran} frame(s) ran in eager PyTorch and {len(fallbacks) - ran} failed past Dynamo's "
              f"recompile limit: {'; '.join(sorted(fallbacks))}; fix: torch._dynamo.reset() between models, a higher "
              "recompile_limit, or bucketing", red=True, bold=True)
    if data["rows"]:
        for line in records.table(_rows(data), data.get("serve_calls"), rule=False).split("\n"):
            write(line)
    write(footer_line(data, str(cache_dir)))
    if data.get("workers_silent"):
        write(f"xdist worker(s) {', '.join(data['workers_silent'])} did not report (the session was interrupted, or "
              "they crashed): the table and counts lack what they compiled or loaded; the cache and any manifest "
              f"written below hold it (`neuron-args cache ls {cache_dir}`)", yellow=True)
    compiled = (data.get("stats") or {}).get("compiles", 0)
    if compiled and assert_cache_hit_enabled():  # no serve block is open: the variable's value
        write(f"{ASSERT_CACHE_HIT_ENV} is set, and the warmups compiled {compiled} graph(s): a warmup builds what the "
              "cache lacks whatever the variable says (it asserts after warmup, while serving). To fail when the "
              "cache lacks a graph, assert it in a test: with neuron_compile_counter.expect(compiles=0): "
              "neuron_runner.warmup()", yellow=True)
    failed = [row for row in _rows(data) if row.status == "failed"]
    for row in failed:
        error = row.error or "see the test that warmed it"
        where = "" if row.key in error else f" key {row.key}"
        write(f"failed: {row.graph_type or '-'} {records.shapes_text(row.input_shapes)}{where}: {error}", red=True)
    listed = {row.graph_type for row in failed}
    for failure in data.get("warmup_failures") or []:  # no key to list it by: its trace or lowering failed
        if failure["graph_type"] not in listed:
            write(f"warmup failed: graph type {failure['graph_type']!r} in {failure['test']}: {failure['error']}",
                  red=True)
    for key, why in sorted((data.get("corrupt") or {}).items()):
        write(f"cache entry {key} was corrupt ({why}): moved to {QUARANTINE_DIR}/ in the cache and rebuilt; if this "
              "repeats, check the disk (`neuron-args cache verify`)", yellow=True)
    for serve in data.get("tp_serves") or []:
        failed = any(r.get("outcome") != "passed" or r.get("serve_misses") for r in serve["ranks"])
        write(f"--neuron-tp {serve['tp']} served in the rank processes: {serve['test']}: "
              + "; ".join(rank_line(r) for r in serve["ranks"]), red=failed)
    counts = baseline_counts(data)
    if counts:
        write(f"baselines: {counts}")
    for name, _, what in _BASELINE_LINES:
        for path in data.get(name) or []:
            write(f"{what}: {path}")
    if data.get("baselines_unused") and not session.settings.update_baseline:
        write("(re-run the whole suite with --neuron-update-baseline to remove the baselines of tests that no longer "
              "exist)")
    for path in data.get("manifests_written", []):
        write(f"manifest written: {path}")
        if session.interrupted:
            write("  the session was interrupted: it lists only the graphs the warmups reached by then; rerun to "
                  "write the whole manifest", yellow=True)
        missing, total, elsewhere = session.manifest_gaps.get(path, (0, 0, {}))
        for cache, n in elsewhere.items():
            test = (data.get("other_caches") or {}).get(cache, "a test")
            write(f"  {n} of its {total} graph(s) were built into {cache}, the cache of a project's own neuron_runner "
                  f"(first warmed in {test}), not the session cache {cache_dir}: a manifest names one cache, so it "
                  "lists them without their NEFF; build that runner with cache_dir=neuron_cache.root (the plugin's "
                  "neuron_cache fixture) to have them listed", yellow=True)
        if missing:
            write(f"  {missing} of its {total} graph(s) have no executable in the cache {cache_dir}: not built (a "
                  "warmup failed or was interrupted before their compile) or removed from the cache during the "
                  "session; rerun to build them and write a manifest that lists their NEFFs", yellow=True)
    for path in session.manifests_not_ours if data.get("manifests_written") else []:
        write(f"not written by this session: {path} (another engine's, from an earlier session: remove it if that "
              "engine is gone, so the folder holds only this run's manifests)", yellow=True)
    for what, reasons, other in (("manifest NOT written", session.manifest_failures, "--neuron-manifest-dir"),
                                 ("NOT written", session.output_failures, "path")):
        for reason in reasons:
            write(f"{what} (the session fails): {reason}; free space or make the folder writable (or give another "
                  f"{other}) and rerun", red=True)
    if session.report_written is not None:
        write(f"report written: {session.report_written}")


def baseline_counts(data: dict[str, Any]) -> str:
    """``2 written, 0 updated, ...``: baselines by what became of them, then the checks' outcomes ('' when none);
    written/updated/unused always listed once anything is counted, as snapshot tools do, the rest only when non-zero."""
    order = ("written", "updated", "unused", "not checked", "removed", "unchanged", "match", "differs", "missing",
             "unreadable")
    counts = {k: 0 for k in order}
    for check in data.get("baseline_checks", []):
        counts[check["status"]] = counts.get(check["status"], 0) + 1
    for name, label, _ in _BASELINE_LINES[1:]:
        counts[label] = len(data.get(name) or [])
    shown = [f"{n} {'matched' if k == 'match' else k}" for k, n in counts.items() if n or k in order[:3]]
    return ", ".join(shown) if any(counts.values()) else ""


def write_json_report(session: NeuronSession) -> Any:
    """``--neuron-report=PATH``: the session's graphs as a JSON report (by the controller); the path, or None."""
    path = session.settings.report
    if path is None:
        return None
    from neuron_args.report import build_report, graph_record, write_report

    data = session.merged()
    s = session.settings
    info, error = _compiler_info(s.compiler)
    compiler = ({"name": info.name, "version": info.version} if info is not None
                else {"name": s.compiler or "auto", "version": None, "error": error})
    settings = {"target": s.target, "compiler": compiler, "flow": s.flow, "cache_dir": str(session.cache_dir()),
                "optimization_level": s.optimization_level, "compiler_args": s.compiler_args, "tp": s.tp}
    graphs = [graph_record(row, row.status if row.status != "-" else "seen") for row in _rows(data)]
    report = build_report(settings, graphs, data.get("eager_outputs"))
    if data.get("tp_serves"):  # each serving test run in the --neuron-tp rank processes, rank by rank
        report["tp_serve"] = data["tp_serves"]
    try:
        return write_report(path, report)
    except OSError as exc:  # a full disk, a read-only folder: said in the summary, and the session fails
        session.output_failures.append(f"--neuron-report {path}: {exc.strerror or exc}")
        return None


def warmup_properties(graphs: Iterable[GraphOutcome | Mapping[str, Any]]) -> list[tuple[str, str]]:
    """JUnit properties of a warmup's graphs: one ``neuron_graph`` per graph, and one-line digests of their graph
    types, keys and ``-O`` levels (each graph's typed level, as the summary table shows it)."""
    rows = sorted(map(GraphOutcome.of, graphs), key=lambda g: g.sort_key)
    props: list[tuple[str, str]] = []
    levels: dict[str, set[str]] = {}
    for g in rows:
        shown = "-" if g.optimization_level is None else f"-O{g.optimization_level}"
        levels.setdefault(str(g.graph_type), set()).add(shown)
        inputs = format_shapes(list(g.input_shapes or []), empty="")
        props.append(("neuron_graph", f"graph_type={g.graph_type} inputs={inputs} key={g.key} "
                                      f"level={shown} how={g.how or '-'}"))
    # levels' keys: the graph types, in the order of their first graph
    return [*props, ("neuron_warmed_graph_types", " ".join(levels)),
            ("neuron_graph_keys", " ".join(sorted({g.key for g in rows}))),
            ("neuron_optimization_levels", " ".join(f"{t}={','.join(sorted(ls))}" for t, ls in levels.items()))]


def serve_properties(calls: Mapping[str, int], misses: int) -> list[tuple[str, str]]:
    """JUnit properties of one ``neuron_served`` block: calls per graph type and the misses."""
    served = sorted(calls.items(), key=lambda kv: str(kv[0]))
    return [("neuron_served_graph_types", " ".join(f"{g}={n}" for g, n in served)),
            ("neuron_serve_misses", str(int(misses)))]


def add_properties(node: pytest.Item, props: Iterable[tuple[str, str]]) -> None:
    """Add properties to a test as ``record_property`` does (one value per name and test: the last wins)."""
    props = list(props)
    names = {name for name, _ in props if name != "neuron_graph"}
    kept = [(n, v) for n, v in node.user_properties if n not in names]
    seen = set(kept)
    node.user_properties[:] = kept + [p for p in props if p not in seen]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(data: Mapping[str, Any], header: str, footer: str) -> str:
    """The step summary of merged session data (see ``NeuronSession.merged``)."""
    from neuron_args.executables import eager_outputs_notice

    notice = eager_outputs_notice(data.get("eager_outputs") or {})
    out = ["## neuron-args: graphs of this session", ""]
    if notice:
        out += [f"> **{_cell(notice)}**", ""]
    out += [_cell(header), ""]
    if data.get("rows"):
        header_cells, body = records.table_rows(_rows(data), data.get("serve_calls"))
        rows = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in (header_cells, *body)]
        out += [rows[0], "|" + "---|" * len(header_cells), *rows[1:], ""]
    out += [_cell(footer), ""]
    missed = [g for g in _rows(data) if (g.serve_misses or 0) > 0]
    out += ["### Cache misses while serving", ""]
    if missed or data.get("serve_misses"):
        out += [f"- `{g.graph_type}` {format_shapes(g.input_shapes or [], empty='')} key `{g.key}`: "
                f"{g.serve_misses} miss(es)" for g in missed]
        out.append(f"- {data.get('serve_misses', 0)} miss(es) in {data.get('serve_sessions', 0)} serve block(s)")
    else:
        out.append(f"none ({data.get('serve_sessions', 0)} serve block(s))")
    out.append("")
    counts = baseline_counts(data)  # every check is counted: no counts, no checks
    if counts:
        out += ["### Manifest baselines", "", counts, ""]
        for c in sorted(data.get("baseline_checks") or [], key=lambda c: str(c.get("nodeid"))):
            out.append(f"- `{c.get('nodeid')}` (`{c.get('path')}`): **{c.get('status')}**")
            if c.get("lines"):
                out += ["", "  ```diff", *(f"  {line}" for line in c["lines"]), "  ```"]
        out.append("")
    return "\n".join(out) + "\n"


def write_step_summary(session: NeuronSession) -> Any:
    """The markdown summary appended to ``$GITHUB_STEP_SUMMARY`` (controller only); the path, or None."""
    if not envs.is_set(STEP_SUMMARY_ENV):
        return None
    data = session.merged()
    if not _has_content(data):
        return None  # a session that used no neuron fixture adds nothing to the job's page
    markdown = summary_markdown(data, header_line(session), footer_line(data, str(session.cache_dir())))
    path = Path(envs.text(STEP_SUMMARY_ENV))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(markdown)
        return path
    except OSError as exc:  # a full disk: said in the terminal summary, and the session fails
        session.output_failures.append(f"${STEP_SUMMARY_ENV} {envs.text(STEP_SUMMARY_ENV)}: {exc.strerror or exc}")
        return None


__all__ = ["STEP_SUMMARY_ENV", "SUMMARY_TITLE", "add_properties", "baseline_counts", "compiler_description",
           "header_line", "serve_properties", "summary_markdown", "warmup_properties",
           "write_json_report", "write_step_summary", "write_summary"]
