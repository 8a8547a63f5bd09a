"""What CI systems read from a session besides the terminal: JUnit properties and the GitHub step summary.

Per test, the graphs ``neuron_warmup`` covered and what ``neuron_served`` served go into ``user_properties``
(``--junitxml``); at session end the controller appends a markdown summary to ``$GITHUB_STEP_SUMMARY``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from neuron_args import envs
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.text import format_shapes

if TYPE_CHECKING:
    from pytest_neuron_args.state import NeuronSession

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


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
    types = list(dict.fromkeys(str(g.graph_type) for g in rows))
    props.append(("neuron_warmed_graph_types", " ".join(types)))
    props.append(("neuron_graph_keys", " ".join(sorted({g.key for g in rows}))))
    props.append(("neuron_optimization_levels",
                  " ".join(f"{t}={','.join(sorted(levels[t]))}" for t in types)))
    return props


def serve_properties(calls: Mapping[str, int], misses: int) -> list[tuple[str, str]]:
    """JUnit properties of one ``neuron_served`` block: calls per graph type and the misses."""
    served = sorted(calls.items(), key=lambda kv: str(kv[0]))
    return [("neuron_served_graph_types", " ".join(f"{g}={n}" for g, n in served)),
            ("neuron_serve_misses", str(int(misses)))]


def record(node: pytest.Item, props: Iterable[tuple[str, str]]) -> None:
    """Add properties to a test as ``record_property`` does (one value per name and test: the last wins)."""
    props = list(props)
    names = {name for name, _ in props if name != "neuron_graph"}
    kept = [(n, v) for n, v in node.user_properties if n not in names]
    seen = set(kept)
    node.user_properties[:] = kept + [p for p in props if p not in seen]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(data: Mapping[str, Any], header: str, footer: str,
                     baseline_checks: Iterable[Mapping[str, Any]] = (),
                     baseline_counts: Mapping[str, int] | None = None,
                     notice: str | None = None) -> str:
    """The step summary of merged session data (see ``NeuronSession.merged``)."""
    from pytest_neuron_args.report import table_rows

    out = ["## neuron-args: graphs of this session", ""]
    if notice:
        out += [f"> **{_cell(notice)}**", ""]
    out += [_cell(header), ""]
    if data.get("rows"):
        header_cells, body = table_rows(data)
        rows = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in (header_cells, *body)]
        out += [rows[0], "|" + "---|" * len(header_cells), *rows[1:], ""]
    out += [_cell(footer), ""]
    missed = [r for r in data.get("rows", []) if (r.get("serve_misses") or 0) > 0]
    out.append("### Cache misses while serving")
    out.append("")
    if missed or data.get("serve_misses"):
        for r in missed:
            inputs = format_shapes(list(r.get("input_shapes") or []), empty="")
            out.append(f"- `{r.get('graph_type')}` {inputs} key `{r['key']}`: {r.get('serve_misses')} miss(es)")
        out.append(f"- {data.get('serve_misses', 0)} miss(es) in {data.get('serve_sessions', 0)} serve block(s)")
    else:
        out.append(f"none ({data.get('serve_sessions', 0)} serve block(s))")
    out.append("")
    checks = list(baseline_checks)
    if checks or (baseline_counts and any(baseline_counts.values())):
        out += ["### Manifest baselines", ""]
        if baseline_counts:
            out += [", ".join(f"{n} {k}" for k, n in baseline_counts.items()), ""]
        for c in sorted(checks, key=lambda c: str(c.get("nodeid"))):
            out.append(f"- `{c.get('nodeid')}` (`{c.get('path')}`): **{c.get('status')}**")
            if c.get("lines"):
                out += ["", "  ```diff", *(f"  {line}" for line in c["lines"]), "  ```"]
        out.append("")
    return "\n".join(out) + "\n"


def write_step_summary(session: NeuronSession) -> Any:
    """The markdown summary appended to ``$GITHUB_STEP_SUMMARY`` (controller only); the path, or None."""
    if session.is_worker or session.is_rank_worker or not envs.is_set(STEP_SUMMARY_ENV):
        return None
    from neuron_args.executables import eager_outputs_notice
    from pytest_neuron_args.report import _has_content, baseline_counts, footer_line, header_line

    data = session.merged()
    if not _has_content(data):
        return None  # a session that used no neuron fixture adds nothing to the job's page
    counts = baseline_counts(data)
    markdown = summary_markdown(
        data, header_line(session), footer_line(data, str(session.cache_dir())),
        baseline_checks=data.get("baseline_checks", []), baseline_counts=counts if any(counts.values()) else None,
        notice=eager_outputs_notice(data.get("eager_outputs") or {}))
    path = Path(envs.text(STEP_SUMMARY_ENV))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(markdown)
        return path
    except OSError as exc:  # a full disk: said in the terminal summary, and the session fails
        session.output_failures.append(f"${STEP_SUMMARY_ENV} {envs.text(STEP_SUMMARY_ENV)}: {exc.strerror or exc}")
        return None


__all__ = ["STEP_SUMMARY_ENV", "record", "serve_properties", "summary_markdown",
           "warmup_properties", "write_step_summary"]
