"""`bench.py merge OTHER.db ...`: bring the machines, sweeps, jobs and runs of other results databases
(machines that ran offline) into this one. Idempotent: merging a database twice adds nothing.

Identity is what the schema already uses: a machine is its fingerprint, a sweep its (name, text),
a job its config_hash, a pool its name (a named pool) or its machine (a machine's own pool), and a
run its (job, pool). Decisions:
- Any schema version: an SQLite file is copied (the original is never touched, nor locked for long)
  and the copy is opened like any database, which migrates it; a URL is opened as every command
  opens it (migrated in place). A database from a newer release is refused.
- Only finished runs (done, failed, skipped) are results. A run still 'running' or 'queued' in the
  other database is left out and counted: here its job is simply queued.
- A run already here for the same job and pool: identical (same status, claim and finish times,
  worker) counts as present; a run here that is only 'queued' takes the imported result; any other
  difference is a conflict: the run here is kept, and the merge says which (never two runs of one
  job in one pool, never a silent overwrite of a measurement).
- Effects are not merged: they are fitted from runs, and the next report refits them.
- Pools whose queue exists here get the new jobs, and lose the jobs whose result was imported.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Connection

from common.errors import BadInput
from common import scratch
from orchestrator.queue.store import PG_QUEUE_LOCK, Store, database_url, safe_url
from orchestrator.stats.applied_cut import read_text

FINISHED = ("done", "failed", "skipped")
SAME_RUN = ("status", "claimed", "finished", "worker_host", "worker_pid")

SELECT_ALL = "SELECT * FROM {table}"
SELECT_COLUMNS = "SELECT * FROM {table} WHERE 1 = 0"
SELECT_MACHINE_IDS = "SELECT fingerprint, machine_id FROM machines"
SELECT_SWEEP_IDS = "SELECT name, text_sha, sweep_id FROM sweeps"
SELECT_JOB_IDS = "SELECT config_hash, job_id FROM jobs"
SELECT_POOL_IDS = "SELECT pool_id, name, machine_id FROM pools"
SELECT_RUNS = "SELECT * FROM runs"
SELECT_BOOLEANS = """
SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = :table AND data_type = 'boolean'
"""
SELECT_MAX_JOB = "SELECT COALESCE(MAX(job_id), 0) FROM jobs"
INSERT_OWN_POOL = ("INSERT INTO pools (machine_id, created) VALUES (:machine_id, :created) "
                   "ON CONFLICT (machine_id) DO NOTHING")
INSERT_NAMED_POOL = "INSERT INTO pools (name, created) VALUES (:name, :created) ON CONFLICT (name) DO NOTHING"
INSERT_SWEEP_JOB = """
INSERT INTO sweep_jobs (sweep_id, job_id) VALUES (:sweep_id, :job_id) ON CONFLICT (sweep_id, job_id) DO NOTHING
"""
# Queues made here already: the merged jobs join them, the jobs with an imported result leave them.
QUEUE_MERGED_JOBS = """
INSERT INTO queue (pool_id, job_id, run_order, cores)
SELECT p.pool_id, j.job_id, j.run_order, j.cores FROM jobs j JOIN pools p ON p.filled IS NOT NULL
WHERE j.job_id > :after
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.job_id AND r.pool_id = p.pool_id AND r.status <> 'queued')
ON CONFLICT (pool_id, job_id) DO NOTHING
"""
UNQUEUE_FINISHED = """
DELETE FROM queue WHERE EXISTS (
    SELECT 1 FROM runs r WHERE r.job_id = queue.job_id AND r.pool_id = queue.pool_id AND r.status <> 'queued')
