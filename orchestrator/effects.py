"""The statistics of the report: how step time changes with each variable, fitted from done runs.

Pure functions over run rows (dicts with the columns of v_results); numpy and scipy.special, no I/O.

What is compared
- Runs are grouped on what really ran: `dataset_used` rather than `dataset`, and the settings read
  back in the child (`applied`) where they differ from the job's (RAN_FROM). Asked-for values that
  ran identically (the hub dataset unreachable, so both values trained on `builtin`) are one value.
- A variable is *varied* when its done runs ran with more than one value (`repeat` is the pass index,
  never a factor).
- The *comparison group* of a variable holds the runs that differ in that variable alone: every other
  varied variable at one value, and the variables that follow it (variables.DERIVATIONS: threads
  follow cores, head_dim and kv_heads follow d_model / n_heads) at their derived values. A run whose
  follower was set by hand (omp_threads=1 at cores=2) is not in the cores comparison: it differs in
  omp_threads too. Of the candidate groups we take the one with the most values of the variable, then
  the one closest to the modal configuration; its most common value is the *baseline*.

How the uncertainty is made
- Repeats are passes: all of pass 0 runs before pass 1, so a slow drift of the machine is shared by
  the runs of a pass. Each pass's drift is estimated from every configuration seen in more than one
  pass (a robust two-way fit: configuration x pass, medians) and removed from every run's log step
  time. A pass with fewer than MIN_PASS_CONFIGS such configurations is left as it is (said in the
  effect's method).
- Disturbed runs (disturbed(): another process or the hypervisor took a share of the job's CPUs
  in its timed window) are left out of every fit, unless every run of the machine was disturbed.
- Each value's location is the TRIM-trimmed mean of its runs' drift-free log step times (from
  TRIM_FROM runs on; below, the mean) and its noise is its own: Yuen's squared standard error
  (winsorized variance). Nothing is pooled across values, so one noisy value widens only its own
  comparisons, and a few runs slowed by something no sensor saw (heavy tails) move neither the
  estimate nor the interval.
- A *ratio* (value vs baseline): the difference of trimmed mean log step times, Yuen's standard
  errors combined as Welch's with Satterthwaite's degrees of freedom, a Student t interval and a
  two-sided p-value.
- An *elasticity* (size-like numeric variables): the least-squares slope of the values' trimmed mean
  log step time on log value (within each group), its variance summed from each value's own.
- Across the whole report, p-values are Holm-adjusted (family-wise error 5%): `significant` means the
  adjusted p < 0.05. The intervals shown are simultaneous (Bonferroni, each at 1 - 0.05/m), so all of
  them cover their true values together with probability at least 95%. A value that ran once has no
  variance of its own: its comparisons get no interval and no test.
- Variables are ranked by how clearly they change step time: by the p-value of their headline effect
  (an effect relative to its uncertainty), not by its size.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.special import ndtri, stdtr, stdtrit

from orchestrator.variables import BY_NAME, DERIVATIONS, DERIVED_BY_NAME, NAMES
from worker.sensors import DISTURBED_SHARE, disturbance  # noqa: F401  (DISTURBED_SHARE: the report states it)
from worker.trainers.harness import SIMULATED

METRIC = "step_ms_median"
ALPHA = 0.05  # family-wise error rate of the whole report
POWER = 0.8  # for "how many repeats would resolve it"
# Not factors: repeat indexes the pass (the noise).
NOT_FACTORS = ("repeat",)
FACTORS = tuple(n for n in NAMES if n not in NOT_FACTORS)
# Numeric, but not sizes: a log-log slope means nothing for them.
NOT_SIZES = ("seed", "dropout", "repeat")
# A pass's drift is estimated only from at least this many configurations also run in another pass;
# fewer would move every run of the pass by the noise of a handful.
MIN_PASS_CONFIGS = 5
DERIVED_MARK = "(derived)"  # the comparison-group key of a follower at its derived value
# Each value's location is its TRIM-trimmed mean of log step time (Yuen): 20%, the usual choice,
# from TRIM_FROM runs on; below, the mean. Trimming 6 runs leaves 4 and 3 degrees of freedom: at the
# quick preset's 3-6 runs per value that widened every family-wise interval by half and lost real
# effects, for protection against outliers that so few runs cannot tell from noise anyway.
TRIM = 0.2
TRIM_FROM = 8  # runs; 8 cut 1 at each end and keep 6 (5 degrees of freedom), 10 cut 2
TRIMMING = f"{TRIM:.0%}-trimmed means from {TRIM_FROM} runs per value (plain means below)"

# What really ran, where a run records it: variable -> (where, read-back key). The worker records a
# run whose read-back differs from its job as failed; done runs of older databases may still differ,
# and they count under what they ran with.
RAN_FROM = {
    "dataset": ("column", "dataset_used"),
    "omp_threads": ("applied", "omp_num_threads"),
    "intra_threads": ("applied", "torch_threads"),
    "inter_threads": ("applied", "interop_threads"),
    "onednn": ("applied", "mkldnn"),
    "allocator": ("applied", "allocator_lib"),
    "blas": ("applied", "blas"),  # the library the GEMMs ran on (torch's build: mkl; jax: eigen)
}


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
    if name == "precision" and value in SIMULATED:  # never shown as if it were that format's arithmetic
        return f"{value} ({SIMULATED[value]})"
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
    """The variables that follow `name` when left on "auto", directly or through another."""
    out, todo = set(), [name]
    while todo:
        parent = todo.pop()
        for d in DERIVATIONS:
            if parent in d.parents and d.name not in out:
                out.add(d.name)
                todo.append(d.name)
    return out


def _ran_value(name: str, row: dict, applied: dict):
    """What a run ran with for `name` according to its own record, or None where it says nothing."""
    where, key = RAN_FROM[name]
    raw = row.get(key) if where == "column" else applied.get(key)
    if raw is None:
        return None if name != "allocator" or key not in applied else "default"
    if name == "allocator":
        base = os.path.basename(str(raw))
        return next((a for a in ("jemalloc", "tcmalloc") if base.startswith(f"lib{a}")), None)
    try:
        return BY_NAME[name].parse(raw)
    except Exception:  # an unreadable record says nothing
        return None


@dataclass
class Run:
    """One done run as the report groups it."""

    row: dict
    values: dict  # variable -> the value it ran with
    changed: dict  # variable -> (asked, ran) where the run's record differs from its job
    log_ms: float  # log step time
    pass_: int
    derived: dict | None  # recorded at enqueue (jobs.derived); None for older jobs
    adj: float = 0.0  # log step time with its pass's drift removed
    disturbed: str | None = None  # why its timed window was disturbed (disturbed()), or None

    @property
    def step_ms(self) -> float:
        return float(self.row[METRIC])

    def at_derived(self, name: str) -> bool:
        """Is this follower at the value its rule derives from this run's other values?"""
        d = DERIVED_BY_NAME[name]
        touched = name in self.changed or any(p in self.changed for p in d.parents)
        if self.derived is not None and name in self.derived and not touched:
            return True  # the job says so: resolve() filled it in
        return self.values[name] == d.rule(self.values)  # older jobs, explicit spellings, read-backs

    @cached_property
    def _key(self) -> tuple:
        return tuple(self.values[n] for n in FACTORS)

    def config_key(self) -> tuple:
        """The values of every factor: the configuration (computed once; the values never change)."""
        return self._key


