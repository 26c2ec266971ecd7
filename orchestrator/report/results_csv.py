"""results.csv from the runs, jobs and machines tables: the bytes csv.writer writes for v_results' rows,
with each job's and machine's part of a row written once rather than once per run (at 100k runs the
view's 122 values a row are ~1.5 CPU-seconds to fetch and ~1.7 to write, in the child that shares the
second CPU with the cost model's fit and the PNG drawers).

A run's row is its own columns and, between them, runs of its job's columns (its sweep's name; job_id to
block) and its machine's. Each run is fetched as its own values with a marker (MARK) in the place of each
such run of columns, and written by csv.writer, so that every field is quoted and printed by csv.writer
itself; the markers are then filled with the text csv.writer wrote for the job's and the machine's fields.
A job's text is kept in memory for the runs that follow it (at most JOBS_KEPT jobs: a fleet's machines run
the same job at about the same time), and on disk once let go (_Spill: read back, not made again, where a
machine runs a job another ran long before). Most of a job's columns are its configuration's, the same
for each of its repeats (all but PER_RUN_JOB): their longest stretch is written once per configuration and
put in its place in each job's text (_stretched: ~6.5 us a job where ~9 were; past STRETCHES_KEPT
configurations, the jobs are written whole). PostgreSQL gives a job's stretch as one text, its row's
(view_sql.row_text: the same text exactly where the values are the same), and each configuration's values
are read once (_keyed): half the CPU of making the jobs' texts. On SQLite, where most jobs ran once (a grid
of one run each, a sweep on one machine: _jobs_run_once), a job's text made apart would serve one line: its
columns are then read with its run's own, from the run query's join, and written with them.

A run's long texts (QUOTED_IN_SQL: applied, ~3 KB of JSON a real run) take csv.writer ~30 us each (1M
runs: 30 s); SQLite quotes them as csv.writer would (QUOTED: quoted where they hold a comma, a quote or a
line break, quotes doubled; NULL empty) and they fill a marker of their own. PostgreSQL's are read as their
UTF-8 bytes (convert_to: no text decoded here and encoded again) and quoted so here (_quoted_bytes:
bytes.replace, where str.replace took ~1.8 times as long and the server's replace longer still); each
chunk's other text is encoded as the file would encode it, and the bytes put in at their places (OWN). Its
other values are read in PostgreSQL's binary format (_Driver).

A run's measurements (each stretch of NUMBERS_MIN or more columns of a numeric type) are floats that
csv.writer prints by repr, ~0.25 us each (a real run has ~25: 1M runs ~7 s); msgspec's JSON encoder
writes a chunk of them at once with the same digits, several times faster, and each stretch fills a
marker of its own. Where its text would not be repr's (an exponent, a float below 1e-4, an infinite one,
a value that is not a number) the chunk's stretch is written by csv.writer (_numbers).

Where that cannot give the view's bytes (another database than SQLite and PostgreSQL, a view column this
does not know, a value that holds the marker, a file encoding other than UTF-8 on PostgreSQL), write() says
so and the caller writes the view itself (rows._write_csv).
"""

from __future__ import annotations

import codecs
import csv
import ctypes
import io
import os
import tempfile
from array import array
from itertools import chain, repeat
from operator import add, itemgetter
from pathlib import Path

import msgspec
from sqlalchemy import text

from orchestrator.report.view_sql import (FROM_JOBS, JOB_EXPR, JOB_VALUE, MINE, RUN_EXPR, VIEW_COLUMNS, binary_cursor,
                                          driver_sql, floats_exact, quoted, row_text, run_joins, sources,
                                          tuple_getter)
from orchestrator.stats.columns import PER_RUN_JOB, gc_paused, print_keys

