"""One machine's runs seen through the model (step_model.py): their blocks and noise strata, the
fitted model, each pass's drift and the machine's noise in words a report can use. Pure, no I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

import numpy as np

from orchestrator.stats import step_model as sm
from orchestrator.stats.ran import Run, label, modal_config, numbered
from orchestrator.stats.columns import column
from common.blocks import stretch_of


@dataclass
class Model:
    """One machine's fitted step_model, and how its runs map onto it."""

    fit: sm.Fit
    config_index: dict  # config key -> index in the fit
    block_index: dict  # (pass, block) -> index in the fit
    run_configs: list[int]  # each of its runs' configuration index in the fit, in the runs' order

    def weights(self, levels: list[list[Run]], coefs: list[float]) -> dict[int, float]:
        """The contrast sum_k coefs[k] * (mean effect of the configurations of level k): each
        configuration counted once, however many runs it has."""
        return self.weights_of([{self.config_index[k] for k in {r.config_key() for r in runs}} for runs in levels],
                               coefs)

    def weights_of(self, levels: list[set[int]], coefs: list[float]) -> dict[int, float]:
        """weights() of levels given as their sets of configuration indices: each level's configurations
        in order, each given its level's coefficient over the level's size (added up where levels
        share a configuration). All levels at once where they share none and the coefficients are of
        one type, float or numpy's (a slope by group has thousands of levels of a configuration or two)."""
        n = min(len(levels), len(coefs))  # (as zip pairs them)
        levels, coefs = levels[:n], coefs[:n]
        sizes = np.fromiter(map(len, levels), dtype=np.intp, count=n)
        config = np.fromiter(chain.from_iterable(levels), dtype=np.intp, count=int(sizes.sum()))
        in_order = np.sort(config)
        kind = set(map(type, coefs))
        if not (kind <= {float} or kind == {np.float64}) or np.any(in_order[1:] == in_order[:-1]):
            return _weights_added(levels, coefs)
        level = np.repeat(np.arange(n), sizes)  # each member's level
        order = np.lexsort((config, level))  # level by level, each level's configurations sorted
        level = level[order]
        share = np.array(coefs, dtype=float)[level] / sizes[level]  # (c / len(level): the same division)
        share = 0.0 + share  # (a share of -0.0 adds up to 0.0)
        return dict(zip(config[order].tolist(), share.tolist() if kind <= {float} else list(share)))  # (c's type)


def _weights_added(levels: list[set[int]], coefs: list) -> dict[int, float]:
    """Model.weights_of level by level, adding up the shares of a configuration in several levels."""
    out: dict[int, float] = defaultdict(float)
    for configs, c in zip(levels, coefs):
        idx = sorted(configs)
        for i in idx:
            out[i] += c / len(idx)
    return dict(out)


def block_of(r: Run) -> tuple:
    """A run's block in the run order: its pass and jobs.block (NULL: the whole pass is the block)."""
    return (r.pass_, stretch_of(r.row.get("block")))


def stratum_of(r: Run):
    """A run's noise stratum: the number of CPUs it ran on."""
    return r.values.get("cores")


# The probe's noise figure (machines.noise_cv) is the CV of 7 identical runs' medians (worker/machine/noise.py):
# a variance measured with 6 degrees of freedom.
PROBE_DOF = 6


def quiet_probe_cv(noise_cv, facts) -> float | None:
    """A machine's probe noise (machines.noise_cv) where its probe ran on a quiet machine, else None:
    one taken under load (facts' limits_disturbed; facts as JSON text or a dict) is not its noise.
    What the report, --target-ci and --budget all give the analysis."""
    import json

    facts = facts if isinstance(facts, dict) else json.loads(facts or "{}")
    return float(noise_cv) if noise_cv is not None and not facts.get("limits_disturbed") else None


def probe_prior(probe_cv: float | None) -> tuple[float, float] | None:
    """The machine probe's noise as step_model.fit's prior: (log-scale variance, its degrees of freedom)."""
    if probe_cv is None or not math.isfinite(probe_cv) or probe_cv <= 0:
        return None
    return math.log1p(probe_cv * probe_cv), float(PROBE_DOF)


