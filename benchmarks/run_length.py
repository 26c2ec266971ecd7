"""Does a longer timed window narrow the intervals? The model's residual at two step counts.

    venv/bin/python benchmarks/run_length.py [--steps 10 30] [--rounds 3] [--dir /tmp/run-length]

One blocked ofat sweep on the quick base (five axes, three repeats) is run once per step count and
round, the step counts alternating (round 1 at 10 steps, round 1 at 30, round 2 at 10, ...) so both
see the machine alike; each into its own database, each round with its own seed. Prints, per
database, the wall time, the model's residual (orchestrator/stats/step_model.py: configuration + block +
residual, the figure every interval of the report is built from) with its degrees of freedom, and
the median shown ratio half-width. If the noise were a run's own sampling, three times the steps
would cut the residual by about sqrt(3). Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SWEEP = """
[sweep]
name = "run-length-{steps}"
mode = "ofat"
repeats = 3
seed = {seed}

[base]
d_model = 256
n_layers = 2
n_heads = 4
seq_len = 64
batch_size = 4
vocab_size = 1024
window = 16
steps = {steps}
warmup_steps = 2

[axes]
n_layers = [1, 2, 4]
d_model = [128, 256, 384]
batch_size = [2, 4, 8]
omp_threads = [1, 2]
seq_len = [32, 64, 128]
"""


def bench(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def residual(db: Path) -> tuple[float, float, float]:
    """(the model's residual CV, its degrees of freedom, the median shown ratio half-width)."""
    from sqlalchemy import text

    from orchestrator.stats import effects as fx
    from orchestrator.queue.store import Store

    with Store(str(db)).transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))]
    analysis = fx.analyse(rows)
    (machine,) = analysis.machines.values()
    stratum = max(machine.noise.strata, key=lambda s: s.runs)
    half = [(e.ci_high / e.ci_low) ** 0.5 - 1 for e in analysis.effects
            if e.kind == "ratio" and e.ci_low and not e.group]
    return stratum.cv, stratum.dof, statistics.median(half)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 30])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/run-length"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    for round_ in range(1, args.rounds + 1):
        for steps in args.steps:
            db, sweep = args.dir / f"r{round_}_s{steps}.db", args.dir / f"r{round_}_s{steps}.toml"
            for stale in args.dir.glob(f"{db.name}*"):
                stale.unlink()
            sweep.write_text(SWEEP.format(steps=steps, seed=round_))
            t0 = time.time()
            bench("enqueue", str(sweep), "--db", str(db))
            bench("work", "--db", str(db))
            cv, dof, half = residual(db)
            print(f"round {round_}, {steps} steps: {time.time() - t0:.0f} s, residual {cv:.1%} ({dof:.0f} df), "
                  f"median shown ratio half-width +-{half:.1%}", flush=True)


if __name__ == "__main__":
    main()
