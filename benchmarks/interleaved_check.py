"""An independent check of one effect of a report: configurations A and B measured alternately with
`bench.py once` (A B A B ..., each pair side by side in time), outside the queue, on the base of a
preset. Prints each pair's ratio B/A, their geometric mean with a 95% t interval over pairs, and,
given --db, the report's own estimate and shown (family-wise) interval for the same comparison.

    venv/bin/python benchmarks/interleaved_check.py --var n_layers --a 2 --b 4 --pairs 8 --db results.db

A and B differ only in --var; everything else is the preset's [base] (its followers derived as the
sweep derives them). Each `once` is a fresh child, as a worker's run is.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def once(settings: dict) -> dict:
    args = [f"{k}={v}" for k, v in settings.items()]
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), "once", *args, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    if proc.returncode:
        raise SystemExit(f"once {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def report_interval(db: str, var: str, a: str, b: str):
    from sqlalchemy import text

    from orchestrator.stats import effects as fx
    from orchestrator.queue.store import Store

    store = Store(db)
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results"))]
    for e in fx.analyse(rows).effects:
        if e.variable == var and e.kind == "ratio" and {e.value, e.baseline} == {a, b} and not e.group:
            if e.value == b:
                return e.estimate, e.ci_low, e.ci_high
            return 1 / e.estimate, 1 / e.ci_high, 1 / e.ci_low
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--var", required=True)
    parser.add_argument("--a", required=True, help="the baseline value")
    parser.add_argument("--b", required=True, help="the value compared with it")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--db", help="a results database whose report has this comparison")
    args = parser.parse_args()
    base = tomllib.loads((ROOT / "orchestrator" / "presets" / f"{args.preset}.toml").read_text())["base"]
    from scipy.stats import t as student

    logs = []
    for i in range(args.pairs):
        order = [("a", args.a), ("b", args.b)] if i % 2 == 0 else [("b", args.b), ("a", args.a)]
        got = {}
        for which, value in order:
            got[which] = once({**base, args.var: value})["step_ms_median"]
        logs.append(math.log(got["b"] / got["a"]))
        print(f"pair {i + 1}: {args.var}={args.a} {got['a']:.1f} ms, {args.var}={args.b} {got['b']:.1f} ms, "
              f"ratio {got['b'] / got['a']:.3f}", flush=True)
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = student.ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
    print(f"{args.var}={args.b} vs {args.a}: {math.exp(mean):.3f}x over {len(logs)} interleaved pairs, 95% CI "
          f"{math.exp(mean - half):.3f} to {math.exp(mean + half):.3f} (pair-to-pair CV {sd:.1%})")
    if args.db:
        got = report_interval(args.db, args.var, args.a, args.b)
        if got is None:
            print(f"the report of {args.db} has no {args.var} {args.b} vs {args.a} comparison")
        else:
            est, lo, hi = got
            inside = lo <= math.exp(mean) <= hi
            print(f"the report: {est:.3f}x, shown interval {lo:.3f} to {hi:.3f}: the interleaved estimate is "
                  f"{'inside' if inside else 'OUTSIDE'} it")


if __name__ == "__main__":
    main()