def model_inputs(runs: list[Run], probe_cv: float | None = None) -> tuple[dict, dict, tuple]:
    """What fit_model fits: the configurations' and blocks' indices (config key -> index, (pass, block)
    -> index), and step_model.fit's arguments as plain lists (fit_inputs: picklable, so that
    effects.analyse can have a child fit one machine while this process fits another). probe_cv: the
    machine probe's noise, the prior of the residual variance (probe_prior)."""
    configs, config_idx = _config_numbers(runs)
    blocks: dict = {}
    raw = column(list(map(attrgetter("row"), runs)), "block")
    stretch = {b: stretch_of(b) for b in set(raw)}  # block_of, once per distinct jobs.block
    block_idx = [blocks.setdefault((p, stretch[b]), len(blocks)) for p, b in zip(map(attrgetter("pass_"), runs), raw)]
    log_ms = [r.log_ms for r in runs]
    return configs, blocks, (log_ms, config_idx, block_idx, [stratum_of(r) for r in runs], len(configs),
                             len(blocks), [r.pass_ for r in runs], probe_prior(probe_cv))


def _config_numbers(runs: list[Run]) -> tuple[dict, list[int]]:
    """The runs' configurations numbered in the order they first ran: (config key -> number, each
    run's number)."""
    numbers, configs = numbered(list(map(attrgetter("_key"), runs)))  # (_key: config_key()'s, shared by a cell's runs)
    return configs, numbers


def fit_inputs(inputs: tuple) -> sm.Fit:
    """step_model.fit of model_inputs()'s arguments."""
    log_ms, config_idx, block_idx, strata, n_configs, n_blocks, passes, prior = inputs
    return sm.fit(log_ms, config_idx, block_idx, strata, n_configs=n_configs, n_blocks=n_blocks, pass_idx=passes,
                  prior=prior)


def fit_model(runs: list[Run], fitted: tuple | None = None, probe_cv: float | None = None) -> Model:
    """The model of these runs, each run given its block-adjusted log step time (adj) and its chance of
    being in the slow mode (slow). `fitted`: (model_inputs(runs), fit_inputs() of them) where the fit
    was made elsewhere."""
    if fitted is None:
        made = model_inputs(runs, probe_cv)
        fitted = made, fit_inputs(made[2])
    (configs, blocks, inputs), f = fitted
    log_ms, block_idx = inputs[0], inputs[2]
    adj = (np.asarray(log_ms, dtype=float)
           - np.asarray(f.gamma, dtype=float)[np.asarray(block_idx, dtype=int)]).tolist()
    for r, a, slow in zip(runs, adj, np.asarray(f.slow_prob, dtype=float).tolist()):
        r.adj = a
        r.slow = slow
    return Model(f, configs, blocks, inputs[1])


@dataclass
class Drift:
    """How much slower each repeat pass ran than the first: the mean of its blocks' effects."""

    shift: dict[int, float]  # pass -> mean log block effect, relative to the first pass
    configs: dict[int, int]  # pass -> configurations it ran
    not_estimated: list[int]  # passes that share no configuration with the first (not comparable)

    def relative(self) -> dict[int, float]:
        """Each estimated pass's step time relative to the first (1.10 = 10% slower)."""
        est = sorted(p for p in self.shift if p not in self.not_estimated)
        return {p: math.exp(self.shift[p] - self.shift[est[0]]) for p in est} if est else {}


def pass_drift(runs: list[Run], model: Model) -> Drift:
    """model: the fit of these runs (fit_model's)."""
    f = model.fit
    by_pass: dict[int, list[int]] = defaultdict(list)
    for (p, _), b in model.block_index.items():
        by_pass[p].append(b)
    passes = sorted(by_pass)
    if not passes:
        return Drift({}, {}, [])
    seen, first = _configs_by_pass(list(map(attrgetter("pass_"), runs)), model.run_configs)
    configs = {p: seen.get(p, 0) for p in passes}
    part = {p: int(f.component[c]) for p, c in first.items()}
    shift = {p: float(np.mean(f.gamma[by_pass[p]])) for p in passes}
    return Drift({p: v - shift[passes[0]] for p, v in shift.items()}, configs,
                 [p for p in passes if part.get(p) != part.get(passes[0])])


