"""The comparisons of the report: how step time changes with each variable, from one model of the runs.

Pure functions over run rows (dicts with the columns of v_results); numpy and scipy, no I/O. The
statistical model itself (configuration + block + residual, fitted once per machine) is
step_model.py; the runs by cell and the comparison groups over them, as columns, are cells.py; the words a
reader sees are the report package's (orchestrator/report/words.py).

What is compared
- Runs are grouped on what really ran: `dataset_used` rather than `dataset`, and the settings read
  back in the child (`applied`) where they differ from the job's (RAN_FROM). Asked-for values that
  ran identically (the hub dataset unreachable, so both values trained on `builtin`) are one value.
- A variable is *varied* when its done runs ran with more than one value (`repeat` and `block`
  place a run in the run order, never a factor).
- The *comparison group* of a variable holds the runs that differ in that variable alone: every other
  varied variable at one value, and the variables that follow it (variables.DERIVATIONS: threads
  follow cores, head_dim and kv_heads follow d_model / n_heads) at their derived values. A run whose
  follower was set by hand (omp_threads=1 at cores=2) is not in the cores comparison: it differs in
  omp_threads too. Of the candidate groups we take the one with the most values of the variable, then
  the one closest to the modal configuration; its most common value is the *baseline*.

How the uncertainty is made
- One model per machine (step_model.fit): log step time = configuration + block + residual. Blocks
  are the run order's (pass, jobs.block): drift and correlated noise are estimated inside the
  model and their degrees of freedom paid. The residual variance is shared by every configuration
  (stratified by the number of CPUs where a stratum has enough runs), so a value with 3 runs borrows
  the degrees of freedom of the whole sweep. A slow mode (bimodal or heavy-tailed runs) is fitted
  where the residuals clearly show one; the effects are then the fast mode's.
- Disturbed runs (disturbed(): another process or the hypervisor took a share of the job's CPUs
  in its timed window) are left out of every fit, unless every run of the machine was disturbed.
- A *ratio* (value vs baseline) is exp of the difference of the two configurations' effects; an
  *elasticity* (size-like numeric variables with three or more values) the least-squares slope of
  the configurations' effects on log value within each group. Both are contrasts of the one fit:
  standard error sqrt(a' A^-1 a), Satterthwaite's degrees of freedom over the noise strata, a
  Student t test. A size variable with two values has only its ratio (the same test twice would be
  counted twice).
- Where a variable varies in several groups (a grid), the groups' effects are tested for equality
  (a Wald F test, in the family); where they differ, the effect is reported per group and no pooled
  number is given.
- One procedure for verdicts and intervals: single-step Bonferroni over every test of the report
  (family-wise error 5%): `significant` means p * m < 0.05, which is exactly when the shown
  (simultaneous) interval excludes no change. "Runs needed" and "target met" use the same quantile
  and standard error.
- Values that were asked for and have no usable run are named with why (failed, skipped, disturbed,
  not run yet), never dropped silently.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from itertools import compress, repeat
from operator import attrgetter, is_not, itemgetter, ne, not_
from dataclasses import dataclass, field

import numpy as np
from scipy.special import fdtrc, ndtri, stdtr, stdtrit

from orchestrator.stats import step_model as sm
from orchestrator.stats.cells import (DERIVED_MARK, Cells, Groups, best_group, codes_of, distinct_sorted,
                                     first_seen)
from orchestrator.stats.columns import column, conf_values, runs_fingerprint
from orchestrator.stats.config_index import values_of
# What each run ran with and the model's view of a machine live beside this module; their names are
# re-exported for the report, the adaptive loop and the tests, which read them as effects.*.
from orchestrator.stats.noise import (Drift, Model, Noise, cv_of, fit_inputs, fit_model, machine_noise,
                               model_inputs, pass_drift)
from orchestrator.stats.ran import (FACTORS, METRIC, NOT_FACTORS, NOT_SIZES, RAN_FROM, Run, as_ran,  # noqa: F401
                              disturbed, disturbed_run_ids, done_runs, followers_of, is_size, label, modal_config,
                              peak_of, provisional_peak, sort_key, value_of, varied_variables, _configs)
from common.variables import NAMES
from common.blocks import JOINT
from common.metrics import DISTURBED_SHARE  # noqa: F401  (the report states it)

ALPHA = 0.05  # family-wise error rate of the whole report
POWER = 0.8  # for "how many repeats would resolve it"
METHOD = ("one model of log step time (configuration + block + residual), residual variance shared "
          "across configurations, single-step Bonferroni")


# -- effects ------------------------------------------------------------------------------------

def t_quantile(p: float, dof: float) -> float:
    """The p-quantile of Student's t with (possibly fractional) dof; the normal one for dof=inf."""
    return float(ndtri(p)) if math.isinf(dof) else float(stdtrit(dof, p))


def t975(dof: float) -> float:
    return t_quantile(0.975, dof)


def two_sided_p(t: float, dof: float) -> float:
    if math.isinf(t):
        return 0.0
    return float(2 * stdtr(dof, -abs(t)))


def family_quantile(family: int, dof: float) -> float:
    """The t quantile of the report's simultaneous intervals and tests (Bonferroni over `family`)."""
    return t_quantile(1 - ALPHA / (2 * max(1, family)), dof)


USABLE = 5.0  # an interval reaching further than 5x either side (0.2x-5x around 1) is too wide to read (Effect.usable)


