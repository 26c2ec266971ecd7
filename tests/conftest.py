"""Shared fixtures: an isolated worker state dir, a quick probe, a real SQLite file, a real
PostgreSQL server started for the session (Debian's postgresql), and a way to run bench.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory) -> Path:
    """One quick probe for the session: its cache files seed every test's state dir, so each test
    does not pay the probe's measurement child (a torch import) again."""
    from worker.probe import probe

    state = tmp_path_factory.mktemp("probe")
    probe(state, quick=True)
    return state


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch, probe_cache):
    """Each test gets its own locks, journals, probe cache and output dir; the probe runs quick."""
    state = tmp_path / "state"
    shutil.copytree(probe_cache, state)
    monkeypatch.setenv("BENCH_STATE_DIR", str(state))
    monkeypatch.setenv("BENCH_PROBE_QUICK", "1")
    monkeypatch.setenv("BENCH_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.delenv("BENCH_DB", raising=False)
    monkeypatch.delenv("BENCH_CHILD_MODULE", raising=False)
    return state


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "results.db")


def bench(*args: str, env: dict | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """Run `python bench.py ARGS` as a real process; returns the completed process."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"bench {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _pg_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL server on loopback, for the session. Skipped only where Debian's
    postgresql is not installed (.ci/run installs it, so CI always runs these tests)."""
    if os.environ.get("BENCH_TEST_PG_URL"):
        yield os.environ["BENCH_TEST_PG_URL"]
        return
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    # Not under pytest's tmp dir: it is private to root and the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="cpubench-pg-"))
    data = base / "data"
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        shutil.chown(base, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run([*run_as, str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench"],
                   check=True, capture_output=True)
    log = base / "log"
    subprocess.run([*run_as, str(pg / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o",
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True)
    try:
        url = f"postgresql+psycopg://bench@127.0.0.1:{port}/postgres"
        yield url
    finally:
        subprocess.run([*run_as, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_db(postgres_url):
    """A fresh database on the session's PostgreSQL server."""
    import psycopg

    name = f"t{time.time_ns()}"
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"
