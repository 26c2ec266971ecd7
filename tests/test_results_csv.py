"""results.csv written from the tables (orchestrator/report/results_csv.py: a run's own fields, its job's and its
machine's text written once and put in their places) is byte for byte what csv.writer writes for v_results'
rows, on values that make csv.writer quote, double quotes, print floats by repr, and on a value that holds
the marker (then it says so and the view is written as it is)."""

from __future__ import annotations

import csv
import io
import random
import struct
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.report import results_csv
from orchestrator.report.rows import _write_csv
from orchestrator.report.view_sql import SELECT_RESULTS
from tests.scaledb import build, configurations_a_float_apart

# text that csv.writer quotes or passes through as it is
TEXTS = ["a,b", 'say "hi"', "line1\nline2", "cr\ronly", "crlf\r\nend", "", " lead and trail ", "100% %s %(x)s %%",
         "ünïcødé €", '"', ",", "\t"]
FLOATS = [1e-05, 1e16, 1e22, 123456789012345.6, -0.0, 0.0, float("inf"), float("-inf"), 5e-324, 0.1 + 0.2,
          1795673557.1659863, -1.5e-300, 1e15, 9999999999999998.0, 1e-4, 9.99e-05, -1e-07, 10.00001, 12345.678]
INTS = [2**63 - 1, -(2**63), 0, -1]


def _view_csv(store, machine_id) -> bytes:
    where = "WHERE machine_id = :machine_id" if machine_id is not None else ""
    with store.transaction() as conn:
        result = conn.execute(text(SELECT_RESULTS.format(where=where)), {"machine_id": machine_id})
        out = io.StringIO(newline="")
        writer = csv.writer(out)
        writer.writerow(list(result.keys()))
        writer.writerows(tuple(r) for r in result)
    return out.getvalue().encode()


def _awkward(store) -> None:
    """Awkward values in the runs', jobs', machines', sweeps' and pools' columns of the view."""
    with store.transaction() as conn:
        if store.dialect == "postgresql":  # psycopg's placeholders, and no value of another type than its column's
            conn = _PsycopgMarks(conn)
        run_ids = [r[0] for r in conn.exec_driver_sql("SELECT run_id FROM runs ORDER BY run_id")]
        job_ids = [r[0] for r in conn.exec_driver_sql("SELECT job_id FROM jobs ORDER BY job_id")]
        for i, s in enumerate(TEXTS):
            conn.exec_driver_sql("UPDATE runs SET reason = ?, worker_host = ?, applied = ? WHERE run_id = ?",
                                 (s, s, s, run_ids[i * 7]))  # (applied: quoted by SQLite, QUOTED_IN_SQL)
            conn.exec_driver_sql("UPDATE jobs SET dataset = ?, derived = ? WHERE job_id = ?", (s, s, job_ids[i * 5]))
        for i, x in enumerate(FLOATS):  # (step_ms_median: among a run's numbers, written by msgspec)
            conn.exec_driver_sql("UPDATE runs SET step_ms_median = ?, load_before = ? WHERE run_id = ?",
                                 (x, x, run_ids[i * 11 + 1]))
            conn.exec_driver_sql("UPDATE jobs SET dropout = ? WHERE job_id = ?", (x, job_ids[i * 3 + 1]))
        for i, n in enumerate(INTS):
            conn.exec_driver_sql("UPDATE runs SET params = ? WHERE run_id = ?", (n, run_ids[i * 13 + 2]))
            conn.exec_driver_sql("UPDATE jobs SET seed = ? WHERE job_id = ?", (n, job_ids[i * 13 + 2]))
        if store.dialect == "sqlite":  # SQLite keeps what it cannot convert: text in a REAL column, a float in INTEGER
            conn.exec_driver_sql("UPDATE runs SET step_ms_p10 = 'n/a, \"none\"' WHERE run_id = ?", (run_ids[3],))
            conn.exec_driver_sql("UPDATE jobs SET seq_len = 2.5 WHERE job_id = ?", (job_ids[4],))
        conn.exec_driver_sql("UPDATE runs SET applied = ? WHERE run_id = ?",
                             ('{"a": [1, 2], "b": "x\\"y", "c": "\u00e9\u0002"}', run_ids[6]))
        conn.exec_driver_sql("UPDATE runs SET status = 'queued' WHERE run_id IN (?, ?)", (run_ids[5], run_ids[-1]))
        conn.exec_driver_sql("UPDATE machines SET hostname = 'h,\"1\"', cpu_model = '', kernel = '%s %' "
                             "WHERE machine_id = 1")
        conn.exec_driver_sql("UPDATE machines SET mem_total_gb = 1e-05, sockets = NULL WHERE machine_id = 2")
        conn.exec_driver_sql("UPDATE sweeps SET name = 'sweep, \"one\"\n'")
        conn.exec_driver_sql("UPDATE pools SET name = 'p\r\nq', machine_id = NULL "
                             "WHERE pool_id = (SELECT MIN(pool_id) FROM pools)")


