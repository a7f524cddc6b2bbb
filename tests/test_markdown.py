"""bakery.markdown.table: literal expected text, and cells read back by a real
Markdown parser (markdown-it-py, which rich already depends on), not by our own split."""

import pytest
from markdown_it import MarkdownIt

from bakery.markdown import table

TRICKY = [
    ("plain", 7, "–"),
    ("a|b", '`` "x|y" ``', ""),  # a pipe in text and in a code span
    ("two\nlines", "ünïcødé", "trailing \\"),
]


def _cells(text: str) -> list[list[str]]:
    """Each row's cells as the GFM table rule reads them (header first)."""
    parser = MarkdownIt("commonmark").enable("table")
    rows: list[list[str]] = []
    for token in parser.parse(text + "\n"):
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline":
            rows[-1].append(token.content.replace("<br>", "\n"))
    return rows


def test_a_table_is_exactly_the_text_github_expects():
    text = table(("patch", "0.32.0"), [("01-a.diff", "clean"), ("02-b.diff", 3)])
    assert text == ("| patch | 0.32.0 |\n|---|---|\n| 01-a.diff | clean |\n| 02-b.diff | 3 |")


def test_escapes_are_exactly_these():
    assert table(("a|b",), [("x\ny",)]) == "| a\\|b |\n|---|\n| x<br>y |"


def test_every_cell_reads_back_unchanged_through_a_markdown_parser():
    header = ("name", "value", "note")
    rows = _cells(table(header, TRICKY))
    assert rows == [list(header), *([str(v) for v in row] for row in TRICKY)]


def test_an_empty_table_is_header_and_separator():
    assert _cells(table(("a", "b"), [])) == [["a", "b"]]


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="row has 1 cells, the header 2"):
        table(("a", "b"), [("only one",)])
