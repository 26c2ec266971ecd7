"""Per-job overhead of the queue and the child, on tiny jobs: jobs per minute, and how much of each
job's wall time is not timed steps (child start, imports, data, model, warmup, saving, recording).

    venv/bin/python benchmarks/queue_overhead.py [--jobs 12] [--steps 5]

Prints figures; asserts nothing. Uses a throwaway database and state dir.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cpubench-overhead-"))
    db = str(tmp / "results.db")
    env = {**os.environ, "BENCH_STATE_DIR": str(tmp / "state"), "BENCH_OUTPUT_DIR": str(tmp / "output")}
    bench = [sys.executable, str(ROOT / "bench.py")]
    widths = ",".join(str(32 + 8 * i) for i in range(args.jobs))
    subprocess.run([*bench, "enqueue", "--db", db, "--axis", f"d_model={widths}", "--set", "n_layers=1",
                    "--set", "seq_len=32", "--set", "batch_size=4", "--set", f"steps={args.steps}",
                    "--set", "warmup_steps=1", "--set", "vocab_size=512"], check=True, env=env, cwd=ROOT)
    # The first job pays for the probe and the data cache: warm them with one job, then time the rest.
    subprocess.run([*bench, "work", "--db", db, "--max-jobs", "1"], check=True, env=env, cwd=ROOT,
                   stderr=subprocess.DEVNULL)
    start = time.perf_counter()
    subprocess.run([*bench, "work", "--db", db], check=True, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT wall_s, train_s, setup_s, first_step_s FROM runs WHERE status = 'done' "
                            "ORDER BY run_id").fetchall()[1:]
        statuses = conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
    n = len(rows)
    print(f"statuses: {dict(statuses)}")
    print(f"{n} tiny jobs in {elapsed:.1f} s: {60 * n / elapsed:.1f} jobs/min")
    overhead = [w - t for w, t, _, _ in rows]
    print(f"per-job child overhead beyond timed steps (wall_s - train_s): median {statistics.median(overhead):.2f} s, "
          f"min {min(overhead):.2f}, max {max(overhead):.2f}")
    print(f"  of which setup_s (start to first step) median {statistics.median(r[2] for r in rows):.2f} s, "
          f"first_step_s median {statistics.median(r[3] for r in rows):.3f} s")
    worker_side = (elapsed - sum(w for w, _, _, _ in rows)) / n
    print(f"per-job worker overhead outside the child (claim, knobs, record, worker start amortised): {worker_side:.3f} s")
    print(f"per-job total overhead (elapsed/jobs - train_s): "
          f"{statistics.median(elapsed / n - t for _, t, _, _ in rows):.2f} s")


if __name__ == "__main__":
    main()
