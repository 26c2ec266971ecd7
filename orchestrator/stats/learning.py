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

from scipy.special import stdtrit

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
        """Seeds that reached the target."""
        return len(self.tokens)

    @property
    def seeds(self) -> int:
        """Distinct seeds run (an OFAT baseline runs the same seeds in every block)."""
        return len(self.tokens) + len(self.censored)

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
            out.append(Comparison(machine_id, differ[0], baseline, v, step, tokens,
                                  _product(step, tokens, baseline, v)))
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
    q = stdtrit(dof, 0.975)
    return Factor(math.exp(est), math.exp(est - q * se), math.exp(est + q * se))


def geomean(xs: list[float]) -> Factor:
    """The geometric mean of positive values with the 95% t interval of their mean log (none from one)."""
    if not xs:
        return Factor(None, None, None, "unresolved")
    logs = [math.log(x) for x in xs]
    est = statistics.fmean(logs)
    if len(logs) < 2:
        return Factor(math.exp(est), None, None)
    half = float(stdtrit(len(logs) - 1, 0.975)) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Factor(math.exp(est), math.exp(est - half), math.exp(est + half))


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


def clear_flips(cs: list[Comparison]) -> list[str]:
    """The values whose step time and time to target are both clearly apart from the baseline's, on
    opposite sides: a clearly faster step that clearly trains slower, or the reverse."""
    def side(f: Factor) -> int:
        if f.low is not None and f.low > 1:
            return 1
        if f.high is not None and f.high < 1:
            return -1
        return 0
    return [c.label for c in cs if side(c.step) * side(c.time) == -1]


def rank_changes(comps: list[Comparison]) -> list[tuple[int, str, list[str], list[str]]]:
    """(machine, variable, values ranked by step time, by time to target) where the two orders differ:
    the faster step is not the faster training (point estimates: clear_flips() says which are clear)."""
    out = []
    groups: dict[tuple, list[Comparison]] = defaultdict(list)
    for c in comps:
        groups[(c.machine_id, c.variable)].append(c)
    for (machine_id, variable), cs in groups.items():
        if any(c.time.estimate is None or c.step.estimate is None for c in cs):
            continue
        entries = [(cs[0].base_label, 1.0, 1.0)] + [(c.label, c.step.estimate, c.time.estimate) for c in cs]
        by_step = [e[0] for e in sorted(entries, key=lambda e: e[1])]
        by_time = [e[0] for e in sorted(entries, key=lambda e: e[2])]
        if by_step != by_time:
            out.append((machine_id, variable, by_step, by_time))
    return out


# -- a tokens-to-loss law, for configurations never run (bench.py predict --to-loss) ---------------

# What learning depends on, as the law sees it: numeric variables enter as logs (lr also squared, the
# loss being U-shaped in it), categorical ones as factors; a variable that never varied among the
# learning runs is held: a query off its measured value is refused. The system settings (cores,
# threads, allocator, framework, GEMM route) change a step's time, not what a step learns.
LAW_NUMERIC = ("d_model", "n_layers", "n_heads", "mlp_ratio", "vocab_size", "seq_len", "batch", "lr")
LAW_CATEGORICAL = ("precision", "optimizer", "lr_schedule", "activation", "attention", "dropout", "dataset_used")


def law_values(config: dict) -> dict:
    """The law's variables of a configuration (batch: samples per optimizer step over every rank)."""
    out = {k: config.get(k) for k in LAW_NUMERIC + LAW_CATEGORICAL if k != "batch"}
    out["batch"] = (config["batch_size"] * config["grad_accum"] * (config.get("ranks") or 1)
                    * (config.get("nodes") or 1))
    out["dataset_used"] = config.get("dataset_used") or config.get("dataset")
    return out


def tokens_to(curve: list[tuple[float, float]], loss: float) -> float | None:
    """Tokens at which a curve [(tokens, val_loss)] first comes to `loss`, interpolated between its
    evaluations (linear in loss against log tokens); None where it never does (censored)."""
    previous = None
    for tokens, val in curve:
        if val <= loss:
            if previous is None or previous[1] <= val:
                return float(tokens)
            (t0, l0) = previous
            share = (l0 - loss) / (l0 - val)
            return math.exp(math.log(t0) + share * (math.log(tokens) - math.log(t0)))
        previous = (tokens, val)
    return None


