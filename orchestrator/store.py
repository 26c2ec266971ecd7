"""The store: one SQLAlchemy engine over SQLite or PostgreSQL, the schema applied from schema.sql, and
every statement that changes the queue (enqueue, claim, heartbeat, finish, requeue, retry).

Claiming is atomic: on SQLite the claim runs inside BEGIN IMMEDIATE (one writer at a time); on
PostgreSQL the UNIQUE (job_id, machine_id) constraint and a conditional UPDATE decide, and a loser
simply tries the next job. Times come from the database's clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from orchestrator.errors import BenchError
from orchestrator.variables import NAMES, column_value

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema.sql"

METRICS = (
    "setup_s", "first_step_s", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_mean",
    "step_ms_std", "train_s", "wall_s", "tokens_per_s", "samples_per_s", "loss_first", "loss_last",
    "peak_rss_mb", "cpu_user_s", "cpu_sys_s", "ctx_switches", "freq_mhz_avg", "energy_j",
    "temp_c_max", "params", "flops_per_step", "gflops", "mfu",
)
# Columns of runs a finished child fills besides the metrics.
RUN_FACTS = ("dataset_used", "output_path", "torch_version", "python_version", "build_info",
             "applied", "load_before", "child_pid")
MACHINE_COLUMNS = (
    "hostname", "cpu_model", "vendor", "sockets", "physical_cores", "logical_cores", "numa_nodes",
    "smt", "isa_flags", "l1d_kb", "l2_kb", "l3_kb", "mem_total_gb", "mem_bw_gbs_1t", "mem_bw_gbs_all",
    "gemm_gflops_fp32_1c", "gemm_gflops_fp32_all", "gemm_gflops_bf16_1c", "gemm_gflops_bf16_all",
    "freq_driver", "freq_min_mhz", "freq_max_mhz", "kernel", "torch_version", "knobs",
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
SELECT_JOBS_BY_HASH = "SELECT config_hash, job_id FROM jobs WHERE config_hash IN ({marks})"
INSERT_JOB = """
INSERT INTO jobs (config_hash, sweep_id, run_order, config, derived, created, {columns})
VALUES (:config_hash, :sweep_id, :run_order, :config, :derived, {now}, {params})
ON CONFLICT (config_hash) DO NOTHING
"""
INSERT_SWEEP_JOB = """
INSERT INTO sweep_jobs (sweep_id, job_id) VALUES (:sweep_id, :job_id)
ON CONFLICT (sweep_id, job_id) DO NOTHING
"""

SELECT_MACHINE = "SELECT machine_id FROM machines WHERE fingerprint = :fingerprint"
INSERT_MACHINE = """
INSERT INTO machines (fingerprint, facts, first_seen, last_seen, {columns})
VALUES (:fingerprint, :facts, {now}, {now}, {params})
"""
UPDATE_MACHINE = "UPDATE machines SET facts = :facts, last_seen = {now}, {assignments} WHERE machine_id = :machine_id"

# The next job for this machine in run order: no run row yet, or a row taken back as 'queued'.
# Jobs wider than the worker's CPU pool wait for a worker that has the CPUs.
SELECT_NEXT_JOB = """
SELECT j.job_id, j.config, r.run_id
FROM jobs j
LEFT JOIN runs r ON r.job_id = j.job_id AND r.machine_id = :machine_id
WHERE (r.run_id IS NULL OR r.status = 'queued') AND j.cores <= :max_cores
ORDER BY j.run_order, j.job_id
LIMIT 1
"""
INSERT_RUN = """
INSERT INTO runs (job_id, machine_id, status, attempts, worker_pid, worker_host, claimed, heartbeat)
VALUES (:job_id, :machine_id, 'running', 1, :pid, :host, {now}, {now})
ON CONFLICT (job_id, machine_id) DO NOTHING
RETURNING run_id, attempts
"""
RECLAIM_RUN = """
UPDATE runs SET status = 'running', attempts = attempts + 1, worker_pid = :pid, worker_host = :host,
    claimed = {now}, heartbeat = {now}, finished = NULL, reason = NULL
WHERE run_id = :run_id AND status = 'queued'
RETURNING run_id, attempts
"""
HEARTBEAT = """
UPDATE runs SET heartbeat = {now}, child_pid = COALESCE(:child_pid, child_pid)
WHERE run_id = :run_id AND status = 'running'
"""
FINISH_RUN = """
UPDATE runs SET status = :status, finished = {now}, reason = :reason, {assignments}
WHERE run_id = :run_id AND status = 'running' AND worker_pid = :pid
"""
SELECT_RUNNING = """
SELECT run_id, worker_pid, worker_host, heartbeat, attempts, {now} AS now
FROM runs WHERE machine_id = :machine_id AND status = 'running'
"""
# Taken back only if nobody touched it since we looked (the heartbeat is the version).
TAKE_BACK = """
UPDATE runs SET status = CASE WHEN attempts >= :max_attempts THEN 'failed' ELSE 'queued' END,
    reason = CASE WHEN attempts >= :max_attempts THEN :failed_reason ELSE :reason END,
    finished = CASE WHEN attempts >= :max_attempts THEN {now} ELSE NULL END,
    worker_pid = NULL, child_pid = NULL
