"""`predict --to-loss` against configurations its database never ran: the learning preset's database
fits the tokens-to-loss law and the cost model; this script trains held-out configurations (other
widths, batch sizes and learning rates, five seeds each, seeds the preset never used) into a
database of their own and prints predicted vs measured time to target (the median over seeds, as
measured: training plus evaluation), the error, and whether each 95% interval covers it.

    venv/bin/python benchmarks/learning_heldout.py --train-db learning.db --heldout-db heldout.db [--run]

--run trains the held-out configurations first (`bench.py enqueue` + `work`, the preset's base with
one change each); without it the held-out database is read as it is. Prints, never asserts.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "orchestrator" / "presets" / "learning.toml"
# One change each from the preset's base, none of them a value the preset ran; chosen before any ran.
HELDOUT = [{"d_model": 48}, {"d_model": 96}, {"batch_size": 12}, {"batch_size": 24}, {"lr": 0.002}, {"lr": 0.005}]
SEED = 100  # training seeds 100..104: the preset trains seeds 0..4


def bench(*args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def base() -> dict:
    return tomllib.loads(PRESET.read_text())["base"]


def run_heldout(db: str, repeats: int) -> None:
    for change in HELDOUT:
        settings = base() | change | {"seed": SEED}
        args = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
        bench("enqueue", "--db", db, *args, "--repeats", str(repeats), "--name", "heldout-" + "-".join(
            f"{k}{v}" for k, v in change.items()))
    bench("work", "--db", db)


def measured(db: str, change: dict) -> tuple[list[float], int]:
    """The held-out configuration's runs: their times to target (reached ones) and how many did not reach."""
    where = " AND ".join(f"{k} = ?" for k in base() | change if k not in ("dataset",))
    values = [v for k, v in (base() | change).items() if k not in ("dataset",)]
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT reached, time_to_target_s FROM v_results WHERE status = 'done' AND seed = ? "
                            f"AND {where}", [SEED, *values]).fetchall()
    return [t for r, t in rows if r], sum(1 for r, _ in rows if not r)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-db", required=True)
    parser.add_argument("--heldout-db", required=True)
    parser.add_argument("--run", action="store_true", help="train the held-out configurations first")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.run:
        run_heldout(args.heldout_db, args.repeats)
    target = base()["target_loss"]
    print("| held-out change | predicted s [95%] | measured median s (runs, unreached) | error | covered |")
    print("|---|---|---|---|---|")
    errors, covered = [], 0
    for change in HELDOUT:
        settings = {k: v for k, v in (base() | change).items() if k not in ("max_tokens", "target_loss", "eval_every")}
        doc = json.loads(bench("predict", "--db", args.train_db, *(f"{k}={v}" for k, v in settings.items()),
                               "--to-loss", str(target), "--json"))
        times, unreached = measured(args.heldout_db, change)
        if not times:
            print(f"| {change} | {doc['time_to_target_s']:.1f} | no run reached it ({unreached}) | - | - |")
            continue
        m = statistics.median(times)
        error = doc["time_to_target_s"] / m - 1
        inside = doc["time_to_target_s_low"] <= m <= doc["time_to_target_s_high"]
        errors.append(abs(error))
        covered += inside
        print(f"| {change} | {doc['time_to_target_s']:.1f} [{doc['time_to_target_s_low']:.1f}, "
              f"{doc['time_to_target_s_high']:.1f}] | {m:.1f} ({len(times)}, {unreached}) | {error:+.0%} | "
              f"{'yes' if inside else 'no'} |")
    if errors:
        print(f"\nmedian |error| {statistics.median(errors):.0%} over {len(errors)} configurations; "
              f"{covered} of {len(errors)} intervals cover the measured median")


if __name__ == "__main__":
    main()
