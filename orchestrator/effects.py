"""The statistics of the report: how step time changes with each variable, fitted from done runs.

Pure functions over run rows (dicts with the columns of v_results); numpy only, no I/O.

- A variable is *varied* when its done runs take more than one value (`repeat` never counts: repeats
  are the noise, not a factor).
- The *baseline* of a variable is its most common value among the done runs: in a one-factor-at-a-
  time sweep that is the sweep's base, since every other axis's runs share it.
- The *slice* of a variable is the group of runs that differ only in that variable (and in the
  variables resolve() derives from it, e.g. head_dim follows d_model). We take the group with the
  most values of the variable, then the one closest to the modal configuration.
- Numeric size-like variables get an *elasticity*: the least-squares slope of log step time on
  log variable, within every group of runs that differ only in it, with a 95% t-interval.
- Every variable gets a *ratio* per value: geometric-mean step time over the baseline's, in the
  slice, with a 95% t-interval on the log scale (noise pooled across the values, since timing
  noise is multiplicative and about the same at every value).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from orchestrator.variables import BY_NAME, NAMES

METRIC = "step_ms_median"

# Not factors: repeat indexes the noise.
NOT_FACTORS = ("repeat",)
# Numeric, but not sizes: a log-log slope means nothing for them.
NOT_SIZES = ("seed", "dropout", "repeat")
# What resolve() derives from a variable when it is left on "auto": these move with their parent,
# so they are not held fixed when the parent varies.
DERIVED = {
    "cores": ("omp_threads", "intra_threads", "inter_threads"),
    "omp_threads": ("intra_threads",),
    "d_model": ("head_dim",),
    "n_heads": ("head_dim", "kv_heads"),
}

# Two-sided 95% quantiles of Student's t by degrees of freedom (numpy has no t distribution).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 22: 2.074, 24: 2.064, 26: 2.056, 28: 2.048, 30: 2.042,
         40: 2.021, 60: 2.000, 120: 1.980}


def t975(dof: int) -> float:
    """The 97.5% quantile of Student's t; the nearest tabulated dof below (conservative)."""
    assert dof >= 1, dof
    return _T975[max(d for d in _T975 if d <= dof)] if dof <= 120 else 1.960


@dataclass
class Effect:
    """One fitted number: an elasticity (value None) or the ratio of `value` to `baseline`."""

    machine_id: int
    variable: str
    kind: str  # 'elasticity' | 'ratio'
    value: str | None  # the value compared (ratio); None for an elasticity
    baseline: str | None  # the value it is compared with (ratio); None for an elasticity
    estimate: float
    ci_low: float | None  # 95%; None when there are too few repeats to estimate the noise
    ci_high: float | None
    n_runs: int
    span: float = 1.0  # slowest / fastest median step time over the variable's values: the ranking key

    def describe(self) -> str:
        ci = f" (95% CI {self.ci_low:.2f} to {self.ci_high:.2f})" if self.ci_low is not None else ""
        if self.kind == "elasticity":
            return f"step time ~ {self.variable}^{self.estimate:.2f}{ci}"
        return f"{self.variable}={self.value}: {self.estimate:.2f}x the step time of {self.baseline}{ci}"

    def row(self) -> tuple[str, str, str, str, str]:
        """variable, effect, estimate, 95% CI, runs: as text, for a table (bench.py's rich table)."""
        ci = f"{self.ci_low:.2f} to {self.ci_high:.2f}" if self.ci_low is not None else "-"
        if self.kind == "elasticity":
            return (self.variable, f"step time ~ {self.variable}^e", f"e = {self.estimate:.2f}", ci, str(self.n_runs))
        return (self.variable, f"{self.value} vs {self.baseline}", f"{self.estimate:.2f}x", ci, str(self.n_runs))


@dataclass
class Level:
    """One value of a variable within its slice."""

    value: object
    label: str
    step_ms: list[float]
    tokens_per_s: list[float]

    @property
    def median_step_ms(self) -> float:
        return float(np.median(self.step_ms))

    @property
    def median_tokens_per_s(self) -> float | None:
        return float(np.median(self.tokens_per_s)) if self.tokens_per_s else None


@dataclass
class VariableEffect:
    """Everything the report says about one variable on one machine."""

    machine_id: int
    variable: str
    size_like: bool
    baseline: Level
    levels: list[Level]  # in value order, baseline included
    fixed: dict[str, str]  # the other varied variables, as held in the slice
    followers: list[str]  # derived variables that move with this one in the slice
    ratios: list[Effect]  # one per non-baseline level
    elasticity: Effect | None = None
    n_groups: int = 1  # groups of runs the elasticity was fitted on

    @property
    def span(self) -> float:
        medians = [lv.median_step_ms for lv in self.levels]
        return max(medians) / min(medians)

    @property
    def headline(self) -> Effect:
        """The one number that ranks this variable: its elasticity, or its most extreme ratio."""
        if self.elasticity is not None:
            return self.elasticity
        return max(self.ratios, key=lambda e: abs(math.log(e.estimate)))


