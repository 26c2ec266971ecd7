"""Schema versions: a results database outlives releases (Optuna's storage habit).

schema.sql is the latest schema. A database records the versions it was brought to in
`schema_version`; the release before versions existed had no such table: that is version 1. On open:

- an up-to-date database costs one SELECT: no DDL is re-run (PostgreSQL's CREATE OR REPLACE VIEW
  raced between clients when every open re-applied the schema);
- an empty database gets schema.sql and the latest version;
- an older one is migrated by the numbered steps in MIGRATIONS, each applied once, all in one
  transaction, under a lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock), and the
  version is read again under the lock, so two processes opening an old database at once migrate it
  once;
- a database from a newer release is refused: this code would not know its columns.

Step 2 (version 1 -> 2) is mostly generic, so that the columns and tables other workstreams add to
schema.sql need no hand-written ALTER: tables schema.sql has and the database lacks are created;
on SQLite a table whose definition differs from schema.sql is rebuilt from it (SQLite's documented
12-step table rebuild: new table, copy, drop, rename), so a migrated database is column-for-column
the same as a fresh one; on PostgreSQL the missing columns are added (at the end: PostgreSQL cannot
reorder columns). A new column takes its DEFAULT or NULL in old rows, or the expression in FILLS; a
NOT NULL column with neither is a programming error that names itself. Jobs are completed from the
catalogue: a variable the old release did not have gets its default (the value the old release ran
with), and config/config_hash are recomputed, so re-enqueueing an old sweep finds its jobs. Indexes
and views are (re)made from schema.sql. The specific part of step 2: pools (each machine becomes its
own pool, every old run belongs to its machine's pool, runs are unique per (job, pool)). Step 3
(version 2, the first release with versions -> 3) is the generic part alone: a release that only adds
columns, tables and catalogue variables needs a new number and nothing else.

The generic part always targets the latest schema.sql: a later step that needs an intermediate
shape must run its own statements before calling `reconcile`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from common.paths import REPO
from common.errors import BadInput, BenchError

SCHEMA_PATH = REPO / "schema.sql"

# Any constant will do; it only has to be the same for every cpubench process on one server.
PG_SCHEMA_LOCK = 0x63707562656E6368 >> 1  # "cpubench", halved to fit a signed bigint

CONSTRAINT_WORDS = ("UNIQUE", "PRIMARY KEY", "CHECK", "FOREIGN KEY", "CONSTRAINT")

# How PostgreSQL stores the columns schema.sql cannot say (SQLite has no such setting): each run's `applied`
# (~3 KB of JSON, its own in every run) out of line and uncompressed (EXTERNAL, every server version),
# rather than pglz-compressed: the report reads every run's whole, twice, and the server then decompresses
# none of them, for ~12% more space on disk.
PG_STORAGE = ("ALTER TABLE runs ALTER COLUMN applied SET STORAGE EXTERNAL",)

SELECT_VERSION = "SELECT MAX(version) FROM schema_version"
INSERT_VERSION = "INSERT INTO schema_version (version, applied, note) VALUES (:version, {now}, :note)"
SQLITE_TABLES = "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
SQLITE_VIEWS = "SELECT name FROM sqlite_master WHERE type = 'view'"
PG_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
PG_VIEWS = "SELECT viewname FROM pg_views WHERE schemaname = current_schema()"
PG_COLUMNS = """
SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = :table
"""


class SchemaTooNew(BenchError):
    """The database was written by a newer release: refuse before touching it."""

    exit_code = 2


# -- schema.sql, parsed ---------------------------------------------------------------------------

@dataclass
class Table:
    name: str
    statement: str  # the CREATE TABLE statement, adapted to the dialect
    columns: dict[str, str]  # name -> its definition after the name ("INTEGER NOT NULL DEFAULT 0")


@dataclass
class Schema:
    tables: dict[str, Table]  # in schema.sql order
    indexes: list[str]  # CREATE INDEX statements
    views: dict[str, str]  # name -> CREATE VIEW statement
    statements: list[str]  # everything, in order: what a fresh database runs


def schema_statements(dialect: str) -> list[str]:
    """schema.sql split into statements, adapted to the dialect."""
    sql = re.sub(r"--[^\n]*", "", SCHEMA_PATH.read_text())
    if dialect == "postgresql":
        sql = sql.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
        sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
        sql = sql.replace("CREATE VIEW IF NOT EXISTS", "CREATE OR REPLACE VIEW")
    return [s.strip() for s in sql.split(";") if s.strip()]


def parse_schema(dialect: str) -> Schema:
    schema = Schema(tables={}, indexes=[], views={}, statements=schema_statements(dialect))
    for statement in schema.statements:
        if m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)$", statement, re.S):
            columns = {}
            for part in _top_level_split(m.group(2)):
                if not part.upper().startswith(CONSTRAINT_WORDS):
                    name, _, definition = part.partition(" ")
                    columns[name.strip('"')] = definition.strip()
            schema.tables[m.group(1)] = Table(m.group(1), statement, columns)
        elif re.match(r"CREATE (UNIQUE )?INDEX", statement):
            schema.indexes.append(statement)
        elif m := re.match(r"CREATE (?:OR REPLACE )?VIEW (?:IF NOT EXISTS )?(\w+)", statement):
            schema.views[m.group(1)] = statement
        else:
            raise AssertionError(f"schema.sql: a statement of an unknown kind: {statement[:60]}")
    return schema


def _top_level_split(body: str) -> list[str]:
    """A table body split on the commas outside parentheses, whitespace collapsed."""
    parts, depth, current = [], 0, []
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += (ch == "(") - (ch == ")")
        current.append(ch)
    parts.append("".join(current))
    return [" ".join(p.split()) for p in parts if p.strip()]


def _normalised(statement: str) -> str:
    """A CREATE TABLE statement as SQLite keeps it, for comparison: no IF NOT EXISTS, no quotes
    around the table's name (a renamed table gets them), whitespace collapsed."""
    s = " ".join(statement.split())
    s = s.replace("CREATE TABLE IF NOT EXISTS ", "CREATE TABLE ")
    s = re.sub(r'^CREATE TABLE "(\w+)"', r"CREATE TABLE \1", s)
    return s.replace("( ", "(").replace(" )", ")")