"""


@dataclass
class MergeResult:
    source: str
    machines: list[int] = field(default_factory=lambda: [0, 0])  # [new, already here]
    sweeps: list[int] = field(default_factory=lambda: [0, 0])
    jobs: list[int] = field(default_factory=lambda: [0, 0])
    runs: list[int] = field(default_factory=lambda: [0, 0])  # [imported, already here]
    replaced: int = 0  # runs here that were only 'queued', now the imported result
    unfinished: int = 0  # running or queued there: left out
    conflicts: list[str] = field(default_factory=list)  # kept the run here; what differed


def read_source(other: str) -> dict:
    """Every row merge() needs from another database (checked, migrated in a copy if it is a file)."""
    with _opened(other) as source:
        return _read(source)


def merge(target: Store, other: str, rows: dict | None = None) -> MergeResult:
    """Import one other database into `target`, in one transaction; `rows` if read_source() read it."""
    if database_url(other) == target.url:
        raise BadInput(f"merge {safe_url(other)}: that is the database being merged into")
    if rows is None:
        rows = read_source(other)
    result = MergeResult(source=safe_url(other))
    with target.transaction(write=True) as conn:
        if target.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_QUEUE_LOCK})
        after = conn.execute(text(SELECT_MAX_JOB)).scalar_one()
        machines = _merge_keyed(conn, "machines", rows["machines"], key=("fingerprint",), id_column="machine_id",
                                known=SELECT_MACHINE_IDS, count=result.machines)
        sweeps = _merge_keyed(conn, "sweeps", rows["sweeps"], key=("name", "text_sha"), id_column="sweep_id",
                              known=SELECT_SWEEP_IDS, count=result.sweeps)
        jobs = _merge_keyed(conn, "jobs", rows["jobs"], key=("config_hash",), id_column="job_id",
                            known=SELECT_JOB_IDS, count=result.jobs, remap={"sweep_id": sweeps})
        links = [{"sweep_id": sweeps[r["sweep_id"]], "job_id": jobs[r["job_id"]]} for r in rows["sweep_jobs"]]
        if links:
            conn.execute(text(INSERT_SWEEP_JOB), links)
        pools = _merge_pools(conn, rows["pools"], machines)
        _merge_runs(conn, rows["runs"], jobs, machines, pools, result, rows)
        conn.execute(text(QUEUE_MERGED_JOBS), {"after": after})
        conn.execute(text(UNQUEUE_FINISHED))
    return result


def _file_of(other: str) -> Path:
    """The file an SQLite source names, as a path or an sqlite:/// URL."""
    if other.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        return Path(make_url(other).database or "").expanduser()
    return Path(other).expanduser()


def check_source(other: str) -> Path | None:
    """An SQLite source that is not a file is bad input; checked for every source before the
    database merged into is opened (or created)."""
    if "://" in other and not other.startswith("sqlite"):
        return None
    path = _file_of(other)
    if not path.is_file():
        raise BadInput(f"merge: {path} is " + ("a directory" if path.is_dir() else "not a file") +
                       ": give the results database file to merge")
    return path


class _opened:
    """The other database opened through the migrations: an SQLite file as a temporary copy."""

    def __init__(self, other: str):
        self.other = other
        self.tmp: Path | None = None

    def __enter__(self) -> Store:
        if "://" in self.other and not self.other.startswith("sqlite"):
            self.store = Store(self.other)
            return self.store
        path = check_source(self.other)  # an sqlite:/// URL too: read as its file, never created
        self.tmp = scratch.make("cpubench-merge-")
        try:
            self.store = self._copy(path)
        except BaseException:  # __exit__ is not called when __enter__ raises: the copy goes here
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return self.store

    def _copy(self, path: Path) -> Store:
        """A consistent copy of the SQLite file `path` in self.tmp, opened through the migrations."""
        copy = self.tmp / path.name
        try:
            # Immutable (no -wal/-shm made, nothing locked) unless a writer's -wal is there to be read:
            # a read-only WAL reader would leave side files it may not remove. On read-only media
            # SQLite cannot make the -shm file a WAL reader needs anyway, and nobody writes there.
            live = Path(f"{path.resolve()}-wal").exists() and os.access(path.resolve().parent, os.W_OK)
            flags = "mode=ro" if live else "mode=ro&immutable=1"
            # closing(): a connection's own `with` commits but does not close, and an open reader
            # would leave -wal and -shm files beside a source merge promises never to change
            with closing(sqlite3.connect(f"file:{path.resolve()}?{flags}", uri=True)) as src, \
                    closing(sqlite3.connect(copy)) as dst:
                src.backup(dst)  # a consistent copy, WAL included
                if not dst.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone():
                    raise BadInput(f"merge: {path} is not a cpubench results database (no jobs table)")
        except sqlite3.DatabaseError as err:
            raise BadInput(f"merge: {path} is not an SQLite database: {err}") from None
        return Store(str(copy))

    def __exit__(self, *exc) -> None:
        if hasattr(self, "store"):
            self.store.engine.dispose()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _read(source: Store) -> dict[str, list[dict]]:
    with source.transaction() as conn:
        return {table: [dict(r) for r in conn.execute(text(SELECT_ALL.format(table=table))).mappings()]
                for table in ("machines", "sweeps", "jobs", "sweep_jobs", "pools", "runs")}