def done_runs(rows: list[dict]) -> list[dict]:
    """The runs every aggregate uses: done, with a step time."""
    return [r for r in rows if r.get("status") == "done" and r.get(METRIC) is not None and r[METRIC] > 0]


def disturbed(row: dict) -> str | None:
    """Why a done run was disturbed (worker/sensors.disturbance: other processes' CPU time or steal
    above DISTURBED_SHARE of the window), or None. The window is applied.timed_window (train_s
    without one), the CPUs the child's read-back affinity (else `cores`)."""
    applied = _json(row.get("applied")) or {}
    window = applied.get("timed_window") or {}
    if window.get("end_unix_s") is not None and window.get("start_unix_s") is not None:
        window_s = float(window["end_unix_s"]) - float(window["start_unix_s"])
    else:
        window_s = float(row.get("train_s") or 0)
    cpus = len(applied.get("affinity") or []) or int(row.get("cores") or 1)
    return disturbance(row.get("other_cpu_s"), row.get("steal_s"), cpus, window_s)


def provisional_peak(row: dict) -> str | None:
    """Why a run's MFU is against a provisional GEMM peak (worker/gemm_peak.py), or None."""
    return ((_json(row.get("applied")) or {}).get("peak_gflops") or {}).get("provisional")


def as_ran(rows: list[dict]) -> list[Run]:
    """The done runs, each with the values it really ran with."""
    out = []
    for row in done_runs(rows):
        applied = _json(row.get("applied")) or {}
        values, changed = {}, {}
        for n in NAMES:
            asked = value_of(n, row[n])
            ran = _ran_value(n, row, applied) if n in RAN_FROM else None
            if ran is not None and ran != asked:
                changed[n] = (asked, ran)
            values[n] = asked if ran is None else ran
        derived = _json(row.get("derived"))
        out.append(Run(row, values, changed, math.log(float(row[METRIC])), int(row.get("repeat") or 0),
                       derived if isinstance(derived, dict) else None, disturbed=disturbed(row)))
    return out


