"""The store: one SQLAlchemy engine over SQLite or PostgreSQL, the schema kept at schema.sql's
version by orchestrator/queue/migrations.py, and every statement that changes the queue (enqueue, claim,
heartbeat, finish, requeue, retry).

Queues belong to pools (schema.sql says why): a machine's own pool runs every job; a named pool
(`work --pool NAME`) runs each job once on whichever of its nodes claims it. The claim pops the
first row of the pool's `queue` in run order: O(log n) however much of the plan is done. It is
atomic: on SQLite it runs inside BEGIN IMMEDIATE (one writer at a time); on PostgreSQL the row is
taken with FOR UPDATE SKIP LOCKED, so concurrent workers take different rows without waiting on
each other. Times come from the database's clock.

The database is the user's (docs/databases.md): a file that is not a cpubench database is refused
before anything is written (migrations.current_version); a read command opens the store with
`read_only=True` and writes nothing (a missing file is not created; a file on read-only media is
read as immutable); every driver error leaves `transaction()` as one BenchError whose message names
the file or URL (password hidden) and what is wrong, never the statement or its parameters; the
ones that may pass (a lost connection, a restarting server, SQLite's lock held past the busy
timeout) are DatabaseUnavailable, which a worker retries (worker/loop.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from orchestrator.queue import migrations
from orchestrator.stats.applied_cut import read_text
from common.errors import BadInput, BenchError, DatabaseUnavailable
from common.variables import BY_NAME, NAMES, complete
from common.metrics import METRICS  # the one metric list: schema.sql's runs columns follow it

# Enqueue and pool filling hold this PostgreSQL advisory lock, so a pool's first fill and a
# concurrent enqueue cannot miss each other's jobs (SQLite's BEGIN IMMEDIATE serialises them anyway).
PG_QUEUE_LOCK = migrations.PG_SCHEMA_LOCK + 1

# Columns of runs a finished child fills besides the metrics.
RUN_FACTS = ("dataset_used", "output_path", "torch_version", "python_version", "build_info",
             "gemm_format", "applied", "load_before", "child_pid")
MACHINE_COLUMNS = (
    "hostname", "cpu_model", "vendor", "sockets", "physical_cores", "logical_cores", "numa_nodes",
    "smt", "isa_flags", "l1d_kb", "l2_kb", "l3_kb", "mem_total_gb", "mem_bw_gbs_1t", "mem_bw_gbs_all",
    "gemm_gflops_fp32_1c", "gemm_gflops_fp32_all", "gemm_gflops_bf16_1c", "gemm_gflops_bf16_all",
    "noise_cv", "freq_driver", "freq_min_mhz", "freq_max_mhz", "kernel", "torch_version", "knobs",
)
STATUSES = ("queued", "running", "done", "failed", "skipped")

NOW = {
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "postgresql": "CAST(extract(epoch from clock_timestamp()) AS DOUBLE PRECISION)",
}

SELECT_NOW = "SELECT {now}"

SELECT_SWEEP = "SELECT sweep_id FROM sweeps WHERE name = :name AND text_sha = :text_sha"
INSERT_SWEEP = """
INSERT INTO sweeps (name, source, text, text_sha, notes, created)
VALUES (:name, :source, :text, :text_sha, :notes, {now})
"""
SELECT_MAX_JOB = "SELECT COALESCE(MAX(job_id), 0) FROM jobs"
# The bulk insert of planned jobs uses the driver's positional marks ({mark}: ? or %s) through
# exec_driver_sql: named parameters cost more Python per row than the insert itself (100k jobs).
INSERT_JOBS = """
INSERT INTO jobs (config_hash, sweep_id, run_order, block, config, derived, created, {columns})
VALUES ({marks})
ON CONFLICT (config_hash) DO NOTHING
"""
# PostgreSQL's bulk path: COPY into a scratch table shaped like jobs, then one INSERT ... SELECT.
COPY_TABLE = "CREATE TEMPORARY TABLE plan_jobs ON COMMIT DROP AS SELECT {columns} FROM jobs WITH NO DATA"
INSERT_COPIED_JOBS = """
INSERT INTO jobs ({columns}, created) SELECT {columns}, {now} FROM plan_jobs
ON CONFLICT (config_hash) DO NOTHING
"""
LINK_COPIED_JOBS = """
INSERT INTO sweep_jobs (sweep_id, job_id) SELECT :sweep_id, j.job_id FROM jobs j JOIN plan_jobs p USING (config_hash)
WHERE j.job_id <= :after
ON CONFLICT (sweep_id, job_id) DO NOTHING
"""
COUNT_JOBS_BY_HASH = "SELECT COUNT(*) FROM jobs WHERE config_hash IN ({marks})"
LINK_JOBS_BY_HASH = """
INSERT INTO sweep_jobs (sweep_id, job_id) SELECT {mark}, job_id FROM jobs WHERE config_hash IN ({marks})
ON CONFLICT (sweep_id, job_id) DO NOTHING
"""
LINK_NEW_JOBS = """
INSERT INTO sweep_jobs (sweep_id, job_id) SELECT :sweep_id, job_id FROM jobs WHERE job_id > :after
ON CONFLICT (sweep_id, job_id) DO NOTHING
"""
# New jobs join the queue of every pool whose queue exists already.
QUEUE_NEW_JOBS = """
INSERT INTO queue (pool_id, job_id, run_order, cores)
SELECT p.pool_id, j.job_id, j.run_order, j.cores FROM jobs j JOIN pools p ON p.filled IS NOT NULL
WHERE j.job_id > :after
ON CONFLICT (pool_id, job_id) DO NOTHING
"""

SELECT_MACHINE = "SELECT machine_id FROM machines WHERE fingerprint = :fingerprint"
# No pool has this id (ids start at 1): the counts of a machine that never worked on this database.
NO_POOL = 0
INSERT_MACHINE = """
INSERT INTO machines (fingerprint, facts, first_seen, last_seen, {columns})
VALUES (:fingerprint, :facts, {now}, {now}, {params})
ON CONFLICT (fingerprint) DO NOTHING
"""
UPDATE_MACHINE = "UPDATE machines SET facts = :facts, last_seen = {now}, {assignments} WHERE machine_id = :machine_id"

# ON CONFLICT: two workers starting at once on PostgreSQL both see no row, and one insert must yield.
INSERT_OWN_POOL = """
INSERT INTO pools (machine_id, created) VALUES (:machine_id, {now})
ON CONFLICT (machine_id) DO NOTHING
"""
SELECT_OWN_POOL = "SELECT pool_id FROM pools WHERE machine_id = :machine_id"
INSERT_NAMED_POOL = """
INSERT INTO pools (name, created) VALUES (:name, {now})
ON CONFLICT (name) DO NOTHING
"""
SELECT_NAMED_POOL = "SELECT pool_id FROM pools WHERE name = :name"
SELECT_POOLS = """
SELECT p.pool_id, p.name, p.machine_id, m.hostname FROM pools p LEFT JOIN machines m ON m.machine_id = p.machine_id
ORDER BY p.pool_id
"""
# The hardware a pool's runs ran on: a machine that differs may not join it.
SELECT_POOL_HARDWARE = """
SELECT DISTINCT m.cpu_model, m.logical_cores FROM runs r JOIN machines m ON m.machine_id = r.machine_id
WHERE r.pool_id = :pool_id
"""
SELECT_POOL_FILLED = "SELECT filled FROM pools WHERE pool_id = :pool_id"
# A pool's queue, made at its first claim: every job without a finished or running run in the pool.
FILL_POOL = """
INSERT INTO queue (pool_id, job_id, run_order, cores)
SELECT :pool_id, j.job_id, j.run_order, j.cores FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.job_id AND r.pool_id = :pool_id AND r.status <> 'queued')
ON CONFLICT (pool_id, job_id) DO NOTHING
"""
MARK_POOL_FILLED = "UPDATE pools SET filled = {now} WHERE pool_id = :pool_id"
# The next job of the pool in run order; jobs wider than the worker's CPUs wait for a wider worker.
# {skip_locked}: PostgreSQL's FOR UPDATE SKIP LOCKED, so concurrent claimers take different rows.
POP_QUEUE = """
DELETE FROM queue WHERE pool_id = :pool_id AND job_id = (
    SELECT job_id FROM queue WHERE pool_id = :pool_id AND cores <= :max_cores
    ORDER BY run_order, job_id LIMIT 1 {skip_locked})