class _PsycopgMarks:
    """A connection whose exec_driver_sql takes SQLite's ? placeholders (and a literal %) as psycopg does."""

    def __init__(self, conn):
        self.conn = conn

    def exec_driver_sql(self, sql: str, params=()):
        return self.conn.exec_driver_sql(sql.replace("%", "%%").replace("?", "%s"), params)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_results_csv_is_the_views_csv_writer_bytes_on_awkward_values(tmp_path, monkeypatch, request, backend):
    url = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_db")
    store = build(url, 600, machines=2, shape="small", quiet=True)
    _awkward(store)
    configurations_a_float_apart(store)
    # small chunks and few jobs kept: jobs are let go and read back from disk (_Spill), and chunks end mid-job
    monkeypatch.setattr(results_csv, "CHUNK", 37)
    monkeypatch.setattr(results_csv, "JOBS_KEPT", 50)
    # the configurations' stretches written once each (PostgreSQL's keyed by their row's text: _keyed), and
    # given up on past a few (jobs then written whole)
    made, ways = [], set()

    def recorded(name):
        way = getattr(results_csv, name)
        return lambda *args: ways.add(name) or made.append(way(*args)) or made[-1]
    for name in ("_stretched", "_keyed"):
        monkeypatch.setattr(results_csv, name, recorded(name))
    for machine_id, kept in ((None, 20_000), (2, 20_000), (None, 60)):
        monkeypatch.setattr(results_csv, "STRETCHES_KEPT", kept)
        made.clear()
        expected = _view_csv(store, machine_id)
        assert expected.count(b"\n") > 300
        for seen in (b'"a,b"', b'"say ""hi"""', b',1e-05,', b',-inf,', b',9223372036854775807,', b',5e-324,',
                     b'"sweep, ""one""\n"', b"100% %s %(x)s %%", b"\xc3\xbcn", b'"p\r\nq"',
                     *((b',2.5,', b'"n/a, ""none"""') if backend == "sqlite" else ())):
            assert machine_id or seen in expected, seen  # the awkward values are in the view
        with store.transaction() as conn:
            assert results_csv.write(conn, machine_id, tmp_path / "new.csv"), "written from the tables"
        assert (tmp_path / "new.csv").read_bytes() == expected
        assert made and (None in made) == (kept == 60) and any(made), made[-3:]
        assert ways == {"_keyed" if backend == "postgresql" else "_stretched"}
        ways.clear()


def test_where_each_job_ran_once_its_columns_are_read_with_its_run_and_give_the_views_bytes(tmp_path, monkeypatch):
    """On SQLite, a database whose jobs ran once each (one machine) has its jobs' columns read with the runs
    (no job's text made apart), and results.csv is the view's bytes, awkward values and one machine's file too;
    where the jobs ran on two machines their texts are made apart."""
    once = build(str(tmp_path / "once.db"), 300, machines=1, shape="small", quiet=True)
    twice = build(str(tmp_path / "twice.db"), 300, machines=2, shape="small", quiet=True)
    for store, joined in ((once, True), (twice, False)):
        with store.transaction() as conn:
            assert results_csv._jobs_run_once(results_csv._Driver(conn)) is joined
    _awkward(once)
    made_apart = []
    job_texts = results_csv._job_texts
    monkeypatch.setattr(results_csv, "_job_texts", lambda *args: made_apart.append(1) or job_texts(*args))
    monkeypatch.setattr(results_csv, "CHUNK", 37)
    for machine_id in (None, 1):
        expected = _view_csv(once, machine_id)
        assert b'"sweep, ""one""\n"' in expected and b",2.5," in expected and expected.count(b"\n") > 250
        with once.transaction() as conn:
            assert results_csv.write(conn, machine_id, tmp_path / "new.csv"), "written from the tables"
        assert (tmp_path / "new.csv").read_bytes() == expected
    assert not made_apart
    with twice.transaction() as conn:
        assert results_csv.write(conn, None, tmp_path / "new.csv")
    assert (tmp_path / "new.csv").read_bytes() == _view_csv(twice, None) and made_apart