def _json(text):
    if text is None or isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def varied_variables(runs: list[Run]) -> list[str]:
    """Variables that ran with more than one value among these runs, in catalogue order."""
    return [n for n in FACTORS if len({r.values[n] for r in runs}) > 1]


def _configs(runs: list[Run]) -> list[Run]:
    """One run per distinct configuration: what the plan holds, however often each one was repeated
    (work --target-ci repeats only some, and must not move the baseline by doing so)."""
    return list({r.config_key(): r for r in runs}.values())


def modal_config(runs: list[Run], names) -> dict:
    """Per variable, the value most configurations share, counting each configuration once however
    many runs it has (ties: the catalogue default, then the lowest)."""
    out = {}
    configs = _configs(runs)
    for n in names:
        counts = Counter(r.values[n] for r in configs)
        top = max(counts.values())
        tied = sorted((v for v, c in counts.items() if c == top), key=lambda v: sort_key(n, v))
        default = BY_NAME[n].default
        default = default if isinstance(default, str) else value_of(n, default)
        out[n] = default if default in tied else tied[0]
    return out


# -- pass drift and noise -----------------------------------------------------------------------

@dataclass
class Drift:
    """Each pass's shift of log step time, estimated from configurations run in several passes."""

    shift: dict[int, float]  # pass -> log shift removed from its runs (mean 0 over the estimated ones)
    configs: dict[int, int]  # pass -> configurations it shares with other passes
    not_estimated: list[int]  # passes left as they are (too few shared configurations)

    def relative(self) -> dict[int, float]:
        """Each estimated pass's step time relative to the first estimated one (1.10 = 10% slower)."""
        est = sorted(p for p in self.shift if p not in self.not_estimated)
        return {p: math.exp(self.shift[p] - self.shift[est[0]]) for p in est} if est else {}


def pass_drift(runs: list[Run]) -> Drift:
    """A robust two-way fit of log step time: configuration + pass. Medians, so one noisy
    configuration cannot move a pass."""
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        cells[r.config_key()][r.pass_].append(r.log_ms)
    means = {c: {p: float(np.mean(ys)) for p, ys in by_pass.items()} for c, by_pass in cells.items() if len(by_pass) > 1}
    passes = sorted({r.pass_ for r in runs})
    shared = {p: sum(1 for m in means.values() if p in m) for p in passes}
    est = [p for p in passes if shared[p] >= MIN_PASS_CONFIGS]
    shift = {p: 0.0 for p in passes}
    if len(est) >= 2:
        for _ in range(25):
            level = {c: float(np.mean([y - shift[p] for p, y in m.items()])) for c, m in means.items()}
            new = {p: float(np.median([m[p] - level[c] for c, m in means.items() if p in m])) for p in est}
            centre = float(np.mean(list(new.values())))
            moved = max(abs(new[p] - centre - shift[p]) for p in est)
            shift.update({p: new[p] - centre for p in est})
            if moved < 1e-9:
                break
    else:
        est = []
    for r in runs:
        r.adj = r.log_ms - shift[r.pass_]
    return Drift(shift, shared, [p for p in passes if p not in est] if len(passes) > 1 else [])