RETURNING job_id
"""
# The run row: new, or a row taken back as 'queued' (its attempt and strike counts go on).
UPSERT_RUN = """
INSERT INTO runs (job_id, machine_id, pool_id, status, attempts, worker_pid, worker_host, worker_started,
                  claimed, heartbeat)
VALUES (:job_id, :machine_id, :pool_id, 'running', 1, :pid, :host, :started, {now}, {now})
ON CONFLICT (job_id, pool_id) DO UPDATE SET status = 'running', attempts = runs.attempts + 1,
    machine_id = excluded.machine_id, worker_pid = excluded.worker_pid, worker_host = excluded.worker_host,
    worker_started = excluded.worker_started,
    child_pid = NULL, child_started = NULL, claimed = excluded.claimed, heartbeat = excluded.heartbeat,
    finished = NULL, reason = NULL
WHERE runs.status = 'queued'
RETURNING run_id, attempts, strikes
"""
SELECT_JOB_CONFIG = "SELECT config, derived FROM jobs WHERE job_id = :job_id"
# A run put back ('queued') goes back in its pool's queue (if the pool has one yet).
REQUEUE = """
INSERT INTO queue (pool_id, job_id, run_order, cores)
SELECT r.pool_id, r.job_id, j.run_order, j.cores
FROM runs r JOIN jobs j ON j.job_id = r.job_id JOIN pools p ON p.pool_id = r.pool_id
WHERE {which} AND r.status = 'queued' AND p.filled IS NOT NULL
ON CONFLICT (pool_id, job_id) DO NOTHING
"""
# The first beat that names the child dates its start (:has_child 1 with a child_pid): how long it
# ran when its worker died says whether the job or the user is the likely cause (take_back_stale).
HEARTBEAT = """
UPDATE runs SET heartbeat = {now}, child_pid = COALESCE(:child_pid, child_pid),
    child_started = CASE WHEN child_pid IS NULL AND :has_child = 1 THEN {now} ELSE child_started END
WHERE run_id = :run_id AND status = 'running'
"""
FINISH_RUN = """
UPDATE runs SET status = :status, finished = {now}, reason = :reason, {assignments}
WHERE run_id = :run_id AND status = 'running' AND worker_pid = :pid
"""
# A learning run's evaluations, written with its outcome in one transaction (only by the finish that
# changed the run: a finish tried again after a lost answer writes no second curve).
# The claim's curve is numbered after the run's earlier ones (`retry` sets runs.attempts back to 0, so
# that count cannot tell a retried run's curves apart).
NEXT_CURVE_ATTEMPT = "SELECT COALESCE(MAX(attempt), 0) + 1 FROM curves WHERE run_id = :run_id"
INSERT_CURVE = """
INSERT INTO curves (run_id, attempt, step, tokens, train_s, eval_s, train_loss, val_loss)
VALUES (:run_id, :attempt, :step, :tokens, :train_s, :eval_s, :train_loss, :val_loss)
"""
CURVE_FIELDS = ("step", "tokens", "train_s", "eval_s", "train_loss", "val_loss")
# {server_start}: when the PostgreSQL server (re)started: heartbeats missed while it was down were
# not the workers' fault, so staleness counts from the later of the last beat and the start.
SELECT_RUNNING = """
SELECT run_id, job_id, worker_pid, worker_host, worker_started, heartbeat, attempts, strikes, child_started,
    {now} AS now, {server_start} AS server_start
FROM runs WHERE pool_id = :pool_id AND status = 'running'
"""
SERVER_START = {
    "sqlite": "NULL",
    "postgresql": "CAST(extract(epoch from pg_postmaster_start_time()) AS DOUBLE PRECISION)",
}
# A run this worker holds: after a connection lost during the claim's commit, the claim may have
# been written without the worker hearing it.
SELECT_OWN_RUNNING = """
SELECT r.run_id, r.job_id, r.attempts, r.strikes, r.worker_started, j.config, j.derived
FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.pool_id = :pool_id AND r.status = 'running' AND r.worker_pid = :pid AND r.worker_host = :host
ORDER BY r.run_id
"""
# What a finish whose answer was lost left: written already when it is ours and finished.
SELECT_RUN_STATE = "SELECT status, worker_pid, finished FROM runs WHERE run_id = :run_id"
# A dead worker's run, back in the queue or failed (:status), a strike against its job or not
# (:strike 1 or 0); only if nobody touched it since we looked (the heartbeat is the version).
TAKE_BACK = """
UPDATE runs SET status = :status, reason = :reason, strikes = strikes + :strike,
    finished = CASE WHEN :status = 'failed' THEN {now} ELSE NULL END,
    worker_pid = NULL, child_pid = NULL, child_started = NULL
WHERE run_id = :run_id AND status = 'running' AND heartbeat = :heartbeat
"""
# A worker stopped by the user gives its run back without spending an attempt.
RELEASE_RUN = """
UPDATE runs SET status = 'queued', attempts = attempts - 1, worker_pid = NULL, child_pid = NULL, child_started = NULL,
    reason = :reason
