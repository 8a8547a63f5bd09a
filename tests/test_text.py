"""The one spelling of sizes, shape lists, clipped values and tables (neuron_args.text)."""
from __future__ import annotations

from neuron_args.text import clip, first_line, format_shapes, human_size, render_table


def test_sizes():
    assert [human_size(n) for n in (None, -1, True, 0, 1023, 1024, 949_498, 5 * 1024**3, 3 * 1024**4)] == [
        "-", "-", "-", "0 B", "1023 B", "1.0 KiB", "927.2 KiB", "5.0 GiB", "3.0 TiB"]


def test_shapes_and_clipping():
    assert format_shapes(["4,", "4, 16", ""]) == "(4,) (4, 16) ()"
    assert format_shapes([]) == "none" and format_shapes([], empty="-") == "-" and format_shapes(None) == "-"
    assert format_shapes(["4,", "8,"], sep=" / ") == "(4,) / (8,)"
    assert format_shapes(["4, 16"] * 10, limit=12) == "(4, 16) (4,\u2026"
    assert clip("abcdef", 6) == "abcdef" and clip("abcdefg", 6) == "abcde\u2026"


def test_first_line_of_a_message():
    assert first_line("\n  XlaRuntimeError: bad HLO  \n  at line 3") == "XlaRuntimeError: bad HLO"
    assert first_line("") == "" and first_line(" \n\t\n") == ""


def test_tables_align_columns():
    table = render_table(["A", "LONG"], [["xyz", "1"], ["", "22"]])
    assert table.splitlines() == ["A    LONG", "---  ----", "xyz  1", "     22"]
    assert render_table(["A"], [["b"]], rule=False).splitlines() == ["A", "b"]
