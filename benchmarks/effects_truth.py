"""The report's statistics against a known truth, before and after: the real quick preset, step times
from the law in tests/synthetic.py (followers on their own axes, one noisy level, pass drift), the
runs finished through the real Store, then the effects of each checkout computed on the same rows.

    venv/bin/python benchmarks/effects_truth.py [--seeds 100] [--baseline /work/baseline] [--drift 0,0.12,-0.08]
                                                [--sigma 0.02] [--repeats N] [--tail] [--disturbed]

--tail slows a share of runs where no sensor sees it, --disturbed as many where other_cpu_s does
(tests/synthetic.py TAIL and DISTURBED: the heavy tails of a shared machine); --repeats sets the
passes (the preset's 3 by default; trimming starts at 8 runs per value, effects.TRIM_FROM).

Prints, per comparison, the true effect, the mean estimate over seeds and how often its interval
covered the truth; then per checkout the share of seeds with at least one no-effect comparison
called an effect (the family-wise error) and with at least one interval missing its truth.
"Before" (the baseline checkout) has no adjustment: an effect there is an interval excluding no
change, which is what its report implied. No timing: nothing here depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import checkouts

ROOT = checkouts.ROOT


def generate(seeds: int, out: Path, drift: tuple[float, ...], sigma: float, repeats: int | None = None,
             tail: bool = False, disturbed: bool = False) -> None:
    sys.path.insert(0, str(ROOT))
    from sqlalchemy import text

    from orchestrator.queue.store import Store
    from tests import synthetic as S

    S.SIGMA = sigma
    data = {"truth": [[kind, name, value, t] for (kind, name, value), t in S.truth_by_label().items()],
            "noisy": list(S.NOISY), "seeds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            store = Store(str(Path(tmp) / f"seed{seed}.db"))
            S.build(store, seed=seed, drift=drift, repeats=repeats, tail=S.TAIL if tail else None,
                    disturbed=S.DISTURBED if disturbed else None)
            with store.transaction() as conn:
                rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))]
            data["seeds"].append(rows)
            store.engine.dispose()
    out.write_text(json.dumps(data, default=str))


def evaluate(rows_path: Path, code: Path) -> None:
    """Run inside a checkout (`code` first on sys.path): print one JSON list per seed of
    (kind, variable, value, estimate, ci_low, ci_high, called_an_effect)."""
    fx = checkouts.effects_module(code)

    data = json.loads(rows_path.read_text())
    out = []
    for rows in data["seeds"]:
        found = []
        if hasattr(fx, "analyse"):  # a release with analyse(): adjusted tests, simultaneous intervals
            for e in fx.analyse(rows).effects:
                found.append([e.kind, e.variable, e.value, e.estimate, e.ci_low, e.ci_high, bool(e.significant)])
        else:  # before: unadjusted 95% intervals; an interval excluding no change read as an effect
            ves, _ = fx.analyse_machine(rows, rows[0]["machine_id"])
            for ve in ves:
                for e in ([ve.elasticity] if ve.elasticity else []) + ve.ratios:
                    null = 1.0 if e.kind == "ratio" else 0.0
                    called = e.ci_low is not None and not (e.ci_low <= null <= e.ci_high)
                    found.append([e.kind, e.variable, e.value, e.estimate, e.ci_low, e.ci_high, called])
        out.append(found)
    print(json.dumps(out))


def off_by_more_than_10_percent(kind: str, est: float, true: float) -> bool:
    """As tests/test_synthetic_truth.within_10_percent: a ratio, or the factor of a doubling (and an
    exponent of 0.5 or more within 10% of itself), more than 10% from the truth."""
    if kind == "ratio":
        return abs(est / true - 1) > 0.10
    return abs(2 ** est / 2 ** true - 1) > 0.10 or (abs(true) >= 0.5 and abs(est / true - 1) > 0.10)


def summarise(truth: dict, seeds: list[list], noisy: tuple) -> dict:
    per = {}
    alarms = misses = offs = 0
    halfs = []  # the shown ratio intervals' relative half-widths (geometric), every seed's
    for found in seeds:
        halfs += [math.expm1(math.log(hi / lo) / 2) for kind, _, _, _, lo, hi, _ in found
                  if kind == "ratio" and lo is not None and lo > 0]
        alarm = miss = off = False
        for kind, name, value, est, lo, hi, called in found:
            k = (kind, name, value)
            if k not in truth:
                continue
            t = truth[k]
            null = abs(t - (1.0 if kind == "ratio" else 0.0)) < 1e-12
            covered = lo is not None and lo <= t <= hi
            alarm |= null and called
            miss |= not covered
            off |= (name, value) != noisy and off_by_more_than_10_percent(kind, est, t)
            p = per.setdefault(k, {"log_err": [], "covered": 0, "called": 0, "n": 0})
            p["log_err"].append(math.log(est / t) if kind == "ratio" else est - t)
            p["covered"] += covered
            p["called"] += called
            p["n"] += 1
        alarms += alarm
        misses += miss
        offs += off
    halfs.sort()
    return {"per": per, "alarms": alarms, "misses": misses, "offs": offs, "n": len(seeds),
            "half": halfs[len(halfs) // 2] if halfs else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--drift", default="0,0.12,-0.08", help="log shift of each repeat pass (default: the test's)")
    parser.add_argument("--sigma", type=float, default=0.02, help="run-to-run noise of log step time (default 0.02)")
    parser.add_argument("--repeats", type=int, help="repeat passes (default: the quick preset's)")
    parser.add_argument("--tail", action="store_true", help="slow a share of runs unseen (tests/synthetic.py TAIL)")
    parser.add_argument("--disturbed", action="store_true",
                        help="slow a share of runs, seen by other_cpu_s (tests/synthetic.py DISTURBED)")
    checkouts.add_arguments(parser)
    args = parser.parse_args()
    if args.evaluate:
        evaluate(args.evaluate, args.code)
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.json"
        drift = tuple(float(x) for x in args.drift.split(","))
        generate(args.seeds, rows_path, drift, args.sigma, args.repeats, args.tail, args.disturbed)
        data = json.loads(rows_path.read_text())
        truth = {(k, n, v): t for k, n, v, t in data["truth"]}
        noisy = tuple(data["noisy"])
        results = {label: summarise(truth, found, noisy) for label, found
                   in checkouts.evaluate_in_each(__file__, rows_path, args.baseline, ("before", "after")).items()}
    labels = list(results)
    extra = (f", {args.repeats or 'the preset'} repeats" + (", heavy tail" if args.tail else "")
             + (", disturbed runs" if args.disturbed else ""))
    print(f"synthetic truth, quick preset, {args.seeds} seeds, noise {args.sigma:g} (one level {0.15:g}), "
          f"pass drift {args.drift}{extra}; estimate = geometric mean over seeds; "
          "covered = share of seeds whose interval held the truth; called = share called an effect")
    header = f"{'comparison':32s} {'true':>7s} " + " ".join(f"{lab + ' est':>11s} {'covered':>8s} {'called':>7s}"
                                                           for lab in labels)
    print(header)
    for k in sorted(truth, key=lambda k: (k[1], k[0] != "elasticity", str(k[2]))):
        kind, name, value = k
        t = truth[k]
        cells = []
        for lab in labels:
            p = results[lab]["per"].get(k)
            if p is None:
                cells.append(f"{'-':>11s} {'-':>8s} {'-':>7s}")
                continue
            mean = sum(p["log_err"]) / len(p["log_err"])
            est = t * math.exp(mean) if kind == "ratio" else t + mean
            cells.append(f"{est:11.3f} {p['covered'] / p['n']:8.0%} {p['called'] / p['n']:7.0%}")
        what = f"{name} ^e" if kind == "elasticity" else f"{name}={value}"
        print(f"{what:32s} {t:7.3f} " + " ".join(cells))
    for lab in labels:
        r = results[lab]
        print(f"{lab}: seeds with a no-effect comparison called an effect {r['alarms']}/{r['n']} "
              f"({r['alarms'] / r['n']:.0%}); seeds with an interval missing its truth {r['misses']}/{r['n']} "
              f"({r['misses'] / r['n']:.0%}); seeds with an estimate more than 10% off (the noisy level aside) "
              f"{r['offs']}/{r['n']} ({r['offs'] / r['n']:.0%}); median shown ratio half-width "
              + (f"+-{r['half']:.1%}" if r["half"] is not None else "-"))


if __name__ == "__main__":
    main()