@dataclass
class Noise:
    """How much the same configuration's step time varies from run to run on one machine."""

    cv: float | None  # typical CV of step time between repeats, pass drift removed (None: no repeats)
    cv_with_drift: float | None  # the same without removing the drift
    configs: int  # configurations with two or more runs it rests on
    noisiest: list[tuple[str, float]]  # (configuration as text, its CV) of the noisiest ones
    probe_cv: float | None = None  # the machine probe's measured figure (machines.noise_cv), if any

    @property
    def source(self) -> str:
        return "probe" if self.probe_cv is not None else "repeats" if self.cv is not None else "none"

    @property
    def sigma(self) -> float | None:
        """The log-scale noise used to say which effects the machine can resolve."""
        cv = self.probe_cv if self.probe_cv is not None else self.cv
        return None if cv is None else math.sqrt(math.log1p(cv * cv))


def _typical_variance(groups: list[np.ndarray]) -> float | None:
    """A robust typical variance: each group's variance over the median of its chi-square, then
    the median over groups (a few very noisy groups do not make the machine look noisy)."""
    scaled = []
    for g in groups:
        if len(g) >= 2:
            df = len(g) - 1
            scaled.append(float(np.var(g, ddof=1)) * df / _chi2_median(df))
    return float(np.median(scaled)) if scaled else None


def _chi2_median(df: int) -> float:
    from scipy.special import chdtri

    return float(chdtri(df, 0.5))


def cv_of(var: float | None) -> float | None:
    return None if var is None else math.sqrt(math.expm1(var))


def machine_noise(runs: list[Run], varied: list[str], probe_cv: float | None = None) -> Noise:
    by_config: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        by_config[r.config_key()].append(r)
    repeated = [rs for rs in by_config.values() if len(rs) >= 2]
    adj = _typical_variance([np.array([r.adj for r in rs]) for rs in repeated])
    raw = _typical_variance([np.array([r.log_ms for r in rs]) for rs in repeated])
    modal = modal_config(runs, varied) if runs else {}

    def name(rs):
        v = rs[0].values
        differ = [f"{n}={label(n, v[n])}" for n in varied if v[n] != modal.get(n)]
        return ", ".join(differ) or "the baseline"
    noisiest = sorted(((name(rs), cv_of(float(np.var([r.adj for r in rs], ddof=1)))) for rs in repeated),
                      key=lambda x: -x[1])[:3]
    return Noise(cv_of(adj), cv_of(raw), len(repeated), noisiest, probe_cv)


# -- robust location ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Trimmed:
    """A value's trimmed mean of log step time and its squared standard error (Yuen 1974)."""

    mean: float
    se2: float | None  # None: fewer than 2 runs, no noise estimate of its own
    dof: int  # h - 1, h = the runs left after trimming
    cut: int  # runs trimmed from each end