@dataclass
class Effect:
    """One fitted number: an elasticity (value None) or the ratio of `value`'s step time to `baseline`'s."""

    machine_id: int
    variable: str
    kind: str  # 'elasticity' | 'ratio'
    value: str | None  # the value compared (ratio); None for an elasticity
    baseline: str | None  # the value it is compared with (ratio); None for an elasticity
    estimate: float  # the ratio, or the exponent
    se: float | None  # standard error of log(ratio), or of the exponent; None: no interval
    dof: float | None
    n_runs: int
    min_runs: int = 0  # runs of the value (or values) with the fewest
    n_passes: int = 0  # repeat passes the runs came from
    method: str = ""
    job_ids: np.ndarray | tuple = ()  # the jobs of the runs it rests on (what --target-ci repeats: Cells.job_ids)
    p_value: float | None = None
    p_adjusted: float | None = None  # Bonferroni, across the whole report
    significant: bool | None = None  # p_adjusted < ALPHA (the shown interval excludes no change); None: not tested
    family: int = 0  # the number of tests adjusted for
    repeats_needed: int | None = None  # for an effect not resolved: repeats per value that would resolve it
    target_met: bool | None = None  # the shown (family-wise) interval's relative half-width within --target-ci
    log_range: float = 0.0  # elasticity: log(largest / smallest value) of the values fitted
    group: str | None = None  # where the effect differs between groups: the group it holds in, in words
    why_untested: str | None = None  # why there is no interval ("a value ran once", "not estimable: ...")

    @property
    def log_effect(self) -> float:
        """On the scale the interval is built: log ratio, or the exponent."""
        return math.log(self.estimate) if self.kind == "ratio" else self.estimate

    def _back(self, x: float) -> float:
        return math.exp(x) if self.kind == "ratio" else x

    def interval(self, level_q: float) -> tuple[float | None, float | None]:
        if self.se is None:
            return None, None
        half = t_quantile(level_q, self.dof) * self.se if self.se > 0 else 0.0
        return self._back(self.log_effect - half), self._back(self.log_effect + half)

    @property
    def ci95(self) -> tuple[float | None, float | None]:
        """This comparison's own 95% interval."""
        return self.interval(0.975)

    @property
    def ci_adj(self) -> tuple[float | None, float | None]:
        """The simultaneous 95% interval (Bonferroni over the report's `family` tests): what the
        report shows, and excludes no change exactly when the effect is called significant."""
        if self.se is None:
            return None, None
        return self.interval(1 - ALPHA / (2 * max(1, self.family)))

    @property
    def half_log(self) -> float | None:
        """Half-width of the shown interval on the log (or exponent) scale."""
        if self.se is None:
            return None
        return family_quantile(self.family, self.dof) * self.se

    # the interval the report shows
    @property
    def ci_low(self) -> float | None:
        return self.ci_adj[0]

    @property
    def ci_high(self) -> float | None:
        return self.ci_adj[1]

    @property
    def half_width(self) -> float | None:
        """Relative half-width of the shown (family-wise) interval on the step-time scale (0.05 =
        +-5%); for an elasticity, of the step-time factor of a doubling."""
        if self.se is None:
            return None
        return math.expm1(self.half_log * (1.0 if self.kind == "ratio" else math.log(2)))

    @property
    def usable(self) -> bool:
        """Whether the shown interval is narrow enough to read as an effect: it reaches no further than
        a factor USABLE either side of the estimate (0.2x-5x around no change), on the step-time scale
        (of a doubling, for an elasticity). A wider one is shown as unresolved."""
        if self.se is None:
            return False
        return self.half_log * (1.0 if self.kind == "ratio" else math.log(2)) <= math.log(USABLE)

    @property
    def no_change(self) -> float:
        return 1.0 if self.kind == "ratio" else 0.0

    def verdict(self) -> str:
        if self.significant is None:
            return f"not tested: {self.why_untested or 'no noise estimate'}"
        if not self.usable:
            return f"unresolved: {self.n_runs} runs, the interval too wide to read"
        if self.significant:
            return "clear effect"
        return "no detectable effect"

    def describe(self) -> str:
        lo, hi = self.ci_adj
        ci = f" (95% CI {lo:.2f} to {hi:.2f})" if lo is not None else ""
        where = f" at {self.group}" if self.group else ""
        if self.kind == "elasticity":
            return f"step time ~ {self.variable}^{self.estimate:.2f}{where}{ci}"
        return f"{self.variable}={self.value}: {self.estimate:.2f}x the step time of {self.baseline}{ci}"

    def row(self) -> tuple[str, str, str, str, str]:
        """variable, effect, estimate, family-wise 95% CI, runs: as text, for a table (bench.py's rich table)."""
        lo, hi = self.ci_adj
        ci = f"{lo:.2f} to {hi:.2f}" if lo is not None else "-"
        if lo is not None and not self.usable:
            ci = f"unresolved ({lo:.2g} to {hi:.2g})"
        if self.kind == "elasticity":
            where = f" at {self.group}" if self.group else ""
            return (self.variable, f"step time ~ {self.variable}^e{where}", f"e = {self.estimate:.2f}", ci,
                    str(self.n_runs))
        return (self.variable, f"{self.value} vs {self.baseline}", f"{self.estimate:.2f}x", ci, str(self.n_runs))


@dataclass
class Level:
    """One value of a variable within its comparison group."""

    value: object
    label: str
    runs: list[Run]

    @property
    def step_ms(self) -> list[float]:
        return [r.step_ms for r in self.runs]

    @property
    def tokens_per_s(self) -> list[float]:
        return [float(r.row["tokens_per_s"]) for r in self.runs if r.row.get("tokens_per_s") is not None]

    @property
    def adj(self) -> np.ndarray:
        return np.array([r.adj for r in self.runs])

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def passes(self) -> set[int]:
        return {r.pass_ for r in self.runs}

    @property
    def var(self) -> float | None:
        return float(np.var(self.adj, ddof=1)) if self.n >= 2 else None

    @property
    def cv(self) -> float | None:
        """This value's own run-to-run noise (its blocks' effects removed): descriptive only, the
        comparisons use the model's shared variance."""
        return cv_of(self.var)

    @property
    def median_step_ms(self) -> float:
        return float(np.median(self.step_ms))

    @property
    def median_tokens_per_s(self) -> float | None:
        return float(np.median(self.tokens_per_s)) if self.tokens_per_s else None

    @property
    def within_run_spread(self) -> float | None:
        """Median over its runs of p90/p10 of the step times inside one run (1.10 = 10%)."""
        spreads = [r.row["step_ms_p90"] / r.row["step_ms_p10"] for r in self.runs
                   if r.row.get("step_ms_p90") and r.row.get("step_ms_p10")]
        return float(np.median(spreads)) if spreads else None


