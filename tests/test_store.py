"""The store on real SQLite files and on a real PostgreSQL server."""

import re
import sqlite3
import threading

import pytest

from orchestrator.queue.store import Store
from orchestrator.queue.sweep import Machine, load
from common.variables import NAMES
from tests.conftest import done_fields

FACTS = {"fingerprint": "test-machine", "hostname": "here", "logical_cores": 2, "knobs": {"freq_mhz": "no cpufreq"}}


def plan(tmp_path, n=6, repeats=1):
    path = tmp_path / "s.toml"
    values = ", ".join(str(32 + 8 * i) for i in range(n))
    path.write_text(f"[sweep]\nname = \"s\"\nrepeats = {repeats}\n[axes]\nd_model = [{values}]\n")
    return load(path, machine=Machine(cpu_count=2))


def enqueue(store, p):
    return store.enqueue(name=p.name, source=p.source, sweep_text=p.text, jobs=p.jobs)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request, db, tmp_path):
    if request.param == "sqlite":
        return Store(db)
    return Store(request.getfixturevalue("pg_db"))


def test_jobs_columns_follow_the_catalogue(db):
    Store(db)
    columns = [r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(jobs)")]
    assert columns[columns.index("cores"):] == list(NAMES)


def test_sqlite_runs_in_wal_mode(db):
    Store(db)
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_enqueue_twice_adds_nothing_the_second_time(store, tmp_path):
    p = plan(tmp_path, repeats=2)
    first, second = enqueue(store, p), enqueue(store, p)
    assert (first.new, first.present) == (12, 0)
    assert (second.new, second.present) == (0, 12)
    assert store.counts(None)["total"] == 12


def test_claims_follow_run_order_and_finish_records_metrics(store, tmp_path):
    p = plan(tmp_path)
    enqueue(store, p)
    machine = store.register_machine(FACTS)
    first = store.claim(machine, pid=1, host="here", max_cores=2)
    assert first.config["d_model"] == p.jobs[0]["config"]["d_model"]
    store.finish(first.run_id, pid=1, status="done", fields=done_fields(step_ms_median=3.5, applied={"affinity": [0]}))
    with store.transaction() as conn:
        row = conn.exec_driver_sql("SELECT status, step_ms_median, applied FROM v_results").one()
    assert row[0] == "done" and row[1] == 3.5 and "affinity" in row[2]


def test_finish_of_a_run_taken_away_raises(store, tmp_path):
    enqueue(store, plan(tmp_path))
    machine = store.register_machine(FACTS)
    claim = store.claim(machine, pid=10, host="here", max_cores=2)
    store.take_back_stale(machine, host="here", grace_s=1e9, max_attempts=3, is_alive=lambda pid: False)
    with pytest.raises(Exception, match="taken back"):
        store.finish(claim.run_id, pid=10, status="done", fields=done_fields())


def _reason(store) -> str:
    with store.transaction() as conn:
        return conn.exec_driver_sql("SELECT reason FROM runs").scalar_one()


def test_a_worker_dead_before_its_child_started_costs_no_strike_until_the_backstop(store, tmp_path):
    """A user stopping and restarting a worker kills it while it starts, over and over: the job is not
    to blame, but a job that kills its worker every time must still end (UNCOUNTED_PER_STRIKE)."""
    from orchestrator.queue.store import UNCOUNTED_PER_STRIKE

    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    cap = UNCOUNTED_PER_STRIKE * 3
    for attempt in range(1, cap + 1):
        claim = store.claim(machine, pid=100 + attempt, host="here", max_cores=2)
        assert claim is not None and (claim.attempts, claim.strikes) == (attempt, 0)
        store.take_back_stale(machine, host="here", grace_s=1e9, max_attempts=3, is_alive=lambda pid: False)
        if attempt == 3:  # where three claims used to fail it
            assert "requeued: worker pid 103 on here died (not counted: before its child started)" == _reason(store)
    assert store.claim(machine, pid=200, host="here", max_cores=2) is None
    counts = store.counts(machine)
    assert counts["failed"] == 1 and counts["running"] == 0
    assert _reason(store) == (f"gave up after {cap} claims, {cap} of them taken back from a dead worker without a "
                              f"strike; last: worker pid {100 + cap} on here died "
                              "(not counted: before its child started)")


def test_a_worker_dead_while_its_child_ran_past_its_prediction_strikes_and_three_strikes_fail(store, tmp_path):
    import time

    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    for attempt, predicted in enumerate((10.0, 0.1, 0.1, 0.1), start=1):
        claim = store.claim(machine, pid=100 + attempt, host="here", max_cores=2)
        assert store.heartbeat(claim.run_id, child_pid=5000 + attempt)  # the child starts
        time.sleep(0.3)
        assert store.heartbeat(claim.run_id, child_pid=5000 + attempt)  # and runs 0.3 s by the last beat
        assert store.take_back_stale(machine, host="here", grace_s=1e9, max_attempts=3, is_alive=lambda pid: False,
                                     predicted_s=lambda job_id: predicted) == [claim.run_id]
        reason = _reason(store)
        if attempt == 1:
            assert re.fullmatch(r"requeued: worker pid 101 on here died \(not counted: child ran 0\.\d s of a "
                                r"predicted 10 s\)", reason), reason
        elif attempt == 2:
            assert re.fullmatch(r"requeued: worker pid 102 on here died while its child ran 0\.\d s, past 2x its "
                                r"predicted 0\.1 s \(strike 1 of 3\)", reason), reason
    assert re.fullmatch(r"gave up after 3 strikes; last: worker pid 104 on here died while its child ran 0\.\d s, "
                        r"past 2x its predicted 0\.1 s", reason), reason
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT status, attempts, strikes FROM runs").one() == ("failed", 4, 3)


def test_a_strike_from_a_live_worker_requeues_and_retry_clears_the_count(store, tmp_path):
    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    claim = store.claim(machine, pid=7, host="here", max_cores=2)
    assert store.strike(claim.run_id, pid=8, reason="not ours") is False  # another worker's run: untouched
    assert store.strike(claim.run_id, pid=7, reason="requeued (strike 1 of 3): child killed by signal SIGKILL")
    again = store.claim(machine, pid=7, host="here", max_cores=2)
    assert (again.run_id, again.attempts, again.strikes) == (claim.run_id, 2, 1)
    store.finish(again.run_id, pid=7, status="failed", reason="gave up", fields={}, strike=True)
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT status, attempts, strikes FROM runs").one() == ("failed", 2, 2)
    assert store.retry(machine, failed=True, skipped=False) == 1
    fresh = store.claim(machine, pid=7, host="here", max_cores=2)
    assert (fresh.attempts, fresh.strikes) == (1, 0)


def test_a_live_worker_on_this_host_keeps_its_run(store, tmp_path):
    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    store.claim(machine, pid=5, host="here", max_cores=2)
    assert store.take_back_stale(machine, host="here", grace_s=1e9, max_attempts=3, is_alive=lambda pid: True) == []


def test_a_silent_worker_on_another_host_loses_its_run_after_the_grace_period(store, tmp_path):
    enqueue(store, plan(tmp_path, n=1))
    machine = store.register_machine(FACTS)
    store.claim(machine, pid=5, host="elsewhere", max_cores=2)
    assert store.take_back_stale(machine, host="here", grace_s=60, max_attempts=3, is_alive=lambda pid: True) == []
    assert len(store.take_back_stale(machine, host="here", grace_s=-1, max_attempts=3, is_alive=lambda pid: True)) == 1


def test_jobs_wider_than_the_worker_pool_wait(store, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[axes]\ncores = [2]\n")
    p = load(path, machine=Machine(cpu_count=2))
    enqueue(store, p)
    machine = store.register_machine(FACTS)
    assert store.claim(machine, pid=1, host="here", max_cores=1) is None
    assert store.claim(machine, pid=1, host="here", max_cores=2) is not None


def test_concurrent_claims_never_hand_out_a_job_twice(store, tmp_path):
    enqueue(store, plan(tmp_path, n=40))
    machine = store.register_machine(FACTS)
    got: list[int] = []
    lock = threading.Lock()

    def claimer(pid):
        while (claim := store.claim(machine, pid=pid, host="here", max_cores=2)) is not None:
            with lock:
                got.append(claim.job_id)

    threads = [threading.Thread(target=claimer, args=(pid,)) for pid in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(set(got)) and len(got) == 40


def test_retry_puts_failed_and_skipped_runs_back(store, tmp_path):
    enqueue(store, plan(tmp_path, n=2))
    machine = store.register_machine(FACTS)
    a = store.claim(machine, pid=1, host="here", max_cores=2)
    store.finish(a.run_id, pid=1, status="failed", reason="boom")
    b = store.claim(machine, pid=1, host="here", max_cores=2)
    store.finish(b.run_id, pid=1, status="skipped", reason="no cpufreq")
    assert store.retry(machine, failed=True, skipped=False) == 1
    assert store.counts(machine)["queued"] == 1
    assert store.retry(machine, failed=False, skipped=True) == 1
    assert store.counts(machine)["queued"] == 2


def test_a_job_planned_by_two_sweeps_belongs_to_both_is_stored_once_and_counted_once(store):
    machine = Machine(cpu_count=2)
    a = load(None, axes=["d_model=32,40"], machine=machine)
    b = load(None, sets=["steps=20"], axes=["d_model=40,48"], machine=machine)  # same jobs as a's 40, other text
    assert enqueue(store, a).new == 2
    second = store.enqueue(name="b", source=b.source, sweep_text=b.text, jobs=b.iter_jobs())
    assert (second.new, second.present) == (1, 1)
    with store.transaction() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM sweep_jobs").scalar_one() == 4  # 40 belongs to both
    by_sweep = store.counts_by_sweep(None)  # each job once, under the sweep that first planned it
    assert a.name == "d_model" and by_sweep["d_model"]["total"] == 2 and by_sweep["b"]["total"] == 1
    assert sum(c["total"] for c in by_sweep.values()) == store.counts(None)["total"] == 3


@pytest.mark.parametrize("status, fields, words", [
    ("done", done_fields(steps_seen=4), "unknown field(s) steps_seen"),
    ("done", {k: v for k, v in done_fields().items() if k != "mfu"}, "missing metric(s) mfu"),
    ("failed", {"oops": 1}, "unknown field(s) oops"),
])
def test_a_result_with_an_unknown_or_missing_metric_is_refused_and_nothing_is_written(store, tmp_path, status,
                                                                                       fields, words):
    enqueue(store, plan(tmp_path))
    machine = store.register_machine(FACTS)
    claim = store.claim(machine, pid=1, host="here", max_cores=2)
    with pytest.raises(Exception, match=re.escape(words)):
        store.finish(claim.run_id, pid=1, status=status, fields=fields)
    with store.transaction() as conn:
        assert conn.exec_driver_sql(f"SELECT status FROM runs WHERE run_id = {claim.run_id}").scalar() == "running"


def test_a_claimed_config_holds_every_variable_even_those_its_stored_json_leaves_out(store):
    """The planner stores a later release's variables only away from their unset value (lora_rank at 8,
    blas at what older releases ran, BLAS_OF): a claim puts them back, or finetune_lora's child found no
    lora_rank (make run's task block failed with KeyError: 'lora_rank')."""
    plan = load(sets=["task=finetune_lora"], machine=Machine(cpu_count=2))
    store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.jobs)
    machine = store.register_machine({"fingerprint": "fp-claim", "hostname": "h"})
    claim = store.claim(machine, pid=1, host="h", max_cores=2)
    assert set(claim.config) == set(NAMES)
    assert claim.config["lora_rank"] == 8 and claim.config["blas"] == "mkl_intel_path"  # torch's auto, stored
