"""ranks 1 vs 2 (cores = every CPU in both) at two model sizes, from a database the `parallel` preset
filled (`bench.py run --preset parallel --db DB`): per configuration the median over repeats of the
step time, all-reduce time and share, tokens/s, and each rank's read-back affinity and threads, plus
the spread of the repeats (min..max) so the noise is stated. Measures nothing itself; prints.

    flock /tmp/cpu.lock venv/bin/python bench.py run --preset parallel --db /tmp/parallel.db --out /tmp/parallel
    venv/bin/python benchmarks/data_parallel.py /tmp/parallel.db
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from collections import defaultdict

SQL = """SELECT d_model, n_layers, ranks, cores, repeat, step_ms_median, allreduce_ms, allreduce_share, tokens_per_s,
                global_batch, applied, finished, claimed, status FROM v_results ORDER BY run_id"""


def main(db: str) -> None:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(SQL).fetchall()
    groups = defaultdict(list)
    times = [(r[12], r[11]) for r in rows if r[11]]
    for r in rows:
        if r[13] == "done":
            groups[(r[0], r[1], r[2], r[3])].append(r)
    print(f"{len(rows)} runs ({sum(1 for r in rows if r[13] == 'done')} done), first claim to last finish "
          f"{max(f for _, f in times) - min(c for c, _ in times):.0f} s")
    print("| model (d_model x layers) | cores | ranks | runs | step ms median (min..max) | all-reduce ms | share | "
          "tokens/s median (min..max) | global batch | each rank: affinity, threads |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (d, layers, ranks, cores), runs in sorted(groups.items()):
        step = [r[5] for r in runs]
        tps = [r[8] for r in runs]
        ar = [r[6] for r in runs if r[6] is not None]
        share = [r[7] for r in runs if r[7] is not None]
        applied = json.loads(runs[-1][10])
        per_rank = ("; ".join(f"r{x['rank']} {x['affinity']} t{x['torch_threads']}" for x in applied["ranks"])
                    if applied.get("ranks") else f"r0 {applied.get('affinity')} t{applied.get('torch_threads')}")
        print(f"| {d} x {layers} | {cores} | {ranks} | {len(runs)} | {statistics.median(step):.2f} ({min(step):.2f}.."
              f"{max(step):.2f}) | {statistics.median(ar):.2f} | {statistics.median(share):.1%} | " if ar else
              f"| {d} x {layers} | {cores} | {ranks} | {len(runs)} | {statistics.median(step):.2f} ({min(step):.2f}.."
              f"{max(step):.2f}) | - | - | ", end="")
        print(f"{statistics.median(tps):,.0f} ({min(tps):,.0f}..{max(tps):,.0f}) | {runs[0][9]} | {per_rank} |")


if __name__ == "__main__":
    main(sys.argv[1])
