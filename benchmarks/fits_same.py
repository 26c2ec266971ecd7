"""Do the fits give the same numbers after a change? The step model (orchestrator/stats/step_model.py)
and the cost model (orchestrator/stats/cost_model.py) of this checkout against those of another
revision (each module as `git show REV:path` has it, loaded beside this checkout's), every number
compared bit for bit: each field of the Fit and its strata, contrasts and covariances through it, on
sweeps with and without slow modes, noisy configurations, blocks unlike passes, dropped blocks, a
prior, merged strata, disconnected parts and the SuperLU path; each field of the cost model, its
predictions and point predictions, the leave-one-out check and its calibration, on the tests'
synthetic quick machine (one block per pass, and two passes per block so that cells hold two runs),
per run, on cells and thinned. Used when a fit's code moves (fit() and fit_cells() as named steps).

    venv/bin/python benchmarks/fits_same.py --against 4140e4d [--seeds N]

Exit status 1 when any number differs. About 7 CPU-minutes with the default 3 seeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.queue.predict import machine_rows, machines  # noqa: E402
from orchestrator.stats import cost_model as new_cm, step_model as new_sm  # noqa: E402
from tests.test_cost_model import HELDOUT, build, resolved  # noqa: E402


def module_at(rev: str, path: str, name: str, folder: Path):
    """The module at `path` as revision `rev` has it, loaded under `name`."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True).stdout
    file = folder / f"{name}.py"
    file.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def same(a, b, where):
    """a and b the same, bit for bit (arrays, floats with their sign and NaNs, containers, dataclasses)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float) or isinstance(b, float):
        assert type(a) is type(b) and (a == b or (math.isnan(a) and math.isnan(b))) and \
            math.copysign(1, a) == math.copysign(1, b), (where, a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif hasattr(a, "tocsr"):
        a, b = a.tocsr(), b.tocsr()
        for f in ("data", "indices", "indptr"):
            same(getattr(a, f), getattr(b, f), f"{where}.{f}")
        assert a.shape == b.shape
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a).__name__ == type(b).__name__
        for f in a.__dataclass_fields__:
            same(getattr(a, f), getattr(b, f), f"{where}.{f}")
    else:
        assert a == b, (where, a, b)


def compare(fa, fb, n_configs, label):
    """The same fit, the same contrasts and covariances."""
    for f in ("mu", "gamma", "component", "slow_prob", "n_runs", "prior", "blocks_dropped"):
        same(getattr(fa, f), getattr(fb, f), f"{label}.{f}")
    assert list(fa.strata) == list(fb.strata)
    for k in fa.strata:
        same(fa.strata[k], fb.strata[k], f"{label}.strata[{k!r}]")
    same(list(fa._design), list(fb._design), f"{label}._design")
    assert (fa._solve is None) == (fb._solve is None)
    for f in ("dof", "sigma2"):
        same(getattr(fa, f), getattr(fb, f), f"{label}.{f}")
    same(fa.block_variance(), fb.block_variance(), f"{label}.block_variance")
    vecs = [{c: 1.0, 0: -1.0} for c in range(1, n_configs)]
    vecs.append({c: 1.0 / (n_configs // 2) for c in range(n_configs // 2)}
                | {c: -1.0 / (n_configs - n_configs // 2) for c in range(n_configs // 2, n_configs)})
    for w in vecs:
        same(fa.contrast(w), fb.contrast(w), f"{label}.contrast")
    good = [w for w in vecs if fa.contrast(w) is not None][:6]
    if good and fa._solve is not None:
        same(fa.covariance(good), fb.covariance(good), f"{label}.covariance")


def compare_models(a, b, label):
    """The same model, the same predictions of the held-out configurations."""
    same(a, b, label)
    for settings in HELDOUT:
        config = resolved(**settings)
        pa = pb = None
        try:
            pa = a.predict(config)
        except Exception as e:  # any failure is a difference to report
            pa = repr(e)
        try:
            pb = b.predict(config)
        except Exception as e:  # any failure is a difference to report
            pb = repr(e)
        same(pa, pb, f"{label} predict {settings}")
        same(a.point_ms(config), b.point_ms(config), f"{label} point {settings}")


def sweep(seed, *, n_configs=30, passes=10, slow=0.3, noisy=(), two_strata=True, rare=False, split_blocks=False,
          disconnect=False):
    """tests/test_step_model.sweep's runs, with a stratum of too few runs, blocks of half a pass, or
    half the configurations in blocks of their own."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(3.0, 0.5, n_configs)
    drift = rng.normal(0.0, 0.03, 2 * passes)
    ci, bi, keys, y, pi = [], [], [], [], []
    for q in range(passes):
        for c in rng.permutation(n_configs):
            if disconnect and c >= n_configs // 2 and q % 2 == 0:
                continue
            cores = (1 if c % 3 == 0 else 2) if two_strata else 2
            if rare and c == 5:
                cores = 4  # a stratum of too few runs: merged into the largest
            e = rng.normal(0.0, 0.02 * (6 if c in noisy else 1))
            if cores == 2 and rng.random() < slow:
                e += 0.15
            b = 2 * q + (c % 2) if split_blocks else q
            if disconnect and c >= n_configs // 2:
                b = 2 * passes + q  # their own blocks: a second connected part
            ci.append(int(c)), bi.append(b), keys.append(cores), pi.append(q)
            y.append(mu[c] + drift[b % (2 * passes)] + e)
    n_blocks = max(bi) + 1
    return np.array(y), np.array(ci), np.array(bi), keys, np.array(pi), n_configs, n_blocks


