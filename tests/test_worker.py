"""The worker as users run it: real `bench.py work` processes, real child processes, real kill -9.
The queue's tests use tests/stub_child.py (same protocol, no torch) so they can crash on purpose."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys

import psutil
import pytest

from tests.conftest import ROOT, adopting_orphans, bench, wait_until

pytestmark = [pytest.mark.probe, pytest.mark.usefixtures("adopts_orphans")]

STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}


def start_worker(db, *args, env=None):
    return subprocess.Popen([sys.executable, str(ROOT / "bench.py"), "work", "--db", db, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **STUB, **(env or {})})


def rows(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def stub_children():
    """This test's processes running tests/stub_child.py: among this process's descendants, where its
    `adopts_orphans` keeps those whose worker died; another session's stub children are not."""
    assert adopting_orphans(), "stub_children() needs the test to use the adopts_orphans fixture"
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "tests.stub_child" in " ".join(proc.cmdline()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile, or a zombie
            pass
    return found


@pytest.mark.slow
def test_killed_worker_leaves_no_job_running_after_restart(db, tmp_path):
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(12)),
          "--set", "steps=6", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    rng = random.Random(7)
    kills = 0
    env = {"BENCH_MAX_ATTEMPTS": "100"}
    for _ in range(40):
        worker = start_worker(db, env=env)
        try:
            worker.wait(timeout=rng.uniform(0.3, 2.5))
            break  # it finished the queue by itself
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            # The child must not outlive its worker (PR_SET_PDEATHSIG).
            assert wait_until(lambda: not stub_children(), timeout=5), "a child outlived its killed worker"
    final = start_worker(db, env=env)
    assert final.wait(timeout=120) == 0, final.stderr.read()
    print(f"killed the worker {kills} times; every job done exactly once")
    assert kills >= 3
    runs = rows(db, "SELECT job_id, status FROM runs")
    assert len(runs) == 12 and {s for _, s in runs} == {"done"}
    assert len({j for j, _ in runs}) == 12  # one run row per job
    markers = list((tmp_path / "output" / "markers").iterdir())
    assert len(markers) >= 12  # each job ran to the end at least once; a kill may make it run again


def run_two_workers(db: str, jobs: int, steps: int) -> None:
    """Enqueue `jobs` one-core jobs and drain them with two workers at once, one per CPU."""
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs)),
          "--set", f"steps={steps}", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    a, b = start_worker(db, "--cpus", "0"), start_worker(db, "--cpus", "1")
    assert a.wait(timeout=120) == 0, a.stderr.read()
    assert b.wait(timeout=120) == 0, b.stderr.read()


@pytest.mark.slow
def test_two_workers_on_disjoint_cpus_never_claim_the_same_job(db, tmp_path):
    run_two_workers(db, jobs=16, steps=8)
    runs = rows(db, "SELECT job_id, status, attempts, applied FROM runs")
    assert len(runs) == 16 and {r[1] for r in runs} == {"done"} and {r[2] for r in runs} == {1}
    markers = list((tmp_path / "output" / "markers").iterdir())
    assert len(markers) == 16  # no job was executed twice
    affinities = {tuple(json.loads(r[3])["affinity"]) for r in runs}
    assert affinities == {(0,), (1,)}  # both workers worked, each on its own CPU


@pytest.mark.slow
def test_a_second_worker_on_the_same_cpus_is_refused(db):
    bench("enqueue", "--db", db, "--axis", "d_model=32,40", "--set", "steps=100", "--set", "dataset=builtin",
          check=True)
    first = start_worker(db)
    try:
        assert wait_until(lambda: rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0] == 1)
        second = bench("work", "--db", db, env=STUB)
        assert second.returncode == 1
        assert "in use by worker pid" in second.stderr
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("seed, reason", [
    (1, "child killed by signal SIGSEGV"),
    (2, "child exited with code 3"),
    (4, "RuntimeError: stub child raised on purpose"),
    (5, "child printed no result line"),
    (3, "timed out after 2 s"),
    (6, "the trainer's result breaks the contract: unknown field(s) steps_seen; missing metric(s) mfu"),
    (7, "1 compilation(s) during the timed steps (the slowest timed step 9.0x the median): the run timed the compiler"),
])
@pytest.mark.slow
def test_a_child_that_crashes_or_hangs_gives_a_failed_run_with_its_reason(db, seed, reason):
    bench("enqueue", "--db", db, "--set", f"seed={seed}", "--set", "dataset=builtin", "--set", "steps=1",
          "--axis", "d_model=32,64", check=True)
    proc = bench("work", "--db", db, "--timeout", "2", env=STUB)
    assert proc.returncode == 0, proc.stderr
    runs = rows(db, "SELECT status, reason FROM runs")
    assert len(runs) == 2  # the worker went on after the first failure
    for status, why in runs:
        assert status == "failed" and reason in why
    assert not stub_children()


def test_sigterm_restores_and_puts_the_unfinished_run_back_in_the_queue(db):
    bench("enqueue", "--db", db, "--set", "steps=200", "--set", "dataset=builtin", "--axis", "d_model=32,40",
          check=True)
    worker = start_worker(db)
    assert wait_until(lambda: rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0] == 1)
    assert wait_until(lambda: bool(stub_children()))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 143
    assert "stopped by SIGTERM" in worker.stderr.read()
    assert rows(db, "SELECT status, attempts FROM runs") == [("queued", 0)]
    assert wait_until(lambda: not stub_children(), timeout=5)


def test_heartbeat_moves_while_the_child_runs(db):
    bench("enqueue", "--db", db, "--set", "steps=60", "--set", "dataset=builtin", check=True)
    worker = start_worker(db, env={"BENCH_HEARTBEAT_S": "0.2"})
    try:
        assert wait_until(lambda: rows(db, "SELECT COUNT(*) FROM runs WHERE child_pid IS NOT NULL")[0][0] == 1)
        first = rows(db, "SELECT heartbeat, child_pid FROM runs")[0]
        assert wait_until(lambda: rows(db, "SELECT heartbeat FROM runs")[0][0] > first[0], timeout=5)
        assert first[1] is not None and psutil.pid_exists(first[1])
    finally:
        assert worker.wait(timeout=60) == 0


@pytest.mark.slow
def test_status_json_counts_this_machines_runs(db):
    bench("enqueue", "--db", db, "--set", "dataset=builtin", "--set", "steps=1", "--axis", "d_model=32,40,48",
          check=True)
    before = json.loads(bench("status", "--db", db, "--json", check=True).stdout)
    totals = {"total": 3, "queued": 3, "running": 0, "done": 0, "failed": 0, "skipped": 0}
    assert {k: before[k] for k in totals} == totals
    # each sweep's own counts (a command-line sweep is named by its axes)
    assert before["sweeps"] == {"d_model": totals}
    bench("work", "--db", db, "--max-jobs", "2", env=STUB, check=True)
    after = json.loads(bench("status", "--db", db, "--json", check=True).stdout)
    assert after["done"] == 2 and after["queued"] == 1


@pytest.mark.postgres
def test_two_workers_share_a_postgresql_queue_without_claiming_a_job_twice(pg_db, tmp_path):
    import psycopg

    run_two_workers(pg_db, jobs=10, steps=6)
    with psycopg.connect(pg_db.replace("postgresql+psycopg://", "postgresql://")) as conn:
        runs = conn.execute("SELECT job_id, status, attempts FROM runs").fetchall()
    assert len(runs) == 10 and {r[1] for r in runs} == {"done"} and {r[2] for r in runs} == {1}
    assert len(list((tmp_path / "output" / "markers").iterdir())) == 10
