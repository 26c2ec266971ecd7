"""Held-out scenarios with known truths for the report's statistics (issue: one statistical model).

Each scenario plans its jobs, enqueues them through the real Store and reads v_results back once;
then, per seed, every run gets a step time from a known law plus noise with the structure of these
VMs: an AR(1) process over the run order (slow stretches: neighbours agree better than runs minutes
apart), independent run noise, and where asked a slow mode or drifting passes. `Scenario.rows(seed)`
gives the v_results rows of one seed; `truth` maps (kind, variable, value) to the true effect.

Used by tests/test_scenarios.py (thresholds) and benchmarks/stats_scenarios.py (old code vs new).
"""

from __future__ import annotations

import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from orchestrator.queue.store import Store
from tests.reportdb import machine_facts, metrics, run_all

RHO = 0.7  # lag-1 autocorrelation of the slow stretches, run to run (measured 0.6-0.75 on the VM)
SIGMA_AR = 0.04  # their log-scale spread
SIGMA_RUN = 0.02  # independent run-to-run noise


@dataclass
class Scenario:
    name: str
    what: str  # the finding it reproduces, in words
    law: Callable[[dict], float]  # config -> true log step time
    base_rows: list[dict]
    truth: dict  # (kind, variable, value label or None) -> true ratio or exponent
    nulls: set = field(default_factory=set)  # keys of truth with no effect
    slow: Callable[[dict], tuple[float, float]] | None = None  # config -> (share, log shift) of a slow mode
    pass_shift: dict = field(default_factory=dict)  # repeat -> log shift of the whole pass
    fail: Callable[[dict], bool] | None = None  # config -> the run failed
    sigma_run: float = SIGMA_RUN
    sigma_ar: float = SIGMA_AR

    def rows(self, seed: int) -> list[dict]:
        rng = random.Random(seed)
        out = []
        e = 0.0
        for row in sorted(self.base_rows, key=lambda r: r["run_order"]):
            e = RHO * e + math.sqrt(1 - RHO * RHO) * rng.gauss(0, self.sigma_ar)
            y = self.law(row) + e + rng.gauss(0, self.sigma_run) + self.pass_shift.get(row["repeat"], 0.0)
            if self.slow is not None:
                share, shift = self.slow(row)
                if rng.random() < share:
                    y += shift
            r = dict(row)
            if self.fail is not None and self.fail(row):
                r.update(status="failed", step_ms_median=None, error="RuntimeError: boom (synthetic)")
            else:
                r["step_ms_median"] = math.exp(y)
            out.append(r)
        return out


def _blocked_ofat(base: dict, axes: dict[str, list], repeats: int, seed: int = 0,
                  blocked: bool = True) -> tuple[list[dict], Callable]:
    """One-factor-at-a-time configs with the run order of the blocked planner: per pass, one block
    per axis (its values and the base), blocks and configs inside them shuffled. blocked=False: the
    whole pass shuffled (the order before)."""
    from common.variables import config_hash, resolve

    rng = random.Random(seed)
    out = []
    for rep in range(repeats):
        blocks = []
        for name, values in axes.items():
            members = [dict(base)] + [{**base, name: v} for v in values if v != base.get(name)]
            blocks.append((name, members))
        rng.shuffle(blocks)
        pass_configs = []
        for name, members in blocks:
            rng.shuffle(members)
            for p in members:
                c, why = resolve({**p, "repeat": rep}, 8)
                assert not why, why
                pass_configs.append((name, c))
        if not blocked:  # the base once per pass, everything shuffled
            pass_configs = list({config_hash(c): (None, c) for _, c in pass_configs}.values())
            rng.shuffle(pass_configs)
        for name, c in pass_configs:
            # the same config in two blocks is two jobs (the block is part of the job's identity)
            out.append((config_hash(c, name), name, c))
    jobs = [{"config": c, "config_hash": key, "run_order": i, "block": name} for i, (key, name, c) in enumerate(out)]
    return jobs, None


def _rows_from_jobs(jobs: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "results.db"))
        store.enqueue(name="scenario", source="tests", sweep_text="scenario", jobs=jobs)
        m = store.register_machine(machine_facts("scenario"))
        run_all(store, m, lambda c: ("done", None, metrics(10.0, c)))
        with store.transaction() as conn:
            rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))]
        store.engine.dispose()
    by_hash = {j["config_hash"]: j for j in jobs}
    for r in rows:
        j = by_hash[r["config_hash"]]
        r["run_order"] = j["run_order"]
        r["block"] = j["block"]
    return rows


# -- the scenarios ------------------------------------------------------------------------------

LOG = math.log

