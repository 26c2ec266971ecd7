"""v_results, the view of every run the report shows, taken apart as the report's readers read it: its
query, which of the runs, jobs and machines tables gives each of its columns, and the joins and
expressions of a read by parts. rows.read_results builds the report's rows from these parts, and
results_csv writes results.csv's bytes from them, each job's and machine's values once rather than once
per run. Imports nothing of the report: both depend on it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import count
from operator import itemgetter

from sqlalchemy import text

# v_results' columns come from three tables. A read by parts fetches a run's own columns per run, and its
# job's (jobs, its sweep's name) and its machine's once each, so that a million runs do not fetch (and make
# Python objects of) ~80 identical values each.
SELECT_RESULTS = "SELECT * FROM v_results {where} ORDER BY run_id"  # the view's rows: results.csv, and the fallback
VIEW_COLUMNS = "SELECT * FROM v_results WHERE 1 = 0"
JOINS = ("FROM runs r JOIN jobs j ON j.job_id = r.job_id JOIN sweeps s ON s.sweep_id = j.sweep_id "
         "JOIN machines m ON m.machine_id = r.machine_id JOIN pools p ON p.pool_id = r.pool_id "
         "WHERE r.status <> 'queued'{mine}")
MINE = " AND r.machine_id = :machine_id"
# PostgreSQL's foreign keys always hold: every run has its one job, sweep and machine (NOT NULL REFERENCES), so
# a read of the runs by parts there joins pools alone (the pool's name), not a probe of jobs' index per run.
JOINS_PG = "FROM runs r JOIN pools p ON p.pool_id = r.pool_id WHERE r.status <> 'queued'{mine}"

# The columns of v_results the report's rows leave out (write_report: read_results(leave_out=REPORT_LEAVES)):
# a run's measurements only results.csv shows, and the machine's facts, which the report takes once per
# machine, from its machines row (the rows keep its id, hostname and L3 size: readers take them per run).
# A real run's row then keeps 72 of its 112 non-NULL columns (a quick sweep's): CPython's dict doubles its
# table past 85 keys (1,584 -> 3,328 bytes), so that a fleet's rows take half the memory.
CSV_ONLY = ("claimed", "setup_s", "first_step_s", "step_ms_mean", "step_ms_std", "wall_s", "samples_per_s",
            "loss_first", "loss_last", "peak_rss_mb", "cpu_user_s", "cpu_sys_s", "ctx_switches", "freq_mhz_avg",
            "energy_j", "temp_c_max", "gflops", "output_path", "torch_version", "python_version", "load_before",
            "val_loss", "steps_to_target",  # a learning run's: its section reads the others
            "params", "trainable_params", "flops_per_step")  # the cost model counts them from the configuration
MACHINE_ONLY = ("fingerprint", "cpu_model", "vendor", "sockets", "physical_cores", "logical_cores", "numa_nodes",
                "smt", "isa_flags", "l1d_kb", "l2_kb", "mem_total_gb", "mem_bw_gbs_1t", "mem_bw_gbs_all",
                "gemm_gflops_fp32_1c", "gemm_gflops_fp32_all", "gemm_gflops_bf16_1c", "gemm_gflops_bf16_all",
                "freq_driver", "freq_min_mhz", "freq_max_mhz", "kernel")
REPORT_LEAVES = frozenset(CSV_ONLY + MACHINE_ONLY)
RUN_EXPR = {"pool": "COALESCE(p.name, 'machine ' || r.machine_id) AS pool"}  # the rest: r.<column>
# A run's `applied` as the report reads it: its runs.applied_read where that text starts with :read_prefix (it
# holds the keys the report reads: stats/applied_cut.py; the whole text is then not fetched), else the whole text.
READ_APPLIED = ("CASE WHEN substr(r.applied_read, 1, {length}) = :read_prefix THEN r.applied_read ELSE r.applied END "
                "AS applied")
JOB_VALUE = {"sweep": "s.name"}  # a job's column from another table than jobs (the rest: j.<column>)
JOB_EXPR = {c: f"{v} AS {c}" for c, v in JOB_VALUE.items()}  # the same, named in a SELECT's list
FROM_JOBS = "FROM jobs j JOIN sweeps s ON s.sweep_id = j.sweep_id"  # the jobs read by parts, with JOB_VALUE's


def sources(conn) -> dict[str, str]:
    """Each column the runs, jobs and machines tables give v_results: column -> 'r', 'j' or 'm'."""
    known = {}
    for source, table in (("m", "machines"), ("j", "jobs"), ("r", "runs")):  # runs' own columns win
        known.update((c, source) for c in conn.execute(text(f"SELECT * FROM {table} WHERE 1 = 0")).keys())
    known["sweep"], known["pool"] = "j", "r"
    known["job_id"], known["machine_id"] = "j", "m"  # the view takes them from jobs and machines
    return known


def run_joins(dialect: str) -> str:
    """The FROM and WHERE of a read of the runs by parts, {mine} to fill: JOINS, or JOINS_PG on PostgreSQL."""
    return JOINS_PG if dialect == "postgresql" else JOINS


def quoted(conn, column: str) -> str:
    return conn.dialect.identifier_preparer.quote(column)


def tuple_getter(indices: list[int]):
    """A function of a sequence: its values at `indices`, always as a tuple (itemgetter gives a bare value
    for one index and cannot take none)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    if indices:
        i, = indices
        return lambda values: (values[i],)
    return lambda values: ()