def test_a_jobs_configuration_stretch_is_its_columns_but_the_jobs_own(monkeypatch):
    """_stretch: the longest stretch of a job's columns that its configuration's repeats share (no
    PER_RUN_JOB column), as positions in the job query's row (its key, each segment's columns, a marker)."""
    conf = [f"v{i}" for i in range(12)]
    assert results_csv._stretch([["sweep"], ["job_id", "config_hash", *conf, "repeat", "block"]]) == slice(5, 17)
    assert results_csv._stretch([["job_id", *conf[:3], "repeat", *conf]]) == slice(6, 18)
    assert results_csv._stretch([["job_id", *conf[:7], "repeat"]]) is None  # too short to be worth it
    assert results_csv._stretch([]) is None


def test_a_jobs_own_value_holding_the_stretchs_marker_is_written_from_the_view(tmp_path):
    """A job's own text holding PLACE (what stands for its configuration's stretch) makes write() say so, and
    the view is written as it is (two machines: the jobs' texts are made apart, _jobs_run_once)."""
    store = build(str(tmp_path / "r.db"), 100, machines=2, shape="small", quiet=True)
    with store.transaction() as conn:
        conn.exec_driver_sql("UPDATE jobs SET config_hash = ? WHERE job_id = 3", (f"x{results_csv.PLACE}y",))
    with store.transaction() as conn:
        assert not results_csv.write(conn, None, tmp_path / "new.csv")
        _write_csv(conn, SELECT_RESULTS.format(where=""), {"machine_id": None}, tmp_path / "new.csv", True)
    assert (tmp_path / "new.csv").read_bytes() == _view_csv(store, None)


def test_an_applied_neither_text_nor_null_is_written_from_the_view(tmp_path):
    """SQLite quotes a run's applied only where it is text (its TEXT column keeps numbers as text): a blob
    there (or the text standing for one) makes write() say so, and the view is written as it is."""
    for value in (b"\x01,\x02", results_csv.NOT_TEXT):
        store = build(str(tmp_path / f"r{value!r}.db"), 100, machines=1, shape="small", quiet=True)
        with store.transaction() as conn:
            conn.exec_driver_sql("UPDATE runs SET applied = ? WHERE run_id = 5", (value,))
        with store.transaction() as conn:
            assert not results_csv.write(conn, None, tmp_path / "new.csv")
            _write_csv(conn, SELECT_RESULTS.format(where=""), {"machine_id": None}, tmp_path / "new.csv", True)
        assert (tmp_path / "new.csv").read_bytes() == _view_csv(store, None)


def _csv_writers(rows) -> list[str]:
    out = []
    for row in rows:
        buf = io.StringIO(newline="")
        csv.writer(buf).writerow(row)
        out.append(buf.getvalue().removesuffix("\r\n"))
    return out


def test_a_runs_numbers_are_csv_writers_text_whether_msgspec_or_csv_writer_writes_them(monkeypatch):
    """_numbers gives each row's numbers as csv.writer does: msgspec's JSON where it prints them as repr
    does (a plain chunk never reaches csv.writer), csv.writer where it would not (any float of any
    magnitude, each alone in a chunk; an infinite one; text)."""
    rng = random.Random(46)
    plain = [(rng.uniform(0, 1e6), rng.randrange(10**12), None, -rng.random(), 0.0, -0.0, 1e-4, 10.00001)
             for _ in range(300)]
    written = results_csv._written
    monkeypatch.setattr(results_csv, "_written", lambda rows: pytest.fail("a plain chunk went to csv.writer"))
    assert results_csv._numbers(plain) == _csv_writers(plain)
    monkeypatch.setattr(results_csv, "_written", written)
    odd = [(x, None) for x in FLOATS + INTS] + [(1.5, "n/a, \"none\""), (None, b"\x01"), (float("nan"), 2)]
    odd += [(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0],) for _ in range(20_000)]
    odd += [(rng.choice((1, -1)) * 10 ** rng.uniform(-9, 20),) for _ in range(20_000)]
    for row in odd:
        assert results_csv._numbers([row]) == _csv_writers([row]), row
    assert results_csv._numbers(odd[:500]) == _csv_writers(odd[:500])


def test_quoted_bytes_are_csv_writers_text_of_a_text_or_null_in_utf8_and_refuse_any_other_value():
    for value in [*TEXTS, None, '{"a": [1, 2], "b": "x\\"y"}', "no quotes here", f"a{results_csv.MARK}b"]:
        raw = value.encode() if value is not None else None
        assert results_csv._quoted_bytes(raw) == _csv_writers([(value, "")])[0][:-1].encode(), value
    for value in (1, 2.5, "a,b", True, bytearray(b"a")):
        with pytest.raises(results_csv.NotHere):
            results_csv._quoted_bytes(value)