CASES = {
    "plain": dict(),
    "noisy": dict(noisy=(4, 7)),
    "one stratum": dict(two_strata=False),
    "no slow mode": dict(slow=0.0),
    "heavy slow mode": dict(slow=0.45, noisy=(2,)),
    "blocks unlike passes": dict(split_blocks=True, noisy=(3,)),
    "merged stratum": dict(rare=True),
    "blocks dropped": dict(n_configs=8, passes=2, slow=0.0),
    "disconnected": dict(disconnect=True, noisy=(1,)),
    "many configs": dict(n_configs=120, passes=4, noisy=(10, 11, 50)),
}


def steps_same(old, seeds: int) -> int:
    """The step model's fits of every case, seed and option, both factor paths: how many."""
    checked = 0
    for name, kw in CASES.items():
        for seed in range(seeds):
            y, ci, bi, keys, pi, nc, nb = sweep(seed, **kw)
            for opts in (dict(pass_idx=pi), dict(), dict(pass_idx=pi, mixture=False),
                         dict(pass_idx=pi, prior=(4e-4, 9)), dict(pass_idx=pi, prior=(0.05, 3))):
                for dense in (True, False):
                    for mod in (new_sm, old):
                        mod.DENSE_SOLVE_MAX = mod.DENSE_LEVERAGE_MAX if dense else 0
                    fa = new_sm.fit(y, ci, bi, keys, n_configs=nc, n_blocks=nb, **opts)
                    fb = old.fit(y, ci, bi, keys, n_configs=nc, n_blocks=nb, **opts)
                    compare(fa, fb, nc, f"{name} seed {seed} {sorted(opts)} dense={dense}")
                    checked += 1
    for mod in (new_sm, old):
        mod.DENSE_SOLVE_MAX = mod.DENSE_LEVERAGE_MAX
    for n in (0, 1, 3):  # empty and tiny inputs
        y, ci = np.zeros(n), np.zeros(n, dtype=int)
        compare(new_sm.fit(y, ci, ci, [2] * n, n_configs=1, n_blocks=1),
                old.fit(y, ci, ci, [2] * n, n_configs=1, n_blocks=1), 1, f"tiny {n}")
        checked += 1
    return checked


def costs_same(old, seeds: int, folder: Path) -> int:
    """The cost model's fits, checks and calibrations on the synthetic quick machine: how many."""
    new, checked = new_cm, 0
    for seed in range(min(seeds, 2)):
        store = build(folder / f"q{seed}.db", seed=seed)
        rows = new.usable(machine_rows(store, machines(store)[0].machine_id))
        assert old.usable(rows) == rows
        paired = [dict(r, repeat=(r.get("repeat") or 0) // 2) for r in rows]  # two passes in one block
        for label, rs in (("quick", rows), ("paired", paired)):
            for per_run in (False, True):
                compare_models(new.fit(rs, per_run=per_run), old.fit(rs, per_run=per_run),
                               f"{label} seed {seed} per_run={per_run}")
                checked += 1
            compare_models(new.fit(rs[:150]), old.fit(rs[:150]), f"{label} seed {seed} first 150")
            compare_models(new.fit(new.thin(rs, 120), n_all=len(rs)), old.fit(old.thin(rs, 120), n_all=len(rs)),
                           f"{label} seed {seed} thinned")
            ea, ua = new.check(rs)
            eb, ub = old.check(rs)
            same(ea, eb, f"{label} seed {seed} check")
            same(ua, ub, f"{label} seed {seed} check rows")
            ma, mb = new.fit(rs), old.fit(rs)
            new.calibrate(ma, ua, ea)
            old.calibrate(mb, ub, eb)
            compare_models(ma, mb, f"{label} seed {seed} calibrated")
            checked += 3 + len(ea)
        la = new.leave_one_config_out(rows[:200], per_run=True)
        same(la, old.leave_one_config_out(rows[:200], per_run=True), f"seed {seed} leave one out per run")
        checked += len(la)
    return checked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the revision to compare with (git show REV:path)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per step-model case (the cost model: up to 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        old_sm = module_at(args.against, "orchestrator/stats/step_model.py", "old_step_model", folder)
        old_cm = module_at(args.against, "orchestrator/stats/cost_model.py", "old_cost_model", folder)
        try:
            n_steps = steps_same(old_sm, args.seeds)
            print(f"step model: {n_steps} fits, every number the same bit for bit", flush=True)
            n_costs = costs_same(old_cm, args.seeds, folder)
            print(f"cost model: {n_costs} fits, every number the same bit for bit")
        except AssertionError as e:
            print(f"differs: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
