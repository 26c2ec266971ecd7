"""The report's rows, read once in chunks from the DBAPI cursor, each chunk made compact rows as
fetched, so the report never holds the fetched tuples beside the rows (a million runs among them);
results.csv is written meanwhile by a forked child from the tables on its own connection (results_csv):
read_results waits for it; write_report starts it itself (start_results_csv) and waits only at its end.

A compact row is a dict that keeps only its non-NULL columns, with the text values shared between
rows (a fleet's runs repeat the same few words: status, host, CPU, configuration hash...). It reads
like the full row: a column it left out is None to `row[c]`, `row.get(c)`, iteration, `c in row`,
`dict(row)` and `{**row}` (they go through keys()), and len() counts every column. At 100k runs of
122 columns this halves the rows' memory (tests/test_report_scale.py checks it reads the same).

The report reads v_results through read_results: each run's own columns fetched per run, and its
job's and machine's columns fetched once each and joined here (the same rows, a third of the values
fetched; the view's parts: view_sql.py); read_rows reads any query as it is. A row of read_results is
a JoinedRow: its configuration's columns (its job's but job_id, config_hash and repeat) are one compact
row that every run of that configuration shares, so that a million runs of a few thousand
configurations hold a 21-key dict each, not a 66-key one (docs/measurements.md: a third less peak
memory at 1M runs); its machine's columns (but machine_id) and the run's COMMON_RUN ones are another,
shared by its machine's runs alike in those (stats/columns.py). Unbound dict methods see a JoinedRow's
own columns only: readers of every run's value of a column use `column` and `conf_values`. PostgreSQL
gives each job's configuration as one text, its row's (view_sql.row_text), and each configuration's values
once: not ~50 values a job to fetch, share and key. The report has each run's `applied` (~3 KB, its own
in every run) cut to the keys it reads as each chunk is read (read_results' cut_applied: stats/applied_cut.py),
read from the ~0.8 KB of those keys the run stored apart (runs.applied_read) where it did.
"""

from __future__ import annotations

import csv
import os
import signal
from contextlib import nullcontext
from collections.abc import Iterator
from functools import partial
from itertools import compress, repeat
from operator import is_, is_not
from pathlib import Path
from types import NoneType

from sqlalchemy import text

from common.processes import fork_child
from orchestrator.stats.columns import (COMMON_RUN, CompactRow, JoinedRow, PER_RUN_JOB, PER_RUN_MACHINE,  # noqa: F401
                                         column, conf_values, gc_paused, joined_row_class, present, print_keys,
                                         row_class, runs_fingerprint)
from orchestrator.report import results_csv
from orchestrator.report.view_sql import (FROM_JOBS, JOB_EXPR, JOB_VALUE, MINE, READ_APPLIED, RUN_EXPR,
                                          SELECT_RESULTS, VIEW_COLUMNS, FetchAhead, binary_cursor, floats_exact,
                                          quoted, row_text, run_joins, sources, tuple_getter)

CHUNK = 20_000  # rows fetched at a time
# rows fetched at a time where they are only written out (results.csv from the view, as on PostgreSQL):
# two chunks of the view's ~120 values a row are alive while the next is fetched (20k: ~300 MB at 1M runs)
CSV_CHUNK = 2_000
NONES = repeat(None)
ALL_NULL = (True,)  # _nulls: the flags of a column NULL throughout, read only as f[0]


def read_rows(conn, query: str, params: dict, csv_path: Path | None = None) -> tuple[list[str], list[dict]]:
    """Every row of `query` as compact rows (in its order), and csv_path written (a header, then each
    row as fetched, as csv.writer writes a tuple). The CSV is written by a forked child that reads the
    query on its own connection, so that it takes the second CPU while this process builds the rows;
    without fork (or where the child fails) it is written here, from the same chunks."""
    child = _csv_child(conn, query, params, csv_path) if csv_path is not None else None
    result = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(query), params)
    columns = list(result.keys())
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
        for chunk in _chunks(result):
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