WHERE run_id = :run_id AND status = 'running' AND worker_pid = :pid
"""
# A live worker whose child the job itself likely ended (killed by a signal the worker did not send)
# gives the run back with a strike, to be tried again.
STRIKE_RUN = """
UPDATE runs SET status = 'queued', strikes = strikes + 1, worker_pid = NULL, child_pid = NULL, child_started = NULL,
    reason = :reason
WHERE run_id = :run_id AND status = 'running' AND worker_pid = :pid
"""
RETRY_RUNS = """
UPDATE runs SET status = 'queued', reason = NULL, finished = NULL, attempts = 0, strikes = 0
WHERE pool_id = :pool_id AND status IN ({statuses})
"""
# Per sweep, each job counted once: under the sweep that first planned it (jobs.sweep_id), so the
# rows add up to all jobs however the sweeps overlap (sweep_jobs links a job to every sweep that has it).
COUNT_RUNS = """
SELECT s.name AS sweep, r.status AS status, COUNT(*) AS n
FROM jobs j JOIN sweeps s ON s.sweep_id = j.sweep_id
JOIN runs r ON r.job_id = j.job_id {pool_filter}
GROUP BY s.name, r.status
"""
COUNT_JOBS = """
SELECT s.name AS sweep, COUNT(*) AS n
FROM jobs j JOIN sweeps s ON s.sweep_id = j.sweep_id
GROUP BY s.name
"""
COUNT_ALL_JOBS = "SELECT COUNT(*) FROM jobs"
COUNT_ALL_RUNS = "SELECT status, COUNT(*) FROM runs {pool_filter} GROUP BY status"
# Pools that took part: a queue made, or runs. A machine that only ran `status` is not one.
ACTIVE = "p.filled IS NOT NULL OR EXISTS (SELECT 1 FROM runs r WHERE r.pool_id = p.pool_id)"
COUNT_POOLS = f"SELECT COUNT(*) FROM pools p WHERE {ACTIVE}"
SELECT_ACTIVE_POOLS = f"SELECT p.pool_id FROM pools p WHERE {ACTIVE}"


@dataclass
class Claim:
    run_id: int
    job_id: int
    attempts: int  # claims so far, this one included
    config: dict
    strikes: int = 0  # earlier claims the job itself likely ended (schema.sql: runs.strikes)
    derived: dict = field(default_factory=dict)  # jobs.derived: the variables resolve() filled from a word


@dataclass
class EnqueueResult:
    new: int
    present: int
    sweep_id: int | None


@dataclass
class Pool:
    pool_id: int
    name: str | None  # None: a machine's own pool
    machine_id: int | None
    hostname: str | None

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"machine {self.machine_id} ({self.hostname or '?'})"


def database_url(db: str) -> str:
    """A file path or an SQLAlchemy URL -> an SQLAlchemy URL."""
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).expanduser().resolve()}"


SUPPORTED = "an SQLite file path or a postgresql+psycopg://user@host/db URL"


def _check_backend(db: str, url: str) -> None:
    """A URL of a database or driver this tool does not speak is bad input, said in one line (not
    SQLAlchemy's words about plugins and modules)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise BadInput(f"--db {safe_url(db)!r} is not a database URL: give {SUPPORTED}") from None
    backend, _, driver = parsed.drivername.partition("+")  # the names alone: loading a dialect may fail
    if backend == "sqlite" and driver in ("", "pysqlite"):
        return
    if backend == "postgresql" and driver == "psycopg":
        return
    if backend == "postgresql":
        raise BadInput(f"--db {safe_url(db)!r}: PostgreSQL is spoken through psycopg 3: write postgresql+psycopg://...")
    raise BadInput(f"--db {safe_url(db)!r}: only SQLite and PostgreSQL are supported, not {backend}: give {SUPPORTED}")


def safe_url(url: str) -> str:
    """The URL as it may be shown: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)


schema_statements = migrations.schema_statements  # kept importable from here


class _NothingNew(Exception):
    """Leaves enqueue's transaction (rolled back) when a re-enqueue adds nothing."""

    def __init__(self, result: "EnqueueResult"):
        self.result = result


class ReadOnlyDatabase(BenchError):
    """The database cannot be written (a read-only file or medium, a read-only PostgreSQL role or
    transaction): reading it works; a command that writes says so in one line. Exit code 1."""


class Store:
    """The results database. Open it with `Store(db)`; an empty database gets the schema, an older
    one is migrated (orchestrator/queue/migrations.py), an up-to-date one costs one SELECT, a database that
    is not cpubench's is refused untouched.

    `read_only=True` is for the commands that only read (status, report): a missing file is not
    created, SQLite's journal mode is left as it is, and a file in a folder this process cannot
    write (read-only media, an archive) is opened immutable, without the -wal and -shm files SQLite
    would otherwise need to create there. Only an empty database's schema or an older release's
    migration is ever written by such a store, and only where the database can be written."""

    def __init__(self, db: str, *, busy_timeout_s: float = 60.0, read_only: bool = False, create: bool = True):
        self.url = database_url(db)
        self.display_url = safe_url(self.url)
        self.read_only = read_only
        self.create = create and not read_only  # False: an empty database is refused, not given the schema
        self.busy_timeout_s = busy_timeout_s
        self.path: Path | None = None  # the SQLite file
        url = self.url
        _check_backend(db, self.url)
        try:
            parsed = make_url(self.url)
            if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
                self.path = Path(parsed.database)
                url = self._sqlite_open_url(parsed)
            self.engine: Engine = create_engine(url, connect_args=self._connect_args(busy_timeout_s))
        except (SQLAlchemyError, ImportError, ValueError) as err:
            raise BenchError(f"cannot open database {safe_url(db)!r}: {err}") from err
        self.where = str(self.path) if self.path is not None else self.display_url  # how messages name it
        self.dialect = self.engine.dialect.name
        if self.dialect not in NOW:
            raise BenchError(f"database {safe_url(db)!r}: only SQLite and PostgreSQL are supported, not {self.dialect}")
        self.now = NOW[self.dialect]
        self._mark = "?" if self.dialect == "sqlite" else "%s"
        self._filled: set[int] = set()  # pools whose queue exists (it never goes away)
        self._own_pools: dict[int, int] = {}  # machine -> its own pool
        self._driver_errors = _driver_errors(self.dialect)
        if self.dialect == "sqlite":
            self._sqlite_setup(busy_timeout_s)
        else:
            self._postgresql_setup()
        try:
            try:
                self.migrated = migrations.upgrade(self)
            except (DBAPIError, *self._driver_errors) as err:  # the migration's own transaction
                raise self.fault(err) from None
        except ReadOnlyDatabase:
            raise ReadOnlyDatabase(
                f"database {self.where} is read-only, and this release must first give it the schema of version "
                f"{migrations.LATEST} (an empty or older database is brought up to date on open): "
                f"`bench.py merge {self.where} --db COPY.db` makes a current copy to read") from None
        if self.dialect == "sqlite" and not read_only:
            # Only now that the file is known to be ours: WAL is written into the file's header
            # (outside a transaction: SQLite changes the journal mode only there).
            try:
                with self.engine.connect() as conn:
                    conn.connection.dbapi_connection.execute("PRAGMA journal_mode=WAL")
            except (DBAPIError, *self._driver_errors) as err:
                raise self.fault(err) from None

    def _sqlite_open_url(self, parsed) -> str:
        """The URL to open the SQLite file with, after the checks SQLite would answer obscurely."""
        path = self.path
        if path.is_dir():
            raise BadInput(f"--db {path} is a directory, not a database file")
        if not path.parent.is_dir():
            raise BadInput(f"--db {path}: its folder {path.parent} does not exist")
        if self.read_only and not path.exists():
            raise BadInput(f"no database file {path}: nothing was enqueued there (`bench.py enqueue --db {path}` "
                           f"creates it)")
        if self.read_only and not os.access(path.parent, os.W_OK):
            # A WAL reader needs a -shm file next to the database; on read-only media it cannot make
            # one, and nobody can be writing there: read the file as immutable.
            return f"sqlite:///file:{quote(str(path))}?mode=ro&immutable=1&uri=true"
        return parsed.render_as_string(hide_password=False)

    def _connect_args(self, busy_timeout_s: float) -> dict:
        if self.url.startswith("sqlite"):
            return {"timeout": busy_timeout_s, "isolation_level": None}
        return {"connect_timeout": 10}

    def _postgresql_setup(self) -> None:
        # The server-side cursors (the report's streamed reads: stream_results) fetch in PostgreSQL's binary
        # format: the same values, without each number printed by the server and parsed again here
        import psycopg
        from psycopg.pq import Format

        class BinaryServerCursor(psycopg.ServerCursor):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.format = Format.BINARY

        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.server_cursor_factory = BinaryServerCursor

    def _sqlite_setup(self, busy_timeout_s: float) -> None:
        # pysqlite's own transaction handling would defer BEGIN; we emit it ourselves so that
        # write transactions are BEGIN IMMEDIATE and take the write lock before reading.
        # No journal_mode here: a pragma that writes must not touch a file before it is known to be ours.
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn):
            immediate = conn.get_execution_options().get("immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    @contextmanager
    def transaction(self, *, write: bool = False, snapshot: bool = False) -> Iterator[Connection]:
        """The one way to talk to the database: commits on success, rolls back on error, closes. A
        driver error leaves it as one BenchError (fault()). `snapshot`: every statement reads the
        database as it was at the first (a read of several statements, like the report's, while workers
        write): PostgreSQL's REPEATABLE READ; SQLite's transaction already reads one snapshot throughout."""
        try:
            with self.engine.connect() as conn:
                if write:
                    conn = conn.execution_options(immediate=True)
                if snapshot and self.dialect == "postgresql":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    yield conn
        except (DBAPIError, *self._driver_errors) as err:
            raise self.fault(err) from None

    def fault(self, error: BaseException) -> BenchError:
        """A driver error as one line a user can act on: the file or URL (password hidden), what is
        wrong, the driver's first line; never the statement or its parameters (a machine's facts)."""
        orig = getattr(error, "orig", None) or error
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0].strip()
        if self.dialect == "sqlite":
            return self._sqlite_fault(first)
        sqlstate = getattr(orig, "sqlstate", None) or ""
        if sqlstate == "53100":
            return BenchError(f"database {self.where}: the server's disk is full ({first}); nothing of this command "
                              f"was written: free space on the server and run it again")
        if sqlstate == "25006":
            return ReadOnlyDatabase(f"database {self.where} is read-only ({first}): this command writes to it")
        if sqlstate == "42501":  # a role that may read only: report reads it as a read-only database
            return ReadOnlyDatabase(f"database {self.where}: permission denied ({first}): the role needs the "
                                    f"privileges docs/databases.md lists")
        if getattr(error, "connection_invalidated", False) or _pg_may_come_back(orig, sqlstate, first):
            return DatabaseUnavailable(f"cannot reach database {self.where}: {first}")
        return BenchError(f"database {self.where}: {first}")

    def _sqlite_fault(self, first: str) -> BenchError:
        low = first.lower()
        where = self.where
        if "locked" in low or "busy" in low:
            return DatabaseUnavailable(f"database {where} is locked by another connection past the "
                                       f"{self.busy_timeout_s:g} s busy timeout ({first})")
        if "readonly" in low or "read-only" in low:
            return ReadOnlyDatabase(f"database {where} is read-only ({first}): this command writes to it; "
                                    f"status and report read it as it is")
        if "full" in low or ("i/o error" in low and _nearly_full(self.path)):
            return BenchError(f"database {where}: the disk is full ({first}); nothing of this command was written: "
                              f"free space and run it again")
        if "i/o error" in low:
            return BenchError(f"database {where}: the file system failed to read or write it ({first}); "
                              f"check the disk (dmesg)")
        if "not a database" in low:
            return BadInput(f"{where} is not an SQLite database (another kind of file, or a damaged one): "
                            f"left as it was")
        if "malformed" in low or "corrupt" in low:
            return BenchError(f"database {where} is damaged ({first}): left as it was; restore it from a copy, or "
                              f"recover its rows with `sqlite3 {where} .recover`")
        if "unable to open" in low:
            return BenchError(f"cannot open database {where}: {_why_not_opened(self.path)}")
        return BenchError(f"database {where}: {first}")

    def sql(self, statement: str, **parts: str):
        return text(statement.format(now=self.now, **parts))

    def clock(self) -> float:
        with self.transaction() as conn:
            return float(conn.execute(self.sql(SELECT_NOW)).scalar_one())

    def _lock_queue(self, conn: Connection) -> None:
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_QUEUE_LOCK})

    # -- machines and pools ----------------------------------------------------------------

    def register_machine(self, facts: dict) -> int:
        """The machine's id, its row created or refreshed from the probe's facts, its own pool made."""
        values = {c: _sql_value(facts.get(c)) for c in MACHINE_COLUMNS}
        params = {"fingerprint": facts["fingerprint"], "facts": json.dumps(facts, sort_keys=True, default=str),
                  **values}
        with self.transaction(write=True) as conn:
            machine_id = conn.execute(text(SELECT_MACHINE), params).scalar_one_or_none()
            if machine_id is None:
                conn.execute(self.sql(INSERT_MACHINE, columns=", ".join(MACHINE_COLUMNS),
                                      params=", ".join(f":{c}" for c in MACHINE_COLUMNS)), params)
                machine_id = conn.execute(text(SELECT_MACHINE), params).scalar_one()
            else:
                conn.execute(self.sql(UPDATE_MACHINE, assignments=", ".join(f"{c} = :{c}" for c in MACHINE_COLUMNS)),
                             {**params, "machine_id": machine_id})
            conn.execute(self.sql(INSERT_OWN_POOL), {"machine_id": machine_id})
            return machine_id

    def find_machine(self, fingerprint: str) -> int | None:
        """The machine's id if it was registered here, without registering it (read commands)."""
        with self.transaction() as conn:
            return conn.execute(text(SELECT_MACHINE), {"fingerprint": fingerprint}).scalar_one_or_none()

    def pool_id(self, machine_id: int | None, name: str | None = None, *, create: bool = True) -> int:
        """The queue a worker of this machine claims from: the machine's own pool, or the named pool
        (made on first use when `create`). A named pool whose runs ran on other hardware (CPU model,
        logical CPUs) is refused: its timings would mix machines."""
        if name is None:
            return self._own_pool(machine_id)
        with self.transaction(write=create) as conn:
            if create:
                conn.execute(self.sql(INSERT_NAMED_POOL), {"name": name})
            pool_id = conn.execute(text(SELECT_NAMED_POOL), {"name": name}).scalar_one_or_none()
            if pool_id is None:
                known = ", ".join(p.name for p in self._pools(conn) if p.name) or "none yet"
                raise BadInput(f"no pool named {name!r} in {self.display_url} (named pools: {known})")
            if create:
                mine = conn.execute(text("SELECT cpu_model, logical_cores FROM machines WHERE machine_id = :m"),
                                    {"m": machine_id}).one()
                others = [tuple(r) for r in conn.execute(text(SELECT_POOL_HARDWARE), {"pool_id": pool_id})]
                if others and any(o != tuple(mine) for o in others):
                    there = "; ".join(f"{cpu} ({n} CPUs)" for cpu, n in others)
                    raise BadInput(f"pool {name!r} ran on {there}; this machine is {mine[0]} ({mine[1]} CPUs): a "
                                   f"pool is for identical nodes: use another --pool, or none to compare machines")
            return pool_id

    def _own_pool(self, machine_id: int) -> int:
        if machine_id not in self._own_pools:
            with self.transaction() as conn:
                found = conn.execute(text(SELECT_OWN_POOL), {"machine_id": machine_id}).scalar_one_or_none()
            if found is None:  # a machine registered before it had pools
                with self.transaction(write=True) as conn:
                    conn.execute(self.sql(INSERT_OWN_POOL), {"machine_id": machine_id})
                    found = conn.execute(text(SELECT_OWN_POOL), {"machine_id": machine_id}).scalar_one()
            self._own_pools[machine_id] = found
        return self._own_pools[machine_id]

    def active_pools(self) -> set[int]:
        """Pools that took part: a queue made, or runs."""
        with self.transaction() as conn:
            return {row[0] for row in conn.execute(text(SELECT_ACTIVE_POOLS))}

    def pools(self) -> list[Pool]:
        with self.transaction() as conn:
            return self._pools(conn)

    def _pools(self, conn: Connection) -> list[Pool]:
        return [Pool(*row) for row in conn.execute(text(SELECT_POOLS))]

    # -- the plan --------------------------------------------------------------------------

    def enqueue(self, *, name: str, source: str, sweep_text: str, jobs: Iterable[dict], notes: list[str] = (),
                dry_run: bool = False, chunk: int = 2000) -> EnqueueResult:
        """As _enqueue; a re-enqueue that adds nothing is rolled back, so the file is left byte for byte
        (SQLite moves its AUTOINCREMENT counter even for an insert that does nothing)."""
        try:
            return self._enqueue(name=name, source=source, sweep_text=sweep_text, jobs=jobs, notes=notes,
                                 dry_run=dry_run, chunk=chunk)
        except _NothingNew as nothing:
            return nothing.result

    def close(self) -> None:
        """Close the connections (SQLite's -wal and -shm files go with the last one)."""
        self.engine.dispose()

    def _enqueue(self, *, name: str, source: str, sweep_text: str, jobs: Iterable[dict], notes: list[str] = (),
                 dry_run: bool = False, chunk: int = 2000) -> EnqueueResult:
        """Add the jobs not planned yet, in one transaction. `jobs` (any iterable, consumed once, in
        chunks): config (full), config_hash, run_order, and optionally block (the comparison it runs
        beside; None: the whole pass), config_json (the canonical JSON, when the planner has it) and
        derived (variable -> the word resolve() filled it from).
        `notes` (what expansion left out here, and why) are kept
        with the sweep for the report. New jobs join the queue of every pool that has one."""
        text_sha = _sha(sweep_text)
        m = self._mark
        insert = INSERT_JOBS.format(columns=", ".join(_quoted(n) for n in NAMES), marks=", ".join(
            [m, m, m, m, m, m, self.now, *([m] * len(NAMES))]))
        new = total = 0
        with self.transaction(write=not dry_run) as conn:
            if dry_run:
                for part in _chunks(jobs, chunk):
                    hashes = [j["config_hash"] for j in part]
                    total += len(hashes)
                    new += len(hashes) - conn.exec_driver_sql(
                        COUNT_JOBS_BY_HASH.format(marks=", ".join([m] * len(hashes))), tuple(hashes)).scalar_one()
                return EnqueueResult(new=new, present=total - new, sweep_id=None)
            self._lock_queue(conn)
            sweep_id = conn.execute(text(SELECT_SWEEP), {"name": name, "text_sha": text_sha}).scalar_one_or_none()
            known = sweep_id is not None  # the same sweep enqueued before: maybe nothing to add
            if sweep_id is None:
                conn.execute(self.sql(INSERT_SWEEP), {"name": name, "source": source, "text": sweep_text,
                                                      "text_sha": text_sha, "notes": json.dumps(list(notes))})
                sweep_id = conn.execute(text(SELECT_SWEEP), {"name": name, "text_sha": text_sha}).scalar_one()
            after = conn.exec_driver_sql(SELECT_MAX_JOB).scalar_one()
            if self.dialect == "postgresql":
                total, new = self._copy_jobs(conn, jobs, sweep_id, after)
            else:
                for part in _chunks(jobs, chunk):
                    rows = [_job_row(j, sweep_id) for j in part]
                    added = conn.exec_driver_sql(insert, rows).rowcount
                    total += len(rows)
                    new += added
                    if added < len(rows):  # some were planned before: link them to this sweep too
                        hashes = tuple(r[0] for r in rows)
                        conn.exec_driver_sql(LINK_JOBS_BY_HASH.format(mark=m, marks=", ".join([m] * len(hashes))),
                                             (sweep_id, *hashes))
            if new == 0 and known:
                raise _NothingNew(EnqueueResult(new=0, present=total, sweep_id=sweep_id))
            conn.execute(text(LINK_NEW_JOBS), {"sweep_id": sweep_id, "after": after})
            conn.execute(text(QUEUE_NEW_JOBS), {"after": after})
        return EnqueueResult(new=new, present=total - new, sweep_id=sweep_id)

    def _copy_jobs(self, conn: Connection, jobs: Iterable[dict], sweep_id: int, after: int) -> tuple[int, int]:
        """PostgreSQL: the planned jobs streamed by COPY into a temporary table, then inserted (and the
        ones planned before linked to this sweep) by two statements: twice as fast as executemany."""
        columns = ", ".join(["config_hash", "sweep_id", "run_order", "block", "config", "derived",
                             *(_quoted(n) for n in NAMES)])
        conn.exec_driver_sql(COPY_TABLE.format(columns=columns))
        total = 0
        with conn.connection.driver_connection.cursor() as cursor:
            with cursor.copy(f"COPY plan_jobs ({columns}) FROM STDIN") as copy:
                for job in jobs:
                    copy.write_row(_job_row(job, sweep_id))
                    total += 1
        new = conn.exec_driver_sql(INSERT_COPIED_JOBS.format(columns=columns, now=self.now)).rowcount
        if new < total:  # some were planned before: link them to this sweep too (new ones: LINK_NEW_JOBS)
            conn.execute(text(LINK_COPIED_JOBS), {"sweep_id": sweep_id, "after": after})
        return total, new

    # -- the queue -------------------------------------------------------------------------

    def _fill(self, conn: Connection, pool_id: int) -> None:
        """Make the pool's queue at its first claim (once: `filled` says so)."""
        if pool_id in self._filled:
            return
        if conn.execute(text(SELECT_POOL_FILLED), {"pool_id": pool_id}).scalar_one() is None:
            self._lock_queue(conn)
            if conn.execute(text(SELECT_POOL_FILLED), {"pool_id": pool_id}).scalar_one() is None:
                conn.execute(text(FILL_POOL), {"pool_id": pool_id})
                conn.execute(self.sql(MARK_POOL_FILLED), {"pool_id": pool_id})
        self._filled.add(pool_id)

    def claim(self, machine_id: int, *, pid: int, host: str, max_cores: int, pool_id: int | None = None,
              started: float | None = None) -> Claim | None:
        """The pool's next queued job (the machine's own pool unless given), now 'running' for this
        worker on this machine; None when none is left that fits in max_cores CPUs. `started`: the
        worker process's start time (psutil's create_time), so that a reused pid is not taken for it."""
        if pool_id is None:
            pool_id = self.pool_id(machine_id)
        pop = self.sql(POP_QUEUE, skip_locked="FOR UPDATE SKIP LOCKED" if self.dialect == "postgresql" else "")
        for _ in range(1000):
            with self.transaction(write=True) as conn:
                self._fill(conn, pool_id)
                job_id = conn.execute(pop, {"pool_id": pool_id, "max_cores": max_cores}).scalar_one_or_none()
                if job_id is None:
                    return None
                got = conn.execute(self.sql(UPSERT_RUN), {"job_id": job_id, "machine_id": machine_id,
                                                          "pool_id": pool_id, "pid": pid, "host": host,
                                                          "started": started}).first()
                if got is None:
                    continue  # a queue row whose run is not queued (cannot happen; the row is gone now)
                config, derived = conn.execute(text(SELECT_JOB_CONFIG), {"job_id": job_id}).one()
                return Claim(run_id=got[0], job_id=job_id, attempts=got[1], strikes=got[2],
                             config=complete(json.loads(config)), derived=json.loads(derived or "{}"))
        raise BenchError("could not claim a job after 1000 tries: is the database overloaded?")

    def heartbeat(self, run_id: int, child_pid: int | None = None) -> bool:
        with self.transaction(write=True) as conn:
            return conn.execute(self.sql(HEARTBEAT), {"run_id": run_id, "child_pid": child_pid,
                                                      "has_child": int(child_pid is not None)}).rowcount == 1

    def finish(self, run_id: int, *, pid: int, status: str, reason: str | None = None, fields: dict | None = None,
               curve: list[dict] | None = None, strike: bool = False) -> None:
        """Record the outcome of a claimed run, and the curve of its learning run's evaluations (a failed
        claim's partial curve too, numbered after the run's earlier curves); strike: the failure is the
        job's last strike (counted in runs.strikes). Raises BenchError if the run was taken away
        meanwhile, or, writing nothing, if the fields are not a result (result_problems)."""
        assert status in ("done", "failed", "skipped"), status
        problems = result_problems(status, fields or {})
        if problems:
            raise BenchError(f"run {run_id}: not recorded: {problems}")
        fields = {k: _sql_value(v) for k, v in (fields or {}).items()}
        if "applied" in fields:  # beside it, the keys the report reads of it
            fields["applied_read"] = read_text(fields["applied"])
        assignments = (", ".join([f"{k} = :{k}" for k in fields] + ["strikes = strikes + 1"] * strike)
                       or "run_id = run_id")
        with self.transaction(write=True) as conn:
            changed = conn.execute(self.sql(FINISH_RUN, assignments=assignments),
                                   {"run_id": run_id, "pid": pid, "status": status, "reason": reason,
                                    **fields}).rowcount
            if changed == 1 and curve:
                self._add_curve(conn, run_id, curve)
        if changed != 1 and self._finished_by(run_id, pid, status):
            return  # an earlier try was written, its answer lost with the connection
        if changed != 1:
            raise BenchError(f"run {run_id} was taken back from this worker before it finished (heartbeat too old?)")

    @staticmethod
    def _add_curve(conn: Connection, run_id: int, curve: list[dict]) -> None:
        attempt = conn.execute(text(NEXT_CURVE_ATTEMPT), {"run_id": run_id}).scalar_one()
        conn.execute(text(INSERT_CURVE), [{"run_id": run_id, "attempt": attempt,
                                           **{k: row.get(k) for k in CURVE_FIELDS}} for row in curve])

    def strike(self, run_id: int, *, pid: int, reason: str, curve: list[dict] | None = None) -> bool:
        """Give a claimed run back to the queue with a strike against its job (its child was killed by
        a signal the worker did not send), keeping a learning run's partial curve as finish() does.
        False if the run was taken away meanwhile."""
        with self.transaction(write=True) as conn:
            changed = conn.execute(text(STRIKE_RUN), {"run_id": run_id, "pid": pid, "reason": reason}).rowcount
            if changed == 1:
                if curve:
                    self._add_curve(conn, run_id, curve)
                conn.execute(text(REQUEUE.format(which="r.run_id = :run_id")), {"run_id": run_id})
        return changed == 1

    def _finished_by(self, run_id: int, pid: int, status: str) -> bool:
        with self.transaction() as conn:
            row = conn.execute(text(SELECT_RUN_STATE), {"run_id": run_id}).first()
        return row is not None and row[0] == status and row[1] == pid and row[2] is not None

    def own_running(self, pool_id: int, *, pid: int, host: str, started: float | None) -> Claim | None:
        """The run of the pool this worker (pid, host and start time) holds, if any: a claim written
        before the connection was lost, its answer with it."""
        with self.transaction() as conn:
            for run_id, job_id, attempts, strikes, run_started, config, derived in conn.execute(
                    text(SELECT_OWN_RUNNING), {"pool_id": pool_id, "pid": pid, "host": host}):
                if started is None or run_started is None or same_start(started, run_started):
                    return Claim(run_id=run_id, job_id=job_id, attempts=attempts, strikes=strikes,
                                 config=complete(json.loads(config)), derived=json.loads(derived or "{}"))
        return None

    def release(self, run_id: int, *, pid: int, reason: str) -> None:
        with self.transaction(write=True) as conn:
            conn.execute(text(RELEASE_RUN), {"run_id": run_id, "pid": pid, "reason": reason})
            conn.execute(text(REQUEUE.format(which="r.run_id = :run_id")), {"run_id": run_id})

    def take_back_stale(self, machine_id: int, *, host: str, grace_s: float, max_attempts: int, is_alive,
                        pool_id: int | None = None, started_at=None, other_hosts: bool = True,
                        predicted_s: Callable[[int], float | None] = lambda job_id: None) -> list[int]:
        """Put back in the queue the running runs of the pool (the machine's own unless given) whose
        worker is gone. On this host the worker's pid decides, never the heartbeat's age: a run is
        taken back when is_alive(pid) is False, or when started_at(pid) (the live process's start
        time; None if gone) is not the start time recorded at claim (the pid was reused). A live
        worker keeps its run however long its child takes to start. On other hosts, whose pids we
        cannot see, a heartbeat older than grace_s means gone, counted from the later of the beat and
        the server's (re)start: beats missed while the server was down were nobody's fault.
        other_hosts=False leaves other hosts' runs alone (a worker just back from an outage gives
        them a grace period to beat again).

        A take-back is a strike against the job only where its child ran past PAST_PREDICTED times
        predicted_s(job_id) (the ETA's seconds for the job; None: no prediction yet) when its worker
        last beat (blame): a worker killed while starting, or while its child was within its time, is
        a user's stop, not the job's fault. After max_attempts strikes a run is failed, and after
        UNCOUNTED_PER_STRIKE times as many uncounted take-backs too (a job that kills its worker
        every time still ends); the reason says which."""
        if pool_id is None:
            pool_id = self.pool_id(machine_id)
        with self.transaction() as conn:
            running = conn.execute(self.sql(SELECT_RUNNING, server_start=SERVER_START[self.dialect]),
                                   {"pool_id": pool_id}).all()
        gone = []
        for (run_id, job_id, pid, run_host, started, beat, attempts, strikes, child_started, now,
             server_start) in running:
            if run_host == host and pid is not None:
                if not is_alive(pid):
                    why = f"worker pid {pid} on {host} died"
                elif started is not None and started_at is not None and not same_start(started_at(pid), started):
                    why = f"worker pid {pid} on {host} died (the pid was reused by another process)"
                else:
                    continue  # alive: it heartbeats, or it is busy starting its child
            elif not other_hosts:
                continue
            elif beat is None or now - max(beat, server_start or beat) > grace_s:
                why = f"no heartbeat from worker {pid}@{run_host} for {grace_s:g} s"
            else:
                continue
            # The prediction is read outside the write transaction (an ETA fit may take a moment); the
            # heartbeat guard of TAKE_BACK still takes back only what was looked at.
            strike, why = blame(why, beat, child_started, predicted_s(job_id) if child_started is not None else None)
            gone.append((run_id, beat, attempts, strikes + strike, strike, why))
        taken = []
        with self.transaction(write=True) as conn:
            for run_id, beat, attempts, strikes, strike, why in gone:
                uncounted = attempts - strikes
                if strikes >= max_attempts:
                    status, reason = "failed", f"gave up after {_strikes(strikes)}; last: {why}"
                elif uncounted >= UNCOUNTED_PER_STRIKE * max_attempts:
                    status, reason = "failed", (f"gave up after {attempts} claims, {uncounted} of them taken back "
                                                f"from a dead worker without a strike; last: {why}")
                else:
                    status, reason = "queued", f"requeued: {why}" + (f" (strike {strikes} of {max_attempts})" * strike)
                changed = conn.execute(self.sql(TAKE_BACK), {"run_id": run_id, "heartbeat": beat, "status": status,
                                                             "reason": reason, "strike": int(strike)}).rowcount
                if changed:
                    conn.execute(text(REQUEUE.format(which="r.run_id = :run_id")), {"run_id": run_id})
                    taken.append(run_id)
        return taken

    def retry(self, machine_id: int, *, failed: bool, skipped: bool, pool_id: int | None = None) -> int:
        """Put the pool's (the machine's own unless given) failed and/or skipped runs back in its queue."""
        statuses = [s for s, on in (("failed", failed), ("skipped", skipped)) if on]
        if not statuses:
            return 0
        if pool_id is None:
            pool_id = self.pool_id(machine_id)
        marks = ", ".join(f"'{s}'" for s in statuses)
        with self.transaction(write=True) as conn:
            n = conn.execute(self.sql(RETRY_RUNS, statuses=marks), {"pool_id": pool_id}).rowcount
            conn.execute(text(REQUEUE.format(which="r.pool_id = :pool_id")), {"pool_id": pool_id})
            return n

    # -- reading ---------------------------------------------------------------------------

    def counts(self, machine_id: int | None = None, *, pool_id: int | None = None) -> dict:
        """total / queued / running / done / failed / skipped of one pool (given, or the machine's own);
        with neither, of every pool that took part, where total is jobs times pools."""
        if pool_id is None and machine_id is not None:
            pool_id = self.pool_id(machine_id)
        where = "WHERE pool_id = :pool_id" if pool_id is not None else ""
        with self.transaction() as conn:
            jobs = conn.execute(text(COUNT_ALL_JOBS)).scalar_one()
            pools = 1 if pool_id is not None else max(1, conn.execute(text(COUNT_POOLS)).scalar_one())
            by_status = dict(conn.execute(text(COUNT_ALL_RUNS.format(pool_filter=where)), {"pool_id": pool_id}).all())
        out = {"total": jobs * pools}
        out.update({s: int(by_status.get(s, 0)) for s in STATUSES})
        out["queued"] = out["total"] - sum(out[s] for s in ("running", "done", "failed", "skipped"))
        return out

    def counts_by_sweep(self, machine_id: int | None = None, *, pool_id: int | None = None) -> dict[str, dict]:
        if pool_id is None and machine_id is not None:
            pool_id = self.pool_id(machine_id)
        where = "AND r.pool_id = :pool_id" if pool_id is not None else ""
        with self.transaction() as conn:
            totals = dict(conn.execute(text(COUNT_JOBS)).all())
            pools = 1 if pool_id is not None else max(1, conn.execute(text(COUNT_POOLS)).scalar_one())
            rows = conn.execute(text(COUNT_RUNS.format(pool_filter=where)), {"pool_id": pool_id}).all()
        out = {name: {"total": n * pools, **{s: 0 for s in STATUSES}} for name, n in totals.items()}
        for name, status, n in rows:
            out[name][status] = n
        for c in out.values():
            c["queued"] = c["total"] - sum(c[s] for s in ("running", "done", "failed", "skipped"))
        return out