def trimmed(ys: np.ndarray) -> Trimmed:
    """The TRIM-trimmed mean of ys (the lowest and highest floor(TRIM * n) runs left out), with
    Yuen's squared standard error: the winsorized variance (the cut runs set to the nearest kept
    one) times (n - 1) / (h (h - 1)), on h - 1 degrees of freedom. With fewer than TRIM_FROM runs
    nothing is cut: the mean, the sample variance / n and n - 1.

    Why: step times on a shared machine are heavy-tailed (a run that met another process is 30-50%
    slower, and no sensor saw it). A mean moves with every such run and its variance grows with it;
    the trimmed mean of 20 runs ignores up to 4 of them at each end, at a small price in efficiency
    when the noise is normal."""
    y = np.sort(np.asarray(ys, dtype=float))
    n = len(y)
    cut = int(math.floor(TRIM * n + 1e-9)) if n >= TRIM_FROM else 0
    h = n - 2 * cut
    mean = float(y[cut:n - cut].mean())
    if n < 2:
        return Trimmed(mean, None, 0, cut)
    w = y.copy()
    if cut:
        w[:cut], w[n - cut:] = y[cut], y[n - cut - 1]
    se2 = float(np.var(w, ddof=1)) * (n - 1) / (h * (h - 1))
    return Trimmed(mean, se2, h - 1, cut)


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
    job_ids: tuple = ()  # the jobs of the runs it rests on (what --target-ci repeats)
    p_value: float | None = None
    p_adjusted: float | None = None  # Holm, across the whole report
    significant: bool | None = None  # p_adjusted < ALPHA; None when not tested
    family: int = 0  # the number of tests adjusted for
    repeats_needed: int | None = None  # for an effect not resolved: repeats per value that would resolve it
    target_met: bool | None = None  # the 95% interval's relative half-width within --target-ci
    log_range: float = 0.0  # elasticity: log(largest / smallest value) of the values fitted

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
        """The simultaneous 95% interval (Bonferroni over the report's `family` tests)."""
        if self.se is None:
            return None, None
        return self.interval(1 - ALPHA / (2 * max(1, self.family)))

    # the interval the report shows
    @property
    def ci_low(self) -> float | None:
        return self.ci_adj[0]

    @property
    def ci_high(self) -> float | None:
        return self.ci_adj[1]

    @property
    def half_width(self) -> float | None:
        """Relative half-width of the 95% interval on the step-time scale (0.05 = +-5%); for an
        elasticity, of the step-time factor of a doubling."""
        if self.se is None:
            return None
        half = t975(self.dof) * self.se if self.se > 0 else 0.0
        return math.expm1(half * (1.0 if self.kind == "ratio" else math.log(2)))

    @property
    def no_change(self) -> float:
        return 1.0 if self.kind == "ratio" else 0.0

    def verdict(self) -> str:
        if self.significant is None:
            return "not tested: a value ran once"
        if self.significant:
            return "clear effect"
        return "no detectable effect"

    def describe(self) -> str:
        lo, hi = self.ci_adj
        ci = f" (95% CI {lo:.2f} to {hi:.2f})" if lo is not None else ""
        if self.kind == "elasticity":
            return f"step time ~ {self.variable}^{self.estimate:.2f}{ci}"
        return f"{self.variable}={self.value}: {self.estimate:.2f}x the step time of {self.baseline}{ci}"

    def row(self) -> tuple[str, str, str, str, str]:
        """variable, effect, estimate, family-wise 95% CI, runs: as text, for a table (bench.py's rich table)."""
        lo, hi = self.ci_adj
        ci = f"{lo:.2f} to {hi:.2f}" if lo is not None else "-"
        if self.kind == "elasticity":
            return (self.variable, f"step time ~ {self.variable}^e", f"e = {self.estimate:.2f}", ci, str(self.n_runs))
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
    def trimmed(self) -> Trimmed:
        """The robust location and its squared standard error (Yuen): what the comparisons use."""
        return trimmed(self.adj)

    @property
    def cv(self) -> float | None:
        """This value's own run-to-run noise (pass drift removed)."""
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

    @property
    def effects(self) -> list[Effect]:
        return ([self.elasticity] if self.elasticity else []) + self.ratios

    @property
    def span(self) -> float:
        medians = [lv.median_step_ms for lv in self.levels]
        return max(medians) / min(medians)

    @property
    def headline(self) -> Effect:
        """The one effect that speaks for this variable: its elasticity, or its clearest ratio."""
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


# -- comparison groups --------------------------------------------------------------------------

def _group_keys(runs: list[Run], free: set[str], varied: list[str]) -> tuple[list[str], list[tuple]]:
    """The key of each run's comparison group: the varied variables outside `free` at their values,
    the followers of the free variables as DERIVED_MARK when at their derived value."""
    follow = set().union(*(followers_of(n) for n in free)) - free
    keys = [n for n in varied if n not in free]
    out = []
    for r in runs:
        out.append(tuple(DERIVED_MARK if n in follow and r.at_derived(n) else r.values[n] for n in keys))
    return keys, out


def _groups(runs: list[Run], free: set[str], varied: list[str]) -> tuple[list[str], dict[tuple, list[Run]]]:
    keys, run_keys = _group_keys(runs, free, varied)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r, k in zip(runs, run_keys):
        groups[k].append(r)
    return keys, groups


def _best_group(groups: dict[tuple, list[Run]], distinct) -> tuple | None:
    """The group with the most distinct values of the free variables, then closest to the modal key,
    then with the most configurations (each counted once, so repeats added to some do not move it;
    ties: the group seen first)."""
    if not groups:
        return None
    width = len(next(iter(groups)))
    n_configs = {key: len(_configs(members)) for key, members in groups.items()}
    modal = []
    for i in range(width):
        counts = Counter()
        for key in groups:
            counts[key[i]] += n_configs[key]
        modal.append(counts.most_common(1)[0][0])

    def score(item):
        key, members = item
        return (distinct(members), sum(1 for a, b in zip(key, modal) if a == b), n_configs[key])
    return max(groups.items(), key=score)[0]


