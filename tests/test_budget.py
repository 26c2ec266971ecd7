"""`run --budget` / `work --budget` (orchestrator/queue/budget.py): the allocation against the synthetic
machine's known truth, and end to end with real workers and children (tests/law_child.py: step time
proportional to d_model; tests/stub_child.py: sleeps steps * 50 ms), stopped and killed mid-budget."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from benchmarks import budget_truth
from common.durations import parse_duration
from common.errors import BadInput
from orchestrator.queue import budget
from orchestrator.queue.store import Store
from tests.conftest import ROOT, CpuStall, bench
from tests.test_adaptive import query

pytestmark = pytest.mark.probe

LAW = {"BENCH_CHILD_MODULE": "tests.law_child"}
STUB = {"BENCH_CHILD_MODULE": "tests.stub_child"}
PLAN = ("--axis", "d_model=32,64,128", "--axis", "optimizer=adamw,sgd", "--repeats", "1",
        "--set", "steps=1", "--set", "dataset=builtin", "--set", "cores=1")


def test_durations_read_as_people_type_them():
    assert parse_duration("5m") == 300 and parse_duration("90s") == 90 and parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400 and parse_duration("45") == 45 and parse_duration("1.5m") == 90
    assert parse_duration("none") is None
    for bad in ("5x", "", "m5", "-3m", "0s", "5 m"):
        with pytest.raises(BadInput, match="duration|more than 0"):
            parse_duration(bad)


def test_a_bad_budget_exits_2_naming_it_and_writes_nothing(db):
    bench("enqueue", "--db", db, *PLAN, check=True)
    before = query(db, "SELECT COUNT(*) AS n FROM runs")
    for args in (("work", "--budget", "5x"), ("work", "--budget", "5m", "--target-ci", "5")):
        proc = bench(*args, "--db", db, env=LAW)
        assert proc.returncode == 2, proc.stderr
        assert "--budget" in proc.stderr and "Traceback" not in proc.stderr
    assert query(db, "SELECT COUNT(*) AS n FROM runs") == before
    assert query(db, "SELECT COUNT(*) AS n FROM budgets") == [{"n": 0}]


@pytest.mark.slow
def test_at_the_same_cost_the_budget_leaves_no_interval_unusable_and_keeps_coverage_and_false_alarms(tmp_path):
    """Three seeds of the synthetic machine (its noisy bf16 level, drifting passes): the fixed design of
    three repeats against a budget of the same seconds. The budget spends its time on the widest
    intervals, so its widest is far narrower; coverage and false alarms stay as good."""
    fixed = {"tested": 0, "covered": 0, "false": 0, "unusable": 0, "widest": []}
    spent = dict(fixed, widest=[])
    for seed in range(3):
        for design, totals in (("fixed", fixed), ("budget", spent)):
            store = Store(str(tmp_path / f"{design}-{seed}.db"))
            if design == "fixed":
                machine_id = budget_truth.S.build(store, seed, repeats=3)
            else:
                machine_id, made = budget_truth.run_budget(store, seed)
                assert made[0] == "added runs" and made[-1] in ("spent", "resolved"), made
            got = budget_truth.judge(store, machine_id)
            store.engine.dispose()
            for k in ("tested", "covered", "false", "unusable"):
                totals[k] += got[k]
            totals["widest"].append(max(got["half"]))
    assert spent["unusable"] == 0, spent
    assert spent["covered"] / spent["tested"] >= min(0.95, fixed["covered"] / fixed["tested"] - 0.02), (spent, fixed)
    assert spent["false"] <= fixed["false"] + 1, (spent, fixed)
    assert max(spent["widest"]) < max(fixed["widest"]), (spent, fixed)


def test_the_allocation_reads_widths_and_costs_never_the_direction_of_an_estimate(tmp_path):
    """Mirrored effects (every estimate inverted) get the same comparisons chosen."""
    import dataclasses
    import math

    store = Store(str(tmp_path / "s.db"))
    machine_id = budget_truth.S.build(store, 0, repeats=2)
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results WHERE machine_id = :m"),
                                                        {"m": machine_id})]
    effects = [e for e in budget.fx.analyse(rows, [machine_id]).effects if budget.needs_runs(e)]
    assert effects
    mirrored = [dataclasses.replace(e, estimate=1 / e.estimate if e.kind == "ratio" else -e.estimate) for e in effects]
    assert [budget.needs_runs(e) for e in mirrored] == [budget.needs_runs(e) for e in effects]
    keys = {j: (j, None) for e in effects for j in budget._ids(e)}
    cost = {k: 1.0 + (k[0] % 7) for k in keys.values()}
    picked = budget.choose(effects, keys, cost, 60.0, 30.0)[1]
    assert picked and picked == budget.choose(mirrored, keys, cost, 60.0, 30.0)[1]
    assert all(math.isclose(budget.gain(a), budget.gain(b)) for a, b in zip(effects, mirrored))
    store.engine.dispose()


def test_one_more_run_a_side_repeats_a_comparisons_own_block_not_the_baseline_of_every_other():
    keys = [("base", "n_layers"), ("n_layers=1", "n_layers"), ("base", "d_model"), ("base", "seq_len#2"),
            ("n_layers=1", "n_layers#2"), ("base", "n_layers#2")]
    assert budget.own_keys(keys) == {("base", "n_layers"), ("n_layers=1", "n_layers"), ("n_layers=1", "n_layers#2"),
                                     ("base", "n_layers#2")}
    assert budget.own_keys([("a", None), ("b", None)]) == {("a", None), ("b", None)}  # no blocks: all of it


@pytest.mark.slow
def without_probe_noise(state) -> None:
    """The session's cached probe as if its noise had not been measured: a quiet probe's noise is a prior
    that can make an interval of one run a side usable, so what the budget adds first would follow how
    quiet the machine was when the session probed it (its noise_cv was 0.05-0.064 on a quiet 2-CPU VM)."""
    path = state / "probe-limits.json"
    cached = json.loads(path.read_text())
    for limits in cached.values():
        limits["noise_cv"] = None
    path.write_text(json.dumps(cached))


def test_work_budget_gives_every_comparison_a_second_run_then_the_widest_more_and_the_report_says_so(
        db, tmp_path, isolated_state):
    without_probe_noise(isolated_state)
    bench("enqueue", "--db", db, *PLAN, check=True)
    stall = CpuStall()
    work = bench("work", "--db", db, "--budget", "20s", env=LAW, check=True)
    made = query(db, "SELECT decision, spent_s, budget_s, repeat, jobs, chosen FROM budget_decisions "
                     "ORDER BY decision_id")
    assert made[0]["decision"] == "added runs" and made[0]["repeat"] == 1
    # every job of the first pass again: with one run a side no interval is usable (the probe's prior alone)
    assert made[0]["jobs"] == 6 and all(c["runs"] == 1 for c in json.loads(made[0]["chosen"]))
    assert made[-1]["decision"] in ("resolved", "spent")
    assert all(d["budget_s"] == 20 for d in made) and made[-1]["spent_s"] <= 20 + 2 + stall.seconds()
    assert "budget" in work.stderr and "runs added" in work.stderr
    out = tmp_path / "result"
    bench("report", "--db", db, "--out", str(out), check=True)
    summary = (out / "summary.md").read_text()
    assert "## How the time budget was spent" in summary and "Budget 0 min 20 s" in summary
    assert "| optimizer=sgd vs adamw |" in summary
    page = (out / "index.html").read_text()
    assert "<h2>How the time budget was spent</h2>" in page and "<td>optimizer=sgd vs adamw</td>" in page
    status = bench("status", "--db", db, check=True)
    assert "Time budget (--budget): budget" in status.stdout and "of 20 s spent" in status.stdout


@pytest.mark.slow
def test_run_enqueues_one_pass_of_the_preset_and_stops_when_its_budget_is_spent(tmp_path):
    db, out = str(tmp_path / "results.db"), tmp_path / "result"
    proc = bench("run", "--preset", "quick", "--budget", "6s", "--db", db, "--out", str(out), env=STUB)
    assert proc.returncode == 0, proc.stderr
    assert query(db, "SELECT MAX(repeat) AS r FROM jobs") == [{"r": 0}]  # one pass: the budget adds the rest
    done = query(db, "SELECT COUNT(*) AS n FROM runs WHERE status <> 'queued'")[0]["n"]
    assert 0 < done < query(db, "SELECT COUNT(*) AS n FROM jobs")[0]["n"]
    (d,) = query(db, "SELECT decision, budget_s FROM budget_decisions")
    assert d == {"decision": "spent", "budget_s": 6.0}
    assert "## How the time budget was spent" in (out / "summary.md").read_text()


def _stub_sweep(db: str, jobs: int = 12) -> None:
    bench("enqueue", "--db", db, "--axis", f"d_model={','.join(str(32 + 8 * i) for i in range(jobs))}",
          "--set", "steps=8", "--set", "dataset=builtin", "--set", "cores=1", "--repeats", "1", check=True)


@pytest.mark.slow
def test_a_spent_budget_stops_the_worker_with_jobs_left_and_a_second_start_resumes_under_the_remainder(db):
    _stub_sweep(db)
    stall = CpuStall()
    bench("work", "--db", db, "--budget", "2s", env=STUB, check=True)
    first = query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"]
    assert 1 <= first < 12
    (d,) = query(db, "SELECT decision, spent_s FROM budget_decisions")
    assert d["decision"] == "spent" and 2 <= d["spent_s"] < 2 + 1.5 + stall.seconds()  # the last run's overshoot
    again = bench("work", "--db", db, "--budget", "2s", env=STUB, check=True)  # nothing left of it
    assert query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"] == first
    assert "the budget is spent" in again.stderr
    bench("work", "--db", db, "--budget", "4s", env=STUB, check=True)  # a longer budget continues it
    more = query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"]
    assert first < more < 12
    assert query(db, "SELECT COUNT(*) AS n FROM budgets") == [{"n": 1}]


@pytest.mark.slow
def test_a_worker_killed_mid_budget_is_resumed_under_what_its_runs_spent(db):
    _stub_sweep(db, jobs=16)
    env = {**os.environ, **STUB, "BENCH_HEARTBEAT_S": "0.5"}
    stall = CpuStall()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench.py"), "work", "--db", db, "--budget", "5s"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"] < 3:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"]
    time.sleep(1.5)  # the killed worker's run goes stale, and is taken back by the next worker
    bench("work", "--db", db, "--budget", "5s", env={"BENCH_HEARTBEAT_S": "0.5", **STUB}, check=True)
    after = query(db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'done'")[0]["n"]
    (d,) = query(db, "SELECT decision, spent_s FROM budget_decisions")
    assert d["decision"] == "spent" and 5 <= d["spent_s"] < 5 + 1.5 + stall.seconds()
    assert before < after < 16  # the second worker ran only the remainder
