"""The runs as rows: compact rows (a dict of a run's non-NULL columns; the others read as None) and
joined rows (a run's own columns, its configuration's shared by every run of it, and its machine's and
the like shared by its machine's runs), with readers of every row's value of a column at C speed. The
report's reader (orchestrator/report/rows.py) makes them; the statistics read them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import repeat
from operator import attrgetter, is_, methodcaller
from types import NoneType

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


@contextmanager
def gc_paused():
    """No cyclic collection inside, as it was outside on leaving: for building a million objects with no
    cycles among them (the rows here, ran.as_ran's Runs), whose new tracked objects would otherwise set
    off a full collection over all of them again and again (at 100k runs a third of the read)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def gc_frozen_as_made():
    """gc_paused, then what exists frozen (gc.freeze) before the collector is on again: for objects with no
    cycle among them that live on (a report's rows and analysis, a forked child's task), whose first
    collection after the pause would otherwise walk all of them, and every full one after it again. Frozen
    objects are never collected: whoever freezes them in a process that lives on unfreezes them when done
    (the report: its _collector_set_aside); a cycle among them is freed then."""
    with gc_paused():
        yield
        gc.freeze()


def row_class(columns) -> type[CompactRow]:
    return type("Row", (CompactRow,), {"__slots__": (), "COLUMNS": tuple(columns), "_HAS": frozenset(columns)})


# -- a run's row, its configuration's and its machine's -------------------------------------------------
# A million runs of a fleet have a few thousand configurations. A run's row holds its own columns and its
# job's identity and pass (PER_RUN_JOB); the rest of its job's columns (the variables, the sweep, the
# block, the derivations) are one compact row shared by every run of that configuration (JoinedRow.conf).
# A synthetic run's row is then 21 keys, a 464-byte table, instead of 66 in 1,584 bytes. Its machine's
# columns (but its id: readers take it per run at C speed) and the run's columns that its machine's runs
# mostly have alike (COMMON_RUN: its pool and host, what its trainer reports of its setup) are another
# shared row (JoinedRow.common), one per machine and distinct values of those: a fleet's run then keeps
# 16 keys in a 32-slot table, not 28 in a 64-slot one (view_sql.CSV_ONLY leaves out three more).
PER_RUN_JOB = ("job_id", "config_hash", "repeat")
PER_RUN_MACHINE = ("machine_id",)
COMMON_RUN = ("pool_id", "pool", "worker_host", "world_size", "global_batch", "gemm_format", "dataset_used")


class JoinedRow(CompactRow):
    """A run's row (read_results): a compact row of its own columns, `conf`, the compact row of its
    configuration's (_CONF) that its configuration's runs share, and `common`, the compact row of its
    machine's and COMMON_RUN's columns (_COMMON) that its machine's runs with the same values of those
    share. It reads as a compact row of all of them, but through `dict.get`, `dict.items` and the like
    unbound, which see its own columns only: `column` and `conf_values` read a list of rows at C speed.
    PARTS: the shared rows' attributes (a class made without common columns has `conf` only)."""

    __slots__ = ("conf", "common")
    _CONF: frozenset = frozenset()
    _COMMON: frozenset = frozenset()
    PARTS: tuple[str, ...] = ("conf",)

    def __missing__(self, key):
        if key in self._CONF:
            return self.conf[key]
        if key in self._COMMON:
            return self.common[key]
        if key in self._HAS:
            return None
        raise KeyError(key)

    def get(self, key, default=None):
        if key in self._CONF:
            return self.conf.get(key, default)
        if key in self._COMMON:
            return self.common.get(key, default)
        return dict.get(self, key, default)

    def items(self):
        return [(c, self[c]) for c in self.COLUMNS]

    def values(self):
        return [self[c] for c in self.COLUMNS]

    def copy(self) -> dict:
        """What dict.copy gives of a compact row: its non-NULL columns, in the view's order."""
        return {c: v for c, v in self.items() if v is not None}


def joined_row_class(columns, conf_columns, common_columns=()) -> type[JoinedRow]:
    common = frozenset(common_columns)
    return type("Row", (JoinedRow,), {"__slots__": (), "COLUMNS": tuple(columns), "_HAS": frozenset(columns),
                                      "_CONF": frozenset(conf_columns), "_COMMON": common,
                                      "PARTS": ("conf", "common") if common else ("conf",)})


def present(row: dict) -> list[tuple]:
    """A compact row's non-NULL (column, value) pairs: a JoinedRow's own, then its shared rows' (PARTS)."""
    if isinstance(row, JoinedRow):
        return [*dict.items(row), *(pair for part in row.PARTS for pair in dict.items(getattr(row, part)))]
    return list(dict.items(row))


def _joined_class(rows: list) -> type[JoinedRow] | None:
    """The JoinedRow class of these rows where they are all of one (None otherwise)."""
    cls = type(rows[0]) if rows else None
    if cls is None or not issubclass(cls, JoinedRow) or not all(map(is_, map(type, rows), repeat(cls))):
        return None
    return cls


def column(rows: list[dict], name: str) -> list:
    """Each row's value of `name` (None where NULL), as row.get(name) gives it, read at C speed: from
    each row, or (a shared column of JoinedRows) from its configuration's or common row."""
    if not rows or not isinstance(rows[0], JoinedRow):
        return list(map(dict.get, rows, repeat(name)))
    cls = _joined_class(rows)
    if cls is None:
        return list(map(methodcaller("get", name), rows))
    if name in cls._CONF:
        rows = map(attrgetter("conf"), rows)
    elif name in cls._COMMON:
        rows = map(attrgetter("common"), rows)
    return list(map(dict.get, rows, repeat(name)))


def conf_values(rows: list[dict], names) -> list[tuple]:
    """Each row's values of `names` as a tuple (None where NULL), as tuple(map(row.get, names)) gives it;
    where the rows are JoinedRows whose configuration holds all of `names`, worked out once per
    configuration row (the tuples shared between its runs)."""
    names = tuple(names)
    cls = _joined_class(rows)
    if cls is None or not cls._CONF.issuperset(names):
        return list(map(tuple, map(map, map(attrgetter("get"), rows), repeat(names))))
    confs = list(map(attrgetter("conf"), rows))
    of = {id(c): tuple(map(c.get, names)) for c in {id(c): c for c in confs}.values()}
    return list(map(of.__getitem__, map(id, confs)))


def runs_fingerprint(rows: list[dict]) -> int:
    """What a machine's analysis depends on, in one number (report --watch keeps a machine's work while
    it is unchanged): a run's row changes only as its status, attempts and end time do, and a new or
    deleted run changes the list of ids."""
    return hash(tuple((r.get("run_id"), r["status"], r.get("attempts"), r.get("finished")) for r in rows))


def print_keys(by_column: list) -> tuple[list, tuple]:
    """A chunk's columns as keys that are equal where their values print alike: a column of one type
    (per chunk; its type is the other part of the key) as it is, except floats where it holds a zero
    (0.0 and -0.0 are equal); any other column as each value's (type, repr) (1, 1.0 and True are equal
    too). (The columns as keys, their types: "repr" for a column of (type, repr) pairs.)"""
    kinds_of, key_columns = [], []
    for col in by_column:
        kinds = set(map(type, col))
        kinds.discard(NoneType)
        kind = next(iter(kinds)) if len(kinds) == 1 else None
        if not kinds or kind in (str, int, bool) or (kind is float and 0.0 not in col):
            key_columns.append(col)
            kinds_of.append(kind)
        else:
            key_columns.append(list(zip(map(type, col), map(repr, col))))
            kinds_of.append("repr")
    return key_columns, tuple(kinds_of)