WHERE run_id = :run_id AND status = 'running' AND heartbeat = :heartbeat
"""
# A worker stopped by the user gives its run back without spending an attempt.
RELEASE_RUN = """
UPDATE runs SET status = 'queued', attempts = attempts - 1, worker_pid = NULL, child_pid = NULL, reason = :reason
WHERE run_id = :run_id AND status = 'running' AND worker_pid = :pid
"""
RETRY_RUNS = """
UPDATE runs SET status = 'queued', reason = NULL, finished = NULL, attempts = 0
WHERE machine_id = :machine_id AND status IN ({statuses})
"""
COUNT_RUNS = """
SELECT s.name AS sweep, r.status AS status, COUNT(*) AS n
FROM sweep_jobs sj JOIN sweeps s ON s.sweep_id = sj.sweep_id
JOIN runs r ON r.job_id = sj.job_id {machine_filter}
GROUP BY s.name, r.status
"""
COUNT_JOBS = """
SELECT s.name AS sweep, COUNT(*) AS n
FROM sweep_jobs sj JOIN sweeps s ON s.sweep_id = sj.sweep_id
GROUP BY s.name
"""
COUNT_ALL_JOBS = "SELECT COUNT(*) FROM jobs"
COUNT_ALL_RUNS = "SELECT status, COUNT(*) FROM runs {machine_filter} GROUP BY status"
COUNT_MACHINES = "SELECT COUNT(*) FROM machines"


@dataclass
class Claim:
    run_id: int
    job_id: int
    attempts: int
    config: dict


@dataclass
class EnqueueResult:
    new: int
    present: int
    sweep_id: int | None


def database_url(db: str) -> str:
    """A file path or an SQLAlchemy URL -> an SQLAlchemy URL."""
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).expanduser().resolve()}"


def schema_statements(dialect: str) -> list[str]:
    """schema.sql split into statements, adapted to the dialect."""
    sql = re.sub(r"--[^\n]*", "", SCHEMA_PATH.read_text())
    if dialect == "postgresql":
        sql = sql.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
        sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
        sql = sql.replace("CREATE VIEW IF NOT EXISTS", "CREATE OR REPLACE VIEW")
    return [s.strip() for s in sql.split(";") if s.strip()]


class Store:
    """The results database. Open it with `Store(db)`; the schema is applied on open."""

    def __init__(self, db: str, *, busy_timeout_s: float = 60.0):
        self.url = database_url(db)
        try:
            self.engine: Engine = create_engine(self.url, connect_args=self._connect_args(busy_timeout_s))
        except (SQLAlchemyError, ImportError, ValueError) as err:
            raise BenchError(f"cannot open database {db!r}: {err}") from err
        self.dialect = self.engine.dialect.name
        if self.dialect not in NOW:
            raise BenchError(f"database {db!r}: only SQLite and PostgreSQL are supported, not {self.dialect}")
        self.now = NOW[self.dialect]
        if self.dialect == "sqlite":
            self._sqlite_setup(busy_timeout_s)
        self._apply_schema()

    def _connect_args(self, busy_timeout_s: float) -> dict:
        if self.url.startswith("sqlite"):
            return {"timeout": busy_timeout_s, "isolation_level": None}
        return {"connect_timeout": 10}

    def _sqlite_setup(self, busy_timeout_s: float) -> None:
        # pysqlite's own transaction handling would defer BEGIN; we emit it ourselves so that
        # write transactions are BEGIN IMMEDIATE and take the write lock before reading.
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn):
            immediate = conn.get_execution_options().get("immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def _apply_schema(self) -> None:
        try:
            with self.transaction(write=True) as conn:
                for statement in schema_statements(self.dialect):
                    conn.exec_driver_sql(statement)
        except OperationalError as err:
            raise BenchError(f"cannot use database {self.url}: {err.orig}") from err

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Connection]:
        """The one way to talk to the database: commits on success, rolls back on error, closes."""
        with self.engine.connect() as conn:
            if write:
                conn = conn.execution_options(immediate=True)
            with conn.begin():
                yield conn

    def sql(self, statement: str, **parts: str):
        return text(statement.format(now=self.now, **parts))

    def clock(self) -> float:
        with self.transaction() as conn:
            return float(conn.execute(self.sql(SELECT_NOW)).scalar_one())

    # -- machines --------------------------------------------------------------------------

    def register_machine(self, facts: dict) -> int:
        """The machine's id, its row created or refreshed from the probe's facts."""
        values = {c: _sql_value(facts.get(c)) for c in MACHINE_COLUMNS}
        params = {"fingerprint": facts["fingerprint"], "facts": json.dumps(facts, sort_keys=True, default=str),
                  **values}
        with self.transaction(write=True) as conn:
            machine_id = conn.execute(text(SELECT_MACHINE), params).scalar_one_or_none()
            if machine_id is None:
                conn.execute(self.sql(INSERT_MACHINE, columns=", ".join(MACHINE_COLUMNS),
                                      params=", ".join(f":{c}" for c in MACHINE_COLUMNS)), params)
                return conn.execute(text(SELECT_MACHINE), params).scalar_one()
            conn.execute(self.sql(UPDATE_MACHINE, assignments=", ".join(f"{c} = :{c}" for c in MACHINE_COLUMNS)),
                         {**params, "machine_id": machine_id})
            return machine_id

    # -- the plan --------------------------------------------------------------------------

    def enqueue(self, *, name: str, source: str, sweep_text: str, jobs: list[dict], notes: list[str] = (),
                dry_run: bool = False) -> EnqueueResult:
        """Add the jobs not planned yet. `jobs` items: config (full), config_hash, run_order, and
        optionally derived (variable -> the word resolve() filled it from). `notes`
        (what expansion left out here, and why) are kept with the sweep for the report."""
        text_sha = _sha(sweep_text)
        columns = ", ".join(_quoted(n) for n in NAMES)
        insert = self.sql(INSERT_JOB, columns=columns, params=", ".join(f":{n}" for n in NAMES))
        with self.transaction(write=not dry_run) as conn:
            hashes = [j["config_hash"] for j in jobs]
            present = self._job_ids_by_hash(conn, hashes)
            new = [j for j in jobs if j["config_hash"] not in present]
            if dry_run:
                return EnqueueResult(new=len(new), present=len(jobs) - len(new), sweep_id=None)
            sweep_id = conn.execute(text(SELECT_SWEEP), {"name": name, "text_sha": text_sha}).scalar_one_or_none()
            if sweep_id is None:
                conn.execute(self.sql(INSERT_SWEEP), {"name": name, "source": source, "text": sweep_text,
                                                      "text_sha": text_sha, "notes": json.dumps(list(notes))})
                sweep_id = conn.execute(text(SELECT_SWEEP), {"name": name, "text_sha": text_sha}).scalar_one()
            if new:
                conn.execute(insert, [_job_row(j, sweep_id) for j in new])
            ids = self._job_ids_by_hash(conn, hashes).values()
            if ids:
                conn.execute(text(INSERT_SWEEP_JOB), [{"sweep_id": sweep_id, "job_id": i} for i in ids])
        return EnqueueResult(new=len(new), present=len(jobs) - len(new), sweep_id=sweep_id)

    def _job_ids_by_hash(self, conn: Connection, hashes: list[str]) -> dict[str, int]:
        """config_hash -> job_id of the jobs already planned, in chunks of SQL parameters."""
        found = {}
        for chunk in _chunks(hashes, 500):
            marks = ", ".join(f":h{i}" for i in range(len(chunk)))
            rows = conn.execute(text(SELECT_JOBS_BY_HASH.format(marks=marks)), {f"h{i}": h for i, h in enumerate(chunk)})
            found.update((config_hash, job_id) for config_hash, job_id in rows)
        return found

    # -- the queue -------------------------------------------------------------------------

    def claim(self, machine_id: int, *, pid: int, host: str, max_cores: int) -> Claim | None:
        """The next queued job for this machine, now 'running' for this worker; None when none is left."""
        for _ in range(1000):  # a PostgreSQL loser retries with the next job
            with self.transaction(write=True) as conn:
                row = conn.execute(text(SELECT_NEXT_JOB), {"machine_id": machine_id, "max_cores": max_cores}).first()
                if row is None:
                    return None
                job_id, config, run_id = row
                who = {"pid": pid, "host": host}
                if run_id is None:
                    got = conn.execute(self.sql(INSERT_RUN), {"job_id": job_id, "machine_id": machine_id, **who}).first()
                else:
                    got = conn.execute(self.sql(RECLAIM_RUN), {"run_id": run_id, **who}).first()
                if got is not None:
                    return Claim(run_id=got[0], job_id=job_id, attempts=got[1], config=json.loads(config))
        raise BenchError("could not claim a job after 1000 tries: is the database overloaded?")

    def heartbeat(self, run_id: int, child_pid: int | None = None) -> bool:
        with self.transaction(write=True) as conn:
            return conn.execute(self.sql(HEARTBEAT), {"run_id": run_id, "child_pid": child_pid}).rowcount == 1

    def finish(self, run_id: int, *, pid: int, status: str, reason: str | None = None, fields: dict | None = None) -> None:
        """Record the outcome of a claimed run. Raises BenchError if the run was taken away meanwhile."""
        assert status in ("done", "failed", "skipped"), status
        fields = {k: _sql_value(v) for k, v in (fields or {}).items() if k in METRICS or k in RUN_FACTS}
        assignments = ", ".join(f"{k} = :{k}" for k in fields) or "run_id = run_id"
        with self.transaction(write=True) as conn:
            changed = conn.execute(self.sql(FINISH_RUN, assignments=assignments),
                                   {"run_id": run_id, "pid": pid, "status": status, "reason": reason, **fields}).rowcount
        if changed != 1:
            raise BenchError(f"run {run_id} was taken back from this worker before it finished (heartbeat too old?)")

    def release(self, run_id: int, *, pid: int, reason: str) -> None:
        with self.transaction(write=True) as conn:
            conn.execute(text(RELEASE_RUN), {"run_id": run_id, "pid": pid, "reason": reason})

    def take_back_stale(self, machine_id: int, *, host: str, grace_s: float, max_attempts: int, is_alive) -> list[int]:
        """Put back in the queue the running runs whose worker is gone: its pid is dead on this host,
        or its heartbeat is older than grace_s. After max_attempts claims a run is failed instead."""
        taken = []
        with self.transaction(write=True) as conn:
            for run_id, pid, run_host, beat, attempts, now in conn.execute(self.sql(SELECT_RUNNING), {"machine_id": machine_id}).all():
                if run_host == host and pid is not None and not is_alive(pid):
                    why = f"worker pid {pid} on {host} died"
                elif beat is None or now - beat > grace_s:
                    why = f"no heartbeat from worker {pid}@{run_host} for {grace_s:g} s"
                else:
                    continue
                changed = conn.execute(self.sql(TAKE_BACK), {
                    "run_id": run_id, "heartbeat": beat, "max_attempts": max_attempts,
                    "reason": f"requeued: {why}",
                    "failed_reason": f"gave up after {attempts} attempts; last: {why}"}).rowcount
                if changed:
                    taken.append(run_id)
        return taken

    def retry(self, machine_id: int, *, failed: bool, skipped: bool) -> int:
        statuses = [s for s, on in (("failed", failed), ("skipped", skipped)) if on]
        if not statuses:
            return 0
        marks = ", ".join(f"'{s}'" for s in statuses)
        with self.transaction(write=True) as conn:
            return conn.execute(self.sql(RETRY_RUNS, statuses=marks), {"machine_id": machine_id}).rowcount

    # -- reading ---------------------------------------------------------------------------

    def counts(self, machine_id: int | None) -> dict:
        """total / queued / running / done / failed / skipped for one machine (None: all machines,
        where queued counts jobs times machines minus the runs)."""
        where = "WHERE machine_id = :machine_id" if machine_id is not None else ""
        with self.transaction() as conn:
            jobs = conn.execute(text(COUNT_ALL_JOBS)).scalar_one()
            machines = 1 if machine_id is not None else max(1, conn.execute(text(COUNT_MACHINES)).scalar_one())
            by_status = dict(conn.execute(text(COUNT_ALL_RUNS.format(machine_filter=where)), {"machine_id": machine_id}).all())
        out = {"total": jobs * machines}
        out.update({s: int(by_status.get(s, 0)) for s in STATUSES})
        out["queued"] = out["total"] - sum(out[s] for s in ("running", "done", "failed", "skipped"))
        return out

    def counts_by_sweep(self, machine_id: int | None) -> dict[str, dict]:
        where = "AND r.machine_id = :machine_id" if machine_id is not None else ""
        with self.transaction() as conn:
            totals = dict(conn.execute(text(COUNT_JOBS)).all())
            rows = conn.execute(text(COUNT_RUNS.format(machine_filter=where)), {"machine_id": machine_id}).all()
        out = {name: {"total": n, **{s: 0 for s in STATUSES}} for name, n in totals.items()}
        for name, status, n in rows:
            out[name][status] = n
        for c in out.values():
            c["queued"] = c["total"] - sum(c[s] for s in ("running", "done", "failed", "skipped"))
        return out


def _job_row(job: dict, sweep_id: int) -> dict:
    config = job["config"]
    row = {n: column_value(n, config[n]) for n in NAMES}
    derived = job.get("derived")
    row.update(config_hash=job["config_hash"], sweep_id=sweep_id, run_order=job["run_order"],
               config=json.dumps(config, sort_keys=True),
               derived=None if derived is None else json.dumps(derived, sort_keys=True))
    return row


def _quoted(name: str) -> str:
    return f'"{name}"' if name == "window" else name


def _sql_value(value):
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]