MARK = "\x02"  # stands for a job's or machine's text in a run's line: no value of a real sweep holds it
QUOTED_IN_SQL = ("applied",)  # a run's columns quoted as csv.writer would by SQLite, here on PostgreSQL
OWN = "\x05"  # stands for a run's PostgreSQL-quoted text (bytes) in a chunk's text until it is encoded (_lines)
NOT_TEXT = "\x03"  # what QUOTED gives for a value neither text nor NULL: csv.writer writes those itself
QUOTED = ("CASE typeof({c}) WHEN 'null' THEN '' WHEN 'text' THEN CASE WHEN instr({c}, '\"') OR instr({c}, ',') "
          "OR instr({c}, char(13)) OR instr({c}, char(10)) THEN '\"' || replace({c}, '\"', '\"\"') || '\"' "
          "ELSE {c} END ELSE char(3) END")
MARK_SQL = {"sqlite": f"char({ord(MARK)})", "postgresql": f"chr({ord(MARK)})"}  # the databases written this way
QUOTED_BY = {"sqlite": QUOTED, "postgresql": "convert_to({c}, 'UTF8')"}  # (PostgreSQL's: _quoted_bytes)
PLACE = "\x04"  # stands for a job's configuration stretch in its text (_stretched)
STRETCH_MIN = 8  # columns of a configuration's stretch written once (_stretch): fewer are written per job
STRETCHES_KEPT = 20_000  # configurations' texts kept (~0.6 kB each with their values); past it, jobs written whole
JOBS_KEPT = 1 << 12  # job texts kept in memory for later runs (~0.6 kB each; the rest on disk: _Spill)
SPILL_IDS = 1 << 21  # job ids below this have their texts kept on disk once let go: two array entries of 8
# bytes per id, made for every id up to the database's last (32 MB at most; above it each text is made again)
JOINED_RUNS = 1.25  # runs a job, on average, up to which the jobs' columns are read with the runs (_jobs_run_once)
NUMBERS_MIN = 4  # a run of this many numeric columns (a run's measurements) is written by msgspec (_numbers)
CHUNK = 1_000  # runs fetched at a time (~4 kB each, held 3-4 times over while written)
FREED_KEPT = 32 << 20  # bytes of freed memory a writer's process keeps for its next allocations (keep_freed_memory)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_freed_memory() -> None:
    """This process's freed memory kept for its next allocations, up to FREED_KEPT (glibc's malloc; for a
    process that writes results.csv and exits): each chunk's few MB of text were otherwise given back to
    the system when freed and taken again as fresh pages, each zeroed by the kernel on its first touch."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:  # not glibc's
        return
    mallopt(M_MMAP_THRESHOLD, FREED_KEPT)
    mallopt(M_TRIM_THRESHOLD, FREED_KEPT)


class NotHere(Exception):
    """The view's bytes cannot be written this way: the caller writes them from the view."""


def write(conn, machine_id: int | None, csv_path: Path) -> bool:
    """Write results.csv (every run of v_results, or one machine's) as csv.writer writes the view's rows;
    False where this way does not apply (nothing useful written: the caller writes it from the view)."""
    if conn.dialect.name not in MARK_SQL:
        return False
    columns = list(conn.execute(text(VIEW_COLUMNS)).keys())
    known = sources(conn)
    if set(columns) - set(known) or len(set(columns)) != len(columns) or len(columns) < 2:
        return False
    raw = _Driver(conn)
    # where most jobs ran once, their columns are read with the runs' own, as the runs' are
    joined = {c for c, source in known.items() if source == "j"} if raw.sqlite and _jobs_run_once(raw) else set()
    plan = _Plan(_segments(columns, {c: "r" if c in joined else s for c, s in known.items()}),
                 lambda c: quoted(conn, c), raw.numeric("runs"), machine_id is not None, conn.dialect.name,
                 keyed=conn.dialect.name == "postgresql" and floats_exact(conn), joined=joined)
    try:
        machines = _texts(raw.all(plan.machine_query), plan.machines) if plan.machines else {}
        jobs: dict = {}
        last_job = raw.all("SELECT MAX(job_id) FROM jobs")[0][0] if plan.jobs else None
        cursor = raw.streamed(plan.run_query, {"machine_id": machine_id})
        try:
            with csv_path.open("w", newline="") as f, _Spill(csv_path.parent, last_job) as spill, gc_paused():
                if plan.quote and codecs.lookup(f.encoding).name != "utf-8":  # (PostgreSQL's applied: UTF-8 bytes)
                    raise NotHere
                csv.writer(f).writerow(columns)
                f.flush()  # the lines go to its bytes, encoded as it encodes (_lines)
                while chunk := cursor.fetchmany(CHUNK):
                    f.buffer.write(_lines(raw, chunk, (jobs, spill), machines, plan, f.encoding))
                    del chunk
        finally:
            cursor.close()
    except NotHere:
        return False
    return True


