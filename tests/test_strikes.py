"""A user's kill is not the job's fault: a run taken back from a dead worker counts a strike against
its job only where the job's own child was the likely cause (killed by a signal, or still running far
past its predicted time when its worker died); a worker killed while starting, or while its child was
within its prediction, gives the run back uncounted. Real `bench.py work` processes, real kill -9."""

import random
import signal
import subprocess

import pytest

from tests.conftest import bench
from tests.test_worker import rows, start_worker, stub_children, wait_until

pytestmark = [pytest.mark.probe, pytest.mark.usefixtures("adopts_orphans")]  # stub_children()

TINY_JOBS = 16


def kill_a_restarted_worker(db: str, rng: random.Random, kills: int = 5) -> int:
    """A user stopping and restarting a worker: kill -9 after 3-7 s, start another at once, `kills`
    times; then a last worker drains the queue. How many kills landed (the queue may empty first)."""
    landed = 0
    worker = start_worker(db)
    for _ in range(kills):
        try:
            worker.wait(timeout=rng.uniform(3, 7))
            break  # it emptied the queue by itself
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            landed += 1
            assert wait_until(lambda: not stub_children(), timeout=5), "a child outlived its killed worker"
            worker = start_worker(db)
    assert worker.wait(timeout=300) == 0, worker.stderr.read()
    return landed


def enqueue_tiny_jobs(db: str) -> None:
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(TINY_JOBS)),
          "--set", "steps=6", "--set", "dataset=builtin", "--set", "cores=1", check=True)


@pytest.mark.slow
def test_five_kills_of_a_restarted_worker_fail_no_job(db):
    """The reproduction: before, each new worker's first claim was the run taken back, and start-up
    took most of the seconds before the next kill: three kills in one job's claims failed it
    ("gave up after 3 attempts; last: worker pid N died") in 3 tries of 5."""
    enqueue_tiny_jobs(db)
    landed = kill_a_restarted_worker(db, random.Random(48))
    runs = rows(db, "SELECT job_id, status, reason FROM runs")
    print(f"{landed} kills landed")
    assert len(runs) == TINY_JOBS and {r[1] for r in runs} == {"done"}, [r for r in runs if r[1] != "done"]


def running_child(db: str, worker) -> bool:
    """The worker's child is running (not a killed worker's row, still 'running' until taken back)."""
    return rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'running' AND child_pid IS NOT NULL "
                    f"AND worker_pid = {worker.pid}")[0][0] == 1


@pytest.mark.slow
def test_workers_killed_while_the_first_claims_child_runs_within_its_time_fail_no_job(db):
    """The mechanism, without the luck of the intervals: each restarted worker's first claim is the run
    taken back, and it is killed while that run's child runs (within its predicted time). Before, the
    third such kill failed the job."""
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(TINY_JOBS)),
          "--set", "steps=20", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    worker = start_worker(db)
    assert wait_until(lambda: rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'")[0][0] >= 2, timeout=120)
    for _ in range(5):
        try:
            assert wait_until(lambda: running_child(db, worker), timeout=120), worker.poll()
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        assert wait_until(lambda: not stub_children(), timeout=5), "a child outlived its killed worker"
        worker = start_worker(db)
    assert worker.wait(timeout=300) == 0, worker.stderr.read()
    runs = rows(db, "SELECT job_id, status, attempts, strikes FROM runs")
    assert len(runs) == TINY_JOBS and {r[1] for r in runs} == {"done"}, [r for r in runs if r[1] != "done"]
    assert max(r[2] for r in runs) >= 3  # one job was claimed by three killed workers at least
    assert {r[3] for r in runs} == {0}


def test_a_child_killed_by_a_signal_three_times_fails_its_run_saying_so(db, tmp_path):
    """The OOM killer's SIGKILL (the stub kills itself the same way): a strike each time, the run tried
    again by the same worker, and failed at the third, with the cause."""
    bench("enqueue", "--db", db, "--set", "seed=8", "--set", "dataset=builtin", "--set", "steps=1", check=True)
    proc = bench("work", "--db", db, env={"BENCH_CHILD_MODULE": "tests.stub_child"})
    assert proc.returncode == 0, proc.stderr
    assert "requeued (strike 1 of 3): child killed by signal SIGKILL" in proc.stderr
    (status, attempts, strikes, reason), = rows(db, "SELECT status, attempts, strikes, reason FROM runs")
    assert (status, attempts, strikes) == ("failed", 3, 3)
    assert reason.startswith("gave up after 3 strikes; last: child killed by signal SIGKILL"), reason
    assert len(list((tmp_path / "output" / "tries").iterdir())) == 3


@pytest.mark.slow
def test_a_worker_that_dies_three_times_while_its_child_runs_far_past_its_prediction_fails_the_run(db):
    """The child hangs (stub seed 3) far past what the pool's done runs predict for it, and its worker
    dies each time: three strikes, the reason names how long it ran against its prediction."""
    from orchestrator.queue import eta
    from orchestrator.queue.store import Store

    fast = {"BENCH_HEARTBEAT_S": "0.2"}  # the last beat dates the worker's death closely
    bench("enqueue", "--db", db, "--axis", "d_model=32,40,48", "--set", "steps=6", "--set", "dataset=builtin",
          "--set", "cores=1", check=True)
    bench("work", "--db", db, env={"BENCH_CHILD_MODULE": "tests.stub_child"}, check=True)
    bench("enqueue", "--db", db, "--set", "seed=3", "--set", "steps=6", "--set", "dataset=builtin",
          "--set", "cores=1", check=True)
    (job_id,), = rows(db, "SELECT job_id FROM jobs WHERE seed = 3")
    store = Store(db)
    (machine_id,), = rows(db, "SELECT machine_id FROM machines")
    predicted = eta.predicted_job_s(store, machine_id, job_id)
    assert predicted is not None and predicted < 5
    past = 2 * predicted + 0.5

    def ran_past(worker) -> bool:  # this worker's child, not the last one's row before it is taken back
        ran = rows(db, "SELECT heartbeat - child_started FROM runs WHERE status = 'running' AND child_started "
                       f"IS NOT NULL AND job_id = {job_id} AND worker_pid = {worker.pid}")
        return bool(ran) and ran[0][0] > past

    for _ in range(3):
        worker = start_worker(db, env=fast)
        try:
            assert wait_until(lambda: ran_past(worker), timeout=120), worker.poll()
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        assert wait_until(lambda: not stub_children(), timeout=5)
    last = start_worker(db, env=fast)  # takes it back a third time: failed, and nothing left to claim
    try:
        assert last.wait(timeout=120) == 0, last.stderr.read()
    finally:
        last.kill()
    (status, strikes, reason), = rows(db, f"SELECT status, strikes, reason FROM runs WHERE job_id = {job_id}")
    assert (status, strikes) == ("failed", 3), reason
    assert reason.startswith("gave up after 3 strikes; last: worker pid "), reason
    assert "died while its child ran" in reason and f"past 2x its predicted {predicted:.3g} s" in reason, reason