@dataclass
class Interaction:
    """A test that a variable's effect is the same in every group it was varied in (a grid)."""

    groups: list[str]  # the groups, in words
    statistic: float  # Wald F
    df1: int
    df2: float
    p_value: float
    p_adjusted: float | None = None
    significant: bool | None = None
    family: int = 0


@dataclass
class VariableEffect:
    """Everything the report says about one variable on one machine."""

    machine_id: int
    variable: str
    size_like: bool
    baseline: Level
    levels: list[Level]  # in value order, baseline included
    fixed: dict[str, str]  # the other varied variables, as held in the group
    followers: list[str]  # derived variables that move with this one in the group
    ratios: list[Effect]  # one per non-baseline level
    elasticity: Effect | None = None
    n_groups: int = 1  # groups of runs the elasticity was fitted on
    left_out: int = 0  # runs at a baseline setting whose followers were set by hand
    interaction: Interaction | None = None  # does the effect differ between groups (grids)?
    by_group: list[Effect] = field(default_factory=list)  # per group, where it does

    @property
    def differs(self) -> bool:
        return bool(self.interaction and self.interaction.significant)

    @property
    def effects(self) -> list[Effect]:
        return ([self.elasticity] if self.elasticity else []) + self.ratios + self.by_group

    @property
    def span(self) -> float:
        medians = [lv.median_step_ms for lv in self.levels]
        return max(medians) / min(medians)

    @property
    def headline(self) -> Effect:
        """The one effect that speaks for this variable: its elasticity, or its clearest ratio (where
        it differs between groups: the clearest of the groups' effects, never a pooled one)."""
        if self.differs and self.by_group:
            tested = [e for e in self.by_group if e.p_value is not None]
            if tested:
                return min(tested, key=lambda e: (e.p_value, -abs(e.log_effect)))
        if self.elasticity is not None and self.elasticity.se is not None:
            return self.elasticity
        tested = [e for e in self.ratios if e.p_value is not None]
        if tested:
            return min(tested, key=lambda e: (e.p_value, -abs(e.log_effect)))
        return max(self.ratios, key=lambda e: abs(e.log_effect))

    def rank_key(self) -> tuple:
        """Clearest first: significant before not, then by p-value (effect relative to its
        uncertainty), then by size."""
        h = self.headline
        return (h.significant is not True, h.p_value if h.p_value is not None else 2.0, -abs(h.log_effect))


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


def _group_words(keys: list[str], key: tuple) -> str:
    """A group in words: the variables it holds, less those that follow another one listed."""
    shown = [(n, v) for n, v in zip(keys, key) if v != DERIVED_MARK]
    leaders = {n for n, _ in shown}
    return ", ".join(f"{n}={label(n, v)}" for n, v in shown
                     if not any(n in followers_of(m) for m in leaders if m != n)) or "the baseline"


def _by_value(cells: Cells, members: list[int], name: str) -> dict:
    """value of `name` -> the cells at it (in the order of their first runs)."""
    by_value: dict = defaultdict(list)
    col = cells.column(name)
    for c in members:
        by_value[col[c]].append(c)
    return by_value


def analyse_variable(cells: Cells, name: str, varied: list[str], modal: dict, machine_id: int,
                     model: Model) -> VariableEffect | None:
    """The comparison group, levels, ratios, elasticity and interaction of one variable; None when
    no two runs differ in it alone."""
    groups = Groups(cells, {name}, varied)
    n_values = groups.distinct(cells.codes(name)[0])
    best = best_group(cells, groups, n_values)
    members = groups.members(best)
    by_value = _by_value(cells, members, name)
    if len(by_value) < 2:
        return None
    values = sorted(by_value, key=lambda v: sort_key(name, v))
    levels = [Level(v, label(name, v), cells.runs_of(by_value[v])) for v in values]
    base_value = modal[name] if modal[name] in by_value else max(values, key=lambda v: cells.n_configs(by_value[v]))
    baseline = next(lv for lv in levels if lv.value == base_value)
    follow = followers_of(name)
    followers = sorted((n for n in follow if n in varied and len(cells.values(members, n)) > 1), key=NAMES.index)
    fixed = {n: ("follows" if v == DERIVED_MARK else label(n, v)) for n, v in zip(groups.keys, groups.key(best))}
    fixed = {n: v for n, v in fixed.items() if v != "follows"}
    ve = VariableEffect(machine_id=machine_id, variable=name, size_like=is_size(name, values), baseline=baseline,
                        levels=levels, fixed=fixed, followers=followers,
                        ratios=[ratio(cells, by_value[lv.value], by_value[base_value], lv.label, baseline.label, name,
                                      machine_id, model) for lv in levels if lv is not baseline])
    # Runs at the baseline's other settings that the group leaves out because a follower was set by hand.
    ve.left_out = int(groups.n_runs()[groups.beside(best)].sum())
    several = groups.by_key(np.flatnonzero(n_values >= 2))  # the groups it varies in
    if ve.size_like and (n_values[several] >= 3).any():
        ve.elasticity, ve.n_groups = elasticity(cells, list(map(groups.cells_of, several)), name, machine_id, model)
    if len(several) >= 2:
        _interaction(ve, cells, groups, several, model)
    return ve


def _test(e: Effect, c: sm.Contrast | None, why: str) -> None:
    """Fill the effect's standard error, degrees of freedom and p from a contrast of the model."""
    if c is None:
        e.why_untested = why
        return
    if c.se is None:
        e.why_untested = "nothing was repeated, so the machine's noise is not known"
        return
    e.se, e.dof = c.se, c.dof
    e.p_value = two_sided_p(c.estimate / c.se, c.dof) if c.se > 0 else (0.0 if c.estimate != 0 else 1.0)


NOT_ESTIMABLE = "not estimable: its runs share no block with the baseline's, directly or through other configurations"


