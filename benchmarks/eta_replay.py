"""How right the progress bar's ETA was over a finished sweep: its runs replayed in claim order.

    python benchmarks/eta_replay.py RESULTS.db [--pool ID]

After each finished run k, the ETA is what orchestrator/queue/eta.py would have said then (learn() on runs
1..k, remaining_s() of the jobs of runs k+1..n); the truth is the cost of runs k+1..n (each run's
larger of wall_s and claim-to-finish, the estimator's own measure; waits between runs left out).
Prints the error |ETA - truth| / truth at a quarter, half and three quarters of the sweep's time,
the largest from halfway to 90% of it, and the largest in seconds from halfway to the end. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from orchestrator.queue.eta import FINISHED_ROWS, learn, queued_of, remaining_s
from orchestrator.queue.store import Store

# the estimator's own rows, every one of them, in the order they were claimed
SELECT_RUNS = FINISHED_ROWS + "ORDER BY r.claimed, r.run_id\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--pool", type=int, default=None, help="the pool (default: the one with most runs)")
    args = ap.parse_args()
    store = Store(args.db)
    with store.transaction() as conn:
        pool = args.pool or conn.execute(
            text("SELECT pool_id FROM runs GROUP BY pool_id ORDER BY COUNT(*) DESC")).scalar()
        runs = [tuple(r) for r in conn.execute(text(SELECT_RUNS), {"pool_id": pool})]
    costs = [max(0.0, float(r[2] or 0.0)) for r in runs]
    total, spent, errors = sum(costs), 0.0, []
    for k in range(1, len(runs)):
        spent += costs[k - 1]
        finished = runs[:k][::-1]  # the estimator reads the latest first
        if not any(r[1] == "done" for r in finished):
            continue
        eta = remaining_s(learn(finished), [queued_of(r) for r in runs[k:]])
        truth = total - spent
        errors.append((spent / total, (eta - truth) / truth, eta, truth))
    print(f"{len(runs)} runs, {total / 60:.1f} min of run time")
    for mark in (0.25, 0.5, 0.75):
        at = next(e for e in errors if e[0] >= mark)
        print(f"at {mark:.0%} of the time: ETA {at[2] / 60:.1f} min, truth {at[3] / 60:.1f} min, error {at[1]:+.0%}")
    late = [e for e in errors if e[0] >= 0.5]
    if not late:
        print("no run after halfway")
        return
    # Near the end the truth is seconds, so a relative error there says little: the relative error up
    # to 90% of the time, and the absolute error (seconds) from halfway to the end.
    mid = [abs(e[1]) for e in late if e[0] < 0.9]
    print(f"largest error from halfway to 90% of the time: {max(mid):.0%}" if mid else "no run from halfway to 90%")
    worst = max(late, key=lambda e: abs(e[2] - e[3]))
    print(f"largest error from halfway on, in seconds: {worst[2] - worst[3]:+.0f} s (ETA {worst[2]:.0f} s, truth "
          f"{worst[3]:.0f} s, at {worst[0]:.0%} of the time)")


if __name__ == "__main__":
    main()
