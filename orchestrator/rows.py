"""The report's rows, read once in chunks: each chunk goes to results.csv as fetched, then becomes
compact rows, so the report never holds the fetched tuples beside the rows (issue 31: a million runs).

A compact row is a dict that keeps only its non-NULL columns, with the text values shared between
rows (a fleet's runs repeat the same few words: status, host, CPU, configuration hash...). It reads
like the full row: a column it left out is None to `row[c]`, `row.get(c)`, iteration, `c in row`,
`dict(row)` and `{**row}` (they go through keys()), and len() counts every column. At 100k runs of
122 columns this halves the rows' memory (tests/test_report_scale.py checks it reads the same).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from itertools import compress, repeat
from operator import is_not
from pathlib import Path

from sqlalchemy import text

CHUNK = 20_000  # rows fetched at a time


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
    """Every row of `query` as compact rows (in its order), written to csv_path on the way (a header,
    then each row as fetched, as csv.writer writes a tuple)."""
    result = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(query), params)
    columns = list(result.keys())
    Row = row_class(columns)
    shared: dict = {}  # one copy of each text value
    share = shared.setdefault
    text_at: list[int] | None = None
    rows: list[dict] = []
    f = csv_path.open("w", newline="") if csv_path is not None else None
    try:
        writer = csv.writer(f) if f is not None else None
        if writer is not None:
            writer.writerow(columns)
        for chunk in result.partitions(CHUNK):
            if writer is not None:
                writer.writerows(chunk)
            if text_at is None:
                text_at = [i for i in range(len(columns)) if any(isinstance(r[i], str) for r in chunk)]
            for r in chunk:
                values = list(r)
                for i in text_at:
                    v = values[i]
                    if v is not None:
                        values[i] = share(v, v)
                keep = list(map(is_not, values, repeat(None)))
                rows.append(Row(zip(compress(columns, keep), compress(values, keep))))
            del chunk
    finally:
        if f is not None:
            f.close()
    return columns, rows


def runs_fingerprint(rows: list[dict]) -> int:
    """What a machine's analysis depends on, in one number (report --watch keeps a machine's work while
    it is unchanged): a run's row changes only as its status, attempts and end time do, and a new or
    deleted run changes the list of ids."""
    return hash(tuple((r.get("run_id"), r["status"], r.get("attempts"), r.get("finished")) for r in rows))