def ratio(cells: Cells, at: list[int], base: list[int], value: str, base_label: str, name: str, machine_id: int,
          model: Model, group: str | None = None) -> Effect:
    """Step time at a value (its cells `at`) over the baseline's (`base`): exp of the difference of
    their configurations' effects in the model, with the model's shared variance and degrees of freedom."""
    weights = cells.weights(model, [at, base], [1.0, -1.0])
    c = model.fit.contrast(weights)
    est = c.estimate if c is not None else float(cells.mean_adj(at) - cells.mean_adj(base))
    both = at + base
    e = Effect(machine_id, name, "ratio", value, base_label, math.exp(est), None, None, cells.n_runs(both),
               min_runs=min(cells.n_runs(at), cells.n_runs(base)), n_passes=len(cells.passes(both)), method=METHOD,
               job_ids=cells.job_ids(both), group=group)
    _test(e, c, NOT_ESTIMABLE)
    return e


@dataclass
class _Slope:
    """What an elasticity is fitted on: every value of a variable (a level) in every group where it took
    two or more, group after group, each group's values in the order of their first cells."""

    group: np.ndarray  # each level's group (numbered from 0 among the groups kept)
    log_value: np.ndarray  # each level's log value
    cells: np.ndarray  # the levels' cells, level after level (each level's in its group's order)
    level: np.ndarray  # the level of each of those cells
    start: np.ndarray  # where each level's cells start in `cells`, and their end

    def level_cells(self) -> list[np.ndarray]:
        return np.split(self.cells, self.start[1:-1])


def _slope_cells(cells: Cells, groups: list, name: str) -> _Slope | None:
    """The levels of `name` (its values as floats) in these groups (each a sequence of cells), those of
    groups with one value left out; None where no group has two."""
    members = np.concatenate([np.asarray(ms, np.intp) for ms in groups] or [np.empty(0, np.intp)])
    group_of = np.repeat(np.arange(len(groups)), [len(ms) for ms in groups])
    codes, distinct = cells.codes(name)
    used = distinct_sorted(codes[members])
    float_code = np.zeros(len(distinct), np.intp)  # each value's float, as a code among the floats
    float_code[used], floats = codes_of([float(distinct[k]) for k in used.tolist()])
    at_value = float_code[codes[members]]
    level = first_seen([group_of, at_value], len(members))  # (group, value), group after group
    ordered = np.argsort(level, kind="stable")  # the cells level after level
    first = ordered[np.concatenate(([0], np.cumsum(np.bincount(level))[:-1]))] if len(members) else ordered
    level_group = group_of[first]
    kept = np.bincount(level_group, minlength=len(groups))[level_group] >= 2
    if not kept.any():
        return None
    in_kept = kept[level[ordered]]
    number = np.cumsum(kept) - 1  # a kept level's number among the kept
    slope_level = number[level[ordered[in_kept]]]
    return _Slope(np.unique(level_group[kept], return_inverse=True)[1],
                  np.array([math.log(v) for v in floats])[at_value[first[kept]]], members[ordered[in_kept]],
                  slope_level, np.concatenate(([0], np.cumsum(np.bincount(slope_level)))))


def _group_means(x: np.ndarray, group: np.ndarray) -> np.ndarray:
    """float(np.mean(...)) of each group's values (x group after group), to the last digit: the groups of
    one size as the rows of a matrix, whose row means sum each row as np.mean sums one list."""
    sizes = np.bincount(group)
    start = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    means = np.empty(len(sizes))
    for k in np.unique(sizes).tolist():
        of_size = np.flatnonzero(sizes == k)
        means[of_size] = np.mean(x[start[of_size, None] + np.arange(k)], axis=1)
    return means


def elasticity(cells: Cells, groups: list, name: str, machine_id: int, model: Model,
               group: str | None = None, slope: _Slope | None = None) -> tuple[Effect | None, int]:
    """The least-squares slope of the values' effects in the model on log value, within groups (each
    group, a sequence of cells, its own intercept): a contrast of the one fit. `slope`: _slope_cells of
    these groups, where the caller has it."""
    slope = slope if slope is not None else _slope_cells(cells, groups, name)
    if slope is None:
        return None, 0
    logs = slope.log_value
    x = logs - _group_means(logs, slope.group)[slope.group]
    coefs = x / float(x @ x)
    c = model.fit.contrast(cells.level_weights(model, slope.cells, slope.level, coefs))
    est = c.estimate if c is not None else \
        float(sum(w * cells.mean_adj(cs) for w, cs in zip(coefs, slope.level_cells())))
    e = Effect(machine_id, name, "elasticity", None, None, est, None, None, cells.n_runs(slope.cells),
               min_runs=int(np.add.reduceat(cells.counts[slope.cells], slope.start[:-1]).min()),
               n_passes=len(cells.passes(slope.cells)), method=METHOD, job_ids=cells.job_ids(slope.cells),
               log_range=float(logs.max() - logs.min()), group=group)
    _test(e, c, NOT_ESTIMABLE)
    return e, int(slope.group[-1]) + 1


