"""Schema versions and migrations, on the version-1 database the previous release wrote
(tests/v1/results-v1.db, made by tests/v1/make_v1_db.py) and on real PostgreSQL."""

from __future__ import annotations

import csv
import json
import multiprocessing
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from common import variables
from orchestrator.queue import migrations, store as store_module
from common.errors import BenchError
from orchestrator.queue.migrations import LATEST
from orchestrator.queue.store import Store
from orchestrator.queue.sweep import Machine, load
from tests.conftest import bench
from tests.reportdb import machine_facts
from tests.conftest import done_fields

V1 = Path(__file__).resolve().parent / "v1"
STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}
# The v1 database's tables in an order that satisfies their foreign keys.
V1_TABLES = ("machines", "sweeps", "jobs", "sweep_jobs", "runs", "effects")


@pytest.fixture
def old_db(tmp_path) -> str:
    path = tmp_path / "old.db"
    shutil.copyfile(V1 / "results-v1.db", path)
    return str(path)


def sqlite_rows(db: str, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def sqlite_schema(db: str) -> dict:
    """Everything SQLite says about the schema: tables (columns in order with type, NOT NULL,
    default, key; foreign keys; the CREATE text), indexes (columns, unique, partial), views' columns."""
    out = {}
    with sqlite3.connect(db) as conn:
        for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                                                   "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"):
            if kind == "table":
                out[f"table {name}"] = {
                    "columns": conn.execute(f"PRAGMA table_info({name})").fetchall(),
                    "foreign keys": sorted(r[2:5] for r in conn.execute(f"PRAGMA foreign_key_list({name})")),
                    "sql": " ".join(sql.replace(f'"{name}"', name).split()),
                    "indexes": sorted((r[1], r[2], r[3], r[4], conn.execute(f"PRAGMA index_info({r[1]})").fetchall())
                                      for r in conn.execute(f"PRAGMA index_list({name})")),
                }
            elif kind == "view":
                out[f"view {name}"] = [r[1:3] for r in conn.execute(f"PRAGMA table_info({name})")]
    return out