@dataclass
class Grid:
    """Two variables varied jointly: median step time on their grid of values."""

    machine_id: int
    rows: str  # variable on the y axis
    cols: str  # variable on the x axis
    row_labels: list[str]
    col_labels: list[str]
    step_ms: list[list[float | None]]  # [row][col]; None where no done run
    fixed: dict[str, str] = field(default_factory=dict)


# -- values -------------------------------------------------------------------------------------

def value_of(name: str, raw):
    """A column value as the report groups it: booleans as bool, NULL (the word default) as 'default'."""
    if raw is None:
        return "default"
    var = BY_NAME[name]
    if var.type is bool:
        return bool(raw)
    if var.type is float:
        return float(raw)
    if var.type is int and not isinstance(raw, str):
        return int(raw)
    return raw


def label(name: str, value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def sort_key(name: str, value):
    var = BY_NAME[name]
    if var.choices and value in var.choices:
        return (0, var.choices.index(value), "")
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, 0, str(value))  # words like "default" after the numbers


def is_size(name: str, values) -> bool:
    var = BY_NAME[name]
    return (var.type in (int, float) and name not in NOT_SIZES
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values))


def followers_of(name: str) -> set[str]:
    out, todo = set(), list(DERIVED.get(name, ()))
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(DERIVED.get(n, ()))
    return out


def done_runs(rows: list[dict]) -> list[dict]:
    """The runs every aggregate uses: done, with a step time."""
    return [r for r in rows if r.get("status") == "done" and r.get(METRIC) is not None and r[METRIC] > 0]


def varied_variables(runs: list[dict]) -> list[str]:
    """Variables with more than one value among these runs, in catalogue order."""
    return [n for n in NAMES if n not in NOT_FACTORS and len({value_of(n, r[n]) for r in runs}) > 1]


def modal_config(runs: list[dict], names: list[str]) -> dict:
    """Per variable, the value most runs share (ties: the catalogue default, then the lowest)."""
    out = {}
    for n in names:
        counts = Counter(value_of(n, r[n]) for r in runs)
        top = max(counts.values())
        tied = sorted((v for v, c in counts.items() if c == top), key=lambda v: sort_key(n, v))
        default = value_of(n, BY_NAME[n].default) if not isinstance(BY_NAME[n].default, str) else BY_NAME[n].default
        out[n] = default if default in tied else tied[0]
    return out


# -- fitting ------------------------------------------------------------------------------------

def _groups(runs: list[dict], free: set[str], varied: list[str]) -> dict[tuple, list[dict]]:
    """Runs grouped by the varied variables outside `free`: each group differs only in `free`."""
    keys = [n for n in varied if n not in free]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[tuple(value_of(n, r[n]) for n in keys)].append(r)
    return groups


def _best_group(groups: dict[tuple, list[dict]], keys: list[str], modal: dict, distinct) -> tuple | None:
    """The group with the most distinct values of the free variables, then closest to the modal config."""
    def score(item):
        key, members = item
        agree = sum(1 for n, v in zip(keys, key) if modal[n] == v)
        return (distinct(members), agree, len(members))
    if not groups:
        return None
    return max(groups.items(), key=score)[0]


def analyse_variable(runs: list[dict], name: str, varied: list[str], modal: dict, machine_id: int) -> VariableEffect | None:
    """The slice, levels, ratios and elasticity of one variable; None when no two runs differ only in it."""
    free = {name} | followers_of(name)
    keys = [n for n in varied if n not in free]
    groups = _groups(runs, free, varied)
    best = _best_group(groups, keys, modal, lambda ms: len({value_of(name, r[name]) for r in ms}))
    members = groups[best]
    by_value: dict = defaultdict(list)
    for r in members:
        by_value[value_of(name, r[name])].append(r)
    if len(by_value) < 2:
        return None
    values = sorted(by_value, key=lambda v: sort_key(name, v))
    levels = [Level(v, label(name, v), [float(r[METRIC]) for r in by_value[v]],
                    [float(r["tokens_per_s"]) for r in by_value[v] if r.get("tokens_per_s") is not None])
              for v in values]
    base_value = modal[name] if modal[name] in by_value else max(values, key=lambda v: len(by_value[v]))
    baseline = next(lv for lv in levels if lv.value == base_value)
    followers = sorted(n for n in followers_of(name) if n in varied
                       and len({value_of(n, r[n]) for r in members}) > 1)
    ve = VariableEffect(machine_id=machine_id, variable=name, size_like=is_size(name, values),
                        baseline=baseline, levels=levels, fixed={n: label(n, v) for n, v in zip(keys, best)},
                        followers=followers, ratios=_ratios(levels, baseline, name, machine_id))
    if ve.size_like:
        ve.elasticity, ve.n_groups = _elasticity(groups, name, machine_id)
    span = ve.span
    for e in ve.ratios + ([ve.elasticity] if ve.elasticity else []):
        e.span = span
    return ve