class FetchAhead:
    """A PostgreSQL server-side cursor whose next chunk is fetched by a thread while the reader works on
    this one: each FETCH otherwise kept the reader waiting while the server made its rows, and the server
    waiting while the reader worked (psycopg waits for the server without the GIL, and serialises any other
    statement on the connection with the fetch)."""

    def __init__(self, cursor):
        self.cursor = cursor
        self.pool = ThreadPoolExecutor(1)
        self.next = None

    def fetchmany(self, size: int) -> list[tuple]:
        rows = (self.next or self.pool.submit(self.cursor.fetchmany, size)).result()
        self.next = self.pool.submit(self.cursor.fetchmany, size) if len(rows) == size else None
        return rows

    def stop(self) -> None:
        """No more fetches: the one under way (if any) ends first."""
        self.next = None
        self.pool.shutdown()

    def close(self) -> None:
        self.stop()
        self.cursor.close()


_CURSORS = count()  # a server-side cursor's name: unique in its connection


def binary_cursor(conn, query: str, params: dict) -> FetchAhead:
    """A PostgreSQL server-side cursor of `query` (SQLAlchemy's :name parameters) on `conn`'s connection and
    transaction, its values in PostgreSQL's binary format (the same Python values: no number printed by
    the server and parsed again here), fetched ahead (close it)."""
    cursor = conn.connection.dbapi_connection.cursor(name=f"cpubench_{next(_CURSORS)}", binary=True)
    cursor.execute(driver_sql(conn, query), params)
    return FetchAhead(cursor)


def row_text(exprs: list[str]) -> str:
    """PostgreSQL's text of a row of `exprs` (their values, each as its type prints it): the same text exactly
    where the values are the same, given floats_exact(). The readers key a job's configuration by it, and
    read the values once per configuration (rows._view_parts, results_csv._keyed)."""
    return f"ROW({', '.join(exprs)})::text"


def floats_exact(conn) -> bool:
    """Whether the PostgreSQL server of `conn` prints each float to its last digit, so that two floats
    print alike only where they are equal: PostgreSQL 12 on with extra_float_digits above 0 (its default,
    1), or any server with 3."""
    digits = int(conn.exec_driver_sql("SHOW extra_float_digits").scalar())
    return digits >= 3 or (digits > 0 and conn.connection.dbapi_connection.info.server_version >= 120000)


def driver_sql(conn, query: str) -> str:
    """`query` with SQLAlchemy's :name parameters as `conn`'s driver takes them (psycopg's %(name)s)."""
    return str(text(query).compile(dialect=conn.dialect))
