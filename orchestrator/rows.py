"""The report's rows, read once in chunks from the DBAPI cursor, each chunk made compact rows as
fetched, so the report never holds the fetched tuples beside the rows (issue 31: a million runs);
results.csv is written meanwhile by a forked child from the same query on its own connection.

A compact row is a dict that keeps only its non-NULL columns, with the text values shared between
rows (a fleet's runs repeat the same few words: status, host, CPU, configuration hash...). It reads
like the full row: a column it left out is None to `row[c]`, `row.get(c)`, iteration, `c in row`,
`dict(row)` and `{**row}` (they go through keys()), and len() counts every column. At 100k runs of
122 columns this halves the rows' memory (tests/test_report_scale.py checks it reads the same).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from itertools import compress, repeat
from operator import is_not
from pathlib import Path
from types import NoneType

from sqlalchemy import text

CHUNK = 20_000  # rows fetched at a time
NONES = repeat(None)


class CompactRow(dict):
    """One row: its non-NULL columns; the others read as None. COLUMNS: set per query (row_class)."""

    __slots__ = ()
    COLUMNS: tuple[str, ...] = ()
    _HAS: frozenset = frozenset()

    def __missing__(self, key):
        if key in self._HAS:
            return None
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return key in self._HAS

    def __iter__(self) -> Iterator[str]:
        return iter(self.COLUMNS)

    def __len__(self) -> int:
        return len(self.COLUMNS)

    def keys(self):
        return list(self.COLUMNS)

    def items(self):
        get = dict.get
        return [(c, get(self, c)) for c in self.COLUMNS]

    def values(self):
        get = dict.get
        return [get(self, c) for c in self.COLUMNS]

    def __eq__(self, other) -> bool:
        return dict(self.items()) == (dict(other.items()) if isinstance(other, dict) else other)

    __hash__ = None


def row_class(columns) -> type[CompactRow]:
    return type("Row", (CompactRow,), {"__slots__": (), "COLUMNS": tuple(columns), "_HAS": frozenset(columns)})


def read_rows(conn, query: str, params: dict, csv_path: Path | None = None) -> tuple[list[str], list[dict]]:
    """Every row of `query` as compact rows (in its order), and csv_path written (a header, then each
    row as fetched, as csv.writer writes a tuple). The CSV is written by a forked child that reads the
    query on its own connection, so that it takes the second CPU while this process builds the rows;
    without fork (or where the child fails) it is written here, from the same chunks."""
    child = _csv_child(conn, query, params, csv_path) if csv_path is not None else None
    result = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(query), params)
    columns = list(result.keys())
    # The DBAPI cursor itself: an untyped text() query's values come back as the driver gives them,
    # without SQLAlchemy's Row objects and partitions.
    cursor = result.cursor
    Row = row_class(columns)
    shared: dict = {}  # one copy of each text value
    plan: dict = {}  # the columns whose values are shared (rows_of)
    rows: list[dict] = []
    append = rows.append
    f = csv_path.open("w", newline="") if csv_path is not None and child is None else None
    try:
        writer = csv.writer(f) if f is not None else None
        if writer is not None:
            writer.writerow(columns)
        while chunk := cursor.fetchmany(CHUNK):
            if writer is not None:
                writer.writerows(chunk)
            rows_of(chunk, columns, Row, shared, plan, append)
            del chunk
    finally:
        if f is not None:
            f.close()
        result.close()
        written = _done(child) if child is not None else True  # never leave the child unreaped
    if not written:  # the child failed: write the CSV here after all
        _write_csv(conn, query, params, csv_path)
    return columns, rows


def _write_csv(conn, query: str, params: dict, csv_path: Path) -> None:
    result = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(query), params)
    cursor = result.cursor
    try:
        with csv_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(list(result.keys()))
            while chunk := cursor.fetchmany(CHUNK):
                writer.writerows(chunk)
    finally:
        result.close()


def _csv_child(conn, query: str, params: dict, csv_path: Path) -> int | None:
    """Fork a child that writes csv_path from the query on a connection of its own (opened after the
    fork; the parent's pooled connections are left to the parent). Its pid, or None (no fork)."""
    if not hasattr(os, "fork"):
        return None
    engine = conn.engine
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        engine.dispose(close=False)
        with engine.connect() as own, own.begin():
            _write_csv(own, query, params, csv_path)
        code = 0
    finally:
        os._exit(code)


def _done(pid: int) -> bool:
    """Wait for the CSV child: did it write the file?"""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def rows_of(chunk: list[tuple], columns: list[str], Row, shared: dict, plan: dict, append) -> None:
    """Append `chunk`'s tuples as compact rows. The first chunk decides which columns share their
    values (text, and numbers that repeat); each chunk checks their types again (C loops, column
    by column): a value is only ever replaced by an equal one of its own type."""
    if not plan:
        plan.update(_share_plan(chunk, columns))
    by_column = list(zip(*chunk))
    for i, seen in plan.items():
        col = by_column[i]
        kinds = set(map(type, col))
        kinds.discard(NoneType)
        if len(kinds) != 1:
            continue
        kind, = kinds
        if kind is str:
            seen = shared  # one copy of each text value across every column
        elif kind is float and 0.0 in col:  # 0.0 and -0.0 are equal but print apart
            continue
        else:
            seen = seen.setdefault(kind, {})  # 1 and 1.0 (and True) are equal but stay apart
        by_column[i] = list(map(seen.setdefault, col, col))
    for values in zip(*by_column):
        keep = list(map(is_not, values, NONES))
        append(Row(zip(compress(columns, keep), compress(values, keep))))


def _share_plan(chunk: list[tuple], columns: list[str]) -> dict[int, dict]:
    """The columns whose values are worth sharing: text, and ints or floats that repeat (at most a
    quarter of the first chunk's values distinct); column -> its numbers' copies by type."""
    plan = {}
    for i, col in enumerate(zip(*chunk)):
        kinds = set(map(type, col)) - {NoneType}
        if kinds == {str} or (len(kinds) == 1 and kinds <= {int, float} and len(set(col)) * 4 <= len(col)):
            plan[i] = {}
    return plan


def runs_fingerprint(rows: list[dict]) -> int:
    """What a machine's analysis depends on, in one number (report --watch keeps a machine's work while
    it is unchanged): a run's row changes only as its status, attempts and end time do, and a new or
    deleted run changes the list of ids."""
    return hash(tuple((r.get("run_id"), r["status"], r.get("attempts"), r.get("finished")) for r in rows))