def _interaction(ve: VariableEffect, cells: Cells, groups: Groups, several: list[int], model: Model) -> None:
    """Is the variable's effect the same in every group where it took two or more values? A Wald F
    test on the groups' slopes (sizes) or their log ratios to the baseline value (others), with the
    model's covariance. The per-group effects are kept for the report where the test rejects."""
    name = ve.variable
    base = ve.baseline.value
    per_group: list[tuple[str, list[dict], list[Effect]]] = []
    if ve.size_like:
        for g in several:  # (each with two or more values)
            words = _group_words(groups.keys, groups.key(g))
            slope = _slope_cells(cells, [groups.cells_of(g)], name)
            e, _ = elasticity(cells, [groups.cells_of(g)], name, ve.machine_id, model, group=words, slope=slope)
            x = slope.log_value - slope.log_value.mean()
            per_group.append((words, [cells.level_weights(model, slope.cells, slope.level, x / float(x @ x))], [e]))
            if e.se is None:  # no test without every group's interval: the rest need not be made
                return
    else:
        shared = None
        for g in several:
            vals = cells.values(groups.cells_of(g), name)
            if base in vals:
                shared = vals if shared is None else shared & vals
        shared = sorted((shared or set()) - {base}, key=lambda v: sort_key(name, v))
        if not shared:
            return
        for g in several:
            by_value = _by_value(cells, groups.members(g), name)
            if base not in by_value:
                continue
            words = _group_words(groups.keys, groups.key(g))
            effects = [ratio(cells, by_value[v], by_value[base], label(name, v), label(name, base), name,
                             ve.machine_id, model, group=words) for v in shared]
            per_group.append((words, [cells.weights(model, [by_value[v], by_value[base]], [1.0, -1.0]) for v in shared],
                              effects))
            if any(e.se is None for e in effects):
                return
    if len(per_group) < 2 or any(e.se is None for _, _, es in per_group for e in es):
        return
    f = model.fit
    k = len(per_group[0][1])
    # differences from the first group: (G - 1) * k contrasts, jointly zero when the effect is the same everywhere
    vecs = []
    for _, ws, _ in per_group[1:]:
        for j in range(k):
            d = dict(ws[j])
            for i, w in per_group[0][1][j].items():
                d[i] = d.get(i, 0.0) - w
            vecs.append(d)
    est = np.array([sum(w * f.mu[i] for i, w in d.items()) for d in vecs])
    cov = f.covariance(vecs)
    try:
        stat = float(est @ np.linalg.solve(cov, est)) / len(vecs)
    except np.linalg.LinAlgError:
        return
    df2 = min(e.dof for _, _, es in per_group for e in es)
    ve.interaction = Interaction([w for w, _, _ in per_group], stat, len(vecs), df2, float(fdtrc(len(vecs), df2, stat)))
    ve.by_group = [e for _, _, es in per_group for e in es]


# -- the whole report ---------------------------------------------------------------------------

@dataclass
class Lost:
    """A value that was asked for and has no usable run."""

    variable: str
    value: str
    why: str


@dataclass
class MachineAnalysis:
    machine_id: int
    variables: list[VariableEffect]  # clearest first
    together: list[str]  # varied, but never alone: they only moved with another variable
    drift: Drift
    noise: Noise
    identical: list[str]  # asked-for values that ran identically, in words
    regrouped: list[str]  # runs counted under what they ran with, in words
    runs: list[Run]  # the runs fitted
    varied: list[str]
    disturbed: list[Run] = field(default_factory=list)  # done runs flagged disturbed (effects.disturbed)
    disturbed_kept: bool = False  # every done run was disturbed: they are fitted, as nothing else is left
    lost: list[Lost] = field(default_factory=list)  # values asked for with no usable run, and why
    uncompared: dict[str, str] = field(default_factory=dict)  # variable -> why it could not be compared
    model: Model | None = None
    baseline_lost: str = ""  # where the baseline configuration has no usable run: what happened, in words
    cells: Cells | None = field(default=None, repr=False)  # the runs by cell (grids group them again)

    @property
    def effects(self) -> list[Effect]:
        return [e for ve in self.variables for e in ve.effects]

    @property
    def interactions(self) -> list[Interaction]:
        return [ve.interaction for ve in self.variables if ve.interaction is not None]


@dataclass
class Analysis:
    machines: dict[int, MachineAnalysis]
    family: int  # tests adjusted for together

    @property
    def effects(self) -> list[Effect]:
        return [e for m in self.machines.values() for e in m.effects]

    def ranked(self) -> list[VariableEffect]:
        return sorted((ve for m in self.machines.values() for ve in m.variables), key=VariableEffect.rank_key)


def analyse(rows: list[dict], machine_ids: list[int] | None = None, *, probe_cv: dict[int, float] | None = None,
            target_ci: dict[int, float] | None = None, per_run: bool = False, memo: dict | None = None,
            beside=None, meanwhile=None) -> Analysis:
    """Every machine's comparisons, then one Bonferroni family across all of them. `probe_cv`:
    machine -> its measured noise (machines.noise_cv); `target_ci`: machine -> the relative
    half-width of the shown interval that `work --target-ci` asked for there. per_run=True groups
    run by run instead of once per configuration (as_ran's share=False): slower, the same numbers.
    `memo`: a dict kept by a long-lived caller (report --watch) between calls: a machine none of
    whose runs changed since the last call keeps its comparisons (only the family-wise step is redone).
    `beside`: a forked.Worker that fits the step model of every machine to analyse but the first while
    this process analyses that one (a fleet's machines on both CPUs; the same numbers). `meanwhile`:
    called once that child has its work, before this process starts on the first machine."""
    # An ofat sweep's joint configurations (sweep.JOINT: several sizes at once, for the cost model)
    # belong to no comparison: left out here, they leave every effect and interval as without them
    # (in them, 27 quiet runs more narrowed a noisy level's shared-variance interval: tests/test_synthetic_truth).
    rows = list(compress(rows, map(ne, column(rows, "block"), repeat(JOINT))))
    ids = machine_ids if machine_ids is not None else sorted({r["machine_id"] for r in rows})
    by_machine: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_machine[r["machine_id"]].append(r)
    for gone in set(memo or ()) - set(ids):
        del memo[gone]
    machines = _analysed(memo, by_machine, ids, probe_cv or {}, per_run, beside, meanwhile)
    analysis = Analysis(machines, 0)
    analysis.family = adjust(analysis.effects, [i for m in machines.values() for i in m.interactions])
    for m in machines.values():
        for ve in m.variables:
            if ve.differs:  # never one pooled exponent where the groups disagree
                ve.elasticity = None
            else:  # the groups' effects stand only where the effect differs between them
                ve.by_group = []
        for e in m.effects:
            e.repeats_needed = _repeats_needed(e, analysis.family)
            if target_ci and m.machine_id in target_ci:
                e.target_met = e.half_width is not None and e.half_width <= target_ci[m.machine_id]
        m.variables.sort(key=VariableEffect.rank_key)
    return analysis


@dataclass
class _Kept:
    """One machine's comparisons as analyse_machine left them, before the family-wise step changed them."""
    key: tuple
    analysis: MachineAnalysis
    order: list  # the variables in analyse_machine's order (analyse sorts them in place)
    pooled: list  # (variable, its elasticity, its by-group effects): analyse drops one of the two
    targets: list  # (effect, target_met)