QUICK_AXES = {
    "n_layers": [1, 2, 4], "d_model": [64, 128, 256], "seq_len": [64, 128, 256], "batch_size": [4, 8, 16],
    "optimizer": ["adamw", "sgd"], "activation": ["gelu", "relu", "silu"], "dropout": [0.0, 0.1],
    "attn_backend": ["sdpa", "manual", "sdpa_math"], "pin_threads": [False, True], "vocab_size": [512, 1024, 2048],
    "mlp_ratio": [2.0, 4.0], "onednn": [True, False],
}
QUICK_BASE = {"n_layers": 2, "d_model": 128, "seq_len": 128, "batch_size": 8, "optimizer": "adamw",
              "activation": "gelu", "dropout": 0.0, "attn_backend": "sdpa", "pin_threads": False,
              "vocab_size": 1024, "mlp_ratio": 4.0, "onednn": True, "n_heads": 4}
QUICK_POWER = {"n_layers": 0.9, "d_model": 1.3, "seq_len": 1.05, "batch_size": 0.9, "vocab_size": 0.2, "mlp_ratio": 0.5}
QUICK_FACTOR = {("activation", "relu"): 0.95, ("activation", "silu"): 1.02, ("attn_backend", "manual"): 1.25,
                ("attn_backend", "sdpa_math"): 1.08, ("optimizer", "sgd"): 0.93}


def _quick_law(c: dict) -> float:
    y = LOG(40.0)
    for n, e in QUICK_POWER.items():
        y += e * LOG(float(c[n]) / float(QUICK_BASE[n]))
    for (n, v), f in QUICK_FACTOR.items():
        if c[n] == v:
            y += LOG(f)
    return y


def _quick_truth() -> tuple[dict, set]:
    from orchestrator.stats.effects import label, value_of

    truth, nulls = {}, set()
    for n, values in QUICK_AXES.items():
        for v in values:
            if v == QUICK_BASE[n]:
                continue
            k = ("ratio", n, label(n, value_of(n, v)))
            if n in QUICK_POWER:
                truth[k] = (float(v) / float(QUICK_BASE[n])) ** QUICK_POWER[n]
            else:
                truth[k] = QUICK_FACTOR.get((n, v), 1.0)
            if truth[k] == 1.0:
                nulls.add(k)
        if n in QUICK_POWER and len(set(values) | {QUICK_BASE[n]}) >= 3:
            truth[("elasticity", n, None)] = QUICK_POWER[n]
    return truth, nulls


def quick(blocked: bool = True, repeats: int = 3) -> Scenario:
    """A quick-like one-factor-at-a-time sweep, 3 runs per value, on a VM with time-correlated noise."""
    jobs, _ = _blocked_ofat(QUICK_BASE, QUICK_AXES, repeats, blocked=blocked)
    truth, nulls = _quick_truth()
    return Scenario(f"quick, {repeats} runs per value, {'blocked' if blocked else 'shuffled'} passes",
                    "1, 2, 7: intervals from each value's own 2 degrees of freedom; "
                    "verdict and interval from two procedures",
                    _quick_law, _rows_from_jobs(jobs), truth, nulls)


def three_vs_thirty() -> Scenario:
    """3 runs of one value against 30 of its baseline (what --target-ci leaves), skewed noise, a true null."""
    jobs = []
    for rep in range(30):
        for opt in (["adamw", "sgd"] if rep < 3 else ["adamw"]):
            from common.variables import config_hash, resolve

            c, _ = resolve({"optimizer": opt, "repeat": rep}, 8)
            jobs.append({"config": c, "config_hash": config_hash(c), "run_order": len(jobs), "block": None})
    return Scenario("3 vs 30 runs, skewed noise, null",
                    "3, 4: Welch on 3 vs 30 runs; the estimator changing with the run count",
                    lambda c: LOG(20.0), _rows_from_jobs(jobs), {("ratio", "optimizer", "sgd"): 1.0},
                    {("ratio", "optimizer", "sgd")}, slow=lambda c: (0.25, 0.10))


def drifting_pass() -> Scenario:
    """Three full passes, then a fourth pass of one comparison only, 6% slower: few shared configurations."""
    axes = {"optimizer": ["adamw", "sgd"], "activation": ["gelu", "relu"], "dropout": [0.0, 0.1],
            "pin_threads": [False, True], "onednn": [True, False], "attn_backend": ["sdpa", "manual"]}
    base = {k: v[0] for k, v in axes.items()}
    jobs, _ = _blocked_ofat(base, axes, 3, blocked=False)
    for j in jobs:
        j["block"] = None
    from common.variables import config_hash, resolve

    for v in ("adamw", "sgd"):
        c, _ = resolve({**base, "optimizer": v, "repeat": 3}, 8)
        jobs.append({"config": c, "config_hash": config_hash(c), "run_order": len(jobs), "block": None})
    truth = {("ratio", n, _lab(n, v)): 1.0 for n, vs in axes.items() for v in vs[1:]}
    return Scenario("a fourth pass of one comparison, 6% slower",
                    "5: drift left at zero for a pass with few shared configurations",
                    lambda c: LOG(30.0), _rows_from_jobs(jobs), truth, set(truth), pass_shift={3: 0.06})


