"""The small grid a user types first (tests/scenarios.small_grid: d_model 64, 96, 128 x n_layers 1, 2,
two passes, 12 runs), with runs dropped as if disturbed and the probe's prior right or wrong: per
case, the seeds whose intervals hold both truths, how often d_model and n_layers are called clear,
the n_layers ratio's median shown half-width and degrees of freedom. No timing.

    venv/bin/python benchmarks/small_grid_prior.py [SEEDS]
"""
import random
import statistics
import sys
sys.path.insert(0, ".")
from tests import scenarios as SC
from orchestrator.stats import effects as fx

def run(sigma, probe, seeds=200, drop=1):
    s = SC.small_grid(sigma)
    cover = clear_d = clear_n = n = 0
    halfs = []
    dofs = []
    for seed in range(seeds):
        rows = s.rows(seed)
        rng = random.Random(1000 + seed)
        for _ in range(drop):
            rows.pop(rng.randrange(len(rows)))
        mid = rows[0]["machine_id"]
        a = fx.analyse(rows, probe_cv={mid: probe} if probe else None)
        found = {(e.kind, e.variable, e.value): e for e in a.effects if e.group is None}
        ok = True
        for k, t in s.truth.items():
            e = found.get(k)
            if e is None or e.ci_low is None or not (e.ci_low <= t <= e.ci_high):
                ok = False
        cover += ok
        e = found.get(("elasticity", "d_model", None))
        clear_d += bool(e and e.significant)
        e = found.get(("ratio", "n_layers", "1"))
        clear_n += bool(e and e.significant)
        if e is not None and e.half_width is not None:
            halfs.append(e.half_width)
        dofs.append(e.dof if e is not None and e.dof else 0)
        n += 1
    print(f"sigma {sigma:.0%} probe {probe if probe else '-'} drop {drop}: both truths covered {cover}/{n}, "
          f"d_model clear {clear_d}/{n}, n_layers clear {clear_n}/{n}, n_layers median half-width "
          + (f"+-{statistics.median(halfs):.1%}" if halfs else "-") +
          f" (untested {n-len(halfs)}), median dof {statistics.median(dofs):.1f}")

seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
for sigma, probe, drop in [(0.04, None, 0), (0.04, None, 1), (0.04, 0.04, 1), (0.04, 0.10, 1), (0.03, 0.10, 1),
                           (0.10, 0.03, 1), (0.10, 0.03, 0), (0.04, 0.10, 4)]:
    run(sigma, probe, seeds, drop)