@dataclass
class Law:
    """log tokens to a loss = features x coefficients, fitted by least squares to learning runs' curves."""

    loss: float
    numeric: list[str]  # varied numeric variables (log features)
    squared: list[str]  # of those, also squared (lr, with three values or more)
    levels: dict[str, list]  # varied categorical variable -> its levels (the first is the reference)
    held: dict[str, object]  # variables that never varied -> their one value
    ranges: dict[str, tuple[float, float]]
    coef: object  # numpy array
    cov: object  # (X'X)^-1
    s2: float
    dof: int
    runs: int
    configurations: int
    censored: int

    def features(self, values: dict) -> list[float]:
        x = [1.0]
        for k in self.numeric:
            x.append(math.log(float(values[k])))
            if k in self.squared:
                x.append(math.log(float(values[k])) ** 2)
        for k, levels in self.levels.items():
            x += [1.0 if values[k] == level else 0.0 for level in levels[1:]]
        return x

    def refusal(self, values: dict) -> str | None:
        """Why the law cannot answer for these values (learning never measured there), or None."""
        for k, v in self.held.items():
            if values.get(k) != v:
                return (f"{k}={_label(values.get(k))}: learning was measured only at {k}={_label(v)} "
                        f"(the law does not guess how it changes tokens to a loss)")
        for k, levels in self.levels.items():
            if values.get(k) not in levels:
                return (f"{k}={_label(values.get(k))}: learning was never measured there "
                        f"(measured: {', '.join(map(_label, levels))})")
        return None

    def predict(self, values: dict) -> dict:
        """tokens to the loss with a 95% prediction interval (a new run, seed-to-seed spread included),
        and what it extrapolates beyond the measured range."""
        import numpy as np

        x = np.array(self.features(values))
        mean = float(x @ self.coef)
        se = math.sqrt(self.s2 * (1.0 + float(x @ self.cov @ x)))
        q = float(stdtrit(self.dof, 0.975))
        extrapolated = {k: {"value": float(values[k]), "measured_min": lo, "measured_max": hi}
                        for k, (lo, hi) in self.ranges.items() if not lo <= float(values[k]) <= hi}
        return {"tokens_to_target": math.exp(mean), "tokens_to_target_low": math.exp(mean - q * se),
                "tokens_to_target_high": math.exp(mean + q * se), "log_half_width": q * se,
                "extrapolated": extrapolated}


def fit_law(observations: list[tuple[dict, float | None]], loss: float) -> Law:
    """The law from (law_values of a run, its tokens to `loss` or None where its curve never came to
    it). Censored runs are left out of the fit and counted; BenchError where too few runs remain."""
    import numpy as np

    from common.errors import BenchError

    reached = [(v, t) for v, t in observations if t is not None]
    censored = len(observations) - len(reached)
    if not reached:
        raise BenchError(f"no learning run's validation loss came to {loss:g}: nothing to fit tokens to it from "
                         f"({censored} run(s) never got there)")
    numeric, squared, levels, held, ranges = [], [], {}, {}, {}
    for k in LAW_NUMERIC:
        distinct = sorted({float(v[k]) for v, _ in reached})
        if len(distinct) == 1:
            held[k] = reached[0][0][k]
            continue
        numeric.append(k)
        ranges[k] = (distinct[0], distinct[-1])
        if k == "lr" and len(distinct) >= 3:
            squared.append(k)
    for k in LAW_CATEGORICAL:
        seen = sorted({v[k] for v, _ in reached}, key=lambda x: (str(type(x)), x))
        if len(seen) == 1:
            held[k] = seen[0]
        else:
            modal = statistics.mode(v[k] for v, _ in reached)
            levels[k] = [modal] + [s for s in seen if s != modal]
    law = Law(loss, numeric, squared, levels, held, ranges, None, None, 0.0, 0, len(reached),
              len({tuple(sorted((k, str(v)) for k, v in values.items())) for values, _ in reached}), censored)
    X = np.array([law.features(v) for v, _ in reached])
    y = np.log([t for _, t in reached])
    dof = len(y) - X.shape[1]
    if dof < 1:
        raise BenchError(f"{len(y)} runs reached {loss:g}, fewer than the law's {X.shape[1]} coefficients + 1")
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    law.coef, law.cov = coef, np.linalg.pinv(X.T @ X)
    law.s2, law.dof = float(resid @ resid / dof), dof
    return law


# -- learning is portable, step time is not ------------------------------------------------------

def pooled_tokens(vs: list[Value]) -> Value:
    """One configuration's tokens to target over every machine that measured it: learning does not
    depend on the CPU (up to numerics: machine_agreement() checks it where two machines ran it)."""
    pooled = Value(vs[0].config, [r for v in vs for r in v.runs])
    for v in vs:
        pooled.tokens += v.tokens
        pooled.censored += v.censored
        pooled.step_ms += v.step_ms
        pooled.times += v.times
    return pooled


def machine_agreement(rows: list[dict]) -> list[tuple[dict, int, int, Factor]]:
    """(configuration, machine a, machine b, tokens to target on b / on a) for every configuration
    two machines both measured: where learning should not differ, the figure says whether it did."""
    by_key: dict[tuple, dict[int, Value]] = defaultdict(dict)
    for machine_id, vs in values(rows).items():
        for key, v in vs.items():
            by_key[key][machine_id] = v
    out = []
    for key, per_machine in by_key.items():
        machines = sorted(per_machine)
        for b in machines[1:]:
            a = machines[0]
            out.append((per_machine[a].config, a, b, _ratio(per_machine[a].tokens, per_machine[b].tokens)))
    return out
