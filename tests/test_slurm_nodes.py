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
from tests.conftest import CpuStall, bench
from tests.pgserver import create_database

pytestmark = [pytest.mark.slurm, pytest.mark.postgres, pytest.mark.probe]

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


def submit(cluster, url: str, logs: Path, env: dict, *args: str) -> str:
    proc = bench("submit", "--slurm", "--nodes", "2", "--together", "--timeout", "120", "--logs", str(logs),
                 "--db", url, *args, env={**cluster.env, **env}, check=True)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout + proc.stderr
    return job_id


def submit_together(cluster, url: str, logs: Path, env: dict, *args: str, timeout_s: float = 300) -> tuple[str, str]:
    """`submit --slurm --nodes 2 --together` on the cluster; waits until the allocation ended; returns
    (job id, the batch step's output)."""
    job_id = submit(cluster, url, logs, env, *args)
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


def applied_of(value) -> dict:
    return json.loads(value) if isinstance(value, str) else value


def test_a_sweep_of_nodes_1_and_2_runs_in_one_allocation_and_two_nodes_train_like_two_ranks(
        cluster, cluster_db, tmp_path):
    """nodes = [1, 2], one rank per node, batch 2 per rank: the two-node run trains the global batch of 4
    exactly as one node with two ranks of batch 2 does (`once`, on this machine's two CPUs)."""
    env = {"BENCH_COLLECTIVE_TIMEOUT_S": "30"}
    enqueue(cluster_db, env, "nodes=1,2")
    job_id, out = submit_together(cluster, cluster_db, tmp_path / "logs", env)
    found = rows(cluster_db, "SELECT j.nodes, r.status, r.reason, r.applied, r.loss_first, r.loss_last, "
                             "r.step_ms_median, r.allreduce_ms, r.allreduce_share, r.world_size, r.global_batch, "
                             "r.worker_host "
                             "FROM runs r JOIN jobs j USING (job_id) ORDER BY j.nodes")
    assert [(r.nodes, r.status) for r in found] == [(1, "done"), (2, "done")], (found, out)
    two = found[1]
    applied = applied_of(two.applied)
    ranks = applied["ranks"]
    record = {"world_size": two.world_size, "global_batch": two.global_batch, "step_ms": round(two.step_ms_median, 2),
              "allreduce_ms": round(two.allreduce_ms, 3), "allreduce_share": round(two.allreduce_share, 3),
              "nodes": [{k: r[k] for k in ("rank", "node", "host", "address", "affinity", "torch_threads",
                                             "omp_num_threads")} for r in ranks]}
    print("\ntwo-node run:", json.dumps(record))
    hosts = {n.name: n for n in cluster.nodes}
    assert two.world_size == 2 and two.global_batch == 4
    assert sorted(r["host"] for r in ranks) == sorted(hosts)
    for r in ranks:  # each rank on its own node: that node's address and CPU, one thread
        assert r["address"] == hosts[r["host"]].address and r["affinity"] == hosts[r["host"]].cpus
        assert r["torch_threads"] == 1
    assert sorted(applied["data_parallel"]["machines"]) == ["0", "1"]
    assert {m["address"] for m in applied["data_parallel"]["machines"].values()} == {n.address for n in cluster.nodes}
    assert 0 < two.allreduce_share < 1

    once = bench("once", "--json", *[f"{k}={v}" for k, v in (TINY | {"cores": 2, "ranks": 2, "nodes": 1}).items()],
                 env={"BENCH_COLLECTIVE_TIMEOUT_S": "30"}, check=True)
    local = json.loads(once.stdout)
    assert local["status"] == "done" and local["world_size"] == 2 and local["global_batch"] == 4, local
    loss_diff = max(abs(local[k] - getattr(two, k)) for k in ("loss_first", "loss_last"))
    step_diff = max(abs(a - b) for a, b in zip(
        [sum(x) / 2 for x in zip(*[r["losses"] for r in ranks])],
        [sum(x) / 2 for x in zip(*[r["losses"] for r in local["applied"]["ranks"]])]))
    print(f"one node, two ranks (once): step {local['step_ms_median']:.2f} ms, all-reduce "
          f"{local['allreduce_ms']:.3f} ms (share {local['allreduce_share']:.3f}); max |loss diff| first/last "
          f"{loss_diff:.3g}, over every step {step_diff:.3g}")
    assert loss_diff < 1e-5 and step_diff < 1e-5


def steps_begun(output: Path, rank: int) -> int:
    for path in output.glob(f"cpubench-ranks-*/progress-rank{rank}"):
        fields = path.read_text().split()
        if len(fields) == 3:
            return int(fields[1])
    return 0


def launcher_pid(cluster, node) -> int:
    pids = [p for p in netcluster.netns_pids(node.name) if "distributed --node" in netcluster._cmdline(p)]
    assert len(pids) == 1, pids
    return pids[0]


