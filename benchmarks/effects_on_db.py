"""The top table of a results database's report, old code vs new, on the same rows.

    venv/bin/python benchmarks/effects_on_db.py --db results.db [--baseline /work/baseline]

--baseline is a checkout of the release before (e.g. `git worktree add /work/baseline c6a4c6a`);
each checkout's orchestrator.stats.effects.analyse() runs on the rows of v_results in its own process.
Prints, per checkout, each variable's headline effect (clearest first) with its shown interval and
verdict, the family size, and the median half-width of the shown ratio intervals at each run count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import checkouts

ROOT = checkouts.ROOT


def rows_of(db: str) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from sqlalchemy import text

    from orchestrator.queue.store import Store

    store = Store(db)
    with store.transaction() as conn:
        return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))]


def evaluate(rows_path: Path, code: Path) -> None:
    fx = checkouts.effects_module(code)

    rows = json.loads(rows_path.read_text())
    a = fx.analyse(rows)
    out = {"family": a.family, "top": [], "ratios": []}
    for ve in a.ranked():
        h = ve.headline
        out["top"].append([ve.variable, h.kind, h.value, h.baseline, getattr(h, "group", None), h.estimate,
                           h.ci_low, h.ci_high, h.significant, h.p_adjusted])
    for e in a.effects:
        if e.kind == "ratio" and e.ci_low is not None and not getattr(e, "group", None):
            out["ratios"].append([e.min_runs, (e.ci_high / e.ci_low) ** 0.5 - 1])
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="results.db")
    checkouts.add_arguments(parser)
    args = parser.parse_args()
    if args.evaluate:
        evaluate(args.evaluate, args.code)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.json"
        rows_path.write_text(json.dumps(rows_of(args.db), default=str))
        for label, res in checkouts.evaluate_in_each(__file__, rows_path, args.baseline).items():
            print(f"== {label} code: {res['family']} tests in the family")
            for i, (var, kind, value, base, group, est, lo, hi, sig, p) in enumerate(res["top"], 1):
                what = f"{var}^{est:.2f}" if kind == "elasticity" else f"{var} {value} vs {base}: {est:.2f}x"
                where = f" at {group}" if group else ""
                ci = f"[{lo:.2f}, {hi:.2f}]" if lo is not None else "[no interval]"
                verdict = "clear" if sig else ("not tested" if sig is None else "no detectable effect")
                print(f"{i:3d}. {what}{where} {ci} {verdict}")
            by_runs = defaultdict(list)
            for n, hw in res["ratios"]:
                by_runs[n].append(hw)
            print("median half-width of the shown ratio intervals: " + ", ".join(
                f"{n} runs: +-{statistics.median(v):.1%} ({len(v)} ratios)" for n, v in sorted(by_runs.items())))


if __name__ == "__main__":
    main()