def analyse_variable(runs: list[Run], name: str, varied: list[str], modal: dict, machine_id: int) -> VariableEffect | None:
    """The comparison group, levels, ratios and elasticity of one variable; None when no two runs
    differ in it alone."""
    keys, groups = _groups(runs, {name}, varied)
    best = _best_group(groups, lambda ms: len({r.values[name] for r in ms}))
    members = groups[best]
    by_value: dict = defaultdict(list)
    for r in members:
        by_value[r.values[name]].append(r)
    if len(by_value) < 2:
        return None
    values = sorted(by_value, key=lambda v: sort_key(name, v))
    levels = [Level(v, label(name, v), by_value[v]) for v in values]
    base_value = modal[name] if modal[name] in by_value else max(values, key=lambda v: len(by_value[v]))
    baseline = next(lv for lv in levels if lv.value == base_value)
    follow = followers_of(name)
    followers = sorted((n for n in follow if n in varied and len({r.values[n] for r in members}) > 1), key=NAMES.index)
    fixed = {n: ("follows" if v == DERIVED_MARK else label(n, v)) for n, v in zip(keys, best)}
    fixed = {n: v for n, v in fixed.items() if v != "follows"}
    ve = VariableEffect(machine_id=machine_id, variable=name, size_like=is_size(name, values), baseline=baseline,
                        levels=levels, fixed=fixed, followers=followers,
                        ratios=[ratio(lv, baseline, name, machine_id) for lv in levels if lv is not baseline])
    # Runs at the baseline's other settings that the group leaves out because a follower was set by hand.
    ve.left_out = sum(len(ms) for k, ms in groups.items() if k != best and all(
        a == b or DERIVED_MARK in (a, b) for a, b in zip(k, best)))
    if ve.size_like:
        ve.elasticity, ve.n_groups = elasticity(groups, name, machine_id)
    return ve


def _method(runs: list[Run], drift: Drift) -> str:
    skipped = sorted({r.pass_ for r in runs} & set(drift.not_estimated))
    if len({r.pass_ for r in runs}) <= 1 or len(drift.shift) <= 1:
        base = f"Yuen-Welch t on log step time, {TRIMMING} (one pass: no drift to remove)"
    else:
        base = f"Yuen-Welch t on log step time, {TRIMMING}, pass drift removed"
    return base + (f" (not for pass {', '.join(map(str, skipped))}: too few shared configurations)" if skipped else "")


def ratio(lv: Level, base: Level, name: str, machine_id: int) -> Effect:
    """Step time at lv over the baseline's: the difference of drift-free trimmed-mean log step
    times, each value with its own variance (Yuen's test: Welch's on trimmed means), Satterthwaite's
    degrees of freedom."""
    a, b = lv.trimmed, base.trimmed
    diff = a.mean - b.mean
    runs = lv.runs + base.runs
    e = Effect(machine_id, name, "ratio", lv.label, base.label, math.exp(diff), None, None, len(runs),
               min_runs=min(lv.n, base.n), n_passes=len(lv.passes | base.passes),
               job_ids=tuple(sorted({r.row["job_id"] for r in runs})))
    if a.se2 is not None and b.se2 is not None:
        _test(e, diff, [(a.se2, a.dof), (b.se2, b.dof)])
    return e


def _test(e: Effect, estimate: float, parts: list[tuple[float, int]]) -> None:
    """Standard error, Satterthwaite dof and two-sided p from variance parts (variance, dof)."""
    var = sum(v for v, _ in parts)
    e.se = math.sqrt(var)
    denom = sum(v * v / d for v, d in parts if v > 0)
    e.dof = var * var / denom if denom > 0 else float(sum(d for _, d in parts))
    if e.se > 0:
        e.p_value = two_sided_p(estimate / e.se, e.dof)
    else:
        e.p_value = 0.0 if estimate != 0 else 1.0