def _chunks(result, size: int | None = None) -> Iterator[list[tuple]]:
    """The query's rows in chunks of `size` tuples, read from the DBAPI cursor itself: an untyped text()
    query's values come back as the driver gives them, without SQLAlchemy's Row objects. The first
    chunk is taken through the result: on PostgreSQL's server-side cursor SQLAlchemy has already
    read the first row into its own buffer, and a read of the DBAPI cursor alone would lose it."""
    size = size or CHUNK
    first = [tuple(r) for r in result.fetchmany(size)]
    if first:
        yield first
    if len(first) < size:  # the result is spent (and may be closed)
        return
    cursor = result.cursor
    if result.context.dialect.name == "postgresql":  # the server makes the next chunk while this one is read
        cursor = FetchAhead(cursor)
    try:
        while chunk := cursor.fetchmany(size):
            yield chunk
    finally:
        if isinstance(cursor, FetchAhead):
            cursor.stop()  # (the result, which the caller closes, closes the cursor)


def _read(conn, query: str, params: dict) -> Iterator[list[tuple]]:
    """The query's rows in chunks of CHUNK tuples; PostgreSQL's in its binary format (view_sql.binary_cursor:
    ~2 CPU-s less of the report's process for a million runs)."""
    if conn.dialect.name == "postgresql":
        cursor = binary_cursor(conn, query, params)
        try:
            while chunk := cursor.fetchmany(CHUNK):
                yield chunk
        finally:
            cursor.close()
        return
    result = conn.execution_options(stream_results=True, yield_per=CHUNK).execute(text(query), params)
    try:
        yield from _chunks(result)
    finally:
        result.close()


def _write_csv(conn, query: str, params: dict, csv_path: Path, results: bool = False) -> None:
    """csv_path: the query's rows as csv.writer writes them; `results`: the query is SELECT_RESULTS, whose
    bytes results_csv writes from the tables where it can (each job's and machine's fields once)."""
    if results and results_csv.write(conn, params["machine_id"], csv_path):
        return
    result = conn.execution_options(stream_results=True, yield_per=CSV_CHUNK).execute(text(query), params)
    try:
        with csv_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(list(result.keys()))
            for chunk in _chunks(result, CSV_CHUNK):
                writer.writerows(chunk)
    finally:
        result.close()


def _csv_child(conn, query: str, params: dict, csv_path: Path, results: bool = False, nice: int = 0) -> int | None:
    """Fork a child that writes csv_path from the query on a connection of its own (opened after the
    fork; the parent's pooled connections are left to the parent), at `nice` below this process's
    priority, and that dies with this process (a kill -9 of the report: it would write the file for
    nobody, and hold the pipes of the report's other children open, keeping them alive too). Its pid,
    or None (no fork)."""
    if not hasattr(os, "fork"):
        return None
    engine = conn.engine

    def write() -> None:
        results_csv.keep_freed_memory()
        engine.dispose(close=False)
        with engine.connect() as own:
            if own.dialect.name == "postgresql":  # results_csv reads the tables by several statements: one snapshot
                own = own.execution_options(isolation_level="REPEATABLE READ")
            with own.begin():
                _write_csv(own, query, params, csv_path, results)

    return fork_child(write, nice=nice, die_with_parent=True)


def _done(pid: int) -> bool:
    """Wait for the CSV child: did it write the file?"""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