# the bound on a node fault's time to failure: what notices it (the collective timeout; for a dead slurmd,
# slurmctld's SlurmdTimeout and its ping every third of it) plus the launcher's grace (the other node's
# srun SIGTERM -> SIGKILL) and the worker writing the run
GRACE_S = 15


@pytest.fixture
def nodes_back(cluster):
    """Every node back after a fault test, also one that failed half-way: its link up, its slurmd running, no
    allocation left, every node idle; otherwise one failure leaves a node down and fails every test after it."""
    yield
    env = {**os.environ, **cluster.env}
    subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
    for node in cluster.nodes:
        cluster.mend(node)
        if node.slurmd is None or node.slurmd.poll() is not None:
            cluster.start_slurmd(node)
    cluster.wait_idle(90)


@pytest.mark.parametrize("fault", ["link cut", "slurmd killed", "launcher kill -9"])
def test_a_lost_node_fails_the_run_naming_it_leaves_no_rank_and_the_retry_finishes_once_it_is_back(
        cluster, cluster_db, tmp_path, fault, nodes_back):
    env = {"BENCH_COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)}
    # a dead slurmd stops nothing by itself (its steps' slurmstepd go on): the run must still be training when
    # slurmctld declares the node down, up to SlurmdTimeout x 2 + GRACE_S later: 6000 steps last 30 s or more
    # at the ~5 ms a step of an unloaded run (1500 steps ended before the node was declared down)
    enqueue(cluster_db, env, nodes=2, steps=6000 if fault == "slurmd killed" else 300)
    output = Path(os.environ["BENCH_OUTPUT_DIR"])
    job_id = submit(cluster, cluster_db, tmp_path / "logs", env, "--pool", "nodes")
    second = cluster.nodes[1]
    deadline = time.monotonic() + 180
    while steps_begun(output, 1) < 3:
        assert time.monotonic() < deadline, (tmp_path / "logs" / f"cpubench-{job_id}.out").read_text()
        time.sleep(0.1)
    if fault == "link cut":
        cluster.cut(second)
    elif fault == "slurmd killed":
        cluster.kill_slurmd(second)
    else:
        os.kill(launcher_pid(cluster, second), 9)
    hit, stall = time.monotonic(), CpuStall()
    while rows(cluster_db, "SELECT status FROM runs")[0].status == "running":
        assert time.monotonic() - hit < 120, "the run did not fail"
        time.sleep(0.2)
    failed_after_s, stalled_s = time.monotonic() - hit, stall.seconds()
    ended_after_s = wait_gone(cluster, job_id, 120) + failed_after_s
    status, reason = rows(cluster_db, "SELECT status, reason FROM runs")[0]
    left = cluster.rank_processes()
    print(f"\n{fault}: failed after {failed_after_s:.1f} s, allocation ended after {ended_after_s:.1f} s, "
          f"ranks left {left}: {reason}")
    assert status == "failed" and second.name in reason, reason
    # slurmctld: "not responding" after SlurmdTimeout, DOWN at a ping round after (18 s with 10)
    detector = netcluster.SLURMD_TIMEOUT_S * 2 if fault == "slurmd killed" else COLLECTIVE_TIMEOUT_S
    assert failed_after_s - stalled_s < detector + GRACE_S  # load-aware: a busy machine's waits do not count
    assert not left

    if fault == "link cut":
        cluster.mend(second)
    elif fault == "slurmd killed":
        cluster.start_slurmd(second)
    cluster.wait_idle(90)
    assert "requeued 1 run" in bench("retry", "--failed", "--pool", "nodes", "--db", cluster_db, check=True).stdout
    _, out = submit_together(cluster, cluster_db, tmp_path / "logs", env, "--pool", "nodes")
    status, attempts, reason, applied = rows(cluster_db, "SELECT status, attempts, reason, applied FROM runs")[0]
    print(f"retried once the node was back: {status}, attempts {attempts}")
    assert status == "done", (reason, out)
    assert sorted(r["host"] for r in applied_of(applied)["ranks"]) == [n.name for n in cluster.nodes]
    assert not cluster.rank_processes()


STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}