def elasticity(groups: dict[tuple, list[Run]], name: str, machine_id: int) -> tuple[Effect | None, int]:
    """The least-squares slope of each value's trimmed-mean drift-free log step time on log value,
    within groups (each group its own intercept); its variance is the sum of each value's own
    squared standard error (Yuen's) times its weight squared, so unequal noise is not averaged away."""
    cells = []  # (group index, log value, trimmed mean, its se^2 or None, runs, its dof)
    for g, members in enumerate(groups.values()):
        by_value: dict = defaultdict(list)
        for r in members:
            by_value[float(r.values[name])].append(r)
        if len(by_value) < 2:
            continue
        for v, rs in by_value.items():
            t = Level(v, label(name, v), rs).trimmed
            cells.append((g, math.log(v), t.mean, t.se2, rs, t.dof))
    if not cells:
        return None, 0
    used = sorted({c[0] for c in cells})
    centre = {g: float(np.mean([c[1] for c in cells if c[0] == g])) for g in used}
    x = np.array([c[1] - centre[c[0]] for c in cells])
    sxx = float(x @ x)
    w = x / sxx
    slope = float(w @ np.array([c[2] for c in cells]))
    runs = [r for c in cells for r in c[4]]
    e = Effect(machine_id, name, "elasticity", None, None, slope, None, None, len(runs),
               min_runs=min(len(c[4]) for c in cells), n_passes=len({r.pass_ for r in runs}),
               job_ids=tuple(sorted({r.row["job_id"] for r in runs})),
               log_range=max(c[1] for c in cells) - min(c[1] for c in cells))
    if all(c[3] is not None for c in cells):
        _test(e, slope, [(wi * wi * c[3], c[5]) for wi, c in zip(w, cells)])
    return e, len(used)


# -- the whole report ---------------------------------------------------------------------------

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

    @property
    def effects(self) -> list[Effect]:
        return [e for ve in self.variables for e in ve.effects]


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
            target_ci: dict[int, float] | None = None) -> Analysis:
    """Every machine's comparisons, then Holm across all of them. `probe_cv`: machine -> its
    measured noise (machines.noise_cv); `target_ci`: machine -> the relative half-width of the 95%
    interval that `work --target-ci` asked for there."""
    runs = as_ran(rows)
    ids = machine_ids if machine_ids is not None else sorted({r["machine_id"] for r in rows})
    machines = {m: analyse_machine([r for r in runs if r.row["machine_id"] == m], m, asked=[r for r in rows if r["machine_id"] == m],
                                   probe_cv=(probe_cv or {}).get(m)) for m in ids}
    analysis = Analysis(machines, 0)
    analysis.family = holm(analysis.effects)
    for m in machines.values():
        for e in m.effects:
            e.repeats_needed = _repeats_needed(e, m.noise, analysis.family)
            if target_ci and m.machine_id in target_ci:
                e.target_met = e.half_width is not None and e.half_width <= target_ci[m.machine_id]
        m.variables.sort(key=VariableEffect.rank_key)
    return analysis


def analyse_machine(runs: list[Run], machine_id: int, *, asked: list[dict] = (), probe_cv: float | None = None) -> MachineAnalysis:
    """One machine's comparisons (not yet adjusted for the report's multiplicity). Disturbed runs
    (another process or the hypervisor took a share of their CPUs during the timed window) are left
    out of every fit, unless every run was disturbed."""
    flagged = [r for r in runs if r.disturbed]
    kept_all = bool(flagged) and len(flagged) == len(runs)
    if not kept_all:
        runs = [r for r in runs if not r.disturbed]
    drift = pass_drift(runs)
    varied = varied_variables(runs)
    noise = machine_noise(runs, varied, probe_cv)
    found, together = [], []
    if runs and varied:
        modal = modal_config(runs, varied)
        for n in varied:
            ve = analyse_variable(runs, n, varied, modal, machine_id)
            (found.append(ve) if ve else together.append(n))
        for ve in found:
            ve.fixed = drop_derived(ve.fixed, together)
            for e in ve.effects:
                e.method = _method([r for lv in ve.levels for r in lv.runs], drift)
    return MachineAnalysis(machine_id, found, together, drift, noise, _identical(runs, asked), _regrouped(runs),
                           runs, varied, flagged, kept_all)