# -- versions -------------------------------------------------------------------------------------

def table_names(conn: Connection, dialect: str) -> set[str]:
    query = SQLITE_TABLES if dialect == "sqlite" else PG_TABLES
    return {row[0] for row in conn.exec_driver_sql(query)}


# The tables of version 1, the release before schema_version: all of them, or it is not ours.
V1_TABLES = {"machines", "sweeps", "jobs", "runs"}


class ForeignDatabase(BenchError):
    """The database holds another application's tables: refused before anything is written."""

    exit_code = 2


def current_version(conn: Connection, dialect: str) -> int | None:
    """The database's version; None for an empty database (no table at all). A database with tables
    but neither a schema_version nor version 1's tables is another application's: ForeignDatabase."""
    tables = table_names(conn, dialect)
    if "schema_version" in tables:
        return conn.exec_driver_sql(SELECT_VERSION).scalar_one() or 1
    if V1_TABLES <= tables:
        return 1
    if tables:
        shown = ", ".join(sorted(tables)[:6]) + (f" and {len(tables) - 6} more" if len(tables) > 6 else "")
        raise ForeignDatabase(f"is not a cpubench database: it holds the table(s) {shown} and no schema_version; "
                              f"left as it was (give --db a new file, or a cpubench results database)")
    return None


