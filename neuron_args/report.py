"""The run report (``--neuron-report=PATH``), its comparison and trend plot (matplotlib, the ``plot`` extra, on
first use); graphs match by graph type and input shapes: a key changes with the compiler version, a graph does not."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from neuron_args.errors import NeuronArgsError
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.text import format_shapes
from neuron_args.untrusted import MANIFEST_LIMIT, read_json

REPORT_VERSION = "1"
STATUSES = ("compiled", "loaded", "captured", "missed", "failed", "seen")


def graph_record(row: GraphOutcome | Mapping[str, Any], status: str) -> dict[str, Any]:
    """One graph of a report: a session's graph outcome (or its JSON form) as the report file lists it."""
    g = GraphOutcome.of(row)
    return {"graph_type": g.graph_type, "key": g.key, "compiler_args": list(g.compiler_args or []),
            "input_shapes": list(g.input_shapes or []), "status": status, "compile_seconds": g.compile_seconds,
            "executable_size": g.executable_size, "serve_hits": g.serve_hits or 0, "serve_misses": g.serve_misses or 0,
            "error": g.error if status == "failed" else None}


def build_report(settings: Mapping[str, Any], graphs: Sequence[Mapping[str, Any]],
                 eager_outputs: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The report document: settings, graphs (as :func:`graph_record` makes them) and totals."""
    graphs = [dict(g) for g in graphs]
    totals = {status: sum(g["status"] == status for g in graphs) for status in STATUSES}
    if not totals["failed"]:  # a report of a run whose graphs all built reads as before failures were listed
        del totals["failed"]
    totals.update(
        graphs=len(graphs),
        compile_seconds=round(sum(g["compile_seconds"] or 0.0 for g in graphs), 3),
        executable_bytes=sum(g["executable_size"] or 0 for g in graphs),
        serve_hits=sum(g["serve_hits"] for g in graphs),
        serve_misses=sum(g["serve_misses"] for g in graphs),
        eager_output_graphs=len(eager_outputs or {}),
    )
    return {"report_version": REPORT_VERSION, "created": datetime.now(timezone.utc).isoformat(),
            "settings": dict(settings), "graphs": graphs, "totals": totals}


def write_report(path: str | Path, report: Mapping[str, Any]) -> Path:
    path = Path(path)
    write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")  # creates the folder
    return path


def read_report(path: str | Path) -> dict[str, Any]:
    """A report from disk; a file that is not one is a ``ValueError`` naming the file."""
    try:
        doc = read_json(path, MANIFEST_LIMIT)
    except (OSError, ValueError) as exc:  # too deep a nesting, not a regular file, too large: unreadable too
        raise ValueError(f"{path}: not a neuron-args report ({exc})") from exc
    if not isinstance(doc, dict) or "graphs" not in doc or "report_version" not in doc:
        raise ValueError(f"{path}: not a neuron-args report (write one with pytest --neuron-report=PATH)")
    return doc


# -- comparing two reports ------------------------------------------------------------------------

@dataclass
class Thresholds:
    """A change counts when it is above both the relative and the absolute threshold."""

    seconds_ratio: float = 0.25
    seconds_abs: float = 5.0
    size_ratio: float = 0.10
    size_abs: int = 64 * 1024


#: run settings that change what is compiled: a comparison names each one that differs before its graph diff
COMPARED_SETTINGS = ("tp", "target", "optimization_level", "compiler", "compiler_args")


def _setting_text(name: str, value: Any) -> str:
    """A setting as a comparison shows it (a compiler as ``name version``, a missing value as ``-``)."""
    if name == "compiler" and isinstance(value, Mapping):
        return " ".join(str(value[k]) for k in ("name", "version") if value.get(k)) or "-"
    if name == "tp" and value is None:
        return "1"  # reports written before tp was recorded ran one rank
    return "-" if value is None or value == "" else str(value)


def settings_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """``tp: 1 -> 2``...: the compared settings whose values differ between two reports' ``settings``."""
    old, new = old if isinstance(old, Mapping) else {}, new if isinstance(new, Mapping) else {}
    shown = ((name, _setting_text(name, old.get(name)), _setting_text(name, new.get(name)))
             for name in COMPARED_SETTINGS)
    return [f"{name.replace('_', ' ')}: {a} -> {b}" for name, a, b in shown if a != b]


@dataclass
class Comparison:
    settings: list[str] = field(default_factory=list)  # changed run settings (tp, target, -O level, compiler)
    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    changed: list[tuple[dict[str, Any], list[str], bool]] = field(default_factory=list)  # graph, lines, regression

    @property
    def regression(self) -> bool:
        return bool(self.removed) or any(bad for _, _, bad in self.changed)

    def lines(self) -> list[str]:
        out = [f"~ settings {c}" for c in self.settings]
        out += [f"+ {graph_name(g)}: new graph ({' '.join(g['compiler_args'])})" for g in self.added]
        out += [f"- {graph_name(g)}: gone" for g in self.removed]
        for g, changes, bad in self.changed:
            out += [f"{'!' if bad else '~'} {graph_name(g)}: {c}" for c in changes]
        return out or ["no change"]

    def as_dict(self) -> dict[str, Any]:
        return {"regression": self.regression, "settings": self.settings, "added": self.added, "removed": self.removed,
                "changed": [{"graph": g, "changes": c, "regression": bad} for g, c, bad in self.changed]}


def _identity(g: Mapping[str, Any]) -> tuple[Any, ...]:
    return (g.get("graph_type"), tuple(g.get("input_shapes") or ()))


def graph_name(g: Mapping[str, Any]) -> str:
    """``decode (4, 16) (4,)``: how reports name a graph (its identity across runs)."""
    shapes = format_shapes(list(g.get("input_shapes") or []), empty="")
    return f"{g.get('graph_type') or '-'} {shapes}".strip()


def _moved(old: float | None, new: float | None, ratio: float, minimum: float) -> bool:
    if old is None or new is None:
        return False
    return new - old > minimum and new > old * (1 + ratio)


def compare(old: Mapping[str, Any], new: Mapping[str, Any], thresholds: Thresholds | None = None) -> Comparison:
    """What changed from ``old`` to ``new``; a graph gone, changed flags, slower or larger beyond the thresholds,
    new serve misses or a failed build is a regression."""
    t = thresholds or Thresholds()
    before = {_identity(g): g for g in old.get("graphs", [])}
    after = {_identity(g): g for g in new.get("graphs", [])}
    fresh = [g for k, g in after.items() if k not in before]  # one that did not build is a regression, not an addition
    result = Comparison(settings=settings_changes(old.get("settings"), new.get("settings")),
                        added=[g for g in fresh if g.get("status") != "failed"],
                        removed=[before[k] for k in before if k not in after],
                        changed=[(g, [f"new graph, failed to build: {g.get('error') or 'see its run'}"], True)
                                 for g in fresh if g.get("status") == "failed"])
    for k in after.keys() & before.keys():
        a, b = before[k], after[k]
        changes: list[tuple[str, bool]] = []  # (line, whether it is a regression)
        if a.get("compiler_args") != b.get("compiler_args"):
            flags = [" ".join(g.get("compiler_args") or []) for g in (a, b)]
            changes.append((f"flags {flags[0]!r} -> {flags[1]!r}", True))
        for name, ratio, minimum, line, better in (
                ("compile_seconds", t.seconds_ratio, t.seconds_abs, "compile {:.1f}s -> {:.1f}s", "faster"),
                ("executable_size", t.size_ratio, t.size_abs, "executable {} -> {} bytes", "smaller")):
            if _moved(a.get(name), b.get(name), ratio, minimum):
                changes.append((line.format(a[name], b[name]), True))
            elif _moved(b.get(name), a.get(name), ratio, minimum):
                changes.append((f"{line.format(a[name], b[name])} ({better})", False))
        if b.get("status") == "failed" and a.get("status") != "failed":
            changes.append((f"failed to build ({a.get('status') or 'built'} before): {b.get('error') or 'see its run'}",
                            True))
        if (b.get("serve_misses") or 0) > (a.get("serve_misses") or 0):
            changes.append((f"serve misses {a.get('serve_misses') or 0} -> {b['serve_misses']}", True))
        if changes:
            result.changed.append((b, [line for line, _ in changes], any(bad for _, bad in changes)))
    result.changed.sort(key=lambda c: _identity(c[0]))
    return result


# -- the trend over runs (`neuron-args report plot`): a gap where a run lacks a graph -----------------------

class PlotUnavailable(NeuronArgsError, ImportError):
    """matplotlib (the ``plot`` extra) is not installed."""


def series(reports: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float | None]]]:
    """``{graph name: {"compile_seconds": [...], "executable_size": [...]}}``, one value (or None) per run."""
    out: dict[str, dict[str, list[float | None]]] = {}
    for i, report in enumerate(reports):
        for g in report.get("graphs", []):
            row = out.setdefault(graph_name(g), {f: [None] * len(reports)
                                                 for f in ("compile_seconds", "executable_size")})
            for field, values in row.items():
                if g.get(field) is not None:
                    values[i] = float(g[field])
    return dict(sorted(out.items()))