def _analysed(memo: dict | None, by_machine: dict, ids: list[int], probe_cv: dict, per_run: bool,
              beside, meanwhile) -> dict[int, MachineAnalysis]:
    """Each machine's comparisons: kept from the memo where its runs are those of the last call
    (restored to how analyse_machine left them), else analysed anew (and kept, with a memo). With
    `beside`, the step models of the machines to analyse after the first are fitted by that child,
    sent before this process starts on the first."""
    out = {m: kept for m in ids if (kept := _kept(memo, by_machine[m], m, (probe_cv.get(m), per_run)))}
    todo = [m for m in ids if m not in out]
    ran: dict = {}  # machine -> its runs (as_ran), made before the child is sent its fits
    inputs: dict = {}  # machine -> model_inputs() of its runs the fit uses
    if beside is not None and len(todo) > 1:
        for m in todo[1:]:
            ran[m] = as_ran(by_machine[m], share=not per_run, read=values_of)
            if used := _undisturbed(ran[m])[2]:
                inputs[m] = model_inputs(used, probe_cv.get(m))
    if inputs:
        beside.submit(fit_all, [arrays for _, _, arrays in inputs.values()])
    if meanwhile is not None:
        meanwhile()
    fits = None  # machine -> the child's fit, taken when the first of them is needed
    for m in todo:
        runs = ran[m] if m in ran else as_ran(by_machine[m], share=not per_run, read=values_of)
        if m in inputs and fits is None:
            fits = dict(zip(inputs, beside.result()))
        ma = analyse_machine(runs, m, asked=by_machine[m], probe_cv=probe_cv.get(m),
                             fitted=(inputs[m], fits[m]) if m in inputs else None)
        out[m] = _keep(memo, by_machine[m], m, (probe_cv.get(m), per_run), ma)
    return {m: out[m] for m in ids}


def fit_all(inputs: list[tuple]) -> list[sm.Fit]:
    """The step model of each machine's model_inputs() (run by _analysed's child)."""
    return [fit_inputs(i) for i in inputs]


def _kept(memo: dict | None, asked: list[dict], machine_id: int, how: tuple) -> MachineAnalysis | None:
    """The machine's comparisons from the memo, when its runs are those of the last call."""
    if memo is None:
        return None
    kept = memo.get(machine_id)
    if kept is None or kept.key != (runs_fingerprint(asked), *how):
        return None
    ma = kept.analysis
    ma.variables = list(kept.order)
    for ve, elasticity, by_group in kept.pooled:
        ve.elasticity, ve.by_group = elasticity, list(by_group)
    for e, met in kept.targets:
        e.target_met = met
    return ma


def _keep(memo: dict | None, asked: list[dict], machine_id: int, how: tuple, ma: MachineAnalysis) -> MachineAnalysis:
    """ma, kept in the memo (as analyse_machine left it) for the next call."""
    if memo is not None:
        memo[machine_id] = _Kept((runs_fingerprint(asked), *how), ma, list(ma.variables),
                                 [(ve, ve.elasticity, list(ve.by_group)) for ve in ma.variables],
                                 [(e, e.target_met) for e in ma.effects])
    return ma


def analyse_machine(runs: list[Run], machine_id: int, *, asked: list[dict] = (), probe_cv: float | None = None,
                    fitted: tuple | None = None) -> MachineAnalysis:
    """One machine's comparisons (not yet adjusted for the report's multiplicity). Disturbed runs
    (another process or the hypervisor took a share of their CPUs during the timed window) are left
    out of every fit, unless every run was disturbed. `fitted`: the step model of those runs, fitted
    elsewhere (noise.fit_model's)."""
    flagged, kept_all, runs = _undisturbed(runs)
    model = fit_model(runs, fitted, probe_cv) if runs else None
    drift = pass_drift(runs, model) if model else Drift({}, {}, [])
    cells = Cells(runs)
    varied = varied_variables(cells.rep)  # (one run per cell: a cell's runs share their values)
    modal = modal_config(cells.rep, varied) if runs else {}  # (a cell's runs share their configuration)
    noise = machine_noise(runs, varied, model, probe_cv, modal)
    found, together = [], []
    if runs and varied:
        for n in varied:
            ve = analyse_variable(cells, n, varied, modal, machine_id, model)
            (found.append(ve) if ve else together.append(n))
        for ve in found:
            ve.fixed = drop_derived(ve.fixed, together)
    lost, uncompared, base_note = lost_levels(runs, flagged if not kept_all else [], list(asked), found, together,
                                              cells, varied)
    cells.drop_counts()
    return MachineAnalysis(machine_id, found, [n for n in together if n not in uncompared], drift, noise,
                           _identical(runs, asked, cells), _regrouped(runs, cells), runs, varied, flagged, kept_all,
                           lost, uncompared, model, base_note, cells)


def _undisturbed(runs: list[Run]) -> tuple[list[Run], bool, list[Run]]:
    """(the disturbed runs, whether every run was, the runs the fits use: the undisturbed, or all)."""
    flagged = [r for r in runs if r.disturbed]
    kept_all = bool(flagged) and len(flagged) == len(runs)
    return flagged, kept_all, runs if kept_all else [r for r in runs if not r.disturbed]


def _status_words(rows: list[dict], disturbed_ids: set) -> str:
    """Why these rows of one value gave no usable run, in a few words."""
    counts = Counter()
    reasons: dict[str, str] = {}
    for r in rows:
        st = r.get("status") or "queued"
        if st == "done" and r.get("run_id") in disturbed_ids:
            st = "disturbed"
        counts[st] += 1
        if r.get("error") and st in ("failed", "skipped"):
            reasons.setdefault(st, str(r["error"]).strip().splitlines()[0][:160])
    parts = []
    for st in ("failed", "skipped", "disturbed", "running", "queued", "done"):
        if counts[st]:
            why = {"disturbed": "left out: another process or the hypervisor took its CPUs",
                   "queued": "not run yet", "running": "still running",
                   "done": "no step time"}.get(st, reasons.get(st, ""))
            parts.append(f"{counts[st]} {st}" + (f" ({why})" if why else ""))
    return "; ".join(parts)


