"""A database written by the release that introduced schema versions (version 2: tests/v2, made by
tests/v2/make_v2_db.py from commit 865e974) opens in this release on SQLite and on real PostgreSQL,
keeps every run and job identity, and ends column for column like a fresh database."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from common import variables
from orchestrator.queue.migrations import LATEST
from orchestrator.queue.store import Store
from tests.conftest import bench
from tests.reportdb import machine_facts
from tests.test_migrations import open_at_once, pg_schema, sqlite_rows, sqlite_schema
from tests.conftest import done_fields

V2 = Path(__file__).resolve().parent / "v2"
STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}
# The v2 database's tables in an order that satisfies their foreign keys.
V2_TABLES = ("schema_version", "machines", "pools", "sweeps", "jobs", "sweep_jobs", "runs", "queue", "effects")


@pytest.fixture
def v2_db(tmp_path) -> str:
    path = tmp_path / "v2.db"
    shutil.copyfile(V2 / "results-v2.db", path)
    return str(path)


def test_the_fixture_is_a_version_2_database():
    assert sqlite_rows(str(V2 / "results-v2.db"), "SELECT MAX(version) FROM schema_version") == [(2,)]
    assert LATEST > 2


@pytest.mark.probe
@pytest.mark.slow
def test_a_version_2_database_opens_keeps_every_run_and_job_and_takes_new_work(v2_db, tmp_path):
    old_columns = [r[1] for r in sqlite_rows(v2_db, "PRAGMA table_info(runs)")]
    runs_before = sqlite_rows(v2_db, "SELECT * FROM runs ORDER BY run_id")
    jobs_before = sqlite_rows(v2_db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id")
    store = Store(v2_db)
    assert store.migrated == "migrated from version 2"
    assert (sqlite_rows(v2_db, "SELECT version FROM schema_version ORDER BY version")
            == [(v,) for v in range(2, LATEST + 1)])
    assert sqlite_rows(v2_db, f"SELECT {', '.join(old_columns)} FROM runs ORDER BY run_id") == runs_before
    assert sqlite_rows(v2_db, "SELECT job_id, config_hash FROM jobs ORDER BY job_id") == jobs_before
    for config, config_hash in sqlite_rows(v2_db, "SELECT config, config_hash FROM jobs"):
        config = json.loads(config)
        assert set(variables.NAMES) <= set(config) and variables.config_hash(config) == config_hash

    proc = bench("status", "--all-machines", "--json", "--db", v2_db, check=True)
    counts = json.loads(proc.stdout)
    assert counts["done"] == 11 and counts["failed"] == 8 and counts["skipped"] == 3
    bench("report", "--db", v2_db, "--out", str(tmp_path / "result"), check=True)
    with (tmp_path / "result" / "results.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 23  # every run but the one queued
    bench("enqueue", "--db", v2_db, "--axis", "d_model=72,80", "--set", "steps=1", "--set", "dataset=builtin",
          "--set", "cores=1", check=True)
    bench("work", "--db", v2_db, "--max-jobs", "2", "--timeout", "5", env=STUB, check=True)
    assert len(sqlite_rows(v2_db, "SELECT status FROM runs WHERE run_id > 24 AND status IN ('done', 'failed')")) == 2


def test_a_migrated_version_2_database_and_a_fresh_one_have_the_same_schema(v2_db, tmp_path):
    fresh = str(tmp_path / "fresh.db")
    Store(fresh)
    Store(v2_db)
    old, new = sqlite_schema(v2_db), sqlite_schema(fresh)
    assert sorted(old) == sorted(new)
    for key in new:
        assert old[key] == new[key], key


def test_the_run_taken_back_in_version_2_is_claimed_again_with_its_attempt_count(v2_db):
    store = Store(v2_db)
    node_b = store.register_machine(machine_facts("node-b", "Other CPU"))
    claims = []
    while (claim := store.claim(node_b, pid=7, host="node-b", max_cores=8)) is not None:
        claims.append(claim)
        store.finish(claim.run_id, pid=7, status="done", fields=done_fields())
    again = [c for c in claims if c.config["seed"] == 3]
    assert len(again) == 1 and again[0].attempts == 2


def make_v2_postgres(url: str) -> None:
    """A version-2 PostgreSQL database: the statements that release ran on a fresh server, holding
    the rows of the v2 SQLite file."""
    import psycopg

    sql = re.sub(r"--[^\n]*", "", (V2 / "schema-v2-postgresql.sql").read_text())
    source = sqlite3.connect(V2 / "results-v2.db")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        for statement in (s.strip() for s in sql.split(";\n") if s.strip()):
            conn.execute(statement)
        for table in V2_TABLES:
            cursor = source.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cursor.description]
            booleans = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                                                   "table_name = %s AND data_type = 'boolean'", (table,))}
            rows = [tuple(bool(v) if n in booleans and v is not None else v for n, v in zip(names, row))
                    for row in cursor]
            if not rows:
                continue
            quoted = ", ".join(f'"{n}"' for n in names)
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({', '.join(['%s'] * len(names))})", rows)
            key = names[0]
            if key.endswith("_id") and table not in ("sweep_jobs", "queue"):
                conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{key}'), "
                             f"(SELECT MAX({key}) FROM {table}))")


@pytest.mark.postgres
def test_a_version_2_postgresql_database_migrates_once_keeps_its_runs_and_matches_a_fresh_one(pg_db, postgres_url):
    from tests.pgserver import create_database

    make_v2_postgres(pg_db)
    assert open_at_once(pg_db) == ["None", "None", "None", "migrated from version 2"]
    store = Store(pg_db)
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM runs").scalar_one() == 24
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM v_results").scalar_one() == 23
        assert conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar_one() == LATEST
    fresh = create_database(postgres_url, pg_db.rsplit("/", 1)[1] + "f")
    Store(fresh)
    assert pg_schema(pg_db) == pg_schema(fresh)