def _driver_errors(dialect: str) -> tuple[type[BaseException], ...]:
    """The driver's own exception classes: raised where SQLAlchemy does not wrap them (a raw
    connection's pragma, psycopg's COPY)."""
    if dialect == "postgresql":
        import psycopg

        return (sqlite3.Error, psycopg.Error)
    return (sqlite3.Error,)


# Connection failures that no retry mends: the URL or the role is wrong.
_PG_FOR_GOOD = ("password", "authentication", "does not exist", "pg_hba.conf", "role ", "invalid")


def _pg_may_come_back(orig: BaseException, sqlstate: str, first: str) -> bool:
    """A lost connection or a server shutting down, starting up or failing over: SQLSTATE class 08
    (connection exception) or 57P01-57P03 (admin/crash shutdown, cannot connect now); or a
    connection refused or reset (psycopg gives those no SQLSTATE)."""
    if sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"):
        return True
    import psycopg

    low = first.lower()
    return isinstance(orig, psycopg.OperationalError) and not sqlstate and not any(w in low for w in _PG_FOR_GOOD)


def _nearly_full(path: Path | None) -> bool:
    """Whether the file system of the database has less room than SQLite needs for a page of WAL
    (SQLite reports a write to a full disk as "disk I/O error" when the -wal or -shm file fails)."""
    if path is None:
        return False
    try:
        return shutil.disk_usage(path.parent).free < 1 << 20
    except OSError:
        return False