def test_a_value_holding_the_marker_is_written_from_the_view(tmp_path):
    store = build(str(tmp_path / "r.db"), 200, machines=2, shape="small", quiet=True)
    with store.transaction() as conn:
        conn.exec_driver_sql(f"UPDATE runs SET reason = 'a{results_csv.MARK}b' WHERE run_id = 9")
    with store.transaction() as conn:
        assert not results_csv.write(conn, None, tmp_path / "new.csv")  # says so
        _write_csv(conn, SELECT_RESULTS.format(where=""), {"machine_id": None}, tmp_path / "new.csv", True)
    assert (tmp_path / "new.csv").read_bytes() == _view_csv(store, None)


@pytest.mark.postgres
def test_on_postgresql_applied_is_quoted_as_csv_writer_does_and_a_marker_elsewhere_writes_the_view(tmp_path, pg_db):
    """On PostgreSQL each run's applied is read as its UTF-8 bytes and quoted here (_quoted_bytes), a marker
    or OWN inside it too: the bytes csv.writer writes, for every machine and one. A marker or OWN in another
    value, or a file that does not encode in UTF-8, makes write() say so, and the view is written as it is."""
    from orchestrator.report.rows import _results_query

    store = build(pg_db, 300, machines=2, shape="small", quiet=True)
    values = [*TEXTS, '{"a": [1, 2], "b": "x\\"y", "c": "\\u00e9"}', "ünïcødé, \"q\"\r\n", f"a{results_csv.MARK}b",
              f"a{results_csv.OWN}b"]
    with store.transaction() as conn:
        run_ids = [r[0] for r in conn.execute(text("SELECT run_id FROM runs ORDER BY run_id"))]
        for i, value in enumerate(values):
            conn.execute(text("UPDATE runs SET applied = :v WHERE run_id = :r"), {"v": value, "r": run_ids[i * 9 + 1]})
    latin1 = _Latin1(tmp_path / "latin1.csv")
    with store.transaction() as conn:
        assert not results_csv.write(conn, None, latin1)  # (the view's text is written in the file's encoding)
    for machine_id, marker in ((None, None), (2, None), (None, results_csv.OWN), (None, results_csv.MARK)):
        if marker:
            with store.transaction() as conn:
                conn.execute(text("UPDATE runs SET reason = :v WHERE run_id = :r"),
                             {"v": f"a{marker}b", "r": run_ids[2]})
        expected = _view_csv(store, machine_id)
        assert machine_id or b'"say ""hi"""' in expected
        with store.transaction() as conn:
            assert results_csv.write(conn, machine_id, tmp_path / "new.csv") is (marker is None)
            _write_csv(conn, _results_query(machine_id), {"machine_id": machine_id}, tmp_path / "new.csv", True)
        assert (tmp_path / "new.csv").read_bytes() == expected, (machine_id, marker)


class _Latin1(type(Path())):
    """A path whose text files are opened in Latin-1, whatever the locale."""

    def open(self, mode="r", buffering=-1, encoding=None, errors=None, newline=None):
        return super().open(mode, buffering, "latin-1", errors, newline)


@pytest.mark.postgres
def test_on_postgresql_a_server_printing_floats_short_of_their_last_digit_has_its_jobs_read_whole(
        tmp_path, pg_db, monkeypatch):
    """A job's configuration stretch is keyed by its row's text only where the server prints each float to
    its last digit (view_sql.floats_exact): with extra_float_digits at 0, 0.1 + 0.2 prints as 0.3 does, and
    the jobs are read whole, to the same bytes."""
    store = build(pg_db, 100, machines=1, shape="small", quiet=True)
    keyed, way = [], results_csv._keyed
    monkeypatch.setattr(results_csv, "_keyed", lambda *args: keyed.append(1) or way(*args))
    with store.transaction() as conn:
        conn.exec_driver_sql("SET LOCAL extra_float_digits = 0")
        assert results_csv.write(conn, None, tmp_path / "new.csv")
    assert not keyed and (tmp_path / "new.csv").read_bytes() == _view_csv(store, None)
    with store.transaction() as conn:
        assert results_csv.write(conn, None, tmp_path / "new.csv")
    assert keyed and (tmp_path / "new.csv").read_bytes() == _view_csv(store, None)
