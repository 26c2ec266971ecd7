"""Pools: identical nodes share one queue (each job once per pool); without a pool each machine
runs every job. Real SQLite files and a real PostgreSQL server; real workers for the CLI."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest
from sqlalchemy import text

from common.errors import BadInput
from orchestrator.queue.store import POP_QUEUE, Store
from orchestrator.queue.sweep import Machine, load
from tests.conftest import bench
from tests.reportdb import machine_facts
from tests.test_worker import start_worker
from tests.conftest import done_fields

pytestmark = pytest.mark.probe

STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}


def enqueue(store, n=6, repeats=1, first=32):
    plan = load(None, axes=["d_model=" + ",".join(str(first + 8 * i) for i in range(n))], repeats=repeats,
                machine=Machine(cpu_count=2))
    return store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.iter_jobs())


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request, db):
    if request.param == "sqlite":
        return Store(db)
    return Store(request.getfixturevalue("pg_db"))


def drain(store, machine, pool_id, pid=1, limit=None):
    got = []
    while (limit is None or len(got) < limit) and (claim := store.claim(
            machine, pid=pid, host=f"host{machine}", max_cores=8, pool_id=pool_id)) is not None:
        store.finish(claim.run_id, pid=pid, status="done", fields=done_fields())
        got.append(claim)
    return got


def test_nodes_of_a_named_pool_share_its_queue_and_each_job_runs_once(store):
    enqueue(store, n=8)
    a = store.register_machine(machine_facts("node-a"))
    b = store.register_machine(machine_facts("node-b"))
    pool_a, pool_b = store.pool_id(a, "rack"), store.pool_id(b, "rack")
    assert pool_a == pool_b
    got = drain(store, a, pool_a, limit=3) + drain(store, b, pool_b) + drain(store, a, pool_a)
    assert len(got) == 8 and len({c.job_id for c in got}) == 8
    with store.transaction() as conn:
        ran = conn.execute(text("SELECT machine_id, worker_host, COUNT(*) FROM runs GROUP BY machine_id, worker_host "
                                "ORDER BY machine_id")).all()
    assert [tuple(r) for r in ran] == [(a, f"host{a}", 3), (b, f"host{b}", 5)]  # who ran what is recorded
    assert store.counts(pool_id=pool_a)["done"] == 8
    # The machines' own queues are untouched: each would still run every job to compare machines.
    assert store.counts(a)["queued"] == 8 and store.counts(b)["queued"] == 8


def test_without_a_pool_each_machine_runs_every_job(store):
    enqueue(store, n=5)
    a = store.register_machine(machine_facts("node-a"))
    b = store.register_machine(machine_facts("node-b"))
    assert len(drain(store, a, None)) == 5 and len(drain(store, b, None)) == 5
    assert store.counts(None)["total"] == 10 and store.counts(None)["done"] == 10


def test_one_machine_may_run_a_job_in_its_own_queue_and_in_a_pool(store):
    enqueue(store, n=2)
    a = store.register_machine(machine_facts("node-a"))
    assert len(drain(store, a, None)) == 2
    assert len(drain(store, a, store.pool_id(a, "rack"))) == 2
    assert store.counts(None)["done"] == 4


def test_a_machine_of_other_hardware_may_not_join_a_pool_that_ran_elsewhere(store):
    enqueue(store, n=2)
    a = store.register_machine(machine_facts("node-a", cpu="Xeon 8480"))
    drain(store, a, store.pool_id(a, "rack"), limit=1)
    other = store.register_machine(machine_facts("node-z", cpu="EPYC 9654"))
    with pytest.raises(BadInput, match="pool 'rack' ran on Xeon 8480 .* this machine is EPYC 9654"):
        store.pool_id(other, "rack")
    with pytest.raises(BadInput, match="no pool named 'shelf'"):
        store.pool_id(None, "shelf", create=False)


def test_a_silent_nodes_run_is_taken_back_by_another_node_of_the_pool(store):
    enqueue(store, n=1)
    a = store.register_machine(machine_facts("node-a"))
    b = store.register_machine(machine_facts("node-b"))
    pool = store.pool_id(a, "rack")
    first = store.claim(a, pid=11, host="node-a", max_cores=8, pool_id=pool)
    assert store.claim(b, pid=22, host="node-b", max_cores=8, pool_id=pool) is None
    taken = store.take_back_stale(b, host="node-b", grace_s=-1, max_attempts=3, is_alive=lambda pid: True, pool_id=pool)
    assert taken == [first.run_id]
    again = store.claim(b, pid=22, host="node-b", max_cores=8, pool_id=pool)
    assert (again.run_id, again.attempts) == (first.run_id, 2)  # the same run, its attempts counted on
    store.finish(again.run_id, pid=22, status="done", fields=done_fields())
    with store.transaction() as conn:
        assert conn.execute(text("SELECT machine_id FROM runs")).scalar_one() == b


def test_claims_follow_run_order_repeat_zero_first_and_retry_requeues_in_the_pool(store):
    enqueue(store, n=4, repeats=3)
    a = store.register_machine(machine_facts("node-a"))
    pool = store.pool_id(a, "rack")
    got = drain(store, a, pool)
    with store.transaction() as conn:
        order = dict(conn.execute(text("SELECT job_id, run_order FROM jobs")).all())
    assert [order[c.job_id] for c in got] == sorted(order.values())
    assert [c.config["repeat"] for c in got] == [0] * 4 + [1] * 4 + [2] * 4
    failed = store.claim(a, pid=1, host="h", max_cores=8, pool_id=pool)
    assert failed is None
    with store.transaction(write=True) as conn:
        conn.execute(text("UPDATE runs SET status = 'failed' WHERE run_id IN (SELECT MIN(run_id) FROM runs)"))
    assert store.retry(a, failed=True, skipped=False, pool_id=pool) == 1
    assert len(drain(store, a, pool)) == 1


def test_jobs_enqueued_after_a_pool_started_join_its_queue(store):
    enqueue(store, n=2)
    a = store.register_machine(machine_facts("node-a"))
    pool = store.pool_id(a, "rack")
    assert len(drain(store, a, pool)) == 2
    enqueue(store, n=3, first=200)
    assert len(drain(store, a, pool)) == 3


@pytest.mark.postgres
def test_a_postgresql_claim_skips_a_row_another_claimer_holds_instead_of_waiting(pg_db):
    store = Store(pg_db)
    enqueue(store, n=3)
    a = store.register_machine(machine_facts("node-a"))
    pool = store.pool_id(a, "rack")
    assert store.claim(a, pid=1, host="h", max_cores=8, pool_id=pool) is not None  # makes the pool's queue
    holder = store.engine.connect()
    held = holder.begin()
    popped = holder.execute(text(POP_QUEUE.format(skip_locked="FOR UPDATE SKIP LOCKED")),
                            {"pool_id": pool, "max_cores": 8}).scalar_one()
    result = {}
    claimer = threading.Thread(
        target=lambda: result.update(c=store.claim(a, pid=2, host="h", max_cores=8, pool_id=pool)))
    claimer.start()
    claimer.join(timeout=20)
    try:
        assert not claimer.is_alive(), "the claim waited for the other transaction's row"
        assert result["c"].job_id != popped
    finally:
        held.rollback()
        holder.close()
        claimer.join()


@pytest.mark.slow
def test_workers_started_with_pool_share_it_and_status_and_retry_know_it(db, tmp_path):
    bench("enqueue", "--db", db, "--axis", "d_model=" + ",".join(str(32 + 8 * i) for i in range(10)),
          "--axis", "seed=0,2", "--set", "steps=2", "--set", "dataset=builtin", "--set", "cores=1", check=True)
    a, b = start_worker(db, "--cpus", "0", "--pool", "rack"), start_worker(db, "--cpus", "1", "--pool", "rack")
    assert a.wait(timeout=120) == 0, a.stderr.read()
    assert b.wait(timeout=120) == 0, b.stderr.read()
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT r.job_id, r.status, p.name FROM runs r JOIN pools p USING (pool_id)").fetchall()
    assert len(runs) == 20 and len({r[0] for r in runs}) == 20 and {r[2] for r in runs} == {"rack"}
    markers = list((tmp_path / "output" / "markers").iterdir())
    assert len(markers) == 10  # the seed-0 jobs ran once each; seed 2 exits with code 3 (failed)
    counts = json.loads(bench("status", "--db", db, "--pool", "rack", "--json", check=True).stdout)
    assert ((counts["pool"], counts["total"], counts["done"], counts["failed"], counts["queued"])
            == ("rack", 20, 10, 10, 0))
    mine = json.loads(bench("status", "--db", db, "--json", check=True).stdout)
    assert mine["queued"] == 20  # this machine's own queue is another queue
    everything = json.loads(bench("status", "--db", db, "--all-machines", "--json", check=True).stdout)
    assert everything["pools"]["rack"]["done"] == 10
    retried = bench("retry", "--db", db, "--pool", "rack", "--failed", check=True)
    assert "requeued 10 run(s) of pool rack" in retried.stdout
    unknown = bench("status", "--db", db, "--pool", "shelf")
    assert unknown.returncode == 2 and "no pool named 'shelf'" in unknown.stderr


def test_the_report_compares_pools_and_the_hosts_inside_a_pool(db, tmp_path):
    from orchestrator.report import write_report
    from tests.reportdb import configs, enqueue as enqueue_configs, metrics

    store = Store(db)
    enqueue_configs(store, configs({"d_model": 64, "n_layers": 1}, {"d_model": [64, 128]}, repeats=4))
    a = store.register_machine(machine_facts("node-a"))
    b = store.register_machine(machine_facts("node-b"))
    rack = store.pool_id(a, "rack")
    slow = {"node-a": 1.0, "node-b": 1.5}  # node-b is not as identical as it claims
    for machine, host, pool in ((a, "node-a", rack), (b, "node-b", rack), (a, "node-a", rack), (b, "node-b", rack),
                                (a, "node-a", None)):
        limit = 2 if pool else None
        for claim in iter(lambda: store.claim(machine, pid=1, host=host, max_cores=8, pool_id=pool), None):
            step = claim.config["d_model"] / 64 * (slow[host] if pool else 2.0)
            store.finish(claim.run_id, pid=1, status="done", fields=done_fields(**metrics(step, claim.config)))
            limit = limit - 1 if limit else limit
            if limit == 0:
                break
    summary = write_report(store, tmp_path / "result").summary_path.read_text()
    section = summary.split("## Pools and machines compared")[1].split("\n## ")[0]
    assert "| rack | node-a, node-b | 8 |" in section
    assert f"| machine {a} | node-a | 8 | 0 | 0 | reference |" in section
    assert "node-b 1.50x" in section  # the pool's hosts compared on the configurations they share


def test_the_page_and_summary_list_queues_by_their_number_queue_2_before_queue_10(db, tmp_path):
    from orchestrator.report import write_report
    from tests.reportdb import configs, enqueue as enqueue_configs, metrics

    store = Store(db)
    enqueue_configs(store, configs({"d_model": 64, "n_layers": 1}, {"d_model": [64, 128]}, repeats=2))
    a = store.register_machine(machine_facts("node-a"))
    names = {store.pool_id(a, f"pool-{i}"): f"pool-{i}" for i in range(10)}
    assert {2, 10} <= set(names)
    for pool in (10, 2):
        for claim in iter(lambda: store.claim(a, pid=1, host="node-a", max_cores=8, pool_id=pool), None):
            store.finish(claim.run_id, pid=1, status="done",
                         fields=done_fields(**metrics(claim.config["d_model"] / 64, claim.config)))
    report = write_report(store, tmp_path / "result", plots=False)
    page = (tmp_path / "result" / "index.html").read_text()
    queues = page.split('<table class="pools">')[1].split("</table>")[0]
    assert queues.index(f"<td>{names[2]}</td>") < queues.index(f"<td>{names[10]}</td>")
    summary = report.summary_path.read_text().split("## Pools and machines compared")[1]
    assert summary.index(f"| {names[2]} |") < summary.index(f"| {names[10]} |")
