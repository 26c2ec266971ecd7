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
from dataclasses import dataclass
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


@dataclass
class Server:
    """A running throwaway server that a test may stop, start and restart (a maintenance restart,
    a failover) while workers use it."""

    url: str
    pg: Path
    data: Path
    log: Path
    settings: str  # the postgres command line options it started with
    run_as: list[str]

    def ctl(self, *args: str) -> None:
        subprocess.run([*self.run_as, str(self.pg / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", *args],
                       check=True, capture_output=True)

    def stop(self, mode: str = "fast") -> None:
        self.ctl("-m", mode, "stop")

    def start(self) -> None:
        self.ctl("-o", self.settings, "start")

    def restart(self) -> None:
        self.ctl("-m", "fast", "-o", self.settings, "restart")


@contextmanager
def postgres_server(*options: str, listen: tuple[str, ...] = ("127.0.0.1",),
                    trust: tuple[str, ...] = ()) -> Iterator[Server]:
    """Start a server in a temp dir; yield it; stop it and remove everything.
    `options`: extra server settings, e.g. "-c max_connections=200"; `listen`: its addresses; `trust`:
    networks (e.g. "10.213.7.0/24") whose clients it trusts besides loopback (tests/netcluster.py's nodes)."""
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
    with open(data / "pg_hba.conf", "a") as hba:
        hba.writelines(f"host all all {net} trust\n" for net in trust)
    settings = f"-p {port} -k {base} -c listen_addresses={','.join(listen)} -c fsync=off {' '.join(options)}"
    server = Server(f"postgresql+psycopg://bench@127.0.0.1:{port}/postgres", pg, data, base / "log", settings, run_as)
    server.start()
    try:
        yield server
    finally:
        subprocess.run([*run_as, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def throwaway_postgres(*options: str) -> Iterator[str]:
    """Start a server in a temp dir; yield its SQLAlchemy URL; stop it and remove everything."""
    with postgres_server(*options) as server:
        yield server.url


def create_database(url: str, name: str) -> str:
    """A new database on the server of `url`; its URL."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + f"/{name}"