def holm(effects: list[Effect], alpha: float = ALPHA) -> int:
    """Holm's step-down adjustment over every tested effect; the family size."""
    tested = sorted((e for e in effects if e.p_value is not None), key=lambda e: e.p_value)
    m = len(tested)
    running = 0.0
    for i, e in enumerate(tested):
        running = max(running, min(1.0, (m - i) * e.p_value))
        e.p_adjusted = running
        e.significant = running < alpha
        e.family = m
    for e in effects:
        if e.p_value is None:
            e.family = m
    return m


MAX_REPEATS_SAID = 1000


def _repeats_needed(e: Effect, noise: Noise, family: int) -> int | None:
    """For an effect not resolved: about how many runs per value (two values, Welch's dof) would
    resolve one of this size family-wise with 80% power, at the machine's noise or the comparison's
    own where that is larger. None when resolved or unknowable; MAX_REPEATS_SAID + 1 for "more"."""
    if e.significant or noise.sigma is None:
        return None
    sigma = noise.sigma
    if e.se is not None and e.min_runs:  # the comparison's own noise, back from its standard error
        # ratio: se = sigma * sqrt(2 / n); elasticity over two values: se = sigma * sqrt(2 / n) / log_range
        # (more values fit a slope more tightly: this then overstates sigma, so it errs on the safe side)
        own = e.se * math.sqrt(e.min_runs / 2) * (1.0 if e.kind == "ratio" else e.log_range)
        sigma = max(sigma, own)
    size = abs(e.log_effect) if e.kind == "ratio" else abs(e.estimate) * e.log_range
    if size < 1e-6:
        return None  # no effect at all to resolve
    q_family = 1 - ALPHA / (2 * max(1, family))
    for n in range(2, MAX_REPEATS_SAID + 1):
        dof = 2 * (n - 1)
        if (t_quantile(q_family, dof) + t_quantile(POWER, dof)) * sigma * math.sqrt(2 / n) <= size:
            return n
    return MAX_REPEATS_SAID + 1


def _identical(runs: list[Run], asked: list[dict]) -> list[str]:
    """Variables whose asked-for values ran as fewer values (e.g. dataset: both on builtin)."""
    out = []
    done = {r.row["run_id"]: r for r in runs}
    for n in RAN_FROM:
        mapping: dict = defaultdict(set)
        for row in asked:
            r = done.get(row.get("run_id"))
            if r is not None:
                mapping[value_of(n, row[n])].add(r.values[n])
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


def _regrouped(runs: list[Run]) -> list[str]:
    counts = Counter((n, label(n, a), label(n, b)) for r in runs for n, (a, b) in r.changed.items() if n != "dataset")
    return [f"{k} run(s) asked for {n}={a} ran with {n}={b} (read back in the child) and count under {b}"
            for (n, a, b), k in sorted(counts.items())]


def drop_derived(fixed: dict[str, str], together: list[str]) -> dict[str, str]:
    """`fixed` without the variables that only ever moved with a parent also listed: noise to a reader."""
    return {k: v for k, v in fixed.items()
            if not (k in together and any(k in followers_of(p) for p in fixed))}


def grids(analysis: MachineAnalysis) -> list[Grid]:
    """Pairs of variables varied jointly (more combinations than a one-at-a-time cross would give)."""
    runs, varied, together = analysis.runs, analysis.varied, analysis.together
    names = [ve.variable for ve in analysis.variables]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if b in followers_of(a) or a in followers_of(b):
                continue
            keys, groups = _groups(runs, {a, b}, varied)
            best = _best_group(groups, lambda ms: len({(r.values[a], r.values[b]) for r in ms}))
            if best is None:
                continue
            cells: dict = defaultdict(list)
            for r in groups[best]:
                cells[(r.values[a], r.values[b])].append(r.step_ms)
            av = sorted({k[0] for k in cells}, key=lambda v: sort_key(a, v))
            bv = sorted({k[1] for k in cells}, key=lambda v: sort_key(b, v))
            if len(av) < 2 or len(bv) < 2 or len(cells) <= len(av) + len(bv) - 1:
                continue
            matrix = [[float(np.median(cells[(x, y)])) if (x, y) in cells else None for y in bv] for x in av]
            fixed = {n: label(n, v) for n, v in zip(keys, best) if v != DERIVED_MARK}
            out.append(Grid(analysis.machine_id, a, b, [label(a, v) for v in av], [label(b, v) for v in bv], matrix,
                            drop_derived(fixed, list(together))))
    return out
