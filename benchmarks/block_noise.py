"""Ratio noise of a blocked run order against today's shuffled passes, at equal run counts, on this
machine as it is (shared or not: the point is how the order copes with its noise).

    python benchmarks/block_noise.py [SWEEP.toml] [--repeats 6] [--dir /tmp/block-noise]

One ofat sweep (by default SWEEP below: four blocks of an axis's two values and its baseline) is
planned twice, into two databases with the same jobs: `blocked` keeps the planner's order (each
block's jobs side by side), `shuffled` gets the order every pass had before blocks (a seeded shuffle
of the whole pass, sweep.run_order). The two run pass by pass in turn (blocked pass 0, shuffled pass
0, blocked pass 1, ...: `bench.py work --max-jobs PASS`), so both see the machine's load alike.
For every repeat, block and value other than the baseline: log(step_ms_median of the value / of
the block's baseline in the same pass). Prints, per order, the standard deviation of that log ratio
over the repeats, pooled over the (block, value) pairs (root mean square of the per-pair SDs, each
on repeats - 1 degrees of freedom), as a percentage; and the same from the blocked database with
each value paired with the baseline of *another* block of its pass (a baseline run at another
time of the pass, as a shuffled pass would have it: a third estimate from the same runs).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.queue.sweep import run_order  # noqa: E402

SWEEP = """
[sweep]
name = "block-noise"
mode = "ofat"
repeats = {repeats}
seed = 0

[base]
d_model = 128
n_layers = 2
n_heads = 4
seq_len = 64
batch_size = 4
vocab_size = 1024
steps = 8
warmup_steps = 1
dataset = "builtin"

[axes]
activation = ["gelu", "relu", "silu"]
n_layers = [1, 2, 3]
optimizer = ["adamw", "sgd"]
attn_backend = ["sdpa", "manual", "sdpa_math"]
"""


def bench(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def shuffle_as_before(db: Path) -> None:
    """Today's order before blocks: a seeded shuffle of each whole pass (the same function)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT job_id, repeat, config_hash FROM jobs").fetchall()
        conn.executemany("UPDATE jobs SET run_order = ? WHERE job_id = ?",
                         [(run_order(0, r, h), j) for j, r, h in rows])


def log_ratios(db: Path, base_of: dict, other_block: bool = False, seed: int = 0) -> dict:
    """(block, value job's config) -> [log(value / baseline) per repeat]."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT v.repeat, v.block, j.config, v.step_ms_median FROM v_results v "
                            "JOIN jobs j ON j.job_id = v.job_id WHERE v.status = 'done'").fetchall()
    by = defaultdict(dict)  # (repeat) -> {(block, config): step}
    for repeat, block, config, step in rows:
        by[repeat][(block, _without_repeat(config))] = step
    rng = random.Random(seed)
    out = defaultdict(list)
    for repeat, cells in by.items():
        blocks = sorted({b for b, _ in cells})
        for (block, config), step in cells.items():
            if config == base_of[block]:
                continue
            home = block if not other_block else rng.choice([b for b in blocks if b != block])
            base = cells.get((home, base_of[home]))
            if base:
                out[(block, config)].append(math.log(step / base))
    return out


def _without_repeat(config_json: str) -> str:
    import json

    c = json.loads(config_json)
    c.pop("repeat", None)
    return json.dumps(c, sort_keys=True)


def pooled_sd_percent(ratios: dict) -> tuple[float, int]:
    sds = [(statistics.variance(v), len(v) - 1) for v in ratios.values() if len(v) >= 2]
    dof = sum(d for _, d in sds)
    return 100 * math.sqrt(sum(var * d for var, d in sds) / dof), dof


def baselines(db: Path) -> dict:
    """block -> the baseline's config: the one configuration every block holds."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT block, config FROM jobs WHERE repeat = 0").fetchall()
    configs = defaultdict(set)
    for block, config in rows:
        configs[block].add(_without_repeat(config))
    shared = set.intersection(*configs.values())
    assert len(shared) == 1, "every block holds the baseline"
    return dict.fromkeys(configs, shared.pop())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", nargs="?")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--dir", default="/tmp/block-noise")
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    sweep = Path(args.sweep) if args.sweep else folder / "sweep.toml"
    if not args.sweep:
        sweep.write_text(SWEEP.format(repeats=args.repeats))
    dbs = {"blocked": folder / "blocked.db", "shuffled": folder / "shuffled.db"}
    for order, db in dbs.items():
        if not db.exists():
            bench("enqueue", str(sweep), "--db", str(db))
            if order == "shuffled":
                shuffle_as_before(db)
    with sqlite3.connect(dbs["blocked"]) as conn:
        per_pass = conn.execute("SELECT COUNT(*) FROM jobs WHERE repeat = 0").fetchone()[0]
        repeats = conn.execute("SELECT MAX(repeat) + 1 FROM jobs").fetchone()[0]
    t0 = time.time()
    for r in range(repeats):
        for order, db in dbs.items():
            bench("work", "--db", str(db), "--max-jobs", str(per_pass))
            print(f"pass {r} {order} done at {time.time() - t0:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    base_of = baselines(dbs["blocked"])
    print(f"{per_pass} jobs a pass, {repeats} passes per order; baselines of blocks: {sorted(base_of)}")
    for label, db, other in (("blocked (baseline beside it)", dbs["blocked"], False),
                             ("shuffled passes (today's order)", dbs["shuffled"], False),
                             ("blocked runs, baseline of another block", dbs["blocked"], True)):
        sd, dof = pooled_sd_percent(log_ratios(db, base_of, other_block=other))
        print(f"{label}: SD of log(value / baseline) {sd:.1f}% ({dof} dof)")


if __name__ == "__main__":
    main()