def upgrade(store) -> str | None:
    """Bring the store's database to LATEST. Returns what was done ("created", "migrated from
    version N"), or None when it was up to date (then only one SELECT ran)."""
    try:
        with store.transaction() as conn:
            version = current_version(conn, store.dialect)
    except ForeignDatabase as err:
        raise ForeignDatabase(f"{store.where} {err}") from None
    _refuse_newer(store, version)
    if version == LATEST:
        return None
    if version is None and not getattr(store, "create", True):  # a read command (or retry, work) creates nothing
        raise BadInput(f"{store.where} holds no cpubench database yet (no tables): nothing was enqueued there")
    with _migration_transaction(store) as conn:
        version = current_version(conn, store.dialect)  # again, under the lock: someone may have done it
        _refuse_newer(store, version)
        if version == LATEST:
            return None
        now = store.now
        if version is None:
            for statement in parse_schema(store.dialect).statements:
                conn.exec_driver_sql(statement)
            _storage(conn, store.dialect)
            conn.execute(text(INSERT_VERSION.format(now=now)), {"version": LATEST, "note": "created"})
            return "created"
        for step in range(version + 1, LATEST + 1):
            note = MIGRATIONS[step](conn, store.dialect)
            conn.execute(text(INSERT_VERSION.format(now=now)), {"version": step, "note": note})
        return f"migrated from version {version}"


def _refuse_newer(store, version: int | None) -> None:
    if version is not None and version > LATEST:
        raise SchemaTooNew(f"database {store.display_url} has schema version {version}, written by a newer "
                           f"cpubench; this one knows versions up to {LATEST}: upgrade cpubench to use it")


class _migration_transaction:
    """One transaction holding the schema lock. On SQLite, foreign keys are off on this connection
    while tables are rebuilt (the pragma cannot change inside a transaction), and checked before
    the commit."""

    def __init__(self, store):
        self.store = store

    def __enter__(self) -> Connection:
        self.conn = self.store.engine.connect()
        if self.store.dialect == "sqlite":
            self.conn.connection.dbapi_connection.execute("PRAGMA foreign_keys=OFF")
            self.conn = self.conn.execution_options(immediate=True)
        self.tx = self.conn.begin()
        if self.store.dialect == "postgresql":
            self.conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_SCHEMA_LOCK})
        return self.conn

    def __exit__(self, kind, error, tb) -> None:
        try:
            if kind is None:
                self._check()
                self.tx.commit()
            else:
                self.tx.rollback()
        except BaseException:
            if self.tx.is_active:
                self.tx.rollback()
            raise
        finally:
            if self.store.dialect == "sqlite":
                self.conn.connection.dbapi_connection.execute("PRAGMA foreign_keys=ON")
            self.conn.close()

    def _check(self) -> None:
        if self.store.dialect == "sqlite":
            broken = self.conn.exec_driver_sql("PRAGMA foreign_key_check").all()
            if broken:
                raise BenchError(f"migration would leave {len(broken)} broken references (e.g. {tuple(broken[0])}); "
                                 f"nothing was changed")


# -- the generic part: bring tables, indexes and views to schema.sql ----------------------------

def reconcile(conn: Connection, dialect: str, fills: dict[tuple[str, str], str]) -> list[str]:
    """Create missing tables, bring existing ones to schema.sql's definition, complete jobs from the
    catalogue, remake indexes and views. `fills`: (table, column) -> an SQL expression over the old
    row (alias `old`) for a column, new or not; a new column without one gets its DEFAULT or NULL.
    Returns what it did, for the note."""
    schema = parse_schema(dialect)
    done = []
    for view in _views(conn, dialect):
        conn.exec_driver_sql(f"DROP VIEW IF EXISTS {view}")
    present = table_names(conn, dialect)
    fills = dict(fills)
    if "jobs" in present and (completed := _stage_job_completion(conn, dialect, fills)):
        done.append(completed)
    for table in schema.tables.values():
        if table.name not in present:
            conn.exec_driver_sql(table.statement)
            done.append(f"created {table.name}")
        elif changed := (_rebuild_sqlite if dialect == "sqlite" else _add_columns_pg)(conn, table, fills):
            done.append(changed)
    conn.exec_driver_sql("DROP TABLE IF EXISTS jobs_completed")
    for statement in schema.indexes:
        conn.exec_driver_sql(statement)
    for statement in schema.views.values():
        conn.exec_driver_sql(statement)
    return done