class ResultsCsv:
    """results.csv being written by a forked child while the report reads and analyses the runs
    (start_results_csv), waited for only where the file is wanted (wait), or stopped (stop)."""

    def __init__(self, pid: int | None, machine_id: int | None, csv_path: Path):
        self.pid, self.machine_id, self.csv_path = pid, machine_id, csv_path

    def wait(self, transaction) -> None:
        """The file written: by the child, or here (in `transaction()`) where there was no fork (as the
        child would: from the tables where that applies) or the child failed (from the view itself)."""
        pid, self.pid = self.pid, None
        if pid is not None and _done(pid):
            return
        with transaction() as conn:
            _write_csv(conn, _results_query(self.machine_id), {"machine_id": self.machine_id}, self.csv_path,
                       pid is None)

    def stop(self) -> None:
        """Kill and reap a child not waited for (the report failed)."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def start_results_csv(conn, machine_id: int | None, csv_path: Path, nice: int = 0) -> ResultsCsv:
    """results.csv (v_results' rows, every machine's or one's) started in a forked child on its own
    connection, at `nice` (the report wants it only when it returns): fork before read_results, so the
    child holds none of the rows."""
    child = _csv_child(conn, _results_query(machine_id), {"machine_id": machine_id}, csv_path, True, nice)
    return ResultsCsv(child, machine_id, csv_path)


def _results_query(machine_id: int | None, columns: list[str] | None = None) -> str:
    """SELECT_RESULTS for every machine's runs, or (machine_id given) for one machine's; of `columns`
    (quoted) only, where given."""
    query = SELECT_RESULTS.format(where="WHERE machine_id = :machine_id" if machine_id is not None else "")
    return query.replace("SELECT *", f"SELECT {', '.join(columns)}", 1) if columns is not None else query


def rows_of(chunk: list[tuple], columns: list[str], Row, shared: dict, plan: dict, append) -> None:
    """Append `chunk`'s tuples as compact rows, their values shared (_shared_columns)."""
    _append_compact(zip(*_shared_columns(chunk, plan, shared)), columns, Row, append)


def _append_compact(tuples, columns: list[str], Row, append) -> None:
    """Append each tuple (the columns' values) as a compact row: its non-NULL columns only."""
    for values in tuples:
        keep = list(map(is_not, values, NONES))
        append(Row(zip(compress(columns, keep), compress(values, keep))))


def _share_plan(chunk: list[tuple]) -> dict[int, dict]:
    """The columns whose values are worth sharing: text, and ints or floats that repeat (at most a
    quarter of the first chunk's values distinct); column -> its numbers' copies by type."""
    plan = {}
    for i, col in enumerate(zip(*chunk)):
        kinds = set(map(type, col)) - {NoneType}
        if kinds == {str} or (len(kinds) == 1 and kinds <= {int, float} and len(set(col)) * 4 <= len(col)):
            plan[i] = {}
    return plan


def read_results(conn, machine_id: int | None, csv_path: Path | None = None,
                 leave_out: frozenset = frozenset(), cut_applied=None,
                 read_prefix: str | None = None) -> tuple[list[str], list[dict]]:
    """What read_rows(conn, SELECT_RESULTS, ...) returns, for every run (or one machine's), less the
    columns in `leave_out` (the report's: view_sql.REPORT_LEAVES), read as its runs' own columns in run
    order plus each job's and machine's columns once. results.csv (every column) is written meanwhile by a
    forked child (results_csv, from the tables; the view where that does not apply). Where the view holds
    a column this read does not know (a later schema), it reads the view (read_rows).
    cut_applied(texts, others, steals, cores): what each run's row holds of its `applied` instead, from a
    chunk of runs' applied, other_cpu_s, steal_s and cores (the report's: applied_cut.cut), applied to
    each chunk before its values are shared, so the whole texts are never all held.
    read_prefix: a run whose runs.applied_read starts with it is read with that text as its `applied` (the
    report's: applied_cut.READ_PREFIX, the keys its cut reads), the others with their whole text."""
    params = {"machine_id": machine_id}
    view = list(conn.execute(text(VIEW_COLUMNS)).keys())
    columns = [c for c in view if c not in leave_out]
    known = sources(conn)
    later = bool(set(view) - set(known)) or len(set(view)) != len(view)  # a schema this read does not know
    mine = MINE if machine_id is not None else ""
    # results.csv: the child writes the view's bytes from the tables, each job's and machine's fields written
    # once (results_csv; the view itself where that does not apply). Reading the tuples as _view_parts does
    # gains nothing and holds every job's values (docs/measurements.md).
    csv_child = start_results_csv(conn, machine_id, csv_path) if csv_path is not None else None
    try:
        if later:  # the view itself, of the columns kept (results.csv has them all: the view's, in the child)
            rows = read_rows(conn, _results_query(machine_id, [quoted(conn, c) for c in columns]), params)[1]
            if cut_applied is not None and "applied" in columns:
                _cut_rows(rows, cut_applied)
        else:
            with gc_paused():
                rows = _joined(conn, columns, known, mine, params, cut_applied,
                               read_prefix if known.get("applied_read") == "r" else None)
    except BaseException:
        if csv_child is not None:  # never leave the child unreaped
            csv_child.stop()
        raise
    if csv_child is not None:  # written here, in this read's transaction, where the child was not
        csv_child.wait(lambda: nullcontext(conn))
    return columns, rows


def _cut_rows(rows: list[dict], cut_applied) -> None:
    """read_results' cut_applied on rows already read (a later schema's, from the view)."""
    cut = cut_applied(column(rows, "applied"), column(rows, "other_cpu_s"), column(rows, "steal_s"),
                      column(rows, "cores"))
    for row, value in zip(rows, cut):
        if value is not None:
            row["applied"] = value


def _joined(conn, columns: list[str], known: dict[str, str], mine: str, params: dict,
            cut_applied=None, read_prefix: str | None = None) -> list[dict]:
    """The view's rows as JoinedRows (read_results): each row's non-NULL columns, the same as _append_compact
    makes of the view's tuples, its configuration's in one row shared by its configuration's runs, its
    machine's and COMMON_RUN's in one shared by its machine's runs alike in those. Rows whose own, job's and
    machine's NULLs fall alike share a template: a dict of those columns in the view's order, which each of
    them copies (a copy of a fresh dict's table, with no insertion and no resize) and then fills with its
    values (a key already there keeps its place)."""
    runs, jobs, machines = ([c for c in columns if known[c] == s] for s in "rjm")
    conf = [c for c in jobs if c not in PER_RUN_JOB]  # every configuration column, NULL everywhere or not
    common = [c for c in columns if c in COMMON_RUN and known[c] == "r" or known[c] == "m" and c not in PER_RUN_MACHINE]
    Row, Conf, Common = joined_row_class(columns, conf, common), row_class(conf), row_class(common)
    parts = [[c for c in runs if c not in common], [c for c in jobs if c in PER_RUN_JOB],
             [c for c in machines if c not in common]]
    rows: list[dict] = []
    append = rows.append
    update = dict.update
    templates: dict = {}
    common_parts = [[c for c in common if known[c] == s] for s in "rm"]
    for own, job_parts, machine_parts, commons, keys in _view_parts(conn, parts, conf, Conf, (common_parts, Common),
                                                                    mine, params, cut_applied, read_prefix):
        for values, (job, of), machine, shared, key in zip(own, job_parts, machine_parts, commons, keys):
            try:
                template, own_of, job_of = templates[key]
            except KeyError:
                template, own_of, job_of = templates[key] = _template(columns, parts, (values, job, machine))
            row = Row(template)
            update(row, own_of(values))
            update(row, job_of(job))
            row.conf = of
            row.common = shared
            append(row)
    return rows


def _template(columns: list[str], parts: list[list[str]], values: tuple) -> tuple:
    """For the rows of one machine whose NULLs fall as in `values` (a row's own, job's and machine's
    values): the dict its row copies (its non-NULL columns in the view's order, the machine's values
    already in: sized as a dict built key by key), and the functions that give its own and its job's
    (column, value) pairs to fill in."""
    row = {}
    fill = []
    for names, vals in zip(parts, values):
        keep = [i for i, v in enumerate(vals) if v is not None]
        row.update((names[i], vals[i]) for i in keep)
        fill.append(_pairs([names[i] for i in keep], keep))
    template = dict(zip((c for c in columns if c in row), map(row.get, (c for c in columns if c in row))))
    return template, fill[0], fill[1]


def _pairs(names: list[str], keep: list[int]):
    """A function of one part's values: zip of `names` and the values at `keep`."""
    get = tuple_getter(keep)
    return lambda vals: zip(names, get(vals))


def _view_parts(conn, parts: list[list[str]], conf_cols: list[str], Conf, common: tuple, mine: str, params: dict,
                cut_applied=None, read_prefix: str | None = None) -> Iterator:
    """The view's rows a chunk at a time (run order), in parts: each run's own values, its job's (its
    PER_RUN_JOB values, and its configuration's Conf row: one per distinct configuration), its machine's
    own (fetched once each; the tuples shared between their runs), its common row (common: the run's and
    its machine's columns it holds, and its class: _common_rows), and a key per run that is the same for
    two runs exactly where the same of their columns are NULL. The values shared as read_rows shares them."""
    run_cols, job_cols, machine_cols = parts
    (common_runs, common_machines), Common = common
    shared: dict = {}  # one copy of each text value, across every column and table
    kinds: dict = {}  # a NULL pattern -> its number
    confs: dict = {}  # a configuration's values (as they print) -> its row
    commons: dict = {}  # a machine and its runs' common values (as they print) -> their row

    def table(query: str, row_of, values: dict = params) -> dict:
        """key (the first value) -> row_of(the rest, column by column; the number of rows)."""
        out, plan = {}, {}
        for chunk in _read(conn, query, values):
            by_column = _shared_columns(chunk, plan, shared)
            out.update(zip(by_column[0], row_of(by_column[1:], len(by_column[0]))))
        return out

    # (its NULL pattern's number, its values, its configuration)
    def job_of(by_column: list, length: int) -> Iterator[tuple]:
        k = len(job_cols)
        return zip(_nulls(by_column[:k], kinds), zip(*by_column[:k]) if k else repeat(()),
                   _conf_rows(by_column[k:], length, conf_cols, Conf, confs))

    # (its NULL pattern's number, its values, its configuration's text: view_sql.row_text)
    def job_keyed(by_column: list, length: int) -> Iterator[tuple]:
        k = len(job_cols)
        return zip(_nulls(by_column[:k], kinds), zip(*by_column[:k]) if k else repeat(()), by_column[k])

    # (its own values, its common values)
    def machine_of(by_column: list, length: int) -> Iterator[tuple]:
        k = len(machine_cols)
        return zip(zip(*by_column[:k]) if k else repeat((), length),
                   zip(*by_column[k:]) if len(by_column) > k else repeat((), length))

    q = quoted
    job_exprs, conf_exprs = ([JOB_EXPR.get(c) or "j." + q(conn, c) for c in cols] for cols in (job_cols, conf_cols))
    # the jobs that have a run (of the machine): one whose runs were all taken back ('queued') is read for
    # nothing (the runs' read never asks for it), but the probe reads the runs' (job_id, pool_id) index alone,
    # not each job's run row for its status
    having_runs = f"WHERE EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.job_id{mine})"
    if conf_cols and conn.dialect.name == "postgresql" and floats_exact(conn):
        # a job's configuration read as its row's text (one value, not ~50), its values once per configuration
        key = row_text([JOB_VALUE.get(c) or "j." + q(conn, c) for c in conf_cols])
        keyed = table(f"SELECT j.job_id, {', '.join([*job_exprs, key])} {FROM_JOBS} {having_runs}", job_keyed)
        first = {}  # a configuration's text -> one of its jobs
        for job_id, (_, _, conf_text) in keyed.items():
            first.setdefault(conf_text, job_id)
        conf_of = table(f"SELECT {key}, {', '.join(conf_exprs)} {FROM_JOBS} "
                        f"WHERE j.job_id = ANY(:ids)", partial(_conf_rows, names=conf_cols, Conf=Conf, confs=confs),
                        {"ids": list(first.values())})
        jobs = keyed  # each job's text replaced in place by its configuration's row (no second dict held)
        for job_id, (nulls, values, conf_text) in keyed.items():
            jobs[job_id] = nulls, values, conf_of[conf_text]
        del keyed, first, conf_of
    else:
        jobs = table(f"SELECT j.job_id, {', '.join(job_exprs + conf_exprs)} {FROM_JOBS} {having_runs}", job_of)
    machines = table(f"SELECT m.machine_id{''.join(', m.' + q(conn, c) for c in machine_cols + common_machines)} "
                     f"FROM machines m", machine_of)
    plan: dict = {}
    fetched = run_cols + common_runs
    exprs = RUN_EXPR
    if read_prefix is not None and "applied" in fetched:  # the keys the report reads, where a run stored them apart
        exprs = {**RUN_EXPR, "applied": READ_APPLIED.format(length=len(read_prefix))}
        params = {**params, "read_prefix": read_prefix}
    query = (f"SELECT {', '.join(exprs.get(c) or 'r.' + q(conn, c) for c in fetched)}, r.job_id, r.machine_id "
             f"{run_joins(conn.dialect.name).format(mine=mine)} ORDER BY r.run_id")
    n, k = len(run_cols), len(common_runs)
    cut = None
    if cut_applied is not None and "applied" in fetched:
        at = fetched.index("applied")
        figures = [fetched.index(c) if c in fetched else None for c in ("other_cpu_s", "steal_s")]

        def cut(by_column: list) -> None:  # (before the chunk's values are shared)
            cores = [conf.get("cores") for _, _, conf in map(jobs.__getitem__, by_column[n + k])]
            by_column[at] = cut_applied(by_column[at], *(by_column[i] if i is not None else None for i in figures),
                                        cores)
    for chunk in _read(conn, query, params):
        by_column = _shared_columns(chunk, plan, shared, cut)
        del chunk
        job_nulls, job_values, job_confs = zip(*map(jobs.__getitem__, by_column[n + k]))
        machine_ids = by_column[n + k + 1]
        machine_values = [m for m, _ in map(machines.__getitem__, machine_ids)]
        rows = _common_rows(machine_ids, by_column[n:n + k], machines, common_runs, Common, commons)
        # a machine's own values are in its templates
        keys = zip(_nulls(by_column[:n], kinds), job_nulls, machine_ids)
        yield zip(*by_column[:n]), zip(job_values, job_confs), machine_values, rows, keys


def _common_rows(machine_ids: list, by_column: list, machines: dict, names: list[str], Common, made: dict) -> list:
    """Each of a chunk's runs' common row: its machine's common values (machines: id -> (own, common))
    and its own values of `names` (by_column), its non-NULL columns in Common's order; one row per machine
    and distinct values as they print (print_keys), kept in `made` across chunks."""
    key_columns, kinds_of = print_keys(by_column)
    made = made.setdefault(kinds_of, {})
    keys = list(zip(machine_ids, *key_columns))
    rows = list(map(made.get, keys))
    missing = list(map(is_, rows, NONES))
    if any(missing):
        machine_names = [c for c in Common.COLUMNS if c not in names]
        for at in compress(range(len(keys)), missing):
            row = made.get(keys[at])
            if row is None:
                values = dict(zip(machine_names, machines[machine_ids[at]][1]))
                values.update(zip(names, (col[at] for col in by_column)))
                row = made[keys[at]] = Common((c, values[c]) for c in Common.COLUMNS if values[c] is not None)
            rows[at] = row
    return rows


def _conf_rows(by_column: list, length: int, names: list[str], Conf, confs: dict) -> list:
    """The configuration row of each of a chunk's `length` jobs (`by_column`: their configuration
    columns' values): one Conf row (its non-NULL columns) per distinct configuration, kept in `confs`
    across chunks. Two jobs share one only where their values print alike (print_keys). A grid's jobs
    differ in a few columns: the columns that hold one value throughout the chunk are read once, and each
    key and row is made once per distinct values of the others (_conf_parts)."""
    if not by_column:  # no configuration column holds a value: one empty row for every job
        return [confs.get(()) or confs.setdefault((), Conf())] * length
    key_columns, kinds_of = print_keys(by_column)
    whole, keys_of, row_of = _conf_parts(key_columns, by_column, length, names, Conf)
    own: dict = {}  # the chunk's varied values -> their row
    out = []
    append = out.append
    for at, varied_key in enumerate(keys_of):
        row = own.get(varied_key)
        if row is None:
            key = (kinds_of, whole(varied_key))
            row = confs.get(key)
            if row is None:
                row = confs[key] = row_of(at)
            own[varied_key] = row
        append(row)
    return out


def _conf_parts(key_columns: list, by_column: list, length: int, names: list[str], Conf) -> tuple:
    """_conf_rows' chunk taken apart: (whole(varied key): the full key's values, each job's key of the
    columns that vary in the chunk, row_of(job): its Conf row). A column whose keys are all equal (of one
    type, compared by value) holds one value throughout: its first job's. A job's row copies the row of
    the first job whose varied columns are NULL alike (a copy of a dict's table), then takes its values."""
    fixed = [i for i, col in enumerate(key_columns) if col is by_column[i] and col and col.count(col[0]) == len(col)]
    varied = sorted(set(range(len(key_columns))) - set(fixed))
    # the columns in their order, from (the fixed ones' values) + (the varied ones')
    at = {i: k for k, i in enumerate(fixed + varied)}
    order = tuple_getter([at[i] for i in range(len(key_columns))])
    fixed_values = tuple(by_column[i][0] for i in fixed)
    keys_of = list(zip(*(key_columns[i] for i in varied))) if varied else [()] * length
    # a job's values of the varied columns: its key's, but where a column's key is (type, repr)
    varied_values = (keys_of if all(key_columns[i] is by_column[i] for i in varied)
                     else list(zip(*(by_column[i] for i in varied))))
    varied_names = [names[i] for i in varied]
    templates: dict = {}  # the varied columns' NULLs -> a plain dict of the row's columns in their order

    def whole(varied_key: tuple) -> tuple:
        return order(fixed_values + varied_key)

    def row_of(job: int):
        values = varied_values[job]
        held = tuple(map(is_not, values, NONES))
        template = templates.get(held)
        if template is None:
            every = order(fixed_values + values)
            keep = list(map(is_not, every, NONES))
            template = templates[held] = dict(zip(compress(names, keep), compress(every, keep)))
        row = Conf(template)
        dict.update(row, zip(compress(varied_names, held), compress(values, held)))
        return row

    return whole, keys_of, row_of


def _nulls(by_column: list, kinds: dict) -> list:
    """Each row's NULL pattern (which of `by_column`'s columns are NULL in it) as a number from `kinds`,
    found column by column: a column NULL in every row of the chunk, or in none, is the same for all. A
    column NULL throughout (a sweep's unmeasured ones) is found by a count of None, its flags never listed."""
    flags = [ALL_NULL if col and col[0] is None and col.count(None) == len(col) else list(map(is_, col, NONES))
             for col in by_column]
    mixed = [i for i, f in enumerate(flags) if f is not ALL_NULL and any(f) and not all(f)]
    whole = tuple((i, f[0]) for i, f in enumerate(flags) if i not in mixed and f)
    number = kinds.setdefault
    head = number((whole, tuple(mixed)), len(kinds))  # the chunk's columns NULL throughout, and those that vary
    if not mixed:
        return [number((head, ()), len(kinds))] * (len(by_column[0]) if by_column else 0)
    return [number((head, r), len(kinds)) for r in zip(*(flags[i] for i in mixed))]


def _shared_columns(chunk: list[tuple], plan: dict, shared: dict, cut=None) -> list:
    """`chunk` transposed, its values shared (rows_of, _view_parts): the first chunk decides which columns
    share their values (text, and numbers that repeat: `plan`); each chunk checks their types again (C
    loops, column by column): a value is only ever replaced by an equal one of its own type. cut(by_column)
    changes columns in place before they are shared (_view_parts: cut_applied)."""
    if not plan:
        plan.update(_share_plan(chunk))
        plan.setdefault(None, None)  # decided, even where no column is shared
    by_column = list(zip(*chunk))
    if cut is not None:
        cut(by_column)
    for i, seen in plan.items():
        if i is None:
            continue
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
        if col.count(col[0]) == len(col):  # one value throughout (a grid's unvaried columns): shared once
            by_column[i] = [seen.setdefault(col[0], col[0])] * len(col)
        else:
            by_column[i] = list(map(seen.setdefault, col, col))
    return by_column