@pytest.mark.probe
@pytest.mark.slow
def test_a_version_1_database_opens_keeps_every_run_reports_and_takes_new_work(old_db, tmp_path):
    runs_before = sqlite_rows(old_db, "SELECT * FROM runs ORDER BY run_id")
    old_columns = [r[1] for r in sqlite_rows(old_db, "PRAGMA table_info(runs)")]
    jobs_before = sqlite_rows(old_db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id")
    proc = bench("status", "--all-machines", "--json", "--db", old_db, check=True)
    counts = json.loads(proc.stdout)
    assert counts["done"] == 11 and counts["failed"] == 8 and counts["skipped"] == 3
    assert sqlite_rows(old_db, "SELECT MAX(version) FROM schema_version") == [(LATEST,)]
    # Every run kept, column for column (the new columns: pool_id, each machine's own pool; the
    # metrics added since, NULL in old rows).
    runs_after = sqlite_rows(old_db, f"SELECT {', '.join(old_columns)} FROM runs ORDER BY run_id")
    assert runs_after == runs_before
    assert sqlite_rows(old_db, "SELECT DISTINCT trainable_params, steal_s FROM runs") == [(None, None)]
    assert sqlite_rows(old_db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id") == jobs_before
    assert sqlite_rows(old_db, "SELECT DISTINCT r.machine_id = p.machine_id "
                               "FROM runs r JOIN pools p USING (pool_id)") == [(1,)]

    bench("report", "--db", old_db, "--out", str(tmp_path / "result"), check=True)
    summary = (tmp_path / "result" / "summary.md").read_text()
    assert "d_model" in summary
    with (tmp_path / "result" / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 23  # every run but the one queued

    # New work: a new sweep enqueued and run by this machine, next to the old runs.
    bench("enqueue", "--db", old_db, "--axis", "d_model=72,80", "--set", "steps=1", "--set", "dataset=builtin",
          "--set", "cores=1", check=True)
    bench("work", "--db", old_db, "--max-jobs", "3", "--timeout", "5", env=STUB, check=True)
    new_runs = sqlite_rows(old_db, "SELECT status FROM runs WHERE run_id > 24")
    assert len(new_runs) == 3 and all(s in ("done", "failed") for (s,) in new_runs)


def test_a_run_taken_back_before_the_migration_keeps_its_attempt_count(old_db):
    store = Store(old_db)
    node_b = store.register_machine(machine_facts("node-b", "Other CPU"))
    assert node_b == 2  # the v1 database's second machine, found by its fingerprint
    claims = []
    while (claim := store.claim(node_b, pid=7, host="node-b", max_cores=8)) is not None:
        claims.append(claim)
        store.finish(claim.run_id, pid=7, status="done", fields=done_fields())
    again = [c for c in claims if c.config["seed"] == 3]
    assert len(again) == 1 and again[0].attempts == 2 and again[0].run_id == 24
    # Every job once for node-b: the old runs and the new ones together.
    assert sqlite_rows(old_db, "SELECT COUNT(*), COUNT(DISTINCT job_id) FROM runs WHERE machine_id = 2") == [(16, 16)]


def test_a_migrated_database_and_a_fresh_one_have_the_same_schema(old_db, tmp_path):
    fresh = str(tmp_path / "fresh.db")
    Store(fresh)
    Store(old_db)
    old, new = sqlite_schema(old_db), sqlite_schema(fresh)
    assert sorted(old) == sorted(new)
    for key in new:
        assert old[key] == new[key], key


def test_an_up_to_date_database_runs_no_ddl_on_open(db):
    Store(db)
    seen = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        Store(db)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert seen and not [s for s in seen if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE)", s, re.I)]


def _open(db: str, barrier, results) -> None:
    barrier.wait()
    results.put(Store(db).migrated)


def open_at_once(db: str, n: int = 4) -> list:
    ctx = multiprocessing.get_context("spawn")  # never fork a pytest process that may hold JAX threads
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(db, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    return sorted(str(results.get(timeout=5)) for _ in procs)


def test_processes_opening_an_old_database_at_once_migrate_it_once(old_db):
    outcomes = open_at_once(old_db)
    assert outcomes == ["None", "None", "None", "migrated from version 1"]
    assert sqlite_rows(old_db, "SELECT MAX(version) FROM schema_version") == [(LATEST,)]
    assert sqlite_rows(old_db, "SELECT COUNT(*) FROM runs") == [(24,)]


def test_a_database_from_a_newer_release_is_refused_and_left_alone(db):
    Store(db)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version (version, applied, note) VALUES (?, 0, 'future')", (LATEST + 1,))
    before = list(sqlite3.connect(db).iterdump())
    proc = bench("status", "--db", db)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"schema version {LATEST + 1}" in proc.stderr and "newer cpubench" in proc.stderr
    assert list(sqlite3.connect(db).iterdump()) == before


# -- what other workstreams add to schema.sql needs no hand-written migration --------------------

def _with_additions(tmp_path, monkeypatch, additions: dict[str, str]) -> None:
    """schema.sql with columns added after the named anchors, as another branch would add them."""
    text = migrations.SCHEMA_PATH.read_text()
    for anchor, addition in additions.items():
        assert anchor in text, anchor
        text = text.replace(anchor, anchor + addition, 1)
    path = tmp_path / "schema.sql"
    path.write_text(text)
    monkeypatch.setattr(migrations, "SCHEMA_PATH", path)


def _a_later_release(tmp_path, monkeypatch) -> None:
    """What other workstreams add in this release: metrics and machine columns (one NOT NULL with a
    DEFAULT), an effects column, a new table, and a catalogue variable (a NOT NULL jobs column)."""
    _with_additions(tmp_path, monkeypatch, {
        "    temp_c_max     REAL,\n": "    power_w_avg REAL,\n",
        "    kernel            TEXT,\n": "    noise_pct         REAL NOT NULL DEFAULT 0,\n",
        "    repeat        INTEGER NOT NULL\n": "    , later_knob  TEXT    NOT NULL\n",
        "    n_runs      INTEGER NOT NULL,           -- done runs the estimate rests on\n": "    p_holm      REAL,\n",
        "CREATE INDEX IF NOT EXISTS effects_by_machine ON effects (machine_id, variable);\n":
            "\nCREATE TABLE IF NOT EXISTS probes (probe_id INTEGER PRIMARY KEY AUTOINCREMENT, note TEXT);\n",
    })
    later_knob = variables.Variable("later_knob", str, "default", variables.FRAMEWORK, "a later switch",
                                    choices=("default", "on"))
    catalogue = (*variables.CATALOGUE, later_knob)
    monkeypatch.setattr(variables, "CATALOGUE", catalogue)
    monkeypatch.setattr(variables, "BY_NAME", {v.name: v for v in catalogue})
    monkeypatch.setattr(variables, "NAMES", tuple(v.name for v in catalogue))
    monkeypatch.setattr(store_module, "NAMES", variables.NAMES)


def _enqueue_the_old_sweep_again(store, *extra):
    """The old sweep, spelled with blas=mkl: torch's auto moved to mkl_intel_path in release 6, and the
    old jobs ran mkl (tests/test_gemm_route.py); left unset, the route is a new job of its own."""
    plan = load(None, sets=["steps=3", "n_layers=1", "seq_len=32", "batch_size=2", "vocab_size=256",
                            "warmup_steps=1", "dataset=builtin", "cores=1", "seed=7", *(extra or ["blas=mkl"])],
                axes=["d_model=32,64"], machine=Machine(cpu_count=2))
    return store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.jobs)


def test_columns_tables_and_a_catalogue_variable_added_later_migrate_without_a_hand_written_step(
        old_db, tmp_path, monkeypatch):
    _a_later_release(tmp_path, monkeypatch)
    fresh = str(tmp_path / "fresh.db")
    Store(fresh)
    store = Store(old_db)
    assert store.migrated == "migrated from version 1"
    old, new = sqlite_schema(old_db), sqlite_schema(fresh)
    assert sorted(old) == sorted(new)
    for key in new:
        assert old[key] == new[key], key
    assert sqlite_rows(old_db, "SELECT DISTINCT noise_pct FROM machines") == [(0,)]
    assert sqlite_rows(old_db, "SELECT DISTINCT later_knob FROM jobs") == [("default",)]
    for config, config_hash in sqlite_rows(old_db, "SELECT config, config_hash FROM jobs"):
        assert json.loads(config)["later_knob"] == "default"
        assert variables.config_hash(json.loads(config)) == config_hash
    # The old release's sweep, enqueued again with the new catalogue, finds its jobs.
    again = _enqueue_the_old_sweep_again(store)
    assert (again.new, again.present) == (0, 2)
    moved = _enqueue_the_old_sweep_again(store, "blas=auto")  # today's default route: jobs of their own
    assert (moved.new, moved.present) == (2, 0)


def test_a_new_not_null_column_without_a_default_is_named_and_nothing_changes(old_db, tmp_path, monkeypatch):
    _with_additions(tmp_path, monkeypatch, {"    kernel            TEXT,\n": "    rack TEXT NOT NULL,\n"})
    before = list(sqlite3.connect(old_db).iterdump())
    with pytest.raises(BenchError, match=r"machines\.rack is NOT NULL without a DEFAULT"):
        Store(old_db)
    assert list(sqlite3.connect(old_db).iterdump()) == before


# -- PostgreSQL -----------------------------------------------------------------------------------

def make_v1_postgres(url: str) -> None:
    """A version-1 PostgreSQL database: the old release's schema.sql as that release adapted it,
    holding the rows of the v1 SQLite file."""
    import psycopg

    sql = re.sub(r"--[^\n]*", "", (V1 / "schema-v1.sql").read_text())
    sql = sql.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql).replace("CREATE VIEW IF NOT EXISTS", "CREATE OR REPLACE VIEW")
    source = sqlite3.connect(V1 / "results-v1.db")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        for statement in (s.strip() for s in sql.split(";") if s.strip()):
            conn.execute(statement)
        for table in V1_TABLES:
            cursor = source.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cursor.description]
            booleans = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                                                   "table_name = %s AND data_type = 'boolean'", (table,))}
            rows = [tuple(bool(v) if n in booleans and v is not None else v for n, v in zip(names, row))
                    for row in cursor]
            quoted = ", ".join(f'"{n}"' for n in names)
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({', '.join(['%s'] * len(names))})", rows)
            key = names[0]
            if key.endswith("_id") and table != "sweep_jobs":
                conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{key}'), "
                             f"(SELECT MAX({key}) FROM {table}))")