def _views(conn: Connection, dialect: str) -> list[str]:
    return [row[0] for row in conn.exec_driver_sql(SQLITE_VIEWS if dialect == "sqlite" else PG_VIEWS)]


def _columns(conn: Connection, dialect: str, table: str) -> list[str]:
    if dialect == "sqlite":
        return [row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")]
    return [row[0] for row in conn.execute(text(PG_COLUMNS), {"table": table})]


def _needs_value(table: Table, column: str) -> bool:
    definition = table.columns[column].upper()
    return "NOT NULL" in definition and "DEFAULT" not in definition and "PRIMARY KEY" not in definition


def _no_fill(table: Table, column: str) -> BenchError:
    return BenchError(f"schema.sql: new column {table.name}.{column} is NOT NULL without a DEFAULT: old rows "
                      f"cannot have it; give it a DEFAULT, or a fill in orchestrator/queue/migrations.py")


def _rebuild_sqlite(conn: Connection, table: Table, fills: dict) -> str | None:
    """SQLite's 12-step rebuild when the table's definition differs from schema.sql (columns, their
    order, types or constraints): create it anew, copy the rows, drop the old, rename."""
    stored = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (table.name,)).scalar_one()
    if _normalised(stored) == _normalised(table.statement):
        return None
    old = _columns(conn, "sqlite", table.name)
    target, values = [], []
    for column in table.columns:
        if (table.name, column) in fills:
            target.append(_quote(column))
            values.append(fills[(table.name, column)])
        elif column in old:
            target.append(_quote(column))
            values.append(f"old.{_quote(column)}")
        elif _needs_value(table, column):
            raise _no_fill(table, column)
    temporary = f"{table.name}__new"
    conn.exec_driver_sql(table.statement.replace(f"CREATE TABLE IF NOT EXISTS {table.name} (",
                                                 f"CREATE TABLE {temporary} (", 1))
    conn.exec_driver_sql(f"INSERT INTO {temporary} ({', '.join(target)}) SELECT {', '.join(values)} "
                         f"FROM {table.name} AS old")
    conn.exec_driver_sql(f"DROP TABLE {table.name}")
    conn.exec_driver_sql(f"ALTER TABLE {temporary} RENAME TO {table.name}")
    dropped = [c for c in old if c not in table.columns]
    added = [c for c in table.columns if c not in old]
    return f"rebuilt {table.name}" + (f" (+{', '.join(added)})" if added else "") + (
        f" (-{', '.join(dropped)})" if dropped else "")


def _add_columns_pg(conn: Connection, table: Table, fills: dict) -> str | None:
    """PostgreSQL: add the columns the table lacks (nullable first, filled, then NOT NULL as
    declared), and apply the fills of existing columns. Constraint changes are the numbered step's
    own statements."""
    old = _columns(conn, "postgresql", table.name)
    added = [c for c in table.columns if c not in old]
    for column in added:
        if _needs_value(table, column) and (table.name, column) not in fills:
            raise _no_fill(table, column)
        loose = re.sub(r"\bNOT NULL\b", "", table.columns[column])
        conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {_quote(column)} {loose}")
    assignments = [f"{_quote(c)} = {fills[(table.name, c)]}" for c in table.columns if (table.name, c) in fills]
    if assignments:
        conn.exec_driver_sql(f"UPDATE {table.name} AS old SET {', '.join(assignments)}")
    for column in added:
        if "NOT NULL" in table.columns[column].upper():
            conn.exec_driver_sql(f"ALTER TABLE {table.name} ALTER COLUMN {_quote(column)} SET NOT NULL")
    return f"added {table.name}.({', '.join(added)})" if added else None


