"""The report's one table formatter, in each writer's markup: markdown lines for summary.md and the
sections' markdown, an HTML table for index.html and the sections' HTML.

Cells are escaped here or not, as the caller says: the page's writers pass HTML they built (links,
marked-up verdicts) and escape their plain text before; markdown cells are escaped (a `|` would end
the cell, a newline the row) unless the caller keeps its cells as they are or escapes them its own
way (the references' table writes a `|` as `/`).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from itertools import repeat


def markdown_cell(x: object) -> str:
    """A markdown table cell: `|` escaped, newlines as spaces."""
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list, rows: list[list], *, escape: bool | Callable[[object], str] = True,
                   blank_after: bool = True) -> list[str]:
    """The lines of a markdown table and the blank line after it (none where not `blank_after`: the
    section ends with the table). The header is written as given; the cells escaped by markdown_cell,
    written as given where `escape` is False, or by `escape` where it is a function."""
    cell = escape if callable(escape) else markdown_cell if escape else str
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return out + [""] if blank_after else out


def html_table(header: list, body: list[list], cls: str | None = "", *, escape: bool = False, thead: bool = True,
               row_classes: list[str | None] | None = None) -> str:
    """An HTML table: the header escaped; the cells HTML already (escaped before), or plain text
    escaped here where `escape`. `cls`: its class attribute (None: no attribute); `row_classes`: each
    body row's (None: no attribute). Where not `thead`, the header row and the body rows stand in the
    table without <thead> and <tbody> (a browser draws it the same)."""
    e = _escape
    head = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
    cell = e if escape else str
    rows = "".join(("<tr>" if c is None else f'<tr class="{c}">') + "".join(f"<td>{cell(x)}</td>" for x in row)
                   + "</tr>" for c, row in zip(row_classes or repeat(None), body))
    attr = "" if cls is None else f' class="{cls}"'
    if not thead:
        return f"<table{attr}>{head}{rows}</table>"
    return f"<table{attr}><thead>{head}</thead><tbody>{rows}</tbody></table>"


def _escape(x: object) -> str:
    return html.escape(str(x), quote=True)
