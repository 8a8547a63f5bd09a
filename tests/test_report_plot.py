"""`neuron-args report plot`: compile seconds and executable sizes per graph over runs."""
from __future__ import annotations

import builtins
import sys
from pathlib import Path

import pytest

from neuron_args.cli import main
from neuron_args.report import build_report, graph_record, write_report
from neuron_args.report import load_runs, series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _night(created: str, decode_seconds: float | None, decode_size: int, with_prefill: bool = True) -> dict:
    graphs = [graph_record({"key": "d" * 32, "graph_type": "decode", "input_shapes": ["1, 8"], "compiler_args": ["-O3"],
                            "compile_seconds": decode_seconds, "executable_size": decode_size}, "compiled")]
    if with_prefill:
        graphs.append(graph_record({"key": "p" * 32, "graph_type": "prefill", "input_shapes": ["4, 8"],
                                    "compiler_args": ["-O1"], "compile_seconds": 3.0, "executable_size": 150_000},
                                   "compiled"))
    report = build_report({"target": "trn2"}, graphs)
    report["created"] = created
    return report


@pytest.fixture
def nights(tmp_path: Path) -> list[Path]:
    docs = [_night("2026-11-28T02:00:00+00:00", 10.0, 200_000),
            _night("2026-11-29T02:00:00+00:00", None, 210_000),  # loaded from the persistent cache: no time
            _night("2026-11-30T02:00:00+00:00", 14.0, 400_000, with_prefill=False)]
    paths = [tmp_path / f"night{i}.json" for i in range(3)]
    for path, doc in zip(paths, docs):
        write_report(path, doc)
    return paths


def test_series_orders_runs_by_creation_and_leaves_gaps(nights: list[Path]):
    runs = load_runs([nights[2], nights[0], nights[1]])  # given out of order
    assert [label for label, _ in runs] == ["2026-11-28 02:00", "2026-11-29 02:00", "2026-11-30 02:00"]
    assert series([r for _, r in runs]) == {
        "decode (1, 8)": {"compile_seconds": [10.0, None, 14.0], "executable_size": [200_000.0, 210_000.0, 400_000.0]},
        "prefill (4, 8)": {"compile_seconds": [3.0, 3.0, None], "executable_size": [150_000.0, 150_000.0, None]},
    }


@pytest.mark.slow
def test_cli_plot_writes_a_png(nights: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("matplotlib", reason="the plot extra (scripts/setup.sh installs it)")
    out = tmp_path / "trend" / "trend.png"
    assert main(["report", "plot", *map(str, nights), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"trend written: {out}"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (660, 700)  # figsize (max(6, 1.2 * 3 runs + 3), 7) at 100 dpi


def test_cli_plot_bad_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("matplotlib", reason="the plot extra (scripts/setup.sh installs it)")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["report", "plot", str(bad), "-o", str(tmp_path / "t.png")]) == 2
    assert "not a neuron-args report" in capsys.readouterr().err
    assert not (tmp_path / "t.png").exists()


def test_without_matplotlib_the_error_names_the_extra(nights: list[Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["report", "plot", str(nights[0]), "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert "matplotlib, which is not installed" in err and "pip install 'neuron-args[plot]'" in err
