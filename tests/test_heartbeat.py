"""Heartbeats that cannot lie: a run whose worker is alive on this host is never taken back, however
long its child takes to start; a worker's heartbeat covers its run from claim to finish (data
preparation, knobs, a fork server's start), so other hosts see it alive too; a reused pid does not
keep a dead worker's run (its start time, recorded at claim, must match)."""

import os
import subprocess
import sys

import psutil
import pytest

from tests.test_store import FACTS, enqueue, plan, store  # noqa: F401  (the store fixture)
from tests.test_worker import rows, start_worker, wait_until

pytestmark = pytest.mark.probe

SLOW = {"BENCH_CHILD_MODULE": "tests.slow_stub_child"}  # 5 s to start on CPU 1


@pytest.mark.slow
def test_a_slow_starting_child_on_a_live_worker_is_not_taken_back(db, tmp_path):
    """The reproduction: two workers on disjoint CPUs, heartbeat 1 s (stale after 2 s); the worker on
    CPU 1 spends 5 s starting its fork server (the stub sleeps at import there). Before the fix the
    worker on CPU 0 took that run back, ran it again, and the other worker died with "run N was taken
    back from this worker"."""
    from tests.conftest import bench

    jobs = 16
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs)),
          "--set", "steps=4", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    env = {**SLOW, "BENCH_HEARTBEAT_S": "1"}
    a, b = start_worker(db, "--cpus", "0", env=env), start_worker(db, "--cpus", "1", env=env)
    a_rc, b_rc = a.wait(timeout=120), b.wait(timeout=120)
    a_err, b_err = a.stderr.read(), b.stderr.read()
    assert "taken back" not in a_err + b_err
    assert (a_rc, b_rc) == (0, 0), a_err + b_err
    runs = rows(db, "SELECT job_id, status, attempts, reason FROM runs")
    assert len(runs) == jobs and {r[1] for r in runs} == {"done"}, runs
    assert {r[2] for r in runs} == {1}, [r for r in runs if r[2] != 1]  # nobody claimed a job twice
    markers = list((tmp_path / "output" / "markers").iterdir())
    assert len(markers) == jobs  # no job was executed twice
    assert rows(db, "SELECT COUNT(DISTINCT worker_pid) FROM runs")[0][0] == 2  # both worked


@pytest.mark.slow
def test_the_heartbeat_moves_while_the_fork_server_starts(db):
    """From claim to the child's first output nothing used to beat: a worker on another host would
    have taken the run back after two heartbeats. Now the heartbeat moves before any child exists."""
    from tests.conftest import bench

    bench("enqueue", "--db", db, "--set", "steps=1", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    worker = start_worker(db, "--cpus", "1", env={**SLOW, "BENCH_HEARTBEAT_S": "0.2"})
    try:
        assert wait_until(lambda: rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0] == 1)
        first = rows(db, "SELECT heartbeat FROM runs")[0][0]
        assert wait_until(lambda: rows(db, "SELECT heartbeat FROM runs")[0][0] > first + 0.5, timeout=3)
        assert rows(db, "SELECT child_pid FROM runs")[0][0] is None  # still starting: no child yet
    finally:
        assert worker.wait(timeout=60) == 0, worker.stderr.read()
    assert rows(db, "SELECT status, attempts FROM runs") == [("done", 1)]


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_reused_pid_does_not_keep_a_dead_workers_run(store, tmp_path):  # noqa: F811
    """Same host, pid alive, but not the process that claimed: its start time differs."""
    enqueue(store, plan(tmp_path, n=2))
    machine = store.register_machine(FACTS)
    proc = _sleeper()
    try:
        started = psutil.Process(proc.pid).create_time()
        mine = store.claim(machine, pid=proc.pid, host="here", max_cores=2, started=started)
        other = store.claim(machine, pid=proc.pid, host="here", max_cores=2, started=started - 1000)
        alive = lambda pid: psutil.pid_exists(pid)  # noqa: E731
        start_time = lambda pid: psutil.Process(pid).create_time()  # noqa: E731
        # An ancient heartbeat (grace -1) does not matter on this host: the claimant is alive.
        taken = store.take_back_stale(machine, host="here", grace_s=-1, max_attempts=3, is_alive=alive,
                                      started_at=start_time)
        assert taken == [other.run_id] and mine.run_id not in taken
        with store.transaction() as conn:
            reason = conn.exec_driver_sql(f"SELECT reason FROM runs WHERE run_id = {other.run_id}").scalar_one()
        assert "pid" in reason and "reused" in reason
    finally:
        proc.kill()
        proc.wait()
    # The claimant is gone now: its run goes back too.
    assert store.take_back_stale(machine, host="here", grace_s=1e9, max_attempts=3, is_alive=alive,
                                 started_at=start_time) == [mine.run_id]


def test_a_live_worker_on_this_host_keeps_its_run_past_the_grace_period(store, tmp_path):  # noqa: F811
    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    store.claim(machine, pid=os.getpid(), host="here", max_cores=2)
    assert store.take_back_stale(machine, host="here", grace_s=-1, max_attempts=3, is_alive=lambda pid: True) == []
    # Another host cannot see our pids: for it, heartbeat age decides.
    assert len(store.take_back_stale(machine, host="there", grace_s=-1, max_attempts=3, is_alive=lambda pid: True)) == 1