def _columns(conn: Connection, table: str) -> list[str]:
    return list(conn.execute(text(SELECT_COLUMNS.format(table=table))).keys())


def _quoted(name: str) -> str:
    return f'"{name}"' if name == "window" else name


def _insert(conn: Connection, table: str, columns: list[str], rows: list[dict]) -> None:
    if not rows:
        return
    # SQLite keeps booleans as 0/1; PostgreSQL takes only true/false for a BOOLEAN column.
    flags = set()
    if conn.dialect.name == "postgresql":
        flags = {r[0] for r in conn.execute(text(SELECT_BOOLEANS), {"table": table})}
    conn.execute(text(f"INSERT INTO {table} ({', '.join(map(_quoted, columns))}) "
                      f"VALUES ({', '.join(':' + c for c in columns)})"),
                 [{c: (bool(r.get(c)) if c in flags and r.get(c) is not None else r.get(c)) for c in columns}
                  for r in rows])


def _merge_keyed(conn: Connection, table: str, rows: list[dict], *, key: tuple[str, ...], id_column: str,
                 known: str, count: list[int], remap: dict[str, dict] | None = None) -> dict[int, int]:
    """Rows found here by their key are mapped; the others inserted. Their id there -> id here."""
    here = {tuple(r[:-1]): r[-1] for r in conn.execute(text(known))}
    new = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if k not in here and k not in new:
            new[k] = {**row, **{c: ids[row[c]] for c, ids in (remap or {}).items()}}
    _insert(conn, table, [c for c in _columns(conn, table) if c != id_column], list(new.values()))
    count[0] += len(new)
    count[1] += len(rows) - len(new)
    if new:
        here = {tuple(r[:-1]): r[-1] for r in conn.execute(text(known))}
    return {row[id_column]: here[tuple(row[c] for c in key)] for row in rows}


def _merge_pools(conn: Connection, rows: list[dict], machines: dict[int, int]) -> dict[int, int]:
    for row in rows:
        if row["name"] is None:
            conn.execute(text(INSERT_OWN_POOL), {"machine_id": machines[row["machine_id"]], "created": row["created"]})
        else:
            conn.execute(text(INSERT_NAMED_POOL), {"name": row["name"], "created": row["created"]})
    by_machine, by_name = {}, {}
    for pool_id, name, machine_id in conn.execute(text(SELECT_POOL_IDS)):
        if name is None:
            by_machine[machine_id] = pool_id
        else:
            by_name[name] = pool_id
    return {row["pool_id"]: by_name[row["name"]] if row["name"] is not None else by_machine[machines[row["machine_id"]]]
            for row in rows}


def _merge_runs(conn: Connection, rows: list[dict], jobs: dict, machines: dict, pools: dict, result: MergeResult,
                source: dict) -> None:
    here = {(r["job_id"], r["pool_id"]): r for r in conn.execute(text(SELECT_RUNS)).mappings()}
    columns = [c for c in _columns(conn, "runs") if c != "run_id"]
    hashes = {r["job_id"]: r["config_hash"] for r in source["jobs"]}
    hosts = {r["machine_id"]: r["hostname"] for r in source["machines"]}
    new, replacing = [], []
    for theirs in rows:
        if theirs["status"] not in FINISHED:
            result.unfinished += 1
            continue
        row = {**theirs, "job_id": jobs[theirs["job_id"]], "machine_id": machines[theirs["machine_id"]],
               "pool_id": pools[theirs["pool_id"]],
               "applied_read": read_text(theirs.get("applied"))}  # the keys this release's report reads
        existing = here.get((row["job_id"], row["pool_id"]))
        if existing is None:
            new.append(row)
            here[(row["job_id"], row["pool_id"])] = row
        elif all(existing[c] == row[c] for c in SAME_RUN):
            result.runs[1] += 1
        elif existing["status"] == "queued":
            replacing.append({**{c: row.get(c) for c in columns}, "run_id": existing["run_id"]})
        else:
            result.conflicts.append(
                f"job {hashes[theirs['job_id']][:12]} on {hosts.get(theirs['machine_id']) or 'its machine'}: kept the "
                f"{existing['status']} run here (run {existing['run_id']}), not the other database's {row['status']} "
                f"one (run {theirs['run_id']})")
    _insert(conn, "runs", columns, new)
    result.runs[0] += len(new)
    if replacing:
        assignments = ", ".join(f"{_quoted(c)} = :{c}" for c in columns)
        conn.execute(text(f"UPDATE runs SET {assignments} WHERE run_id = :run_id"), replacing)
        result.replaced += len(replacing)
