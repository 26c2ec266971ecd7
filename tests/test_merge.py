"""`bench.py merge`: other results databases (machines that ran offline) imported idempotently, with
real files: the version-1 database of the previous release, and databases written here."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.queue.merge import merge
from orchestrator.queue.store import Store
from orchestrator.stats.applied_cut import read_text
from tests.conftest import bench
from tests.reportdb import configs, enqueue, machine_facts
from tests.conftest import done_fields

V1 = Path(__file__).resolve().parent / "v1" / "results-v1.db"


def rows(db: str, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_an_old_release_database_merges_once_and_is_left_untouched(db, tmp_path):
    other = tmp_path / "offline.db"
    shutil.copyfile(V1, other)
    before = digest(other)
    first = bench("merge", str(other), "--db", db, check=True)
    assert "runs 22 imported, 0 already here" in first.stdout and "2 unfinished left out" in first.stdout
    second = bench("merge", str(other), "--db", db, check=True)
    assert "machines 0 new, 2 known" in second.stdout and "jobs 0 new, 16 known" in second.stdout
    assert "runs 0 imported, 22 already here" in second.stdout and "0 conflicting" in second.stdout
    assert digest(other) == before  # read through a migrated copy: still the old release's file
    assert rows(db, "SELECT status, COUNT(*) FROM runs GROUP BY status ORDER BY status") == [
        ("done", 11), ("failed", 8), ("skipped", 3)]
    assert rows(db, "SELECT COUNT(*) FROM v_results") == [(22,)]
    old = {r[0]: r[1:] for r in rows(str(V1), "SELECT j.config_hash || '@' || m.fingerprint, r.status, "
                                              "r.step_ms_median, r.reason FROM runs r JOIN jobs j USING (job_id) "
                                              "JOIN machines m USING (machine_id) "
                                              "WHERE r.status IN ('done', 'failed', 'skipped')")}
    new = {r[0]: r[1:] for r in rows(db, "SELECT j.config_hash || '@' || m.fingerprint, r.status, r.step_ms_median, "
                                         "r.reason FROM runs r JOIN jobs j USING (job_id) "
                                         "JOIN machines m USING (machine_id)")}
    assert new == old
    stored = rows(db, "SELECT applied, applied_read FROM runs")  # the keys this release's report reads, apart
    assert sum(a is not None for a, _ in stored) == 14
    assert all(read == read_text(applied) for applied, read in stored)


@pytest.mark.postgres
def test_an_sqlite_file_merges_into_postgresql(pg_db):
    store = Store(pg_db)
    result = merge(store, str(V1))
    assert (result.runs, result.jobs, result.machines) == ([22, 0], [16, 0], [2, 0])
    assert merge(store, str(V1)).runs == [0, 22]
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM v_results WHERE status = 'done'").scalar_one() == 11


def two_databases(tmp_path, metric_here: float, metric_there: float):
    """The same plan on one machine in two files, job 0 done in both with the given step times."""
    plan = configs({"d_model": 32, "n_layers": 1, "seq_len": 32}, {"d_model": [32, 48, 64]}, repeats=1)
    out = []
    for name, metric in (("here.db", metric_here), ("there.db", metric_there)):
        store = Store(str(tmp_path / name))
        enqueue(store, plan)
        machine = store.register_machine(machine_facts("node-a"))
        claim = store.claim(machine, pid=1, host="node-a", max_cores=8)
        store.finish(claim.run_id, pid=1, status="done", fields=done_fields(step_ms_median=metric))
        out.append((store, machine))
    return out


def test_a_run_done_on_both_sides_keeps_the_one_here_and_says_so(tmp_path):
    (here, _), (there, _) = two_databases(tmp_path, 5.0, 7.0)
    proc = bench("merge", there.url.removeprefix("sqlite:///"), "--db", here.url.removeprefix("sqlite:///"), check=True)
    assert "1 conflicting" in proc.stdout and "kept the done run here" in proc.stderr  # the result; the warning
    assert rows(here.url.removeprefix("sqlite:///"), "SELECT step_ms_median FROM runs") == [(5.0,)]


def test_a_result_from_elsewhere_fills_a_run_here_that_was_only_queued(tmp_path):
    (here, machine), (there, _) = two_databases(tmp_path, 5.0, 7.0)
    here.take_back_stale(machine, host="node-a", grace_s=-1, max_attempts=3, is_alive=lambda pid: False)
    with here.transaction(write=True) as conn:  # the run here was given back before it finished
        conn.exec_driver_sql("UPDATE runs SET status = 'queued', step_ms_median = NULL")
    result = merge(here, there.url.removeprefix("sqlite:///"))
    assert result.replaced == 1 and not result.conflicts
    assert rows(here.url.removeprefix("sqlite:///"), "SELECT status, step_ms_median FROM runs") == [("done", 7.0)]


def test_work_done_offline_leaves_the_queue_here_and_new_jobs_join_it(tmp_path):
    main = Store(str(tmp_path / "main.db"))
    enqueue(main, configs({"d_model": 32, "n_layers": 1, "seq_len": 32}, {"d_model": [32, 48, 64, 80]}, repeats=1))
    machine = main.register_machine(machine_facts("node-a"))
    first = main.claim(machine, pid=1, host="node-a", max_cores=8)  # the machine's queue exists here now
    main.finish(first.run_id, pid=1, status="done", fields=done_fields())
    with sqlite3.connect(tmp_path / "main.db") as src, sqlite3.connect(tmp_path / "laptop.db") as dst:
        src.backup(dst)  # the laptop takes a copy (WAL included) and goes offline
    laptop = Store(str(tmp_path / "laptop.db"))
    enqueue(laptop, configs({"d_model": 32, "n_layers": 2, "seq_len": 32}, {}, repeats=1), sweep="offline")
    offline = [laptop.claim(machine, pid=2, host="node-a", max_cores=8) for _ in range(2)]
    for claim in offline:
        laptop.finish(claim.run_id, pid=2, status="done", fields=done_fields())
    result = merge(main, str(tmp_path / "laptop.db"))
    assert result.runs == [2, 1] and result.jobs == [1, 4]
    left = []
    while (claim := main.claim(machine, pid=3, host="node-a", max_cores=8)) is not None:
        main.finish(claim.run_id, pid=3, status="done", fields=done_fields())
        left.append(claim.job_id)
    assert len(left) == 2  # of 5 jobs: 1 done here, 2 done offline, the laptop's new job and one more
    assert {c.job_id for c in offline}.isdisjoint(left)
    assert main.counts(machine) == {"total": 5, "queued": 0, "running": 0, "done": 5, "failed": 0, "skipped": 0}


@pytest.mark.parametrize("case", ["missing", "not a database", "itself"])
def test_merging_what_is_not_another_results_database_exits_2(db, tmp_path, case):
    Store(db)
    before = list(sqlite3.connect(db).iterdump())
    target = {"missing": str(tmp_path / "nope.db"), "itself": db}.get(case)
    if case == "not a database":
        target = str(tmp_path / "notes.txt")
        Path(target).write_text("hello\n" * 100)
    scratch = tmp_path / "tmp"  # the merge's temporary folder goes here, and must not stay
    scratch.mkdir()
    proc = bench("merge", target, "--db", db, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert list(sqlite3.connect(db).iterdump()) == before
    assert not list(scratch.iterdir())
