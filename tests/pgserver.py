"""A throwaway PostgreSQL server on loopback (Debian's postgresql), for the tests' session fixture
and for benchmarks/queue_scale.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def pg_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def throwaway_postgres(*options: str) -> Iterator[str]:
    """Start a server in a temp dir; yield its SQLAlchemy URL; stop it and remove everything.
    `options`: extra server settings, e.g. "-c max_connections=200"."""
    pg = pg_bin()
    if pg is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
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
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off {' '.join(options)}", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://bench@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def create_database(url: str, name: str) -> str:
    """A new database on the server of `url`; its URL."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + f"/{name}"