def bimodal_one_side(repeats: int = 10) -> Scenario:
    """1 vs 2 cores where only 2-thread runs are bimodal (30% of them 15% slower); other 2-thread configs
    give the stratum its runs."""
    axes = {"cores": [1, 2], "optimizer": ["adamw", "sgd"], "activation": ["gelu", "relu"], "dropout": [0.0, 0.1]}
    base = {"cores": 2, "optimizer": "adamw", "activation": "gelu", "dropout": 0.0}
    jobs, _ = _blocked_ofat(base, axes, repeats)
    truth = {("ratio", "cores", "1"): 1.8, ("ratio", "optimizer", "sgd"): 1.0, ("ratio", "activation", "relu"): 1.0,
             ("ratio", "dropout", "0.1"): 1.0}
    return Scenario(f"bimodal 2-thread runs (30% 15% slower), 1 vs 2 cores, {repeats} runs",
                    "8: a trimmed mean of a bimodal mixture sits above the fast mode, one side bimodal",
                    lambda c: LOG(20.0) + (LOG(1.8) if c["cores"] == 1 else 0.0), _rows_from_jobs(jobs), truth,
                    {k for k, t in truth.items() if t == 1.0},
                    slow=lambda c: (0.3, LOG(1.15)) if c["cores"] == 2 else (0.0, 0.0), sigma_ar=0.015, sigma_run=0.02)


def interaction_grid() -> Scenario:
    """cores x d_model, the cores exponent -0.2 / -0.5 / -0.9 by width."""
    from common.variables import config_hash, resolve

    exps = {32: -0.2, 64: -0.5, 128: -0.9}
    jobs = []
    rng = random.Random(3)
    for rep in range(3):
        cells = [(c, d) for c in (1, 2, 4, 8) for d in exps]
        rng.shuffle(cells)
        for cores, d in cells:
            cfg, _ = resolve({"cores": cores, "d_model": d, "repeat": rep}, 8)
            jobs.append({"config": cfg, "config_hash": config_hash(cfg), "run_order": len(jobs), "block": None})
    truth = {("elasticity", "cores", f"d_model={d}"): e for d, e in exps.items()}
    return Scenario("cores x d_model grid, cores exponent -0.2/-0.5/-0.9 by width",
                    "6: an interaction pooled into one number",
                    lambda c: LOG(10.0) + exps[c["d_model"]] * LOG(c["cores"]) + 1.2 * LOG(c["d_model"] / 64),
                    _rows_from_jobs(jobs), truth)


def failed_baseline() -> Scenario:
    """The quick-like sweep with the base configuration failing in every block."""
    s = quick()
    base_key = {n: QUICK_BASE[n] for n in QUICK_AXES}
    s.name = "quick, the baseline configuration failed"
    s.what = "9: lost levels vanish; 'derived from another variable' said of variables whose baseline failed"
    s.fail = lambda r: all(_same(r[n], v) for n, v in base_key.items())
    return s


def _same(a, b) -> bool:
    if isinstance(b, bool) or isinstance(a, bool):
        return bool(a) == bool(b)
    if isinstance(b, (int, float)) and a is not None and not isinstance(a, str):
        return float(a) == float(b)
    return a == b


def _lab(n, v):
    from orchestrator.stats.effects import label, value_of

    return label(n, value_of(n, v))


SMALL_GRID_TRUTH = {("elasticity", "d_model", None): 1.2, ("ratio", "n_layers", "1"): 1 / 1.35}


def small_grid(sigma_run: float = 0.04) -> Scenario:
    """The small sweep a user types first: d_model 64, 96, 128 x n_layers 1, 2 (n_layers=2 is 35%
    slower: 1 vs 2 is 0.74x), two passes, 12 runs, each pass the block (a grid); independent run
    noise only (Scenario.rows). Drop a run (a disturbed one) from its rows to starve it."""
    from common.variables import config_hash, resolve

    jobs = []
    rng = random.Random(5)
    for rep in range(2):
        cells = [(d, n) for d in (64, 96, 128) for n in (1, 2)]
        rng.shuffle(cells)
        for d, n in cells:
            cfg, why = resolve({"d_model": d, "n_layers": n, "n_heads": 4, "seq_len": 64, "repeat": rep}, 8)
            assert not why, why
            jobs.append({"config": cfg, "config_hash": config_hash(cfg), "run_order": len(jobs), "block": None})
    return Scenario(f"small grid d_model x n_layers, 2 passes, {sigma_run:.0%} run noise",
                    "issue 48: a 12-run sweep starved by one disturbed run",
                    lambda c: LOG(10.0) + 1.2 * LOG(c["d_model"] / 64) + (LOG(1.35) if c["n_layers"] == 2 else 0.0),
                    _rows_from_jobs(jobs), dict(SMALL_GRID_TRUTH), sigma_run=sigma_run, sigma_ar=0.0)
