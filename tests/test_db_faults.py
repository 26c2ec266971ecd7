"""The database is the user's, and a sweep outlives a database restart. The real faults: another
program's file, a truncated or wrong file, a directory, a read-only medium, a file system that
fills (a small tmpfs), a PostgreSQL server stopped and restarted under two workers, SQLite's lock
held past the busy timeout. Each asserts one clear line (no traceback, no SQL, no parameters), the
file as it was, nothing lost and nothing run twice."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, bench, wait_until
from tests.pgserver import pg_bin, postgres_server

pytestmark = pytest.mark.probe

STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}
TINY = ["--set", "steps=2", "--set", "dataset=builtin", "--set", "cores=1"]
SECRET = "pw-Fault-7x"


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def one_clear_line(proc, code: int, *words: str) -> str:
    """The command failed with `code` and said so in one line holding `words`: no traceback, no SQL."""
    shown = proc.stdout + proc.stderr
    assert proc.returncode == code, shown
    assert "Traceback" not in shown and "[SQL" not in shown and "parameters" not in shown, shown
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, shown
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def results_db(path: Path, jobs: int = 3, work: bool = True) -> Path:
    """A real results database: jobs enqueued and (work) run by the stub child."""
    bench("enqueue", "--db", str(path), "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs)),
          *TINY, check=True)
    if work:
        bench("work", "--db", str(path), env=STUB, check=True)
    return path


@contextmanager
def tmpfs(path: Path, size: str):
    """A small tmpfs at path (root, where mount works); skips the test elsewhere."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and mount)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


# -- files that are not ours, or not databases ---------------------------------------------------

def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path):
    notes = tmp_path / "notes.db"
    with sqlite3.connect(notes) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, cron TEXT)")  # a jobs table of its own
        conn.execute("INSERT INTO notes (body) VALUES ('remember the milk')")
    before = sha(notes)
    for args in (["status"], ["status", "--json"], ["report", "--out", str(tmp_path / "r")], ["enqueue", *TINY],
                 ["work"], ["retry"]):
        proc = bench(*args, "--db", str(notes), env=STUB)
        one_clear_line(proc, 2, "not a cpubench database", "jobs, notes", str(notes))
        assert sha(notes) == before, args
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("notes")) == ["notes.db"]


