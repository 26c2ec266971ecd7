"""Time to a trained model, per variable: from the learning runs with a target (target_loss), each
value's factor on step time and on tokens to target against the comparison's baseline, and their
product, the factor on time to target (time = steps x step time). Pure computation on the report's
rows (v_results), no I/O.

    configuration   a learning run's variables but repeat and seed: its runs are its seeds
    baseline        the configuration most runs share a comparison with: in an OFAT sweep, the base
    comparison      a configuration that differs from the baseline in one variable alone
    factor          value / baseline of the geometric means over runs; its 95% interval is Welch's on
                    the log scale (Satterthwaite dof); the time factor's log variance is the sum of the
                    step and tokens factors' (their runs are the same, their noises apart)
    censored        a run that did not reach its target within max_tokens (reached = false): counted,
                    never dropped. Its tokens are a lower bound (what it trained); a value with any such
                    run has a tokens factor that is a bound: ">=" when the value's runs are censored,
                    "<=" when the baseline's are, unresolved when both. MLPerf's olympic mean (fastest
                    and slowest dropped) is given per value with unreached runs as infinitely slow.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from scipy import stats

from common.variables import DERIVED_BY_NAME

# Not a configuration's identity: the repeats of a quality result are its seeds (variables.run_seed)
NOT_CONFIG = ("repeat", "seed", "block")
# Where two configurations may differ and still be one comparison: the variables of the catalogue
LEARNING_KEYS = ("framework", "compile", "blas", "n_layers", "d_model", "n_heads", "head_dim", "kv_heads", "mlp_ratio",
                 "dropout", "activation", "attention", "window", "vocab_size", "seq_len", "batch_size",
                 "grad_accum", "precision", "optimizer", "lr", "lr_schedule", "max_tokens", "target_loss",
                 "eval_every", "dataset", "cores", "ranks", "nodes", "omp_threads", "allocator")


@dataclass
class Value:
    """One configuration's learning runs (its seeds)."""

    config: dict
    runs: list[dict]
    step_ms: list[float] = field(default_factory=list)  # each run's median step
    tokens: list[float] = field(default_factory=list)  # reached runs' tokens to target
    censored: list[float] = field(default_factory=list)  # unreached runs' tokens trained (lower bounds)
    times: list[float] = field(default_factory=list)  # time to target, inf for an unreached run

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def reached(self) -> int:
        return len(self.tokens)

    def olympic_time(self) -> float | None:
        """MLPerf's score: the mean time to target with the fastest and slowest run dropped (from 3 runs
        up), an unreached run as infinitely slow; None without runs, inf where it stays unreached."""
        times = sorted(self.times)
        if len(times) >= 3:
            times = times[1:-1]
        return statistics.fmean(times) if times and all(math.isfinite(t) for t in times) else (
            math.inf if times else None)

    def tokens_spread(self) -> float | None:
        """The seed-to-seed spread of tokens to target: the coefficient of variation over reached runs."""
        if len(self.tokens) < 2:
            return None
        return statistics.stdev(self.tokens) / statistics.fmean(self.tokens)


@dataclass
class Factor:
    estimate: float | None
    low: float | None
    high: float | None
    bound: str = ""  # "", ">=" (a lower bound), "<=" (an upper bound), "unresolved"


@dataclass
class Comparison:
    machine_id: int
    variable: str
    baseline: Value
    value: Value
    step: Factor
    tokens: Factor
    time: Factor

    @property
    def label(self) -> str:
        return _label(self.value.config[self.variable])

    @property
    def base_label(self) -> str:
        return _label(self.baseline.config[self.variable])


