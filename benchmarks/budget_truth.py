"""`--budget`'s allocation against a known truth: the synthetic machine (tests/synthetic.py) run as a
fixed design of three repeats and as a budget of the same seconds (one pass, then runs where the
intervals are widest: orchestrator/budget.plan), over seeds. Prints, per design, the coverage of the
true effects by the shown (family-wise) intervals, the false alarms (clear effects where the truth is
no change) and the median shown half-width.

    python -m benchmarks.budget_truth [SEEDS]

With `--db PATH [MINUTES...]` it reads a real budget run instead (`run --budget 30m`) and prints the
median shown half-width of its ratio comparisons when the first 5, 15 and 30 minutes of its runs had
finished (a prefix of the allocation: what a shorter budget would have run, but its last pass).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from sqlalchemy import text

from common import variables as V
from orchestrator.queue import budget
from orchestrator.stats import effects as fx
from orchestrator.queue.store import Store
from tests import synthetic as S

SELECT_CONFIGS = "SELECT job_id, config FROM jobs WHERE job_id IN ({ids})"


def _spent(store: Store) -> float:
    with store.transaction() as conn:
        configs = [json.loads(c) for (c,) in conn.execute(text(
            "SELECT j.config FROM runs r JOIN jobs j ON j.job_id = r.job_id WHERE r.status = 'done'"))]
    return sum(S.job_seconds(V.complete(c)) for c in configs)


def _costs(store: Store):
    def costs(job_ids):
        with store.transaction() as conn:
            rows = conn.execute(text(SELECT_CONFIGS.format(ids=", ".join(map(str, job_ids))))).all()
        return {j: S.job_seconds(V.complete(json.loads(c))) for j, c in rows}
    return costs


def run_budget(store: Store, seed: int, budget_s: float | None = None, **noise) -> tuple[int, list[str]]:
    """The budget design on `store`: pass 0, then budget.plan until the budget (default: what three fixed
    passes cost) is spent; the machine id and the decisions."""
    machine_id = S.build(store, seed, repeats=1, **noise)
    rng = random.Random(10_000 + seed)
    if budget_s is None:
        budget_s = 3 * _spent(store)
    made = []
    while True:
        d, _ = budget.plan(store, machine_id, budget_s, _spent(store), _costs(store), label=f"synthetic {seed}")
        made.append(d.decision)
        if not d.added:
            return machine_id, made
        S.finish_queued(store, machine_id, rng, **noise)


def judge(store: Store, machine_id: int) -> dict:
    """Coverage, false alarms and half-widths of the report's effects against tests/synthetic.py's truth."""
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results WHERE machine_id = :m"),
                                                        {"m": machine_id})]
    truth = S.truth_by_label()
    out = {"tested": 0, "covered": 0, "nulls": 0, "false": 0, "half": [], "unusable": 0}
    for e in fx.analyse(rows, [machine_id]).effects:
        t = truth.get((e.kind, e.variable, e.value))
        if t is None or e.se is None or e.group:
            continue
        lo, hi = e.ci_adj
        out["tested"] += 1
        out["covered"] += lo <= t <= hi
        null = abs(t - e.no_change) < 1e-9
        out["nulls"] += null
        out["false"] += null and bool(e.significant)
        out["unusable"] += not e.usable
        if e.kind == "ratio":
            out["half"].append(e.half_width)
    return out


def main(seeds: int = 6) -> None:
    for name in ("fixed", "budget"):
        totals = {"tested": 0, "covered": 0, "nulls": 0, "false": 0, "unusable": 0}
        halves, widest = [], []
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as tmp:
                store = Store(str(Path(tmp) / "s.db"))
                machine_id = S.build(store, seed, repeats=3) if name == "fixed" else run_budget(store, seed)[0]
                got = judge(store, machine_id)
                store.engine.dispose()
            for k in totals:
                totals[k] += got[k]
            halves.append(statistics.median(got["half"]))
            widest.append(max(got["half"]))
        print(f"{name:6s}: coverage {totals['covered']}/{totals['tested']} "
              f"({totals['covered'] / totals['tested']:.1%}), false alarms {totals['false']}/{totals['nulls']}, "
              f"unusable {totals['unusable']}, median shown half-width per seed "
              + ", ".join(f"{h:.1%}" for h in halves) + f" (median {statistics.median(halves):.1%}); widest per seed "
              + ", ".join(f"{h:.0%}" for h in widest))


SELECT_SPENT_ORDER = f"""
SELECT r.run_id, {budget._COST} AS cost FROM runs r WHERE r.status IN ('done', 'failed', 'skipped')
AND r.finished IS NOT NULL ORDER BY r.finished
"""


def prefixes(db: str, minutes: list[float]) -> None:
    """The median shown half-width of a real budget run's ratio comparisons after its first M minutes."""
    store = Store(db)
    with store.transaction() as conn:
        order = conn.execute(text(SELECT_SPENT_ORDER)).all()
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results"))]
    by_id = {r["run_id"]: r for r in rows}
    for m in minutes:
        spent, kept = 0.0, []
        for run_id, cost in order:
            spent += float(cost or 0.0)
            if spent > m * 60:
                break
            if run_id in by_id:
                kept.append(by_id[run_id])
        machines = sorted({r["machine_id"] for r in kept})
        effects = [e for e in fx.analyse(kept, machines).effects if e.kind == "ratio"]
        halves = [e.half_width for e in effects if e.se is not None]
        clear = sorted({e.variable for e in fx.analyse(kept, machines).effects if e.significant})
        print(f"{m:g} min: {len(kept)} runs, {len(halves)}/{len(effects)} ratio comparisons with an interval, "
              f"median shown half-width {statistics.median(halves):.1%}, unusable "
              f"{sum(not e.usable for e in effects if e.se is not None)}; clear: {', '.join(clear)}")
    store.engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--db":
        prefixes(sys.argv[2], [float(x) for x in sys.argv[3:]] or [5, 15, 30])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