@pytest.mark.slow
def test_a_truncated_or_wrong_file_or_a_directory_gives_one_line_and_is_left_as_it_was(tmp_path):
    good = results_db(tmp_path / "results.db")
    data = good.read_bytes()
    cases = {
        "truncated.db": (data[:5000], 1, "is damaged"),
        "header.db": (data[:60], 1, "is damaged"),
        "text.db": (b"shopping list\nmilk\n", 2, "is not an SQLite database"),
    }
    for name, (content, code, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        for args in (["status"], ["enqueue", *TINY], ["work"]):
            one_clear_line(bench(*args, "--db", str(path), env=STUB), code, words, str(path))
            assert path.read_bytes() == content, (name, args)
    folder = tmp_path / "folder.db"
    folder.mkdir()
    one_clear_line(bench("status", "--db", str(folder)), 2, "is a directory")
    one_clear_line(bench("enqueue", *TINY, "--db", str(tmp_path / "no" / "such" / "r.db")), 2, "does not exist")
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_read_commands_create_nothing_and_register_no_machine(tmp_path):
    missing = tmp_path / "typo.db"
    one_clear_line(bench("status", "--db", str(missing)), 2, "no database file", str(missing))
    one_clear_line(bench("report", "--db", str(missing), "--out", str(tmp_path / "r")), 2, "no database file")
    assert not missing.exists()
    db = results_db(tmp_path / "results.db", work=False)
    before = sha(db)
    counts = json.loads(bench("status", "--json", "--db", str(db), check=True).stdout)
    assert counts["queued"] == 3 and counts["total"] == 3
    bench("status", "--all-machines", "--db", str(db), check=True)
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM machines").fetchone() == (0,)
    assert sha(db) == before


@pytest.mark.slow
def test_a_read_only_results_file_is_read_and_left_as_it_was(tmp_path):
    db = results_db(tmp_path / "results.db")
    with tmpfs(tmp_path / "archive", "8m") as archive:
        shutil.copy(db, archive / "results.db")
        remount_read_only(archive)
        copy = archive / "results.db"
        before = sha(copy)
        counts = json.loads(bench("status", "--json", "--db", str(copy), check=True).stdout)
        assert counts["done"] == 3 and counts["queued"] == 0
        status = bench("status", "--all-machines", "--json", "--db", str(copy), check=True)
        assert json.loads(status.stdout)["done"] == 3
        proc = bench("report", "--db", str(copy), "--out", str(tmp_path / "result"), check=True)
        assert "effects table was not updated" in proc.stderr and "read-only" in proc.stderr
        assert "Traceback" not in proc.stderr
        with (tmp_path / "result" / "results.csv").open() as f:
            assert len(f.readlines()) == 1 + 3
        # SQL on it (docs/databases.md: read-only media are opened immutable)
        with sqlite3.connect(f"file:{copy}?immutable=1", uri=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM v_results WHERE status = 'done'").fetchone() == (3,)
        one_clear_line(bench("enqueue", *TINY, "--set", "d_model=96", "--db", str(copy)), 1, "cannot open", str(copy))
        one_clear_line(bench("work", "--db", str(copy), env=STUB), 1, str(copy))
        assert sha(copy) == before
        assert sorted(p.name for p in archive.iterdir()) == ["results.db"]


@pytest.mark.slow
def test_a_full_disk_gives_one_line_keeps_the_database_and_leaves_the_jobs_queued(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as small:
        db = results_db(small / "results.db", jobs=2, work=False)
        filler = small / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill the file system to the last block
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        before = sha(db)
        big = ["--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(40)), "--axis", "n_layers=1,2,3,4"]
        one_clear_line(bench("enqueue", *big, *TINY, "--db", str(db)), 1, "disk is full", str(db))
        assert sha(db) == before
        one_clear_line(bench("work", "--db", str(db), env=STUB), 1, str(db))
        filler.unlink()
        assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)
        counts = json.loads(bench("status", "--json", "--db", str(db), check=True).stdout)
        assert counts["queued"] == 2 and counts["running"] == 0  # nothing lost, nothing left running
        bench("work", "--db", str(db), env=STUB, check=True)
        assert json.loads(bench("status", "--json", "--db", str(db), check=True).stdout)["done"] == 2


@pytest.mark.postgres
def test_a_read_only_postgres_role_reads_and_a_write_says_permission_denied(pg_db, tmp_path):
    bench("enqueue", "--db", pg_db, "--axis", "d_model=32,40", *TINY, check=True)
    bench("work", "--db", pg_db, env=STUB, check=True)
    role = f"reader{time.time_ns()}"
    for statement in (f"CREATE ROLE {role} LOGIN", f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"):
        pg_rows(pg_db, statement, fetch=False)
    reader = pg_db.replace("bench@", f"{role}:{SECRET}@", 1)
    assert json.loads(bench("status", "--json", "--db", reader, check=True).stdout)["done"] == 2
    proc = bench("report", "--db", reader, "--out", str(tmp_path / "r"), check=True)
    assert "effects table was not updated" in proc.stderr and "permission denied" in proc.stderr
    line = one_clear_line(bench("enqueue", "--set", "d_model=48", *TINY, "--db", reader), 1, "permission denied",
                          f"{role}:***@")
    assert SECRET not in line
    assert pg_rows(pg_db, "SELECT COUNT(*) FROM jobs") == [(2,)]


# -- a sweep outlives the database going away ---------------------------------------------------

def pg_rows(url: str, sql: str, fetch: bool = True) -> list[tuple]:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if fetch else []


def wait_for(predicate, timeout: float = 120.0) -> None:
    assert wait_until(predicate, timeout, poll_s=0.1), "timed out"


def pg_done(url: str) -> int:
    try:
        return pg_rows(url, "SELECT COUNT(*) FROM runs WHERE status = 'done'")[0][0]
    except Exception:  # the server is down
        return -1


def worker_on_host(url: str, cpu: int, host: str, env: dict, *args: str) -> subprocess.Popen:
    """A `bench.py work` process; in a UTS namespace of its own named `host` where unshare works
    (root), so the two workers are on different hosts as on a cluster and only heartbeats (not pids)
    tell the other that a run's worker is alive."""
    command = [sys.executable, str(ROOT / "bench.py"), "work", "--db", url, "--cpus", str(cpu), *args]
    if os.geteuid() == 0 and subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *command]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **STUB, **env})


@pytest.fixture
def pg_server():
    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with postgres_server() as server:
        yield server


@pytest.mark.postgres
def test_a_postgres_restart_mid_sweep_loses_no_run_and_runs_none_twice(pg_server, tmp_path):
    """The reproduction: two workers (on two hosts), heartbeat 1 s (stale after 2 s), the server
    stopped for 3 s twice mid-sweep. Before, both workers died with AdminShutdown and a traceback,
    their runs left 'running'."""
    url = pg_server.url
    jobs = 14
    bench("enqueue", "--db", url, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs)),
          "--set", "steps=16", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    env = {"BENCH_HEARTBEAT_S": "1"}
    workers = [worker_on_host(url, cpu, f"node{cpu}", env) for cpu in (0, 1)]
    try:
        for after in (2, 7):  # two outages, each while runs are going on
            wait_for(lambda: pg_done(url) >= after)
            pg_server.stop()
            time.sleep(3)
            pg_server.start()
        codes = [w.wait(timeout=300) for w in workers]
    finally:
        for w in workers:
            w.kill() if w.poll() is None else None
    shown = [w.stderr.read() for w in workers]
    assert codes == [0, 0], shown
    for text in shown:
        assert "Traceback" not in text
    assert any("database back after" in text for text in shown), shown
    runs = pg_rows(url, "SELECT job_id, status, attempts FROM runs ORDER BY job_id")
    assert len(runs) == jobs and {r[1] for r in runs} == {"done"}, runs
    assert {r[2] for r in runs} == {1}, runs  # no run was taken back from a live worker
    markers = list((tmp_path / "output" / "markers").iterdir())
    assert len(markers) == jobs  # every job trained exactly once


