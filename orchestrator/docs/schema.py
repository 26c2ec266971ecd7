"""docs/v_results.md and docs/v_curves.md, generated from schema.sql: every column of the views users query, in order,
with the comment schema.sql gives the column where it is defined (a variable's words come from the
catalogue, common/variables.py).

schema.sql stays the single source of truth: a column's meaning is written once, as an SQL comment
beside it (or on the comment lines just above it); a view column computed from others is described
in the comment above the view, as `--   name: what`. `undocumented()` lists the view's columns
without a word: tests/test_docs.py fails on any, and on a page that differs from this module's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.paths import REPO
from common import variables as V
from common.metrics import METRICS
from orchestrator.queue.migrations import _top_level_split

ROOT = REPO
VIEW = "v_results"
GENERATED = ("<!-- generated from schema.sql's comments (and the variable catalogue) by `python bench.py docs`: "
             "edit schema.sql, then run it -->")
ALIASES = {"r": "runs", "j": "jobs", "s": "sweeps", "m": "machines", "p": "pools", "c": "curves"}
SOURCE_WORDS = {"runs": "run", "jobs": "job", "sweeps": "sweep", "machines": "machine", "pools": "pool",
                "curves": "curve"}


@dataclass
class Column:
    name: str
    table: str | None  # where it comes from; None: computed in the view
    sql: str  # the select item
    type: str
    doc: str


def table_comments(schema: str) -> dict[str, dict[str, tuple[str, str]]]:
    """table -> column -> (its SQL type, its comment): the comment on the column's line, with its
    continuation lines (comment-only lines aligned under it), or else the comment lines just above it."""
    tables = {}
    for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", schema, re.S):
        columns: dict[str, tuple[str, str]] = {}
        above: list[str] = []
        last = None  # the previous column, while its comment may continue
        for line in m.group(2).splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("--"):
                words = stripped[2:].strip()
                if last is not None and line.index("--") >= 20:  # aligned under a column's comment
                    kind, doc = columns[last]
                    columns[last] = (kind, f"{doc} {words}")
                else:
                    above.append(words)
                    last = None
                continue
            head, _, comment = line.partition("--")
            col = re.match(r'\s*"?(\w+)"?\s+(\w+)', head)
            if col is None or col.group(1).upper() in ("UNIQUE", "CHECK", "PRIMARY", "FOREIGN"):
                above, last = [], None
                continue
            doc = comment.strip() if comment.strip() else " ".join(above)
            columns[col.group(1)] = (col.group(2), doc)
            above, last = [], col.group(1) if comment.strip() else None
        tables[m.group(1)] = columns
    return tables


def view_columns(schema: str | None = None, view: str = VIEW) -> list[Column]:
    """The view's columns in order, each with its source table and its words."""
    schema = schema if schema is not None else (ROOT / "schema.sql").read_text()
    comments = table_comments(schema)
    m = re.search(rf"((?:--[^\n]*\n)*)CREATE VIEW IF NOT EXISTS {view} AS\s*SELECT(.*?)\bFROM\b", schema, re.S)
    if m is None:
        raise ValueError(f"schema.sql has no view {view}")
    computed = dict(re.findall(r"--\s+(\w+): (.*)", m.group(1)))
    columns = []
    for item in _top_level_split(m.group(2)):
        if src := re.fullmatch(r'(\w)\."?(\w+)"?(?: AS (\w+))?', item):
            alias, column, name = src.groups()
            table = ALIASES[alias]
            kind, doc = comments.get(table, {}).get(column, ("", ""))
            name = name or column
            if table == "jobs" and column in V.BY_NAME:
                var = V.BY_NAME[column]
                doc = f"variable ({var.applied}): {var.doc}"
            columns.append(Column(name, table, item, kind, doc))
        else:
            name = item.rsplit(" AS ", 1)[-1].strip()
            columns.append(Column(name, None, item, "", computed.get(name, "")))
    return columns


def undocumented(schema: str | None = None, view: str = VIEW) -> list[str]:
    return [c.name for c in view_columns(schema, view) if not c.doc]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def v_results_page() -> str:
    """docs/v_results.md."""
    columns = view_columns()
    lines = [GENERATED, "", f"# `{VIEW}`, column by column", "",
             f"`{VIEW}` is one row per run that left the queue (running, done, failed or skipped): the job's",
             "variables, the run's metrics and facts, the machine's facts. It is what users query",
             "([querying results](results.md)); the words below are schema.sql's own comments, so they change",
             "with it. Times are REAL seconds since the epoch on the database's clock; a metric a machine",
             "cannot measure is NULL, never a made-up number. Variables: [the catalogue](variables.md).", "",
             "| column | from | type | what |", "|---|---|---|---|"]
    return "\n".join(lines + _rows(columns))


def v_curves_page() -> str:
    """docs/v_curves.md."""
    lines = [GENERATED, "", "# `v_curves`, column by column", "",
             "`v_curves` is one row per evaluation of a learning run (a job with `max_tokens`): the validation",
             "loss on the corpus's fixed held-out windows after so many steps, tokens and seconds, with the",
             "run's main variables. Every other column of the run is in `v_results` (join on `run_id`); take",
             "`final` for the curve of each run's last claim. The words below are schema.sql's own comments.", "",
             "| column | from | type | what |", "|---|---|---|---|"]
    return "\n".join(lines + _rows(view_columns(view="v_curves")))


def _rows(columns: list[Column]) -> list[str]:
    lines = []
    for c in columns:
        source = SOURCE_WORDS.get(c.table, "computed") if c.table else f"computed: `{_cell(c.sql)}`"
        if c.table == "runs" and c.name in METRICS:
            source = "run (metric)"
        lines.append(f"| `{c.name}` | {source} | {c.type or ''} | {_cell(c.doc)} |")
    lines.append("")
    return lines
