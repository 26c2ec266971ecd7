"""`bench.py submit --slurm` against a real single-node SLURM (tests/slurm.py starts munged,
slurmctld and slurmd on localhost and stops them): two array tasks drain one pool's stub sweep
on the session's PostgreSQL, each job exactly once, and the password of the URL stays out of the
script, the logs and the output."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests import slurm
from tests.conftest import bench

pytestmark = pytest.mark.probe

SECRET = "slurm-pw-7x"
JOBS = 8


def test_submit_refuses_sqlite_for_several_nodes(tmp_path):
    db = tmp_path / "results.db"
    proc = bench("submit", "--slurm", "--nodes", "2", "--db", str(db), "--logs", str(tmp_path / "logs"))
    assert proc.returncode == 2, proc.stderr
    assert "SQLite" in proc.stderr and "PostgreSQL" in proc.stderr
    assert not db.exists() and not (tmp_path / "logs").exists()


def test_submit_needs_a_scheduler(tmp_path):
    proc = bench("submit", "--db", str(tmp_path / "r.db"))
    assert proc.returncode == 2 and "--slurm" in proc.stderr


@pytest.fixture(scope="module")
def local_slurm():
    reason = slurm.why_not()
    if reason:
        pytest.skip(reason)
    with slurm.local_slurm() as env:
        yield env


@pytest.mark.slurm
@pytest.mark.postgres
def test_two_array_tasks_drain_a_pool_once(local_slurm, pg_db, tmp_path, isolated_state):
    url = pg_db.replace("bench@", f"bench:{SECRET}@", 1)
    env = {**local_slurm, "BENCH_CHILD_MODULE": "tests.stub_child"}
    bench("enqueue", "--db", url, "--set", "dataset=builtin", "--set", "steps=10", "--set", "cores=1",
          "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(JOBS)), env=env, check=True)
    logs = tmp_path / "logs"
    proc = bench("submit", "--slurm", "--nodes", "2", "--cpus-per-task", "1", "--pool", "slurmtest",
                 "--timeout", "60", "--logs", str(logs), "--db", url, env=env, check=True)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    assert f"squeue -j {job_id}" in proc.stderr and "status --pool slurmtest" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr

    client_env = {**os.environ, **local_slurm}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], env=client_env, capture_output=True, text=True)
        if queue.returncode == 0 and not queue.stdout.strip():
            break
        time.sleep(1)
    else:
        pytest.fail(f"job array {job_id} still in the queue after 240 s: {queue.stdout}")

    outs = sorted(logs.glob(f"cpubench-{job_id}_*.out"))
    assert [p.name for p in outs] == [f"cpubench-{job_id}_0.out", f"cpubench-{job_id}_1.out"]
    for out in outs:
        content = out.read_text()
        assert "Traceback" not in content and "error" not in content.lower(), content
    for path in logs.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path

    engine = create_engine(pg_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT r.job_id, r.status, r.worker_pid, r.applied FROM runs r JOIN pools p ON p.pool_id = r.pool_id "
                "WHERE p.name = 'slurmtest'")).all()
    finally:
        engine.dispose()
    task_output = "\n".join(out.read_text() for out in outs)
    assert len(rows) == JOBS and {r.status for r in rows} == {"done"}, (rows, task_output)
    assert len({r.job_id for r in rows}) == JOBS  # each job once in the pool
    # both array tasks worked (each pinned to its own CPU by SLURM's task/affinity)
    assert len({r.worker_pid for r in rows}) == 2, rows
    markers = list((Path(os.environ["BENCH_OUTPUT_DIR"]) / "markers").glob("run-*"))
    assert len(markers) == JOBS and len({m.name.split("-")[1] for m in markers}) == JOBS  # each child ran once
    affinities = {tuple(json.loads(r.applied)["affinity"]) if isinstance(r.applied, str)
                  else tuple(r.applied["affinity"]) for r in rows if r.applied}
    assert len(affinities) == 2, affinities


def test_together_asks_one_allocation_of_n_nodes_whose_first_node_runs_the_worker(tmp_path):
    from orchestrator.queue.slurm import batch_script

    script = batch_script(nodes=2, pool=None, partition=None, time_limit=None, cpus_per_task=None, timeout=60,
                          log_dir=tmp_path, together=True)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script and "--array" not in script
    assert script.rstrip().splitlines()[-1].endswith("bench.py work --timeout 60")