def _stage_job_completion(conn: Connection, dialect: str, fills: dict) -> str | None:
    """Jobs planned before a catalogue variable existed get its default (what the old release ran
    with); config and config_hash (job identity) are recomputed. The values are staged in a
    temporary table that the fills of jobs' columns read."""
    from common.variables import BY_NAME, NAMES, column_value, config_hash, resolve, unset_value

    missing = [n for n in NAMES if n not in _columns(conn, dialect, "jobs")]
    if not missing:
        return None
    block = "block" if "block" in _columns(conn, dialect, "jobs") else "NULL"  # part of the identity (version 4)
    rows = conn.exec_driver_sql(f"SELECT job_id, config, {block} FROM jobs").all()
    staged = []
    for job_id, config_json, job_block in rows:
        old = json.loads(config_json)
        partial = {k: v for k, v in old.items() if k in NAMES}
        config, _ = resolve(partial, int(old.get("cores") or 1))
        # a variable the old release did not have takes the value it ran with (blas: BLAS_OF), not auto's today
        later = {n: unset_value(BY_NAME[n], config) for n in NAMES if n not in partial and BY_NAME[n].since > 1}
        config, _ = resolve(partial | later, int(old.get("cores") or 1))
        staged.append({"job_id": job_id, "config": json.dumps(config, sort_keys=True),
                       "config_hash": config_hash(config, job_block),
                       **{f"v{i}": column_value(n, config[n]) for i, n in enumerate(missing)}})
    columns = ["config", "config_hash", *missing]
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE jobs_completed (job_id BIGINT PRIMARY KEY, config TEXT, "
                         f"config_hash TEXT, {', '.join(f'{_quote(n)} {_sql_type(n)}' for n in missing)})")
    if staged:
        marks = ", ".join([":job_id", ":config", ":config_hash", *(f":v{i}" for i in range(len(missing)))])
        conn.execute(text(f"INSERT INTO jobs_completed (job_id, {', '.join(_quote(c) for c in columns)}) "
                          f"VALUES ({marks})"), staged)
    for column in columns:
        fills[("jobs", column)] = f"(SELECT c.{_quote(column)} FROM jobs_completed c WHERE c.job_id = old.job_id)"
    return f"completed {len(rows)} jobs with {', '.join(missing)}"