def pg_schema(url: str) -> dict:
    """What PostgreSQL says about the schema, order-insensitive (a migrated table has its new
    columns at the end: PostgreSQL cannot reorder columns)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        columns = conn.execute("SELECT table_name, column_name, data_type, is_nullable, column_default FROM "
                               "information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2").fetchall()
        constraints = conn.execute("SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                                   "FROM pg_constraint WHERE connamespace = 'public'::regnamespace "
                                   "ORDER BY 1, 2").fetchall()
        indexes = conn.execute("SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                               "ORDER BY 1, 2").fetchall()
        storage = conn.execute("SELECT attrelid::regclass::text, attname, attstorage FROM pg_attribute "
                               "WHERE attnum > 0 AND NOT attisdropped AND attrelid IN (SELECT oid FROM pg_class "
                               "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace) ORDER BY 1, 2"
                               ).fetchall()
    return {"columns": columns, "constraints": constraints, "indexes": indexes, "storage": storage}


@pytest.mark.postgres
def test_a_version_1_postgresql_database_migrates_keeps_its_runs_and_matches_a_fresh_one(pg_db, postgres_url):
    make_v1_postgres(pg_db)
    store = Store(pg_db)
    assert store.migrated == "migrated from version 1"
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM runs").scalar_one() == 24
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM v_results").scalar_one() == 23
        assert conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar_one() == LATEST
    node_b = store.register_machine(machine_facts("node-b", "Other CPU"))
    claim = store.claim(node_b, pid=7, host="node-b", max_cores=8)
    assert claim.config["seed"] == 3 and claim.attempts == 2  # the run taken back in v1, claimed again
    from tests.pgserver import create_database

    fresh = create_database(postgres_url, pg_db.rsplit("/", 1)[1] + "f")
    Store(fresh)
    assert pg_schema(pg_db) == pg_schema(fresh)
    assert ("runs", "applied", "e") in pg_schema(fresh)["storage"]  # out of line, uncompressed (PG_STORAGE)


@pytest.mark.postgres
def test_a_version_9_postgresql_database_stores_applied_uncompressed_from_then_on(pg_db):
    import psycopg

    store = Store(pg_db)
    with store.transaction() as conn:  # as the release before left it: compressed, and at version 9
        conn.exec_driver_sql("ALTER TABLE runs ALTER COLUMN applied SET STORAGE EXTENDED")
        conn.exec_driver_sql(f"UPDATE schema_version SET version = 9 WHERE version = {LATEST}")
    plain = pg_db.replace("postgresql+psycopg://", "postgresql://")
    applied = '"' + "x" * 4000 + '"'
    run = _a_claimed_run(store, "before")
    with psycopg.connect(plain) as conn:
        conn.execute("UPDATE runs SET applied = %s WHERE run_id = %s", (applied, run))
    assert Store(pg_db).migrated == "migrated from version 9"
    after = _a_claimed_run(store, "after")
    with psycopg.connect(plain) as conn:
        conn.execute("UPDATE runs SET applied = %s WHERE run_id = %s", (applied, after))
        stored = dict(conn.execute("SELECT run_id, pg_column_size(applied) FROM runs").fetchall())
        assert conn.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = 'runs'::regclass "
                            "AND attname = 'applied'").fetchone() == ("e",)
    assert stored[run] < 200 and stored[after] >= len(applied)  # the old run's as written: compressed


def _a_claimed_run(store: Store, host: str) -> int:
    from tests.reportdb import configs, enqueue

    machine = store.register_machine(machine_facts(host))
    enqueue(store, configs({"seed": len(host)}, {}, repeats=1), sweep=host)
    return store.claim(machine, pid=1, host=host, max_cores=8).run_id


@pytest.mark.postgres
def test_postgresql_clients_opening_an_old_database_at_once_migrate_it_once(pg_db):
    make_v1_postgres(pg_db)
    assert open_at_once(pg_db) == ["None", "None", "None", "migrated from version 1"]
    store = Store(pg_db)
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").all() == [(LATEST,)]


@pytest.mark.postgres
def test_an_up_to_date_postgresql_database_runs_no_ddl_on_open(pg_db):
    Store(pg_db)
    seen = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        Store(pg_db)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert seen and not [s for s in seen if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE)", s, re.I)]


@pytest.mark.postgres
def test_on_postgresql_too_what_a_later_release_adds_migrates_to_the_fresh_schema(pg_db, postgres_url, tmp_path,
                                                                                  monkeypatch):
    from tests.pgserver import create_database

    make_v1_postgres(pg_db)
    _a_later_release(tmp_path, monkeypatch)
    store = Store(pg_db)
    assert store.migrated == "migrated from version 1"
    fresh = create_database(postgres_url, pg_db.rsplit("/", 1)[1] + "f")
    Store(fresh)
    assert pg_schema(pg_db) == pg_schema(fresh)
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT DISTINCT later_knob FROM jobs").all() == [("default",)]
        assert conn.exec_driver_sql("SELECT DISTINCT noise_pct FROM machines").all() == [(0,)]
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM runs").scalar_one() == 24
    again = _enqueue_the_old_sweep_again(store)
    assert (again.new, again.present) == (0, 2)


def test_a_version_3_database_gets_compiler_blas_and_gemm_format_keeping_its_jobs_and_runs(tmp_path):
    path = tmp_path / "v3.db"
    shutil.copyfile(Path(__file__).resolve().parent / "v3" / "results-v3.db", path)
    db = str(path)
    runs_before = sqlite_rows(db, "SELECT * FROM runs ORDER BY run_id")
    columns_before = [c[1] for c in sqlite_schema(db)["table runs"]["columns"]]
    jobs_before = sqlite_rows(db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id")
    assert sqlite_rows(db, "SELECT MAX(version) FROM schema_version") == [(3,)]
    Store(db)  # opening migrates
    assert sqlite_rows(db, "SELECT MAX(version) FROM schema_version") == [(LATEST,)]
    assert sqlite_rows(db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id") == jobs_before
    # each framework's jobs get the library it ran (variables.BLAS_OF) and inductor's own compiler
    assert sqlite_rows(db, "SELECT framework, blas, compiler FROM jobs ORDER BY job_id") == [
        ("torch", "mkl", "gcc"), ("numpy", "openblas", "gcc"), ("jax", "eigen", "gcc")]
    kept = sqlite_rows(db, f"SELECT {', '.join(columns_before)} FROM runs ORDER BY run_id")
    assert kept == runs_before
    assert sqlite_rows(db, "SELECT DISTINCT gemm_format FROM v_results") == [(None,)]  # not recorded then
    # version 6: every old job ran one process on one machine; the data-parallel metrics were not recorded
    assert sqlite_rows(db, "SELECT DISTINCT ranks, nodes FROM jobs") == [(1, 1)]
    assert sqlite_rows(db, "SELECT DISTINCT interconnect FROM jobs") == [("default",)]  # version 9: links as they were
    assert sqlite_rows(db, "SELECT DISTINCT world_size, allreduce_ms FROM v_results") == [(None, None)]
    fresh = tmp_path / "fresh.db"
    Store(str(fresh))
    assert sqlite_schema(db) == sqlite_schema(str(fresh))
