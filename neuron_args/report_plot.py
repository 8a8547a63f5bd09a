"""``neuron-args report plot``: compile seconds and executable sizes per graph over runs (a gap where a run lacks
one), graphs matched as ``report compare`` matches them; matplotlib is the optional ``plot`` extra.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_args.errors import NeuronArgsError
from neuron_args.report import graph_name, read_report

INSTALL_HINT = "pip install 'neuron-args[plot]'"


class PlotUnavailable(NeuronArgsError, ImportError):
    """matplotlib (the ``plot`` extra) is not installed."""


def run_label(report: Mapping[str, Any], path: Path) -> str:
    created = str(report.get("created") or "")
    return created[:16].replace("T", " ") if created else path.stem


def series(reports: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float | None]]]:
    """``{graph name: {"compile_seconds": [...], "executable_size": [...]}}``, one value (or None) per run."""
    out: dict[str, dict[str, list[float | None]]] = {}
    for i, report in enumerate(reports):
        for g in report.get("graphs", []):
            row = out.setdefault(graph_name(g), {f: [None] * len(reports) for f in ("compile_seconds", "executable_size")})
            for field, values in row.items():
                if g.get(field) is not None:
                    values[i] = float(g[field])
    return dict(sorted(out.items()))


def load_runs(paths: Sequence[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """The reports, oldest first (by ``created``; the given order breaks ties); ``ValueError`` names a bad file."""
    runs = sorted(((Path(p), read_report(p)) for p in paths), key=lambda run: str(run[1].get("created") or ""))
    return [(run_label(report, path), report) for path, report in runs]  # sorted() is stable: ties keep their order


def plot_trend(paths: Sequence[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Draw the trend of the reports at ``paths`` into ``out`` (PNG, or any format matplotlib knows by suffix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on CI hosts
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"neuron-args report plot draws with matplotlib, which is not installed "
                              f"({exc}); install the plot extra: {INSTALL_HINT}") from None
    if not paths:
        raise ValueError("no report given: pass one or more files written by pytest --neuron-report=PATH")
    runs = load_runs(paths)
    labels = [label for label, _ in runs]
    data = series([report for _, report in runs])
    x = list(range(len(runs)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.2 * len(runs) + 3), 7), sharex=True)
    for name, values in data.items():
        for ax, measure, scale in ((top, "compile_seconds", 1), (bottom, "executable_size", 1024)):
            ax.plot(x, [float("nan") if v is None else v / scale for v in values[measure]], marker="o", label=name)
    top.set_ylabel("compile seconds")
    bottom.set_ylabel("executable size (KiB)")
    bottom.set_xticks(x)
    bottom.set_xticklabels(labels, rotation=30, ha="right")
    bottom.set_xlabel("run")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    if data:
        top.legend(fontsize="small", loc="best")
    top.set_title(title or f"neuron-args: {len(data)} graph(s) over {len(runs)} run(s)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["INSTALL_HINT", "PlotUnavailable", "load_runs", "plot_trend", "series"]