def _asked_sample(ran: set[int], asked: list[dict], cells: Cells) -> list[dict]:
    """The asked rows that say something new about the raw job columns: every row without a usable run (`ran`:
    the ids of those with one), and of those with one, the first of each cell (a cell's runs share their job
    columns: as_ran)."""
    said = ran - set(map(id, (r.row for r in cells.rep)))
    if not said or not ran <= set(map(id, asked)):
        return asked
    return list(compress(asked, map(not_, map(said.__contains__, map(id, asked)))))  # (in asked order)


def _asked_values(sample: list[dict], ran: set[int], cells: Cells, varied: list[str]) -> dict[str, dict]:
    """Per variable asked for with two or more values: value -> its raw values, in the order of their rows.
    A row with a usable run asked for its cell's values (as_ran: value_of of its job columns) but where
    the child's read-back changed them, so only the runs' varied variables, those changed, and those that
    differ among the rows without a usable run (and the first with one) can have two (a grid's other ~40
    columns of 100k rows go unread)."""
    changed = {n for what in filter(None, map(attrgetter("changed"), cells.rep)) for n in what}
    rest = list(compress(sample, map(not_, map(ran.__contains__, map(id, sample))))) + [r.row for r in cells.rep[:1]]
    rest = list({id(t): t for t in conf_values(rest, FACTORS)}.values())  # (a configuration's rows share theirs)
    out = {}
    for k, n in enumerate(FACTORS):
        if n in varied or n in changed or len(set(map(itemgetter(k), rest))) > 1:
            by_value = defaultdict(set)
            for raw in dict.fromkeys(column(sample, n)):  # value_of once per distinct raw value
                by_value[value_of(n, raw)].add(raw)
            if len(by_value) > 1:
                out[n] = by_value
    return out


def _asked_baseline(asked: list[dict], asked_values: dict[str, dict]) -> tuple[dict, list[dict]]:
    """The baseline configuration as asked (per variable asked with several values, the value most asked-for
    configurations share) and its rows."""
    hashes = column(asked, "config_hash")
    configs = list((dict(zip(hashes, asked)) if all(hashes) else
                    {h or id(row): row for h, row in zip(hashes, asked)}).values())
    modal, base_rows = {}, list(asked)
    for n, by_value in asked_values.items():
        counts = Counter()
        for raw, k in Counter(column(configs, n)).items():  # value_of once per raw value
            counts[value_of(n, raw)] += k
        modal[n] = counts.most_common(1)[0][0]
        base_rows = list(compress(base_rows, map(by_value[modal[n]].__contains__, column(base_rows, n))))
    return modal, base_rows


def lost_levels(runs: list[Run], disturbed: list[Run],  # noqa: F811 - the runs left out, not ran.disturbed
                asked: list[dict], found: list[VariableEffect], together: list[str],
                cells: Cells | None = None, varied: list[str] | None = None) -> tuple[list[Lost], dict[str, str], str]:
    """Values that jobs asked for and that have no usable run, with why; the varied variables that
    could not be compared, with why (their baseline configuration or their other values lost), as
    against those that only ever moved with another variable (followers); and, where the baseline
    configuration itself has no usable run, that said in words ("" otherwise). `cells`: the runs by
    cell (Cells(runs) when not given); `varied`: the runs' varied variables (varied_variables)."""
    cells = cells if cells is not None else Cells(runs)
    ran = set(map(id, map(attrgetter("row"), runs)))
    asked_values = _asked_values(_asked_sample(ran, asked, cells), ran, cells,
                                 varied if varied is not None else varied_variables(cells.rep))
    # the values asked for that have a usable run (as asked: a value that ran as another, like the hub
    # dataset as builtin, is said so elsewhere); value_of once per distinct raw value (equal raws: equal values)
    reps = [r.row for r in cells.rep]
    d_ids = {r.row.get("run_id") for r in disturbed}
    lost = []
    for n, by_value in asked_values.items():
        usable = {value_of(n, raw) for raw in set(column(reps, n))}
        for v, raws in sorted(by_value.items(), key=lambda kv: sort_key(n, kv[0])):
            if v not in usable:
                rows = list(compress(asked, map(raws.__contains__, column(asked, n))))
                lost.append(Lost(n, label(n, v), _status_words(rows, d_ids)))
    modal, base_rows = _asked_baseline(asked, asked_values)
    base_ids = {row.get("run_id") for row in base_rows}
    base_lost = bool(base_rows) and base_ids.isdisjoint(map(dict.get, map(attrgetter("row"), runs), repeat("run_id")))
    base_words = ", ".join(f"{n}={label(n, modal[n])}" for n in asked_values)
    compared = {ve.variable for ve in found}
    lost_by_var = defaultdict(list)
    for x in lost:
        lost_by_var[x.variable].append(x)
    uncompared = {}
    leaders = set(asked_values) | compared
    for n in sorted(set(together) | (set(lost_by_var) - compared), key=FACTORS.index):
        follows = any(n in followers_of(p) for p in leaders if p != n)
        if base_lost and not follows:
            uncompared[n] = ("its baseline configuration has no usable run, and no other two of its values ran "
                             "with everything else equal")
        elif lost_by_var.get(n):
            words = "; ".join(f"{x.value}: {x.why}" for x in lost_by_var[n])
            uncompared[n] = f"too few of its values have usable runs ({words})"
    note = (f"The baseline configuration ({base_words}) has no usable run: {_status_words(base_rows, d_ids)}. "
            "Variables with another two values that ran with everything else equal are compared against one of "
            "them instead." if base_lost else "")
    return lost, uncompared, note


def adjust(effects: list[Effect], interactions: list[Interaction] = (), alpha: float = ALPHA) -> int:
    """Single-step Bonferroni over every tested effect and interaction test: p_adjusted = min(1, m p),
    significant when below alpha, which is exactly when the effect's shown interval (at 1 - alpha/2m)
    excludes no change. The family size."""
    tests = [e for e in effects if e.p_value is not None] + list(interactions)
    m = len(tests)
    for t in tests:
        t.p_adjusted = min(1.0, m * t.p_value)
        t.significant = t.p_adjusted < alpha
        t.family = m
    for e in effects:
        if e.p_value is None:
            e.family = m
    return m


