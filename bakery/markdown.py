"""Markdown tables: the one renderer behind every table bakery writes.

Reports, PLAN.md's stage table, the rebase and parity matrices all go through
``table``, so a cell that holds a ``|`` or a newline is escaped in one place
instead of breaking one report's layout and not another's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["table"]


def _cell(value: object) -> str:
    # A bare "|" would end the cell and a newline the row; GitHub renders "\|" as "|",
    # inside code spans too.
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """The table as text, one line per row and no trailing newline.

    Cells are ``str()``-ed; a row with more or fewer cells than ``header`` is a bug
    in the caller (a silently shifted column would misreport), so it raises."""
    lines = [
        "| " + " | ".join(_cell(name) for name in header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row has {len(row)} cells, the header {len(header)}: {row!r}")
        lines.append("| " + " | ".join(_cell(value) for value in row) + " |")
    return "\n".join(lines)
