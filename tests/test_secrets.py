"""A database URL's password never appears in what bench.py prints, in its errors, in `status
--json`, in the files a worker writes, or in the database itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from common.secrets import scrub
from tests.conftest import bench

pytestmark = pytest.mark.probe

SECRET = "pw-S3cr3t-q9"
UNREACHABLE = f"postgresql+psycopg://user:{SECRET}@127.0.0.1:1/db"
STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}


def with_password(url: str) -> str:
    """The session's PostgreSQL URL with a password in it (the server trusts loopback, so any works)."""
    assert "bench@" in url
    return url.replace("bench@", f"bench:{SECRET}@", 1)


def test_scrub_hides_url_and_dsn_passwords():
    assert (scrub(f"cannot use {UNREACHABLE}: refused")
            == "cannot use postgresql+psycopg://user:***@127.0.0.1:1/db: refused")
    assert SECRET not in scrub(f"dsn 'host=h user=u password={SECRET} dbname=d'")
    assert SECRET not in scrub(f"password='{SECRET} with blank'")
    plain = "no url here: /tmp/results.db, sqlite:////tmp/x.db"
    assert scrub(plain) == plain
    no_password = "postgresql://bench@127.0.0.1:5432/db"
    assert scrub(no_password) == no_password


COMMANDS = [
    ["status"], ["status", "--json"], ["status", "--all-machines"],
    ["enqueue", "--set", "d_model=32"], ["enqueue", "--set", "d_model=32", "--dry-run"],
    ["work", "--max-jobs", "1"], ["report"], ["retry", "--failed"],
]


@pytest.mark.parametrize("url", [UNREACHABLE, f"postgresql+psycopg://user:{SECRET}@127.0.0.1:notaport/db",
                                 f"postgresql+psycopg://user:{SECRET}@127.0.0.1:1/db?sslmode=bogus",
                                 f"mysql://user:{SECRET}@127.0.0.1:1/db"])
@pytest.mark.slow
def test_unreachable_or_bad_database_url_never_shows_its_password(url, tmp_path):
    for args in COMMANDS:
        extra = ["--out", str(tmp_path / "report")] if args == ["report"] else []
        proc = bench(*args, *extra, "--db", url, timeout=120)
        shown = proc.stdout + proc.stderr
        assert proc.returncode != 0, (args, shown)
        assert "Traceback" not in shown, (args, shown)
        assert SECRET not in shown, (args, shown)
        assert "***" in shown, (args, shown)  # the URL is named, its password hidden
    proc = bench("status", env={"BENCH_DB": UNREACHABLE})  # the same through the environment
    assert proc.returncode != 0 and SECRET not in proc.stdout + proc.stderr
    proc = bench("merge", UNREACHABLE, "--db", str(tmp_path / "here.db"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and SECRET not in proc.stdout + proc.stderr


@pytest.mark.postgres
def test_a_password_url_leaves_no_trace_in_outputs_files_or_database(postgres_url, pg_db, tmp_path, isolated_state):
    url = with_password(pg_db)
    shown = []
    for args in (["enqueue", "--set", "dataset=builtin", "--set", "steps=1", "--axis", "d_model=32,40"],
                 ["work"], ["status"], ["status", "--json"], ["status", "--all-machines"],
                 ["retry", "--failed"]):
        proc = bench(*args, "--db", url, env=STUB, check=True)
        shown.append(proc.stdout + proc.stderr)
        if args == ["status", "--json"]:
            json.loads(proc.stdout)  # one JSON document on stdout, nothing else
    for text_ in shown:
        assert SECRET not in text_
    # no file the worker, the report or the state dir wrote holds it
    for root in (tmp_path, isolated_state):
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    # nor any row of any table
    engine = create_engine(pg_db)
    try:
        with engine.connect() as conn:
            tables = inspect(conn).get_table_names()
            assert "runs" in tables
            rows = 0
            for table in tables:
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    rows += 1
                    assert SECRET not in repr(tuple(row)), table
            assert rows > 0
    finally:
        engine.dispose()