MAX_REPEATS_SAID = 1000


def _repeats_needed(e: Effect, family: int) -> int | None:
    """For an effect not resolved: about how many runs per value would make the shown test reject
    an effect of this size with 80% power: the same standard error, scaled by sqrt(runs now / runs
    then), the same family-wise quantile and degrees of freedom. None when resolved or unknowable;
    MAX_REPEATS_SAID + 1 for "more"."""
    if e.significant or e.se is None or not e.min_runs or e.se <= 0:
        return None
    size = abs(e.log_effect)
    if size < 1e-6:
        return None  # no effect at all to resolve
    z = family_quantile(family, e.dof) + t_quantile(POWER, e.dof)
    for n in range(e.min_runs + 1, MAX_REPEATS_SAID + 1):
        if z * e.se * math.sqrt(e.min_runs / n) <= size:
            return n
    return MAX_REPEATS_SAID + 1


def smallest_resolvable(e: Effect) -> float | None:
    """The smallest step-time change (relative, 0.1 = 10%) the shown test detects with 80% power at
    this effect's standard error."""
    if e.se is None:
        return None
    z = family_quantile(e.family, e.dof) + t_quantile(POWER, e.dof)
    return math.expm1(z * e.se * (1.0 if e.kind == "ratio" else math.log(2)))


def _identical(runs: list[Run], asked: list[dict], cells: Cells | None = None) -> list[str]:
    """Variables whose asked-for values ran as fewer values (e.g. dataset: both on builtin)."""
    out = []
    changed = {n for r in {id(r.changed): r for r in (cells.rep if cells else runs)}.values() for n in r.changed}
    names = [n for n in RAN_FROM if n in changed]  # (if none, every run ran with what it asked for)
    if names:  # the asked rows with a run, and that run (by run_id): read once, as columns
        done = dict(zip(map(itemgetter("run_id"), map(attrgetter("row"), runs)), runs))
        hit = list(map(done.get, column(asked, "run_id")))
        with_run = list(map(is_not, hit, repeat(None)))
        # each distinct pair of (the row's raw values, as conf_values shares them; its run's values) once, in
        # the order of their first rows: each variable's (asked raw value, value ran) pairs in the same order
        pairs = {(id(j), id(v)): (j, v) for j, v in zip(compress(conf_values(asked, names), with_run),
                                                       map(attrgetter("values"), compress(hit, with_run)))}
    for k, n in enumerate(names):
        mapping: dict = defaultdict(set)
        for raw, values in pairs.values():
            mapping[value_of(n, raw[k])].add(values[n])
        if len(mapping) < 2:
            continue
        ran_values = set().union(*mapping.values())
        if len(ran_values) < len(mapping):
            asked_words = ", ".join(label(n, v) for v in sorted(mapping, key=lambda v: sort_key(n, v)))
            ran_words = ", ".join(label(n, v) for v in sorted(ran_values, key=lambda v: sort_key(n, v)))
            where = "recorded in dataset_used" if n == "dataset" else "read back in the child"
            if len(ran_values) == 1:
                out.append(f"`{n}`: {asked_words} were asked for, but every run ran with {ran_words} ({where}): "
                           "they ran identically, so there is no effect to report; their runs count as one value.")
            else:
                out.append(f"`{n}`: {asked_words} were asked for, but the runs ran with {ran_words} only ({where}); "
                           "values that ran identically count as one.")
    return out


def _regrouped(runs: list[Run], cells: Cells | None = None) -> list[str]:
    cells = cells if cells is not None else Cells(runs)
    counts = Counter()
    changed = list(map(attrgetter("changed"), cells.rep))
    for what, k in compress(zip(changed, cells.n), changed):  # (a cell's runs share what changed)
        for n, (a, b) in what.items():
            if n != "dataset":
                counts[(n, label(n, a), label(n, b))] += k
    return [f"{k} run(s) asked for {n}={a} ran with {n}={b} (read back in the child) and count under {b}"
            for (n, a, b), k in sorted(counts.items())]


def drop_derived(fixed: dict[str, str], together: list[str]) -> dict[str, str]:
    """`fixed` without the variables that only ever moved with a parent also listed: noise to a reader."""
    return {k: v for k, v in fixed.items()
            if not (k in together and any(k in followers_of(p) for p in fixed))}


def grids(analysis: MachineAnalysis) -> list[Grid]:
    """Pairs of variables varied jointly (more combinations than a one-at-a-time cross would give)."""
    runs, varied, together = analysis.runs, analysis.varied, analysis.together
    cells = analysis.cells if analysis.cells is not None and analysis.cells.runs is runs else Cells(runs)
    names = [ve.variable for ve in analysis.variables]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if b in followers_of(a) or a in followers_of(b):
                continue
            groups = Groups(cells, {a, b}, varied)
            pairs = first_seen([cells.codes(a)[0], cells.codes(b)[0]], len(cells.rep))  # each cell's (a, b)
            best = best_group(cells, groups, groups.distinct(pairs))
            if best is None:
                continue
            col_a, col_b = cells.column(a), cells.column(b)
            at: dict = defaultdict(list)
            for c in groups.members(best):
                at[(col_a[c], col_b[c])].append(c)
            av = sorted({k[0] for k in at}, key=lambda v: sort_key(a, v))
            bv = sorted({k[1] for k in at}, key=lambda v: sort_key(b, v))
            if len(av) < 2 or len(bv) < 2 or len(at) <= len(av) + len(bv) - 1:
                continue
            matrix = [[float(np.median([r.step_ms for r in cells.runs_of(at[(x, y)])])) if (x, y) in at else None
                       for y in bv] for x in av]
            fixed = {n: label(n, v) for n, v in zip(groups.keys, groups.key(best)) if v != DERIVED_MARK}
            out.append(Grid(analysis.machine_id, a, b, [label(a, v) for v in av], [label(b, v) for v in bv], matrix,
                            drop_derived(fixed, list(together))))
    return out