@pytest.mark.postgres
def test_a_worker_that_gives_up_keeps_the_result_and_the_next_worker_writes_it(pg_server, tmp_path):
    url = pg_server.url.replace("bench@", f"bench:{SECRET}@")  # the server trusts loopback: any password works
    bench("enqueue", "--db", url, "--set", "d_model=32", "--set", "steps=60", "--set", "dataset=builtin",
          "--set", "cores=1", check=True)
    worker = worker_on_host(url, 0, "node0", {"BENCH_HEARTBEAT_S": "1"}, "--db-retry", "3")
    wait_for(lambda: pg_rows(pg_server.url, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0] == 1)
    pg_server.stop()  # while the child trains (3 s)
    try:
        code = worker.wait(timeout=120)
    finally:
        pg_server.start()
    shown = worker.stderr.read()
    line = [x for x in shown.splitlines() if x.startswith("error:")]
    assert code == 1 and len(line) == 1 and "Traceback" not in shown and SECRET not in shown, shown
    assert "gave up after" in line[0] and "kept in" in line[0] and "bench:***@" in line[0], line
    kept = list((Path(os.environ["BENCH_STATE_DIR"]) / "kept").glob("*.json"))
    assert len(kept) == 1 and SECRET not in kept[0].read_text()
    assert pg_rows(pg_server.url, "SELECT status FROM runs") == [("running",)]

    again = worker_on_host(url, 0, "node0", {})
    assert again.wait(timeout=120) == 0
    assert "wrote run 1's result" in again.stderr.read()
    assert pg_rows(pg_server.url, "SELECT status, attempts FROM runs") == [("done", 1)]
    assert len(list((tmp_path / "output" / "markers").iterdir())) == 1  # trained once
    assert not list(kept[0].parent.glob("*.json"))


@pytest.mark.slow
def test_a_sqlite_lock_held_past_the_busy_timeout_is_waited_out(tmp_path):
    """Another connection (a user's long transaction in sqlite3) holds the write lock until the worker has
    met it (at most 60 s, not counting a busy machine's CPU stall); the busy timeout is 0.2 s; a long
    reader keeps a read transaction open throughout. The worker waits the writer out and runs every job
    once."""
    from orchestrator.queue.store import Store
    from worker.loop import Worker, WorkerOptions

    db = results_db(tmp_path / "results.db", jobs=3, work=False)
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT COUNT(*) FROM jobs").fetchone() == (3,)  # holds its snapshot until the end
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    events = []

    def release() -> None:
        """Commit once the worker has met the lock (a fixed hold can end before a busy machine's worker
        gets there), after a few of its retries."""
        wait_until(lambda: any(e.kind == "note" and "is locked" in e.text for e in events), timeout=60)
        time.sleep(0.5)
        holder.execute("COMMIT")
    releaser = threading.Thread(target=release)
    options = WorkerOptions(cpus=[0], child_module="tests.stub_child", spawn="exec", heartbeat_s=0.5, db_retry_s=60)
    releaser.start()
    try:
        counts = Worker(Store(str(db), busy_timeout_s=0.2), options, on_event=events.append).run()
    finally:
        releaser.join()
        holder.close()
        reader.execute("COMMIT")
        reader.close()
    notes = [e.text for e in events if e.kind == "note"]
    assert any("is locked by another connection" in n for n in notes), notes
    assert any("database back after" in n for n in notes), notes
    assert counts["done"] == 3
    assert sqlite3.connect(db).execute("SELECT DISTINCT attempts FROM runs").fetchall() == [(1,)]
    assert len(list((tmp_path / "output" / "markers").iterdir())) == 3


@pytest.mark.slow
def test_an_older_release_on_read_only_media_is_refused_with_the_way_out_that_works(tmp_path):
    """A read command cannot migrate a read-only file; the line it prints names `merge`, and merge
    does copy it (read immutable) into a current database."""
    with tmpfs(tmp_path / "archive", "8m") as archive:
        shutil.copy(ROOT / "tests" / "v1" / "results-v1.db", archive / "old.db")
        remount_read_only(archive)
        old = archive / "old.db"
        before = sha(old)
        one_clear_line(bench("status", "--all-machines", "--db", str(old)), 1, "read-only", f"bench.py merge {old}")
        copy = tmp_path / "copy.db"
        bench("merge", str(old), "--db", str(copy), check=True)
        counts = json.loads(bench("status", "--all-machines", "--json", "--db", str(copy), check=True).stdout)
        assert (counts["done"], counts["failed"], counts["skipped"]) == (11, 8, 3)
        assert sha(old) == before
