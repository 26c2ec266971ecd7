"""What `report --watch` saves by keeping each machine's comparisons and predictions while its runs
do not change (write_report's memo): one watched round after a run of ONE machine changed, against
the same report written from nothing, interleaved (memo, fresh, memo, fresh...), on a synthetic
fleet database (tests/scaledb.py). Prints each round's seconds and the medians; asserts nothing.

    venv/bin/python benchmarks/watch_incremental.py --runs 100000 --machines 4 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from orchestrator.report import write_report  # noqa: E402
from tests.scaledb import build  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--machines", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="watch-incr-"))
    store = build(str(tmp / "fleet.db"), args.runs, machines=args.machines, quiet=True)
    memo: dict = {}
    write_report(store, tmp / "warm", plots=False, memo=memo)  # the watcher's first round: everything
    watched, fresh = [], []
    for i in range(args.repeats):
        machine = 1 + i % args.machines  # one run of one machine changes between rounds
        with store.transaction() as conn:
            run_id = conn.execute(text("SELECT min(run_id) FROM runs WHERE machine_id = :m AND status = 'done'"),
                                  {"m": machine}).scalar()
            conn.execute(text("UPDATE runs SET status = 'failed', reason = 'benchmark', finished = finished + 1 "
                              "WHERE run_id = :r"), {"r": run_id})
        for kind, out in (("watched", watched), ("fresh", fresh))[:: 1 if i % 2 == 0 else -1]:
            t0 = time.perf_counter()
            write_report(store, tmp / f"{kind}{i}", plots=False, memo=memo if kind == "watched" else None)
            out.append(time.perf_counter() - t0)
            print(f"round {i + 1}: machine {machine} changed; {kind} report {out[-1]:.2f} s", flush=True)
    print(f"{args.runs:,} runs on {args.machines} machines, one machine's runs changed per round, "
          f"{args.repeats} rounds:")
    for kind, xs in (("watched (memo)", watched), ("fresh", fresh)):
        print(f"  {kind}: median {statistics.median(xs):.2f} s [{min(xs):.2f}-{max(xs):.2f}]")


if __name__ == "__main__":
    main()