class _Plan:
    """The queries of write() and where each part of a run's row comes from. A run's row (run_query) is
    its job_id and machine_id, its fields for csv.writer (`fields`) with a marker in the place of each of
    its job's segments, its machine's, each run of NUMBERS_MIN or more columns of a numeric type
    (`numbers`: fetched after the fields) and each QUOTED_IN_SQL column (`own`: SQLite's quoted text,
    PostgreSQL's UTF-8 bytes; last). `fill(texts)` orders a run's texts (its job's, machine's, numbers', own)
    as its markers."""

    def __init__(self, segments: list[tuple[str, list[str]]], q, numeric: set[str], mine: bool, dialect: str,
                 keyed: bool = False, joined: set[str] = frozenset()):
        job_segments = [cols for source, cols in segments if source == "j"]
        machine_segments = [cols for source, cols in segments if source == "m"]
        self.jobs, self.machines = len(job_segments), len(machine_segments)
        self.stretch = _stretch(job_segments)
        # the stretch's columns' kinds (or "keyed") -> a configuration's key -> its text (_stretched, _keyed)
        self.stretches: dict = {}
        # joined: the jobs' columns read with the runs (_jobs_run_once), from the run query's join of its job
        run_expr = {**RUN_EXPR, **{c: JOB_EXPR.get(c) or "j." + q(c) for c in joined}}
        fields, numbers, own, order = self._runs(segments, q, numeric, dialect, run_expr)
        at = {"j": 0, "m": self.jobs, "n": self.jobs + self.machines, "q": self.jobs + self.machines + len(numbers)}
        self.fill = tuple_getter([at[kind] + k for kind, k in order])
        self.marks = len(order)
        start = 2 + len(fields)
        self.fields = slice(2, start)
        self.numbers = []
        for group in numbers:
            self.numbers.append(slice(start, start + len(group)))
            start += len(group)
        self.own = len(own)
        self.quote = dialect != "sqlite"  # own values quoted here (_quoted_bytes)
        mark = ", " + MARK_SQL[dialect]
        job_columns = [c for cols in job_segments for c in [*cols, None]]  # (None: a segment's marker)
        job_exprs = [MARK_SQL[dialect] if c is None else JOB_EXPR.get(c) or "j." + q(c) for c in job_columns]
        self.job_query = f"SELECT j.job_id, {', '.join(job_exprs)} {FROM_JOBS} WHERE j.job_id {{where}}"
        # keyed (PostgreSQL with view_sql.floats_exact): a job's stretch read as its row's text (_keyed), its
        # values once per configuration
        self.keyed_query = self.stretch_query = None
        if self.stretch is not None and keyed:
            at = slice(self.stretch.start - 1, self.stretch.stop - 1)  # (the row's key is not an expression)
            values = [JOB_VALUE.get(c) or "j." + q(c) for c in job_columns[at]]
            key = row_text(values)
            self.keyed_query = (f"SELECT j.job_id, {', '.join([*job_exprs[:at.start], key, *job_exprs[at.stop:]])} "
                                f"{FROM_JOBS} WHERE j.job_id {{where}}")
            self.stretch_query = f"SELECT {key}, {', '.join(values)} {FROM_JOBS} WHERE j.job_id IN ({{ids}})"
        machine_fields = ", ".join(_fields({}, "m.", q, cols) + mark for cols in machine_segments)
        self.machine_query = f"SELECT m.machine_id, {machine_fields} FROM machines m"
        self.run_query = (f"SELECT r.job_id, r.machine_id, {', '.join(fields + sum(numbers, []) + own)} "
                          f"{run_joins(dialect).format(mine=MINE if mine else '')} ORDER BY r.run_id")

    @staticmethod
    def _runs(segments, q, numeric: set[str], dialect: str, run_expr: dict[str, str]
              ) -> tuple[list[str], list[list[str]], list[str], list[tuple[str, int]]]:
        """The run query's parts: its fields, its numbers' groups of columns, its own quoted texts, and
        its markers in order ((kind, number): 'j' a job's segment, 'm' a machine's, 'n' numbers, 'q' own).
        run_expr: a run's field's expression where it is not r.<column>."""
        fields: list[str] = []
        numbers: list[list[str]] = []
        own: list[str] = []
        order: list[tuple[str, int]] = []
        marker = MARK_SQL[dialect]
        counts = {"j": 0, "m": 0}
        for source, cols in segments:
            if source != "r":
                fields.append(marker)
                order.append((source, counts[source]))
                counts[source] += 1
                continue
            group: list[str] = []
            for c in [*cols, None]:  # (None: the segment's end)
                if c is not None and c in numeric and c not in run_expr and c not in QUOTED_IN_SQL:
                    group.append("r." + q(c))
                    continue
                if len(group) >= NUMBERS_MIN:
                    fields.append(marker)
                    order.append(("n", len(numbers)))
                    numbers.append(group)
                else:
                    fields.extend(group)
                group = []
                if c is None:
                    continue
                if c in QUOTED_IN_SQL and c not in run_expr:
                    fields.append(marker)
                    order.append(("q", len(own)))
                    own.append(QUOTED_BY[dialect].format(c="r." + q(c)))
                else:
                    fields.append(run_expr.get(c) or "r." + q(c))
        return fields, numbers, own, order


