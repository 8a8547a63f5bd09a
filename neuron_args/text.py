"""Text for people: one spelling of byte sizes, shape lists, clipped values and aligned tables (a leaf module)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["clip", "first_line", "format_shapes", "graph_label", "human_size", "render_table"]


def human_size(size: int | float | None) -> str:
    """Bytes in binary units (``512 B``, ``927.2 KiB``); ``-`` when unknown."""
    if size is None or isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
        return "-"
    if size < 1024:
        return f"{int(size)} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def graph_label(graph_type: str | None) -> str:
    """``graph type 'decode'`` in a message, ``a graph with no graph type`` (never ``graph type None``)."""
    return "a graph with no graph type" if graph_type is None else f"graph type {graph_type!r}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def first_line(text: str) -> str:
    """The first non-blank line of ``text`` (an exception's message), stripped; ``""`` for none."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def format_shapes(shapes: Any, *, empty: str = "none", sep: str = " ", limit: int | None = None) -> str:
    """``["4,", "4, 16", ""]`` -> ``(4,) (4, 16) ()``; ``-`` when not a list (unknown), ``empty`` for none."""
    if not isinstance(shapes, list):
        return "-"
    if not shapes:
        return empty
    text = sep.join(f"({s})" for s in shapes)
    return text if limit is None else clip(text, limit)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = True) -> str:
    """Left-aligned columns, two spaces apart; a dashed rule under the header unless ``rule=False``."""
    widths = [max([len(h), *(len(row[i]) for row in rows if i < len(row))]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    ruled = [line(["-" * w for w in widths])] if rule else []
    return "\n".join([line(headers), *ruled, *(line(r) for r in rows)])