def _sql_type(name: str) -> str:
    from common.variables import BY_NAME

    return {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION"}.get(BY_NAME[name].sql_type, BY_NAME[name].sql_type)


def _quote(name: str) -> str:
    return f'"{name}"' if name == "window" else name


# -- the numbered steps ---------------------------------------------------------------------------

INSERT_MACHINE_POOLS = """
INSERT INTO pools (machine_id, created)
SELECT machine_id, first_seen FROM machines
WHERE machine_id NOT IN (SELECT machine_id FROM pools WHERE machine_id IS NOT NULL)
"""
RUN_POOL = "(SELECT pool_id FROM pools WHERE pools.machine_id = old.machine_id)"


def _to_2(conn: Connection, dialect: str) -> str:
    """Version 1 -> 2: schema versions, pools and the queue table, and whatever schema.sql gained."""
    if dialect == "postgresql":
        conn.exec_driver_sql("ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_job_id_machine_id_key")
    schema = parse_schema(dialect)
    if "pools" not in table_names(conn, dialect):
        conn.exec_driver_sql(schema.tables["pools"].statement)  # before reconcile: runs' fill reads it
    conn.exec_driver_sql(INSERT_MACHINE_POOLS)
    done = reconcile(conn, dialect, fills={("runs", "pool_id"): RUN_POOL})
    if dialect == "postgresql":
        conn.exec_driver_sql("ALTER TABLE runs ADD CONSTRAINT runs_job_id_pool_id_key UNIQUE (job_id, pool_id)")
    return "from version 1: each machine its own pool; " + "; ".join(done)


def _to_3(conn: Connection, dialect: str) -> str:
    """Version 2 -> 3: what this release added to schema.sql and the catalogue (metrics such as
    trainable_params and steal_s, runs.worker_started, variables such as lora_rank), generically."""
    done = reconcile(conn, dialect, fills={})
    return "from version 2: " + ("; ".join(done) or "views remade")


def _to_4(conn: Connection, dialect: str) -> str:
    """Version 3 -> 4: jobs.block (the comparison a job runs beside; NULL for the jobs planned
    before, whose pass was one shuffled block) and v_results.block."""
    done = reconcile(conn, dialect, fills={})
    return "from version 3: " + ("; ".join(done) or "views remade")


def _to_5(conn: Connection, dialect: str) -> str:
    """Version 4 -> 5: the variables compiler and blas (jobs get them from the catalogue: gcc, and the
    library their framework ran), and runs.gemm_format (NULL in old runs: they did not record it)."""
    done = reconcile(conn, dialect, fills={})
    return "from version 4: " + ("; ".join(done) or "views remade")


def _to_6(conn: Connection, dialect: str) -> str:
    """Version 5 -> 6: the variables ranks and nodes (old jobs ran one process on one machine: 1 and 1)
    and the data-parallel metrics world_size, global_batch, allreduce_ms, allreduce_share (NULL in old runs)."""
    done = reconcile(conn, dialect, fills={})
    return "from version 5: " + ("; ".join(done) or "views remade")


def _to_7(conn: Connection, dialect: str) -> str:
    """Version 6 -> 7: the variables lr (old jobs trained at their optimizer's default, variables.LR_OF),
    lr_schedule (constant), max_tokens and target_loss (none: NULL) and eval_every (0); the metrics
    val_loss, eval_s, train_tokens and the time-to-target ones (NULL in old runs: none was measured);
    the curves table and the v_curves view."""
    done = reconcile(conn, dialect, fills={})
    return "from version 6: " + ("; ".join(done) or "views remade")


def _to_8(conn: Connection, dialect: str) -> str:
    """Version 7 -> 8: the budgets and budget_decisions tables (`run --budget`); runs.strikes (claims
    the job itself likely ended; 0 in old runs, whose take-backs were all counted as attempts: attempts -
    strikes now counts them toward the higher cap of uncounted take-backs) and runs.child_started (NULL
    in old runs: a run the old release left running is taken back uncounted, as if its child had not
    started)."""
    done = reconcile(conn, dialect, fills={})
    return "from version 7: " + ("; ".join(done) or "views remade")


def _to_9(conn: Connection, dialect: str) -> str:
    """Version 8 -> 9: the variable interconnect (old jobs ran over the links as they were: default)."""
    done = reconcile(conn, dialect, fills={})
    return "from version 8: " + ("; ".join(done) or "views remade")


def _to_10(conn: Connection, dialect: str) -> str:
    """Version 9 -> 10: on PostgreSQL, runs.applied is stored uncompressed (PG_STORAGE). The runs written
    before keep their values as they were written (compressed): only the runs written from now on are
    read without decompressing. SQLite: nothing changes."""
    _storage(conn, dialect)
    return ("from version 9: runs.applied stored uncompressed from now on" if dialect == "postgresql"
            else "from version 9: nothing on SQLite")


def _to_11(conn: Connection, dialect: str) -> str:
    """Version 10 -> 11: runs.applied_read, the keys of each run's applied the report reads (written with
    applied when a run finishes). The runs written before have none: the report reads their whole applied."""
    done = reconcile(conn, dialect, fills={})
    return "from version 10: " + ("; ".join(done) or "views remade")


def _storage(conn: Connection, dialect: str) -> None:
    if dialect == "postgresql":
        for statement in PG_STORAGE:
            conn.exec_driver_sql(statement)


MIGRATIONS: dict[int, Callable[[Connection, str], str]] = {2: _to_2, 3: _to_3, 4: _to_4, 5: _to_5, 6: _to_6,
                                                            7: _to_7, 8: _to_8, 9: _to_9, 10: _to_10, 11: _to_11}
LATEST = max(MIGRATIONS)
