"""Several nodes for real: a SLURM cluster of two network namespaces on this machine (tests/netcluster.py:
own address, hostname, CPU and slurmd each; slurmctld, munged and PostgreSQL on the bridge), one
`submit --slurm --nodes 2 --together` allocation whose worker trains jobs across both nodes over gloo,
the node faults a cluster has (a cut link, a dead slurmd, a launcher killed with -9), a PostgreSQL
restart under two nodes' workers, and nothing left behind. SLURM tests: skipped with the reason where
they cannot run (not root, SLURM or iproute2 missing)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests import netcluster
from tests.conftest import bench
from tests.pgserver import create_database

pytestmark = pytest.mark.slurm

# one rank per node of the tiny model; 3 s collective timeout keeps the faults short
TINY = dict(d_model=32, n_layers=1, n_heads=2, seq_len=32, vocab_size=256, warmup_steps=1, dataset="builtin",
            cores=1, ranks=1, batch_size=2, steps=4)
COLLECTIVE_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def cluster():
    reason = netcluster.why_not()
    if reason:
        pytest.skip(reason)
    with netcluster.namespace_cluster(2) as built:
        yield built
        tag = built.tag
    left = netcluster.leftovers(tag)
    assert not left, f"the cluster left {left}"


@pytest.fixture
def cluster_db(cluster):
    return create_database(cluster.db_url(), f"n{time.time_ns()}")


def enqueue(url: str, env: dict, *axes: str, **overrides) -> None:
    sets = [a for k, v in (TINY | overrides).items() for a in ("--set", f"{k}={v}")]
    bench("enqueue", "--db", url, *sets, *[a for axis in axes for a in ("--axis", axis)], env=env, check=True)


def rows(url: str, sql: str) -> list:
    engine = create_engine(url.replace(url.split("@")[1].split(":")[0], "127.0.0.1", 1))
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).all()
    finally:
        engine.dispose()


def submit_together(cluster, url: str, logs: Path, env: dict, timeout_s: float = 300) -> tuple[str, str]:
    """`submit --slurm --nodes 2 --together` on the cluster; waits until the allocation ended; returns
    (job id, the batch step's output)."""
    proc = bench("submit", "--slurm", "--nodes", "2", "--together", "--timeout", "120", "--logs", str(logs),
                 "--db", url, env={**cluster.env, **env}, check=True)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout + proc.stderr
    wait_gone(cluster, job_id, timeout_s)
    out = logs / f"cpubench-{job_id}.out"
    return job_id, out.read_text() if out.exists() else ""


def wait_gone(cluster, job_id: str, timeout_s: float) -> float:
    started = time.monotonic()
    env = {**os.environ, **cluster.env}
    while time.monotonic() - started < timeout_s:
        queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True)
        if queue.returncode == 0 and not queue.stdout.strip():
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"allocation {job_id} still in the queue after {timeout_s:.0f} s: {queue.stdout}")


def test_each_node_has_its_own_hostname_address_and_cpu_and_reaches_postgres(cluster):
    env = {**os.environ, **cluster.env}
    pg_port = cluster.db_url().rsplit(":", 1)[1].split("/")[0]
    probe = (f"echo $(hostname) $(python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))') "
             f"$(ip -4 -o addr show eth0 | awk '{{print $4}}') "
             f"$(timeout 5 bash -c '</dev/tcp/{cluster.head}/{pg_port}' && echo pg-ok)")
    out = subprocess.run(["srun", "-N2", "-l", "bash", "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = sorted(line.split(": ", 1)[1] for line in out.stdout.splitlines())
    print("\n" + "\n".join(lines))
    expected = [f"{n.name} {n.cpus} {n.address}/24 pg-ok" for n in cluster.nodes]
    assert lines == sorted(expected)