def _jobs_run_once(raw) -> bool:
    """Whether most jobs have one run (at most JOINED_RUNS runs a job on average: a grid of one run each, a
    sweep on one machine): then each job's columns are read with its run, in the run query's join, rather
    than its text made apart and put in the run's line (at 100k jobs of one run each that apart took ~1.5
    of the child's 4.6 CPU-seconds more)."""
    (runs, jobs), = raw.all("SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM jobs)")
    return runs <= JOINED_RUNS * jobs


def _filled(written, marks: int, texts, mark=MARK):
    """`written` (csv.writer's lines: text, or its bytes with `mark` as bytes) with its `marks` markers filled
    in order from `texts` (an iterable of tuples of texts, or of bytes); NotHere where a value holds the
    marker (more markers than that)."""
    pieces = written.split(mark)
    if len(pieces) != marks + 1:
        raise NotHere
    if not marks:
        return pieces[0]
    texts = list(chain.from_iterable(texts))
    texts.append(written[:0])
    return written[:0].join(chain.from_iterable(zip(pieces, texts)))


def _segments(columns: list[str], known: dict[str, str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for c in columns:
        if out and out[-1][0] == known[c]:
            out[-1][1].append(c)
        else:
            out.append((known[c], [c]))
    return out


def _lines(raw, chunk, jobs: tuple[dict, _Spill], machines: dict, plan: _Plan, encoding: str) -> bytes:
    """A chunk of runs (plan.run_query's rows) as the file's lines, encoded (`encoding`: the file's); jobs: the
    job texts kept in memory, and those kept on disk. PostgreSQL's own texts, bytes already, are put in after
    the rest is encoded (a placeholder, OWN, in their places until then)."""
    job_ids = list(map(_KEY, chunk))
    job_texts = map(_job_texts(raw, job_ids, jobs, plan).__getitem__, job_ids) if plan.jobs else repeat((), len(chunk))
    machine_texts = map(machines.__getitem__, map(_MACHINE, chunk)) if machines else repeat((), len(chunk))
    outside = map(add, job_texts, machine_texts)
    if plan.numbers:
        outside = map(add, outside, zip(*(_numbers(list(map(itemgetter(at), chunk))) for at in plan.numbers)))
    own = None
    if plan.own:
        quoted = list(map(itemgetter(slice(-plan.own, None)), chunk))
        if plan.quote:
            own = list(map(_quoted_bytes, chain.from_iterable(quoted)))
            quoted = repeat((OWN,) * plan.own, len(chunk))
        elif NOT_TEXT in chain.from_iterable(quoted):  # a value neither text nor NULL (or the sentinel itself)
            raise NotHere
        outside = map(add, outside, quoted)
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(map(itemgetter(plan.fields), chunk))
    written = _filled(buf.getvalue(), plan.marks * len(chunk), map(plan.fill, outside)).encode(encoding)
    return written if own is None else _filled(written, len(own), [own], _OWN)


def _job_texts(raw, job_ids: list[int], jobs: tuple[dict, _Spill], plan: _Plan) -> dict:
    """The texts of the jobs of `job_ids` (and maybe others): kept in memory, read back from disk, or made
    (then kept in both)."""
    jobs, spill = jobs
    missing = set(job_ids).difference(jobs)
    if missing:
        if len(jobs) + len(missing) > JOBS_KEPT:
            jobs.clear()
            missing = set(job_ids)
        jobs.update(spill.read(missing))
        missing.difference_update(jobs)
    if missing:
        low, high = min(missing), max(missing)
        if high - low < 2 * len(missing):  # most of a range (a machine's runs in job order): read it all
            where = f"BETWEEN {low} AND {high}"  # integers: safe in the query's text
        else:
            where = f"IN ({','.join(map(str, sorted(missing)))})"
        written = None
        if plan.keyed_query is not None:
            rows = raw.all(plan.keyed_query.format(where=where))
            written = _keyed(raw, rows, plan)
        if written is None:  # (no stretch, SQLite's, or past STRETCHES_KEPT configurations: then written whole)
            rows = raw.all(plan.job_query.format(where=where))
            written = _stretched(rows, plan) if plan.stretch else None
        made = _texts(rows, plan.jobs, written)
        jobs.update(made)
        spill.write(made)
    return jobs


def _quoted_bytes(value) -> bytes:
    """A text read as its UTF-8 bytes, or NULL, as csv.writer writes it (NULL empty; quoted where it holds a
    comma, a quote or a line break, its quotes doubled), in UTF-8; NotHere for any other value."""
    if type(value) is bytes:
        if b'"' in value or b"," in value or b"\r" in value or b"\n" in value:
            return b'"' + value.replace(b'"', b'""') + b'"'
        return value
    if value is None:
        return b""
    raise NotHere


_OWN = OWN.encode()


def _numbers(rows: list[tuple]) -> list[str]:
    """Each row's values (numbers of a run's numeric columns, or NULL) as csv.writer writes them, the
    line's end left out. msgspec's JSON of them gives each number as repr does, except a float it writes
    with an exponent or below 1e-4 in magnitude ('0.00001' where repr gives '1e-05') and one infinite or
    NaN (null, as NULL is): such rows, and any value not a number (text, a blob: a JSON string), are
    written by csv.writer (_written)."""
    s = _JSON(rows)
    if (b'"' in s or b"e" in s or (b"0.0000" in s and any(small in s for small in _SMALL))
            or s.count(b"null") != sum(map(tuple.count, rows, repeat(None)))):
        return _written(rows)
    return s[2:-2].decode().replace("null", "").split("],[")


def _written(rows: list[tuple]) -> list[str]:
    """Each row's values as csv.writer writes them, the line's end left out; NotHere where a value holds
    the marker."""
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(map(add, rows, repeat((MARK,))))
    pieces = buf.getvalue().split(MARK)  # row i's: "\r\n" (the line before's end), its fields, ","
    if len(pieces) != len(rows) + 1:
        raise NotHere
    pieces[0] = "\r\n" + pieces[0]
    return list(map(_FIRST, pieces[:-1]))


class _Driver:
    """The database's own (DBAPI) connection under `conn`, read without SQLAlchemy's row objects: SQLite's, or
    psycopg's with its values in PostgreSQL's binary format (the same values, none printed by the server and
    parsed again here), the runs on a server-side cursor (a million runs are never all held)."""

    def __init__(self, conn):
        self.conn = conn
        self.raw = conn.connection.dbapi_connection
        self.sqlite = conn.dialect.name == "sqlite"

    def all(self, query: str) -> list[tuple]:
        if self.sqlite:
            return self.raw.execute(query).fetchall()
        with self.raw.cursor(binary=True) as cursor:
            return cursor.execute(driver_sql(self.conn, query)).fetchall()

    def streamed(self, query: str, params: dict):
        """A cursor of the query's rows, read with fetchmany (close it)."""
        if self.sqlite:
            return self.raw.execute(query, params)
        return binary_cursor(self.conn, query, params)

    def numeric(self, table: str) -> set[str]:
        """`table`'s columns of a numeric type whose values come back as int or float: SQLite's column
        affinity (not text, not a blob); PostgreSQL's integers and floating-point types (not NUMERIC:
        Decimal; not boolean)."""
        if not self.sqlite:
            return {name for name, kind in self.all(
                f"SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{table}' "
                f"AND table_schema = current_schema()") if kind in _PG_NUMBERS}
        out = set()
        for _, name, declared, *_ in self.raw.execute(f"PRAGMA table_info({table})"):
            declared = (declared or "").upper()
            if declared and not any(word in declared for word in ("CHAR", "CLOB", "TEXT", "BLOB")):
                out.add(name)
        return out


_PG_NUMBERS = frozenset({"smallint", "integer", "bigint", "real", "double precision"})


class _Spill:
    """Each job's text once made, in an unnamed temporary file beside results.csv, read back where a later run
    of the job wants it after the memory let it go (a machine's runs of jobs another machine ran long
    before): reading it back is ~1 us, making it again ~20 us. Where job ids go beyond SPILL_IDS nothing is
    kept (each text is made again)."""

    def __init__(self, folder: Path, last_job: int | None):
        self.keep = last_job is not None and 0 <= last_job < SPILL_IDS
        self.file = tempfile.TemporaryFile(dir=folder) if self.keep else None
        size = last_job + 1 if self.keep else 0
        self.start, self.length = array("q", bytes(8 * size)), array("q", bytes(8 * size))  # length + 1: 0 none
        self.end = 0

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()

    def write(self, texts: dict) -> None:
        if not self.keep or not texts:
            return
        ids = [i for i in texts if 0 <= i < len(self.start)]
        data = [MARK.join(texts[i]).encode() for i in ids]
        start, length, at = self.start, self.length, self.end
        for i, b in zip(ids, data):
            start[i], length[i] = at, len(b) + 1
            at += len(b)
        os.pwrite(self.file.fileno(), b"".join(data), self.end)
        self.end = at

    def read(self, ids) -> dict:
        if not self.keep:
            return {}
        fd, start, length, size = self.file.fileno(), self.start, self.length, len(self.start)
        return {i: tuple(os.pread(fd, length[i] - 1, start[i]).decode().split(MARK)) for i in ids
                if 0 <= i < size and length[i]}


def _fields(expr: dict, prefix: str, q, cols: list[str]) -> str:
    return ", ".join(expr.get(c) or prefix + q(c) for c in cols)


_KEY, _REST, _MACHINE = itemgetter(0), itemgetter(slice(1, None)), itemgetter(1)
_FIRST, _INNER = itemgetter(slice(2, -1)), itemgetter(slice(1, -1))
_JSON = msgspec.json.Encoder().encode
_SMALL = (b",0.0000", b",-0.0000", b"[0.0000", b"[-0.0000")  # a float below 1e-4 as msgspec writes it (repr: 1e-05)


def _texts(rows: list[tuple], n: int, written: str | None = None) -> dict:
    """key (each row's first value) -> the text csv.writer writes for each of the row's n segments (each
    segment's fields followed by a marker). `written`: csv.writer's text of the rows but their keys, where
    made already (_stretched)."""
    if not rows:
        return {}
    if written is None:
        buf = io.StringIO(newline="")
        csv.writer(buf).writerows(map(_REST, rows))
        written = buf.getvalue()
    # row i's text: "a,M,b,M\r\n": its pieces "a," and ",b," (the first after the last row's "\r\n")
    pieces = written.split(MARK)
    if len(pieces) != n * len(rows) + 1:  # a value holds the marker
        raise NotHere
    del pieces[-1]
    pieces[0] = "\r\n" + pieces[0]
    return dict(zip(map(_KEY, rows), zip(*(map(_INNER if k else _FIRST, pieces[k::n]) for k in range(n)))))


def _stretch(job_segments: list[list[str]]) -> slice | None:
    """Where in a job's row (plan.job_query's: its key, then each segment's columns and a marker) the
    longest stretch of its configuration's columns is (none of PER_RUN_JOB: the same for every repeat of
    a configuration); None where no stretch is long enough to be worth writing once."""
    stretches, at = [], 1
    for cols in job_segments:
        start = None
        for k, c in enumerate([*cols, PER_RUN_JOB[0]]):  # (the segment's end closes a stretch)
            if c not in PER_RUN_JOB:
                start = at + k if start is None else start
            elif start is not None:
                stretches.append((start, at + k))
                start = None
        at += len(cols) + 1
    start, end = max(stretches, key=lambda s: s[1] - s[0], default=(0, 0))
    return slice(start, end) if end - start >= STRETCH_MIN else None


def _stretched(rows: list[tuple], plan: _Plan) -> str | None:
    """csv.writer's text of the job rows but their keys, each configuration's stretch (plan.stretch) written
    once and kept (plan.stretches: a configuration's repeats are jobs of their own); two stretches share a
    text only where their values print alike (print_keys). None where there are more configurations than
    STRETCHES_KEPT (then plan.stretch is dropped: the jobs are written whole)."""
    stretches = list(map(itemgetter(plan.stretch), rows))
    key_columns, kinds = print_keys(list(zip(*stretches)))
    keys = list(zip(*key_columns)) if "repr" in kinds else stretches
    kept = plan.stretches.setdefault(kinds, {})
    texts = list(map(kept.get, keys))
    if None in texts:
        new = {k: s for k, s, t in zip(keys, stretches, texts) if t is None}  # key -> its stretch
        if sum(map(len, plan.stretches.values())) + len(new) > STRETCHES_KEPT:
            plan.stretch, plan.stretches = None, {}
            return None
        kept.update(zip(new, _written(list(new.values()))))
        texts = list(map(kept.__getitem__, keys))
    at = plan.stretch
    return _placed(rows, slice(1, at.start), slice(at.stop, None), texts)


def _keyed(raw, rows: list[tuple], plan: _Plan) -> str | None:
    """_stretched's text of plan.keyed_query's job rows, whose stretch is one value: its columns' row as
    PostgreSQL prints it (view_sql.row_text), the same text exactly where the values are the same. The
    stretch of each key not yet kept is read once (plan.stretch_query) and kept. None where that would keep
    more than STRETCHES_KEPT (then plan.stretch and plan.keyed_query are dropped: the jobs are read and
    written whole)."""
    at = plan.stretch.start
    keys = list(map(itemgetter(at), rows))
    kept = plan.stretches.setdefault("keyed", {})
    texts = list(map(kept.get, keys))
    if None in texts:
        new = {k: job for k, job, t in zip(keys, map(_KEY, rows), texts) if t is None}  # key -> one of its jobs
        if sum(map(len, plan.stretches.values())) + len(new) > STRETCHES_KEPT:
            plan.stretch, plan.stretches, plan.keyed_query = None, {}, None
            return None
        read = raw.all(plan.stretch_query.format(ids=",".join(map(str, new.values()))))
        kept.update(zip(map(_KEY, read), _written(list(map(_REST, read)))))
        if not kept.keys() >= new.keys():  # (one snapshot: never)
            raise NotHere
        texts = list(map(kept.__getitem__, keys))
    return _placed(rows, slice(1, at), slice(at + 1, None), texts)


def _placed(rows: list[tuple], before: slice, after: slice, texts: list[str]) -> str:
    """csv.writer's text of each row's `before` and `after` values with its stretch's text (`texts`) between."""
    before, after = itemgetter(before), itemgetter(after)
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(map(add, map(add, map(before, rows), repeat((PLACE,))), map(after, rows)))
    pieces = buf.getvalue().split(PLACE)
    if len(pieces) != len(rows) + 1:  # a value holds PLACE
        raise NotHere
    texts.append("")
    return "".join(chain.from_iterable(zip(pieces, texts)))