def load_runs(paths: Sequence[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """The reports, oldest first (by ``created``; the given order breaks ties); ``ValueError`` names a bad file."""
    runs = sorted(((Path(p), read_report(p)) for p in paths), key=lambda run: str(run[1].get("created") or ""))
    # sorted() is stable: ties keep their order; a run is labelled by its creation minute, else its file name
    return [(str(report.get("created") or "")[:16].replace("T", " ") or path.stem, report) for path, report in runs]


def plot_trend(paths: Sequence[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Draw the trend of the reports at ``paths`` into ``out`` (PNG, or any format matplotlib knows by suffix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on CI hosts
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"neuron-args report plot draws with matplotlib, which is not installed "
                              f"({exc}); install the plot extra: pip install 'neuron-args[plot]'") from None
    if not paths:
        raise ValueError("no report given: pass one or more files written by pytest --neuron-report=PATH")
    runs = load_runs(paths)
    labels = [label for label, _ in runs]
    data = series([report for _, report in runs])
    x = list(range(len(runs)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.2 * len(runs) + 3), 7), sharex=True)
    for ax, measure, scale, unit in ((top, "compile_seconds", 1, "compile seconds"),
                                     (bottom, "executable_size", 1024, "executable size (KiB)")):
        for name, values in data.items():
            ax.plot(x, [float("nan") if v is None else v / scale for v in values[measure]], marker="o", label=name)
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    bottom.set_xticks(x)
    bottom.set_xticklabels(labels, rotation=30, ha="right")
    bottom.set_xlabel("run")
    if data:
        top.legend(fontsize="small", loc="best")
    top.set_title(title or f"neuron-args: {len(data)} graph(s) over {len(runs)} run(s)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