def _why_not_opened(path: Path | None) -> str:
    """Why SQLite said "unable to open database file", as far as the file system tells."""
    if path is None:
        return "unable to open database file"
    if path.exists() and not os.access(path, os.R_OK):
        return f"permission denied: this user cannot read {path}"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return (f"permission denied: this user cannot write in {path.parent} (SQLite keeps its -wal and -shm "
                f"files next to the database)")
    if path.exists() and not os.access(path, os.W_OK):
        return f"permission denied: this user cannot write {path}"
    return "unable to open database file (SQLite's words; the file system allows it: a full disk?)"


# Variables whose column stores NULL for a word ("default"): after resolve() only these can hold one.
_WORDY = tuple((i, BY_NAME[n].words) for i, n in enumerate(NAMES) if BY_NAME[n].words)


def _job_row(job: dict, sweep_id: int) -> tuple:
    """One positional row of INSERT_JOBS."""
    config = job["config"]
    values = [config[n] for n in NAMES]
    for i, words in _WORDY:
        if isinstance(values[i], str) and values[i] in words:  # compile's values are words too: only "auto" etc.
            values[i] = None
    config_json = job.get("config_json") or json.dumps(config, sort_keys=True)
    derived = job.get("derived")
    return (job["config_hash"], sweep_id, job["run_order"], job.get("block"), config_json,
            None if derived is None else json.dumps(derived, sort_keys=True), *values)