def _configs_by_pass(passes: list[int], configs: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Per pass of these runs (each run's pass and configuration index): how many distinct configurations
    it ran, and its first run's configuration; as numpy columns (half a million runs a machine)."""
    if not passes:
        return {}, {}
    at = np.asarray(passes, dtype=np.int64)
    config = np.asarray(configs, dtype=np.int64)
    distinct, pass_of = np.unique(at, return_inverse=True)
    width = int(config.max()) + 1
    pairs = np.sort(pass_of * width + config)  # (sorted, not np.unique: its hash table is slow on these)
    pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]  # each (pass, configuration) once
    counts = np.bincount(pairs // width, minlength=len(distinct))
    first = np.unique(pass_of, return_index=True)[1]  # each pass's first run
    return dict(zip(distinct.tolist(), counts.tolist())), dict(zip(distinct.tolist(), config[first].tolist()))


@dataclass
class Noise:
    """How much the same configuration's step time varies from run to run on one machine."""

    cv: float | None  # the model's residual noise (fast mode, blocks removed); None: nothing repeated
    cv_with_drift: float | None  # the typical CV of one configuration's repeats, blocks left in
    configs: int  # configurations with two or more runs
    noisiest: list[tuple[str, float]]  # (configuration as text, its CV) of the noisiest ones
    probe_cv: float | None = None  # the machine probe's measured figure (machines.noise_cv), if any
    dof: float = 0.0  # the model's residual degrees of freedom
    block_cv: float | None = None  # how much blocks (stretches of time) vary beyond the runs in them
    strata: list = field(default_factory=list)  # step_model.Stratum per noise stratum
    within_cv: float | None = None  # the part of cv that is the sampling noise of a run's median step
    borrowed: str = ""  # where the variance borrowed strength (the probe's prior, the configurations'), in words

    def where_repeats_help(self) -> str:
        """Kalibera & Jones' rule in words: repeat at the level whose noise dominates. The run-to-run
        noise holds the sampling noise of each run's median over its timed steps; where that is most
        of it, more steps per run narrow the intervals at less cost than more runs (each pays the
        setup); otherwise only more runs (passes) do. Blocks cost nothing: comparisons are inside them."""
        if self.cv is None:
            return ""
        within = self.within_cv or 0.0
        share = min(1.0, (within / self.cv) ** 2) if self.cv > 0 else 0.0
        if share >= 0.5:
            return (f"{share:.0%} of the run-to-run noise ({self.cv:.1%}) is the sampling noise of each run's median "
                    "step: more timed steps per run narrow the intervals at less cost than more runs")
        return (f"the run-to-run noise ({self.cv:.1%}) is mostly between runs (the median's own sampling: "
                f"{within:.1%}): more runs narrow the intervals, more steps per run would not")

    @property
    def source(self) -> str:
        return "model" if self.cv is not None else "probe" if self.probe_cv is not None else "none"

    @property
    def sigma(self) -> float | None:
        """The log-scale run-to-run noise."""
        cv = self.cv if self.cv is not None else self.probe_cv
        return None if cv is None else math.sqrt(math.log1p(cv * cv))

    @property
    def slow_modes(self) -> list:
        return [s for s in self.strata if s.bimodal]


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
    return None if var is None or not math.isfinite(var) else math.sqrt(math.expm1(var))


def machine_noise(runs: list[Run], varied: list[str], model: Model | None, probe_cv: float | None = None,
                  modal: dict | None = None) -> Noise:
    """model: the fit of these runs (fit_model's), or None. `modal`: modal_config(runs, varied), where the
    caller has it."""
    # the runs configuration by configuration (numbered in the order they first ran), each's in run order
    config = np.asarray(model.run_configs if model else _config_numbers(runs)[1], dtype=np.intp)
    order = np.argsort(config, kind="stable")
    sizes = np.bincount(config) if len(config) else np.zeros(0, np.intp)
    start = np.concatenate(([0], np.cumsum(sizes)))
    repeated = np.flatnonzero(sizes >= 2).tolist()
    log_ms = np.array([r.log_ms for r in runs], dtype=float)[order]
    adj = np.array([r.adj for r in runs], dtype=float)[order]
    raw = _typical_variance([log_ms[start[c]:start[c + 1]].copy() for c in repeated])
    modal = modal if modal is not None else modal_config(runs, varied) if runs else {}
    first = order[start[:-1]].tolist() if len(config) else []  # each configuration's first run

    def name(c):
        v = runs[first[c]].values
        differ = [f"{n}={label(n, v[n])}" for n in varied if v[n] != modal.get(n)]
        return ", ".join(differ) or "the baseline"
    noisiest = sorted(((name(c), cv_of(float(np.var(adj[start[c]:start[c + 1]].copy(), ddof=1)))) for c in repeated),
                      key=lambda x: -x[1])[:3]
    f = model.fit if model else None
    has = f is not None and f.dof >= 1 and f.sigma2 is not None and math.isfinite(f.sigma2)
    return Noise(cv_of(f.sigma2) if has else None, cv_of(raw), len(repeated), noisiest, probe_cv,
                 dof=f.dof if has else 0.0, block_cv=cv_of(f.block_variance()) if has else None,
                 strata=f.distinct_strata() if has else [], within_cv=_median_sampling_cv(runs),
                 borrowed=borrowed_words(f) if has else "")


def borrowed_words(f: sm.Fit) -> str:
    """How the fit's variances borrowed strength, for the noise section: the degrees of freedom the
    sweep has of its own and those the machine probe's figure is worth, how the configurations'
    variances were moderated, and block effects left out where the design could not pay for them."""
    quiet = [s for s in f.distinct_strata() if not s.noisy_config]
    own = sum(s.own_dof for s in quiet)
    out = []
    p = f.prior
    if p is not None and p.refused and p.refused >= len(quiet):
        out.append(f"{own:.0f} degrees of freedom of its own; the machine probe's {p.cv:.1%} was not borrowed: this "
                   f"sweep's own noise differs from it beyond chance (F test, {sm.PRIOR_ALPHA:g})")
    elif p is not None:
        said = (f"estimated {p.tau2_estimated:.2f} from the probe's and this sweep's figures"
                if p.tau2_estimated is not None else "not estimable here: nothing was repeated")
        out.append(f"{own:.0f} degrees of freedom of its own and {p.dof:.1f} borrowed from the machine probe's "
                   f"{p.cv:.1%} (its {p.sampling_dof:.0f} are worth {p.dof:.1f} on another occasion: the variance of "
                   f"log variance between occasions taken as {p.tau2:.2f}, {said}, at least {sm.TAU2_MIN:g})"
                   + (f"; {p.refused} stratum(s) of runs borrowed nothing: their own noise and the probe's differ "
                      f"beyond chance (F test, {sm.PRIOR_ALPHA:g})" if p.refused else ""))
    priors = [s.config_prior for s in quiet if s.config_prior is not None]
    finite = [d0 for d0, _ in priors if math.isfinite(d0)]
    if finite:
        out.append(f"each configuration's variance moderated toward its stratum's, a prior worth "
                   f"{min(finite):.1f} degrees of freedom (from how much the configurations' variances spread)")
    elif priors:
        out.append("the configurations' variances spread no more than sampling makes them: one shared variance")
    if f.blocks_dropped:
        out.append("no block effects: the design has too few runs to pay for them "
                   "(a pass's drift stays in the residual)")
    return "; ".join(out)


def _median_sampling_cv(runs: list[Run]) -> float | None:
    """The typical noise of a run's median step time from its own steps: the steps' log spread from
    p10 and p90 (a normal's p90/p10 is 2.563 sigmas) times sqrt(pi/2 / steps), the median's."""
    rows = list(map(attrgetter("row"), runs))
    p10s, p90s, steps = (column(rows, c) for c in ("step_ms_p10", "step_ms_p90", "steps"))
    root = {s: math.sqrt(math.pi / 2 / int(s)) for s in set(steps) if s}  # per distinct step count: the same floats
    log = math.log
    out = [log(p90 / p10) / 2.563 * root[n] for p10, p90, n in zip(p10s, p90s, steps)
           if p10 and p90 and n and p90 >= p10 > 0]
    return float(np.median(out)) if out else None