def _ratios(levels: list[Level], baseline: Level, name: str, machine_id: int) -> list[Effect]:
    logs = [np.log(lv.step_ms) for lv in levels]
    n = sum(len(x) for x in logs)
    dof = n - len(logs)
    # Pooled within-value variance of log step time: one noise level for the whole slice.
    s = math.sqrt(sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / dof) if dof >= 1 else None
    base = np.log(baseline.step_ms)
    out = []
    for lv, x in zip(levels, logs):
        if lv is baseline:
            continue
        diff = float(x.mean() - base.mean())
        lo = hi = None
        if s is not None:
            half = t975(dof) * s * math.sqrt(1 / len(x) + 1 / len(base))
            lo, hi = math.exp(diff - half), math.exp(diff + half)
        out.append(Effect(machine_id, name, "ratio", lv.label, baseline.label, math.exp(diff), lo, hi,
                          len(x) + len(base)))
    return out


def _elasticity(groups: dict[tuple, list[dict]], name: str, machine_id: int) -> tuple[Effect | None, int]:
    """Least-squares slope of log step time on log value, within groups (each group its own intercept)."""
    xs, ys, used = [], [], 0
    for members in groups.values():
        x = np.log([float(value_of(name, r[name])) for r in members])
        if len(set(x.tolist())) < 2:
            continue
        y = np.log([float(r[METRIC]) for r in members])
        xs.append(x - x.mean())
        ys.append(y - y.mean())
        used += 1
    if not used:
        return None, 0
    x, y = np.concatenate(xs), np.concatenate(ys)
    sxx = float(x @ x)
    slope = float(x @ y) / sxx
    dof = len(x) - used - 1
    lo = hi = None
    if dof >= 1:
        resid = y - slope * x
        se = math.sqrt(float(resid @ resid) / dof / sxx)
        half = t975(dof) * se
        lo, hi = slope - half, slope + half
    return Effect(machine_id, name, "elasticity", None, None, slope, lo, hi, len(x)), used


def analyse_machine(rows: list[dict], machine_id: int, varied: list[str] | None = None) -> tuple[list[VariableEffect], list[str]]:
    """Every varied variable of one machine's done runs, ranked by effect size (largest first),
    and the varied variables that never vary alone (they only move with another one)."""
    runs = [r for r in done_runs(rows) if r["machine_id"] == machine_id]
    varied = [n for n in (varied or varied_variables(runs)) if len({value_of(n, r[n]) for r in runs}) > 1]
    if not runs or not varied:
        return [], []
    modal = modal_config(runs, varied)
    found, alone = [], []
    for n in varied:
        ve = analyse_variable(runs, n, varied, modal, machine_id)
        (found.append(ve) if ve else alone.append(n))
    for ve in found:
        ve.fixed = drop_derived(ve.fixed, alone)
    found.sort(key=lambda ve: -ve.span)
    return found, alone


def drop_derived(fixed: dict[str, str], together: list[str]) -> dict[str, str]:
    """`fixed` without the variables that only ever moved with a parent also listed: noise to a reader."""
    return {k: v for k, v in fixed.items()
            if not (k in together and any(k in followers_of(p) for p in fixed))}


def grids(rows: list[dict], machine_id: int, names: list[str], together: list[str] = ()) -> list[Grid]:
    """Pairs of variables varied jointly (more combinations than a one-at-a-time cross would give).
    `together`: the variables that never vary alone, left out of the held values shown."""
    runs = [r for r in done_runs(rows) if r["machine_id"] == machine_id]
    varied = [n for n in varied_variables(runs)]
    if not runs:
        return []
    modal = modal_config(runs, varied)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if b in followers_of(a) or a in followers_of(b):
                continue
            free = {a, b} | followers_of(a) | followers_of(b)
            keys = [n for n in varied if n not in free]
            groups = _groups(runs, free, varied)
            best = _best_group(groups, keys, modal, lambda ms: len({(value_of(a, r[a]), value_of(b, r[b])) for r in ms}))
            members = groups[best]
            cells: dict = defaultdict(list)
            for r in members:
                cells[(value_of(a, r[a]), value_of(b, r[b]))].append(float(r[METRIC]))
            av = sorted({k[0] for k in cells}, key=lambda v: sort_key(a, v))
            bv = sorted({k[1] for k in cells}, key=lambda v: sort_key(b, v))
            if len(av) < 2 or len(bv) < 2 or len(cells) <= len(av) + len(bv) - 1:
                continue
            matrix = [[float(np.median(cells[(x, y)])) if (x, y) in cells else None for y in bv] for x in av]
            out.append(Grid(machine_id, a, b, [label(a, v) for v in av], [label(b, v) for v in bv], matrix,
                            drop_derived({n: label(n, v) for n, v in zip(keys, best)}, list(together))))
    return out