def _quoted(name: str) -> str:
    return f'"{name}"' if name == "window" else name


def result_problems(status: str, fields: dict) -> str | None:
    """Why these fields are not a result the runs table can hold, or None: a field that is neither a
    metric nor a run fact would be dropped without a trace, and a done run must carry every metric
    (None where not measured) so that a renamed or forgotten metric cannot pass for "not measured"."""
    unknown = sorted(k for k in fields if k not in METRICS and k not in RUN_FACTS)
    missing = [m for m in METRICS if m not in fields] if status == "done" else []
    why = ([f"unknown field(s) {', '.join(unknown)}"] if unknown else []) + \
        ([f"missing metric(s) {', '.join(missing)}"] if missing else [])
    return "; ".join(why) or None


def _sql_value(value):
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _chunks(items: Iterable, n: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# A take-back counts against the job when its child had run past this many times its predicted
# seconds: the ETA's prediction of a job is its claim-to-finish cost (the child's life and the
# worker's share), and a shared machine's load can stretch a run well past it; twice that is
# beyond what a user's stop of a healthy run explains (a leak swapping, a hang).
PAST_PREDICTED = 2.0
# The backstop: a run taken back this many times max_attempts without a strike is failed too (12
# claims by default), so a job that kills its worker during start-up every time still ends; a user
# stopping and restarting a worker that often on one job is not expected.
UNCOUNTED_PER_STRIKE = 4


def blame(why: str, beat: float | None, child_started: float | None, predicted_s: float | None) -> tuple[bool, str]:
    """(whether a dead worker's run is a strike against its job, `why` saying which it was). The
    child ran at least from its start to the worker's last beat (the worker may have died up to a
    heartbeat later: the count errs toward the user)."""
    if child_started is None or beat is None:
        return False, f"{why} (not counted: before its child started)"
    ran_s = max(0.0, beat - child_started)
    if predicted_s is None:
        return False, f"{why} (not counted: child ran {ran_s:.1f} s, no prediction for the job yet)"
    if ran_s <= PAST_PREDICTED * predicted_s:
        return False, f"{why} (not counted: child ran {ran_s:.1f} s of a predicted {predicted_s:.3g} s)"
    return True, f"{why} while its child ran {ran_s:.1f} s, past {PAST_PREDICTED:g}x its predicted {predicted_s:.3g} s"


def _strikes(n: int) -> str:
    return f"{n} strike" if n == 1 else f"{n} strikes"


def same_start(now_started: float | None, recorded: float) -> bool:
    """Whether a live pid's start time is the one recorded at claim. Start times come from the
    kernel in clock ticks (10 ms) plus the boot time: the same process always reads the same value;
    a reused pid started at least as late as its predecessor died, well over a tick later."""
    return now_started is not None and abs(now_started - recorded) < 0.05