def _label(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def learning_rows(done: list[dict]) -> list[dict]:
    """The done runs that trained to a target (target_loss set): the section's runs."""
    return [r for r in done if r.get("target_loss") is not None and r.get("reached") is not None]


def values(rows: list[dict]) -> dict[int, dict[tuple, Value]]:
    """machine -> configuration key -> its runs. Learning is deterministic for a seed: a seed run again
    (an OFAT baseline run in every block) is one observation of tokens to target, not several."""
    out: dict[int, dict[tuple, Value]] = defaultdict(dict)
    seeds: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = tuple((k, r.get(k)) for k in LEARNING_KEYS)
        v = out[r["machine_id"]].get(key)
        if v is None:
            v = out[r["machine_id"]][key] = Value({k: r.get(k) for k in LEARNING_KEYS}, [])
        v.runs.append(r)
        v.step_ms.append(float(r["step_ms_median"]))
        v.times.append(float(r["time_to_target_s"]) if r["reached"] else math.inf)
        seeds[id(v)][int(r.get("seed") or 0) + int(r.get("repeat") or 0)].append(r)
    for by_key in out.values():
        for v in by_key.values():
            for runs in seeds[id(v)].values():
                reached = [float(r["tokens_to_target"]) for r in runs if r["reached"]]
                if reached:
                    v.tokens.append(statistics.fmean(reached))
                else:
                    v.censored.append(max(float(r.get("train_tokens") or r.get("max_tokens") or 0) for r in runs))
    return out


def comparisons(rows: list[dict]) -> list[Comparison]:
    """Every (machine, variable, value) against its baseline, in the catalogue's order of variables."""
    out = []
    for machine_id, by_key in sorted(values(rows).items()):
        if len(by_key) < 2:
            continue
        baseline = _baseline(list(by_key.values()))
        for v in by_key.values():
            if v is baseline:
                continue
            differ = _differ(baseline.config, v.config)
            if len(differ) != 1:
                continue  # not one variable apart from the baseline: no comparison of one variable
            step = _ratio(baseline.step_ms, v.step_ms)
            tokens = _tokens_factor(baseline, v)
            out.append(Comparison(machine_id, differ[0], baseline, v, step, tokens, _product(step, tokens, baseline, v)))
    out.sort(key=lambda c: (c.machine_id, LEARNING_KEYS.index(c.variable), str(c.label)))
    return out


def _differ(a: dict, b: dict) -> list[str]:
    """The variables two configurations differ in, less a follower at its derived value in both (lr of
    optimizer, head_dim of d_model...): comparing optimizers compares each at its stated lr."""
    differ = [k for k in LEARNING_KEYS if a[k] != b[k]]
    return [k for k in differ if not (k in DERIVED_BY_NAME and set(DERIVED_BY_NAME[k].parents) & set(differ)
                                      and all(_derived(c, k) for c in (a, b)))]


def _derived(config: dict, name: str) -> bool:
    try:
        return config[name] == DERIVED_BY_NAME[name].rule(config)
    except (KeyError, TypeError, ZeroDivisionError):
        return False


def _baseline(vs: list[Value]) -> Value:
    """The configuration one variable apart from the most others (the OFAT base), most runs first."""
    def neighbours(v: Value) -> int:
        return sum(1 for w in vs if w is not v and len(_differ(v.config, w.config)) == 1)
    return max(vs, key=lambda v: (neighbours(v), v.n))


def _ratio(base: list[float], other: list[float]) -> Factor:
    """other / base of the geometric means, with Welch's 95% interval on the log scale."""
    if not base or not other:
        return Factor(None, None, None, "unresolved")
    a, b = [math.log(x) for x in base], [math.log(x) for x in other]
    est = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return Factor(math.exp(est), None, None)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Factor(math.exp(est), math.exp(est), math.exp(est))
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    q = stats.t.ppf(0.975, dof)
    return Factor(math.exp(est), math.exp(est - q * se), math.exp(est + q * se))


def _tokens_factor(base: Value, v: Value) -> Factor:
    """The tokens-to-target factor over reached runs; censored runs make it a bound (said in `bound`)."""
    f = _ratio(base.tokens, v.tokens)
    if v.censored and base.censored:
        return Factor(f.estimate, f.low, f.high, "unresolved")
    if v.censored:  # the value's unreached runs would have needed more: its factor is at least this
        floor = _ratio(base.tokens, v.tokens + v.censored)
        return Factor(floor.estimate, floor.low, None, ">=")
    if base.censored:
        ceiling = _ratio(base.tokens + base.censored, v.tokens)
        return Factor(ceiling.estimate, None, ceiling.high, "<=")
    return f


def _product(step: Factor, tokens: Factor, base: Value, v: Value) -> Factor:
    """Time to target = step time x tokens: the product of the factors, its log variance their sum."""
    if step.estimate is None or tokens.estimate is None:
        return Factor(None, None, None, "unresolved")
    est = step.estimate * tokens.estimate
    if tokens.bound:
        return Factor(est, est if tokens.bound == ">=" else None, est if tokens.bound == "<=" else None, tokens.bound)
    if None in (step.low, step.high, tokens.low, tokens.high):
        return Factor(est, None, None)
    halves = [(math.log(f.high) - math.log(f.low)) / 2 for f in (step, tokens)]
    half = math.sqrt(sum(h * h for h in halves))  # independent noises: the halves' squares add (95% each)
    return Factor(est, est * math.exp(-half), est * math.exp(half))


def rank_changes(comps: list[Comparison]) -> list[tuple[int, str, list[str], list[str]]]:
    """(machine, variable, values ranked by step time, by time to target) where the two orders differ:
    the faster step is not the faster training."""
    out = []
    groups: dict[tuple, list[Comparison]] = defaultdict(list)
    for c in comps:
        groups[(c.machine_id, c.variable)].append(c)
    for (machine_id, variable), cs in groups.items():
        if any(c.time.estimate is None or c.step.estimate is None for c in cs):
            continue
        entries = [(c.base_label, 1.0, 1.0)] + [(c.label, c.step.estimate, c.time.estimate) for c in cs]
        by_step = [e[0] for e in sorted(entries, key=lambda e: e[1])]
        by_time = [e[0] for e in sorted(entries, key=lambda e: e[2])]
        if by_step != by_time:
            out.append((machine_id, variable, by_step, by_time))
    return out
