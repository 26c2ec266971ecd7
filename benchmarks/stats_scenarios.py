"""The report's statistics on held-out scenarios with known truths (tests/scenarios.py), old code vs new.

    venv/bin/python benchmarks/stats_scenarios.py [--seeds 40] [--baseline /work/baseline]

--baseline is a checkout of the release before (e.g. `git worktree add /work/baseline c6a4c6a`);
each checkout's orchestrator.stats.effects.analyse() runs on the same rows, in its own process.

Per scenario and checkout: the mean absolute error of the estimates (log ratio, or exponent x ln 2:
the error of a doubling's factor), the share of intervals (shown, family-wise) that hold their truth,
the family-wise false positives (share of seeds with any true null called an effect), the median
half-width of the shown ratio intervals, and scenario-specific counts. No timing: nothing here
depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import checkouts

ROOT = checkouts.ROOT
SCENARIOS = ("quick", "quick_shuffled", "three_vs_thirty", "drifting_pass", "bimodal_one_side", "interaction_grid",
             "failed_baseline")


def build(name: str):
    from tests import scenarios as SC

    return {"quick": SC.quick, "quick_shuffled": lambda: SC.quick(blocked=False)}.get(name, getattr(SC, name, None))()


def generate(seeds: int, out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    data = {}
    for name in SCENARIOS:
        s = build(name)
        data[name] = {"title": s.name, "what": s.what, "axes": sorted({k[1] for k in s.truth}),
                      "truth": [[k[0], k[1], k[2], t] for k, t in s.truth.items()],
                      "nulls": [list(k) for k in s.nulls], "seeds": [s.rows(seed) for seed in range(seeds)]}
    out.write_text(json.dumps(data, default=str))


def evaluate(rows_path: Path, code: Path) -> None:
    """Inside a checkout (`code` first on sys.path): per scenario and seed, the effects as
    [kind, variable, value, group, estimate, low, high, significant], and the variables compared
    and those named as not compared or lost."""
    sys.path.insert(0, str(code))
    from orchestrator.stats import effects as fx

    data = json.loads(rows_path.read_text())
    out = {}
    for name, sc in data.items():
        per_seed = []
        for rows in sc["seeds"]:
            a = fx.analyse(rows)
            (ma,) = a.machines.values()
            effects = [[e.kind, e.variable, e.value, getattr(e, "group", None), e.estimate, e.ci_low, e.ci_high,
                        bool(e.significant), e.baseline] for e in a.effects]
            named = sorted(set(getattr(ma, "uncompared", {})) | {x.variable for x in getattr(ma, "lost", [])})
            per_seed.append({"effects": effects, "compared": sorted(ve.variable for ve in ma.variables),
                             "named": named, "together": sorted(ma.together),
                             "pooled": sorted(ve.variable for ve in ma.variables if ve.elasticity is not None)})
        out[name] = per_seed
    print(json.dumps(out))


def summarise(sc: dict, seeds: list[dict]) -> dict:
    truth = {(k, n, v): t for k, n, v, t in sc["truth"]}
    nulls = {tuple(k) for k in sc["nulls"]}
    errs, covered, halfs, alarms, n_cov = [], 0, [], 0, 0
    missing = 0
    for s in seeds:
        found = {}
        for kind, var, value, group, est, lo, hi, sig, base in s["effects"]:
            if kind == "ratio" and ("ratio", var, base) in truth:  # compared against another value than the truth's
                if ("ratio", var, value) not in truth:
                    continue
                t = truth[("ratio", var, value)] / truth[("ratio", var, base)]
                truth = {**truth, ("ratio", var, f"{value} vs {base}"): t}
                value = f"{value} vs {base}"
            found[(kind, var, group if kind == "elasticity" and group else value)] = (est, lo, hi, sig)
            if kind == "ratio" and lo is not None and not group:
                halfs.append(math.expm1(math.log(hi / lo) / 2))
        alarm = False
        for k, t in truth.items():
            if k not in found:
                missing += 1
                continue
            est, lo, hi, sig = found[k]
            errs.append(abs(math.log(est / t)) if k[0] == "ratio" else abs(est - t) * math.log(2))
            if lo is not None:
                n_cov += 1
                covered += lo <= t <= hi
            alarm |= k in nulls and sig
        alarms += alarm
    n = len(seeds)
    return {"err": statistics.mean(errs) if errs else None, "cover": covered / n_cov if n_cov else None,
            "fwer": alarms / n if nulls else None, "half": statistics.median(halfs) if halfs else None,
            "missing": missing / (n * len(truth)),
            "compared": statistics.mean(len(s["compared"]) for s in seeds),
            "named": statistics.mean(len(s["named"]) for s in seeds),
            "silent": statistics.mean(len([a for a in sc["axes"] if a not in s["compared"] and a not in s["named"]])
                                      for s in seeds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    checkouts.add_arguments(parser)
    args = parser.parse_args()
    if args.evaluate:
        evaluate(args.evaluate, args.code)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.json"
        generate(args.seeds, rows_path)
        data = json.loads(rows_path.read_text())
        results = checkouts.evaluate_in_each(__file__, rows_path, args.baseline)

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)
    print(f"{args.seeds} seeds per scenario; err = mean |log error| of the estimates (exponents: of a doubling's "
          "factor); cover = shown intervals holding their truth; FWER = seeds with a true null called an effect; "
          "half = median half-width of the shown ratio intervals; missing = truths with no estimate")
    print(f"{'scenario':58s} {'code':4s} {'err':>6s} {'cover':>6s} {'FWER':>6s} {'half':>7s} {'missing':>7s} "
          f"{'compared':>8s} {'named':>6s} {'silent':>6s}")
    for name, sc in data.items():
        for label, res in results.items():
            r = summarise(sc, res[name])
            print(f"{sc['title'][:58]:58s} {label:4s} {f(r['err'], '6.3f')} {f(r['cover'], '6.0%')} "
                  f"{f(r['fwer'], '6.0%')} "
                  f"{'+-' + format(r['half'], '.1%') if r['half'] is not None else '-':>7s} {r['missing']:7.0%} "
                  f"{r['compared']:8.1f} {r['named']:6.1f} {r['silent']:6.1f}")
        print(f"  ({sc['what']})")


if __name__ == "__main__":
    main()