def test_a_postgres_restart_under_two_nodes_workers_loses_no_job_and_runs_none_twice(cluster, cluster_db, tmp_path):
    """`submit --slurm --nodes 2 --pool`: a worker on each node (a job array task per node), a queue of stub
    jobs (no torch), the cluster's PostgreSQL stopped for 3 s mid-queue and started again. Every job is done
    exactly once, by one of the two nodes, and neither worker took back a run from the other."""
    jobs = 12
    env = {**STUB, "BENCH_HEARTBEAT_S": "1"}
    bench("enqueue", "--db", cluster_db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs)),
          "--set", "steps=16", "--set", "dataset=builtin", "--set", "cores=1", env=env, check=True)
    started = time.monotonic()
    proc = bench("submit", "--slurm", "--nodes", "2", "--pool", "pgnodes", "--timeout", "60", "--logs",
                 str(tmp_path / "logs"), "--db", cluster_db, env={**cluster.env, **env}, check=True)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout + proc.stderr

    def done() -> int:
        try:
            return rows(cluster_db, "SELECT COUNT(*) FROM runs WHERE status = 'done'")[0][0]
        except Exception:  # the server is down
            return -1

    deadline = time.monotonic() + 60
    while done() < 3:
        assert time.monotonic() < deadline, "no job done within 60 s"
        time.sleep(0.1)
    running = rows(cluster_db, "SELECT COUNT(*) FROM runs WHERE status = 'running'")[0][0]
    cluster.pg.stop()
    time.sleep(3)
    cluster.pg.start()
    wait_gone(cluster, job_id, 120)
    took_s = time.monotonic() - started
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob(f"cpubench-{job_id}_*.out")))
    runs = rows(cluster_db, "SELECT job_id, status, attempts, worker_host FROM runs ORDER BY job_id")
    markers = [p.name for p in (Path(os.environ["BENCH_OUTPUT_DIR"]) / "markers").iterdir()]
    trained = sorted(m.split("-")[1] for m in markers)  # run-<run_id>-<pid>: one per child that trained
    hosts = sorted({r.worker_host for r in runs})
    print(f"\npg restart under two nodes: {len(runs)} runs of {jobs} jobs, {running} running at the stop, "
          f"{len(markers)} trainings, {len(trained) - len(set(trained))} twice, hosts {hosts}, "
          f"attempts {sorted({r.attempts for r in runs})}, {took_s:.1f} s")
    assert "Traceback" not in logs, logs
    assert "database back after" in logs, logs
    assert len(runs) == jobs and {r.status for r in runs} == {"done"}, (runs, logs)
    assert len({r.job_id for r in runs}) == jobs
    assert {r.attempts for r in runs} == {1}, runs  # no run taken back from a live worker
    assert len(markers) == jobs and len(set(trained)) == jobs  # every job trained exactly once
    assert hosts == sorted(n.name for n in cluster.nodes), runs  # both nodes' workers ran jobs


def root_qdiscs(cluster) -> dict[str, str]:
    return {node.name: subprocess.run(["nsenter", f"--net=/run/netns/{node.name}", "tc", "qdisc", "show",
                                       "dev", "eth0"], capture_output=True, text=True).stdout.strip()
            for node in cluster.nodes}


def test_interconnect_shapes_the_links_between_the_nodes_for_the_run_reads_the_rate_back_and_restores_them(
        cluster, cluster_db, tmp_path):
    """interconnect = [default, 1gbit] at nodes = 2 in one allocation, the nodes' eth0 handed to the worker
    (BENCH_INTERCONNECT_LINKS): the 1gbit run ran over a tbf of 1 Gbit/s on both links, as tc read it back;
    the default run over the links as they were; after the allocation, the links are as they were."""
    before = root_qdiscs(cluster)
    env = {"BENCH_COLLECTIVE_TIMEOUT_S": "30", "BENCH_INTERCONNECT_LINKS": cluster.links()}
    enqueue(cluster_db, env, "interconnect=default,1gbit", nodes=2, steps=8)
    job_id, out = submit_together(cluster, cluster_db, tmp_path / "logs", env)
    found = {r.interconnect: r for r in rows(
        cluster_db, "SELECT j.interconnect, r.status, r.reason, r.applied, r.step_ms_median, r.allreduce_ms, "
                    "r.allreduce_share FROM runs r JOIN jobs j USING (job_id)")}
    assert sorted(found) == ["1gbit", "default"] and {r.status for r in found.values()} == {"done"}, (found, out)
    shaped, plain = (applied_of(found[k].applied)["interconnect"] for k in ("1gbit", "default"))
    for k in ("default", "1gbit"):
        r = found[k]
        print(f"\ninterconnect={k}: rate read back {applied_of(r.applied)['interconnect']['rate']}, step "
              f"{r.step_ms_median:.2f} ms, all-reduce {r.allreduce_ms:.3f} ms, share {r.allreduce_share:.3f}")
    print("links during the 1gbit run:", shaped["links"])
    assert shaped["rate"] == "1Gbit" and shaped["qdisc"] == "tbf"
    assert sorted(shaped["links"]) == sorted(cluster.links().split())
    assert all(line.startswith("qdisc tbf") and " rate 1Gbit " in line for line in shaped["links"].values())
    assert plain["rate"] is None and sorted(plain["links"].values()) == sorted(before.values())
    assert root_qdiscs(cluster) == before  # restored (noqueue on a veth: the kernel's own)

