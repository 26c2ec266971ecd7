"""How many repeat passes `work --target-ci` needs on this machine, and how long they take.

    python benchmarks/adaptive_repeats.py [--target-ci 5] [--max-repeats 20] [--steps 100] [--db PATH]

Enqueues a small real sweep (cores 1 and 2 x d_model 64 and 128, the built-in corpus, `steps`
timed steps, 3 repeats) into a fresh database, runs `bench.py work --target-ci PCT --max-repeats N`
with real training children, and prints: the wall time, every adaptive decision (the pass added and
the comparisons still wider than the target, or the end), and the final effects table's cores and
d_model rows (estimate, 95% half-width, runs per value, target met), with the disturbed runs the fits
left out. The database is kept (--db, default a temporary file printed at the end) for querying.
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bench(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench.py {args[0]} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-ci", type=float, default=5.0)
    ap.add_argument("--max-repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--db", help="database file (default: a new temporary one)")
    args = ap.parse_args()
    db = args.db or str(Path(tempfile.mkdtemp(prefix="adaptive-")) / "results.db")
    Path(db).parent.mkdir(parents=True, exist_ok=True)

    from sqlalchemy import text

    from orchestrator.stats import effects as fx
    from orchestrator.queue.store import Store

    bench("enqueue", "--db", db, "--axis", "cores=1,2", "--axis", "d_model=64,128", "--set", "dataset=builtin",
          "--set", f"steps={args.steps}", "--repeats", "3")
    t0 = time.perf_counter()
    bench("work", "--db", db, "--target-ci", f"{args.target_ci:g}", "--max-repeats", str(args.max_repeats))
    minutes = (time.perf_counter() - t0) / 60
    bench("report", "--db", db, "--out", str(Path(db).parent / "result"))

    store = Store(db)
    with store.transaction() as conn:
        decisions = [dict(r._mapping) for r in conn.execute(text(
            "SELECT decision, repeat, jobs, wide FROM adaptive_decisions ORDER BY decision_id"))]
        effects = [dict(r._mapping) for r in conn.execute(text(
            "SELECT variable, kind, value, baseline, estimate, ci_adj_low, ci_adj_high, half_width, min_runs, "
            "target_met FROM effects WHERE variable IN ('cores', 'd_model') ORDER BY variable, kind"))]
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results"))]
    done = [r for r in rows if r["status"] == "done"]
    flagged = [r for r in done if fx.disturbed(r)]
    print(f"target +-{args.target_ci:g}%, at most {args.max_repeats} runs per value, {args.steps}-step jobs: "
          f"{len(rows)} runs ({len(done)} done, {len(flagged)} flagged disturbed and left out of the fits) "
          f"in {minutes:.1f} min of work")
    for d in decisions:
        wide = ", ".join(f"{w['what']} +-{w['half_width'] * 100:.1f}%" if w["half_width"] is not None
                         else f"{w['what']} (no interval)" for w in json.loads(d["wide"]))
        print(f"  {d['decision']:<16} pass {d['repeat'] if d['repeat'] is not None else '-':>3} "
              f"jobs {d['jobs']:>2}  {wide or '-'}")
    print(f"{'variable':<9}{'effect':<22}{'estimate':>9}{'family-wise 95% CI':>22}{'+-95%':>8}{'runs':>6}  target")
    for e in effects:
        what = "power law" if e["kind"] == "elasticity" else f"{e['value']} vs {e['baseline']}"
        ci = f"{e['ci_adj_low']:.3f} to {e['ci_adj_high']:.3f}" if e["ci_adj_low"] is not None else "-"
        hw = f"{e['half_width'] * 100:.1f}%" if e["half_width"] is not None else "-"
        print(f"{e['variable']:<9}{what:<22}{e['estimate']:>9.3f}{ci:>22}{hw:>8}{e['min_runs']:>6}  "
              f"{'met' if e['target_met'] else 'not met'}")
    per_config: dict = {}
    for r in done:
        per_config.setdefault((r["cores"], r["d_model"]), []).append(r["step_ms_median"])
    for (cores, d_model), ms in sorted(per_config.items()):
        ms = sorted(ms)
        print(f"  cores={cores} d_model={d_model}: {len(ms)} runs, step ms median {ms[len(ms) // 2]:.2f}, "
              f"min {ms[0]:.2f}, max {ms[-1]:.2f}")
    print(f"database: {db}")


if __name__ == "__main__":
    main()
