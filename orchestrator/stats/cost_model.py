"""The cost model: the predicted median step time of a configuration on a machine, with a 95% prediction
interval, fitted to every done run of that machine. `predict`, the report's "How long would it take
here" and the leave-one-configuration-out check all go through `fit()` and `Model.predict()`; nothing
else here is an entry point. Which machine, its runs and the `predict` command's document are the
database's side: orchestrator/queue/predict.py.

The model (docs/prediction.md):

    step_s = ((c_flop * F_gemm + c_move * E_gemm + c_attn * F_attn) * prod(rate[variable = value])
              + c_mem * E_mem + c_call * calls + c_step + c_dram * E_dram)
             * prod(factor[variable = value])

F_gemm, E_gemm: the FLOPs and the matrix elements (m k + k n + m n, what a GEMM moves) of the step's GEMMs,
F_attn: attention's FLOPs, E_mem: the values memory-bound work streams (norms, activations, softmax, the
loss, the optimizer), calls: kernel calls, all exact from common/compute.operations(); E_dram: the
values of tensors larger than the machine's last-level cache (its record's l3_kb), which each pass
streams from DRAM (beyond_cache()). The seven costs are
positive (fitted as exp of a free parameter): c_flop is the inverse of the machine's GEMM FLOP rate on
large shapes and c_move what a GEMM pays for its operands, so a GEMM's efficiency flops / time =
1 / (c_flop + c_move * (1/m + 1/n + 1/k) / 2) rises with every dimension towards 1 / c_flop: small and
thin GEMMs are slow, large ones near the plateau, with no extra parameter per shape. Every variable
that is not a size (framework, precision, compile, cores, threads, allocator...) is a categorical factor
on the whole step where the database holds runs with another value; a value the machine never ran is
refused (BenchError), and values that always occur together in the data (framework=jax with
compile=xla) are one factor, refused apart. A setting the machine ran at sizes at least RATE_SPAN apart
in FLOPs per step also gets a rate: a factor on the compute terms alone (bf16 or another framework
change the GEMMs' rate, not the per-call overhead); at one size the two cannot be told apart.

The fit is least squares on log step time (run noise and model error are multiplicative). The interval:
log prediction +- t(0.975, n - p) * sqrt(s^2 + g' C g), s^2 the residual variance, C = s^2 (J'J)^-1
the parameters' covariance from the Jacobian at the optimum (pseudo-inverse where a cost is not
identified), g the gradient of the log prediction; exp() of the two ends. Pure: rows in, numbers out.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat

import numpy as np

from common.compute import operations
from common.errors import BenchError
from orchestrator.stats.columns import column, conf_values

# Variables the operations price: a new value is arithmetic, extrapolated but never refused.
SIZES = ("n_layers", "d_model", "n_heads", "head_dim", "kv_heads", "mlp_ratio", "vocab_size", "seq_len",
         "batch_size", "grad_accum", "window", "dropout", "lora_rank")
# Structural words the operations also price (their shapes and counts): no factor of their own.
# `task` is priced too (LoRA's adapters, frozen weights) but is a factor as well: the quick base's
# finetune_lora runs take 28% more than their operations say (the adapters' small kernels), in sample.
STRUCTURE = ("activation", "attention", "optimizer")
# Variables that do not change what one step costs (or are the run's bookkeeping): the learning rate
# and a learning run's bounds change how many steps reach a loss, not a step's cost.
IGNORED = ("steps", "warmup_steps", "seed", "repeat", "dataset", "lr", "lr_schedule", "max_tokens", "target_loss",
           "eval_every")
TERMS = ("gemm_flops", "gemm_elements", "attention_flops", "memory_elements", "calls", "step", "dram_elements")
# The cost terms' scales: each feature divided by its scale is of order one on the quick base, so the
# optimizer's free parameters are of order one too.
_SCALE = np.array([1e9, 1e7, 1e8, 1e7, 1e2, 1.0, 1e7])
# The terms a setting's rate factor acts on (compute: the GEMMs and attention's products); the others
# (memory-bound work, calls, the step's fixed cost, DRAM traffic) are overhead.
COMPUTE = np.array([t in ("gemm_flops", "gemm_elements", "attention_flops") for t in TERMS])
# A setting gets a factor on compute of its own (beside the one on the whole step) where the machine ran
# it at sizes this far apart in FLOPs per step: then its runs tell the two apart.
RATE_SPAN = 2.0
LEVEL = 0.95


_FEATURE_KEYS = SIZES + STRUCTURE + ("task", "precision")  # all operations() reads
_features: dict[tuple, np.ndarray] = {}


def features(config: dict, llc_kb: float | None = None) -> np.ndarray:
    """The terms of one step of `config` (TERMS), from its exact operations, on a machine whose
    last-level cache holds `llc_kb` KiB (default: the row's own l3_kb, as v_results has it; unknown:
    no DRAM term). Memoised: the leave-one-out check fits the same rows many times."""
    llc = llc_kb if llc_kb is not None else config.get("l3_kb")
    key = tuple(_word(config.get(k)) for k in _FEATURE_KEYS) + (llc,)
    if key not in _features:
        if len(_features) > 100_000:
            _features.clear()
        _features[key] = _features_of(config, llc)
    return _features[key]


def _bytes_per_value(config: dict) -> int:
    """Bytes of one activation value: bf16 and mixed run their activations in bfloat16."""
    return 2 if config.get("precision") in ("bf16", "mixed") else 4


def beyond_cache(config: dict, llc_kb: float | None, ops: list | None = None) -> float:
    """Values one step streams from tensors larger than the last-level cache (`llc_kb` KiB): such a
    tensor cannot stay in the cache between the kernels that write and read it, so each pass over it
    goes to DRAM. GEMM operands (m x k, k x n, m x n, per call); attention's scores (batch x heads x
    attended pairs) and its Q, K, V; the elementwise work's activations (tokens x d_model, tokens x MLP
    hidden); the logits (tokens x vocab); the optimizer's weights. Each counted as often as
    operations() streams it (`ops`: operations(config), where made already). 0 where the cache size is
    unknown."""
    if not llc_kb:
        return 0.0
    from common.compute import linear_shapes, mlp_hidden
    cap = float(llc_kb) * 1024 / _bytes_per_value(config)
    total = 0.0

    def big(values: float, times: float) -> float:
        return values * times if values > cap else 0.0

    for op in ops if ops is not None else operations(config):
        if op.kind == "gemm":
            total += op.calls * sum(big(s, 1) for s in (op.m * op.k, op.k * op.n, op.m * op.n))
        elif op.kind == "attention":
            streams = op.batch / 6  # batch x heads of one micro-batch
            total += op.calls * (big(streams * op.m * op.n, 6 + 3) + big(streams * op.m * op.k, 6 * 2))
    b, t, d = config["batch_size"], config["seq_len"], config["d_model"]
    m, hidden, calls = b * t, mlp_hidden(config), config["grad_accum"]
    dropout = config.get("dropout", 0) > 0
    per_layer = big(m * d, 3 * (4 + (2 if dropout else 0))) + \
        big(m * hidden, 3 * ((3 if config["activation"] == "swiglu" else 1) + (1 if dropout else 0)))
    total += calls * config["n_layers"] * per_layer
    total += calls * (big(m * config["vocab_size"], 3) + big(m * d, 3))
    sweeps = 7 if config.get("optimizer", "adamw") == "adamw" else 3
    if config.get("task") != "finetune_lora":
        weights = [n_in * n_out for _, n_in, n_out in linear_shapes(config)] * config["n_layers"]
        total += sum(sweeps * w for w in weights + [config["vocab_size"] * d] if 4 * w > float(llc_kb) * 1024)
    return total


def _features_of(config: dict, llc_kb: float | None = None) -> np.ndarray:
    f = [0.0] * len(TERMS)  # (summed as Python floats: the same doubles as a float64 array's, faster)
    ops = operations(config)
    for op in ops:
        if op.kind == "gemm":
            f[0] += op.calls * op.flops
            f[1] += op.calls * op.elements
        elif op.kind == "attention":
            f[2] += op.calls * op.flops
            f[3] += op.calls * op.elements
        else:
            f[3] += op.calls * op.elements
        f[4] += op.calls
    f[5] = 1.0
    f[6] = beyond_cache(config, llc_kb, ops)
    return np.array(f) / _SCALE


def factor_variables(rows: list[dict]) -> list[str]:
    """Variables of the rows that are neither sizes, structure nor ignored, and take more than one value."""
    names = [k for k in rows[0] if k not in SIZES + STRUCTURE + IGNORED]
    from common.variables import NAMES
    # _word() once per distinct value (values that are equal have one word: 1, 1.0 and True are "1")
    return [n for n in names if n in NAMES and len(set(map(_word, set(map(operator.itemgetter(n), rows))))) > 1]


def _word(value) -> str:
    """A setting's value as one word, the same whether it comes from the database (booleans as 0/1,
    REAL columns) or from a resolved config."""
    if value is None or value in ("default", "auto"):  # the jobs' typed columns hold these words as NULL
        return "default"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass
class Prediction:
    step_ms: float
    step_ms_low: float
    step_ms_high: float
    basis: str
    extrapolated: dict  # variable -> {"value", "measured_min", "measured_max", "beyond": ratio}
    flops_per_step: int

    def train(self, tokens_per_step: int, tokens: float) -> dict:
        """Seconds to train `tokens` tokens at this step time (and its interval)."""
        steps = tokens / tokens_per_step
        return {"train_s": self.step_ms / 1e3 * steps, "train_s_low": self.step_ms_low / 1e3 * steps,
                "train_s_high": self.step_ms_high / 1e3 * steps, "steps": steps}


@dataclass
class Model:
    """A fitted model of one machine's step times; predict() is what callers use."""
    log_costs: np.ndarray  # free parameters of the costs (TERMS)
    factors: list[tuple[tuple[tuple[str, str], ...], float]]  # ((variable, value) group, log factor)
    reference: dict  # variable -> the value every factor is relative to
    measured: dict  # variable -> set of measured words (factor variables)
    ranges: dict  # size variable -> (min, max) measured
    cov: np.ndarray
    s2: float
    dof: int
    n_runs: int
    n_configs: int
    rms_log: float
    fixed: dict = field(default_factory=dict)  # variables with one value in the data -> that word

    @property
    def runs_text(self) -> str:
        """How many runs it rests on, in words: '260', or '20000 of 1000000 (the first passes)'."""
        if self.n_runs_all > self.n_runs:
            return f"{self.n_runs} of {self.n_runs_all} (the first passes)"
        return str(self.n_runs)

    def _design(self, config: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = features(config, self.llc_kb)
        rho, d = _takes(config, self.rates), _takes(config, self.factors)
        # an average block: the mean of every block's effect (the first block's is 0)
        blocks = np.full(len(self.block_params), 1.0 / (len(self.block_params) + 1))
        return x, rho, np.concatenate([d, blocks])

    def log_step(self, x: np.ndarray, rho: np.ndarray, d: np.ndarray, params: np.ndarray | None = None) -> float:
        p = self.params if params is None else params
        k, q = len(TERMS), len(self.rates)
        seconds = np.exp(p[:k]) * x
        total = seconds[COMPUTE].sum() * math.exp(float(rho @ p[k:k + q])) + seconds[~COMPUTE].sum()
        return float(math.log(total) + p[k + q:] @ d)

    @property
    def params(self) -> np.ndarray:
        return np.concatenate([self.log_costs, [r for _, r in self.rates], [b for _, b in self.factors],
                               self.block_params])

    def refusal(self, config: dict) -> str | None:
        """Why this model cannot predict `config`, or None."""
        for name, words in self.measured.items():
            word = _word(config.get(name))
            if word not in words:
                return (f"{name}={word} was never measured on this machine (measured: {', '.join(sorted(words))}): "
                        f"the model does not guess a setting's effect")
        for name, word in self.fixed.items():
            if _word(config.get(name)) != word:
                return (f"{name}={_word(config.get(name))} was never measured on this machine (every run has "
                        f"{name}={word}): the model does not guess a setting's effect")
        for group, _ in self.factors:
            hits = [_word(config.get(k)) == v for k, v in group]
            if any(hits) and not all(hits):
                together = " with ".join(f"{k}={v}" for k, v in group)
                return (f"{together} were only measured together on this machine; "
                        f"{', '.join(f'{k}={_word(config.get(k))}' for k, _ in group)} never was")
        return None

    def point_ms(self, config: dict) -> float | None:
        """The predicted median step time alone (no interval: cheap, for the ETA's many queued jobs);
        None where predict() would refuse."""
        if self.refusal(config):
            return None
        x, rho, d = self._design(config)
        if self.null.size and np.any(np.abs(self.null @ d) > 1e-6):
            return None
        return 1e3 * math.exp(self.log_step(x, rho, d))

    def predict(self, config: dict) -> Prediction:
        """The median step time of `config` with its 95% prediction interval; BenchError where the
        machine never ran one of its settings."""
        why = self.refusal(config)
        if why:
            raise BenchError(why)
        x, rho, d = self._design(config)
        if self.null.size:
            lean = self.null @ d
            for v, amount in zip(self.null, lean):
                if abs(amount) > 1e-6:
                    tied = [" with ".join(f"{k}={w}" for k, w in g) for g, c in zip(self.factor_names, v)
                            if abs(c) > 1e-6]
                    raise BenchError(f"this machine's runs cannot tell apart the effects of {'; '.join(tied)} "
                                     f"(they only ever changed together); this configuration takes some of them "
                                     f"without the others")
        mu = self.log_step(x, rho, d)
        g = _gradient(lambda p: self.log_step(x, rho, d, p), self.params)
        var = self.s2 + self.block_var + float(g @ self.cov @ g) + model_error_var(self, config)
        half = _t_quantile(self.dof) * math.sqrt(max(var, 0.0))
        extrapolated = {}
        for name, (lo, hi) in self.ranges.items():
            value = config.get(name)
            if not _matters(name, config):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and (value < lo or value > hi):
                edge = hi if value > hi else lo
                extrapolated[name] = {"value": value, "measured_min": lo, "measured_max": hi,
                                      "beyond": (value / edge) if edge else None}
        from common.compute import flops_per_step
        flops = flops_per_step(config)
        if flops > self.ranges_flops[1] or flops < self.ranges_flops[0]:
            lo, hi = self.ranges_flops
            edge = hi if flops > hi else lo
            extrapolated["flops_per_step"] = {"value": flops, "measured_min": lo, "measured_max": hi,
                                              "beyond": flops / edge}
        basis = (f"{self.runs_text} done runs of {self.n_configs} configurations on this machine; log residual "
                 f"{self.rms_log:.3f} (rms) and block spread {math.sqrt(self.block_var):.3f}, {len(self.factors)} "
                 f"setting factors ({len(self.rates)} with a compute factor of their own), {self.dof} degrees of "
                 f"freedom{self.calibration_text}")
        return Prediction(step_ms=1e3 * math.exp(mu), step_ms_low=1e3 * math.exp(mu - half),
                          step_ms_high=1e3 * math.exp(mu + half), basis=basis, extrapolated=extrapolated,
                          flops_per_step=flops)

    ranges_flops: tuple[float, float] = (0.0, 0.0)
    n_runs_all: int = 0  # the done runs it was given (n_runs: those fitted, fewer beyond FIT_MAX_RUNS)
    block_params: np.ndarray = field(default_factory=lambda: np.zeros(0))  # nuisance: each block but the first
    block_var: float = 0.0  # the spread of the blocks (log), noise a new run meets
    null: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # inestimable directions of (factors, blocks)
    factor_names: list = field(default_factory=list)
    # settings with a factor on the compute terms of their own (log), on top of their whole-step factor
    rates: list = field(default_factory=list)
    llc_kb: float | None = None  # the machine's last-level cache (KiB), for the DRAM term
    # model error (calibrate()): log variances (tau0, tau_size, tau_set) beyond the fit's own, with the
    # distances of extrapolation_distances(); the support it measures them from
    model_error: tuple[float, ...] = (0.0, 0.0, 0.0)
    support: dict | None = None
    calibration_text: str = ""


def _takes(config: dict, groups: list) -> np.ndarray:
    """1 for each (group, parameter) whose every (variable, value) the config has, else 0."""
    return np.array([1.0 if all(_word(config.get(k)) == v for k, v in group) else 0.0 for group, _ in groups])


def _matters(name: str, config: dict) -> bool:
    """Whether a size changes what this config computes: window only with local or sliding attention,
    lora_rank only with task=finetune_lora."""
    if name == "window":
        return config.get("attention") != "full"
    if name == "lora_rank":
        return config.get("task") == "finetune_lora"
    return True


# SCIPY_WHERE_USED: scipy.optimize is imported by the functions that fit, not with the module: the
# report's own process reads the cost model's shares (usable, thin) but its child fits. No module imports
# scipy.stats (~0.4 s of a start, `python -X importtime`): its t and F quantiles are scipy.special's
# stdtrit and fdtri, which its ppf calls.
def _t_quantile(dof: float) -> float:
    """Student's t quantile of the interval's LEVEL at dof (at least 1) degrees of freedom."""
    from scipy.special import stdtrit

    return stdtrit(max(dof, 1), 0.5 + LEVEL / 2)


def _gradient(fn, p: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(p)
    for i in range(len(p)):
        e = np.zeros_like(p)
        e[i] = h
        g[i] = (fn(p + e) - fn(p - e)) / (2 * h)
    return g


def config_key(row: dict) -> tuple:
    """A configuration whatever its repeat: the values of every catalogue variable but the bookkeeping."""
    from common.variables import NAMES
    return tuple(_word(row.get(n)) for n in NAMES if n not in IGNORED)


_KEY_NAMES: tuple[str, ...] = ()


def _key_names() -> tuple[str, ...]:
    """The variables config_key() reads, in its order."""
    global _KEY_NAMES
    if not _KEY_NAMES:
        from common.variables import NAMES
        _KEY_NAMES = tuple(n for n in NAMES if n not in IGNORED)
    return _KEY_NAMES


def _numbered(values: list) -> tuple[list, np.ndarray]:
    """The distinct values in the order they first occur (equal ones: the first), and each value's
    number among them; at C speed but for one step per distinct value."""
    numbers = dict.fromkeys(values)
    for i, value in enumerate(numbers):
        numbers[value] = i
    return list(numbers), np.fromiter(map(numbers.__getitem__, values), dtype=np.int64, count=len(values))


def keys_of_values(raws: list[tuple], names: tuple[str, ...]) -> list[tuple]:
    """[config_key(dict(zip(names, raw))) for raw in raws], made column by column: each variable's
    distinct values made words once (_words_of; equal values give equal words), the keys zipped from
    the words (a grid of 100k configurations: no Python call per configuration and variable)."""
    by_name = dict(zip(names, zip(*raws)))
    unset = [None] * len(raws)  # a variable config_key() reads that `names` lacks: NULL
    return list(zip(*(_words_of(by_name.get(n, unset)) for n in _key_names()))) if raws else []


def config_keys(rows: list[dict]) -> list[tuple]:
    """config_key() of every row, computed once per distinct raw values (a fleet's runs repeat a few
    thousand configurations): the rows' values read at C speed, the keys made column by column."""
    raws = conf_values(rows, _key_names())
    distinct = list(dict.fromkeys(raws))
    keys = dict(zip(distinct, keys_of_values(distinct, _key_names())))
    return list(map(keys.__getitem__, raws))


def distinct_config_keys(rows: list[dict]) -> list[tuple]:
    """list(dict.fromkeys(config_keys(rows))): each configuration's key once, in the order they first
    ran. The rows' raw values are deduplicated at C speed (no Python call per row), then the keys are
    made once per distinct raw values (config_key() reads only those columns: what the row would give)."""
    distinct = list(dict.fromkeys(conf_values(rows, _key_names())))
    return list(dict.fromkeys(keys_of_values(distinct, _key_names())))


def block_of(row: dict) -> tuple:
    """A run's block in the run order: its repeat pass and its comparison's stretch (jobs.block; None:
    the whole pass), as the report's step model has it (orchestrator/stats/noise.py)."""
    from common.blocks import stretch_of
    return (row.get("repeat"), stretch_of(row.get("block")))


def usable(rows: list[dict]) -> list[dict]:
    """The done runs a fit may use: disturbed ones (another process or the hypervisor took a share of
    the job's CPUs, orchestrator/ran.disturbed) are left out, as the report's effects leave them out,
    unless every run was."""
    from orchestrator.stats.ran import disturbed, quiet_runs
    done = _done(rows)
    # disturbed() parses a run's applied: only where its figures could pass a limit (ran.quiet_runs)
    sure = quiet_runs(*(column(done, c) for c in ("other_cpu_s", "steal_s", "cores")))
    if sure is None:
        return list(done)
    quiet = [r for r, q in zip(done, sure) if q or not disturbed(r)]
    return quiet or done


def _done(rows: list[dict]) -> list[dict]:
    """[r for r in rows if r.get("status", "done") == "done" and r.get("step_ms_median")], at C speed."""
    done = map(operator.eq, map(operator.methodcaller("get", "status", "done"), rows), repeat("done"))
    return list(compress(rows, map(operator.and_, done, map(bool, column(rows, "step_ms_median")))))


FIT_MAX_RUNS = 20_000  # a fleet's machine is fitted on its first passes up to this many runs (thin())


def thin(rows: list[dict], most: int = FIT_MAX_RUNS) -> list[dict]:
    """At most `most` of the rows, whole repeat passes first (lowest repeat first, so every kept pass
    keeps its blocks), else an even sample of the first pass. The cost model's design is dense in its
    blocks (runs x passes): at a million runs it would need gigabytes, while a model of six costs and
    a few factors is as well determined by the first passes of every configuration."""
    if len(rows) <= most:
        return rows
    raw = Counter(column(rows, "repeat"))  # each run's repeat, counted at C speed
    per_pass = Counter()
    for v, n in raw.items():
        per_pass[v or 0] += n
    kept, total = set(), 0
    for p in sorted(per_pass):
        if total + per_pass[p] > most and kept:
            break
        kept.add(p)
        total += per_pass[p]
    keep_raw = {v for v in raw if (v or 0) in kept}
    out = list(compress(rows, map(keep_raw.__contains__, column(rows, "repeat"))))
    if len(out) > most:
        step = len(out) / most
        out = [out[int(i * step)] for i in range(most)]
    return out


class Cells:
    """A machine's runs grouped into (configuration, block) cells, the sufficient statistics of the
    least squares on log step time: each cell's first run (its configuration), its runs n, their mean
    log time and their sum of squares about it. The fit's residual sum over runs is, exactly,
    sum_cells n (mean - f)^2 + the within-cell sum of squares, so a fit on the cells weighted by n gives
    the per-run fit's estimates, covariance and s^2 at a cost that follows the cells.
    `per_run`: every run a cell of its own (the per-run fit, kept for the tests' comparison)."""

    def __init__(self, rows: list[dict], per_run: bool = False):
        names = _key_names()
        y_run = np.log(np.array([float(r["step_ms_median"]) / 1e3 for r in rows]))
        # Each run's configuration and block numbered at C speed: its raw values (their keys made column by
        # column, then equal keys merged), its raw repeat and block (block_of() once per
        # distinct ones, their types told apart: a cell's block is its first run's, as block_of() gives it)
        raw_configs, raw_config_of = _numbered(conf_values(rows, names))
        keys_, key_of_raw = _numbered(keys_of_values(raw_configs, names))
        key_of = key_of_raw[raw_config_of]  # each run's configuration: keys_ in the order they first ran
        repeats, stretches = column(rows, "repeat"), column(rows, "block")
        raw_blocks, raw_block_of = _numbered(list(zip(map(type, repeats), repeats, map(type, stretches), stretches)))
        block_tuples = [block_of({"repeat": rep, "block": blk}) for _, rep, _, blk in raw_blocks]
        blocks_, block_of_raw = _numbered(block_tuples)
        # the cells: each distinct (configuration, block) in the order they first ran
        if per_run:
            first, cell_of = np.arange(len(rows)), np.arange(len(rows))
        else:
            cell = key_of * max(len(blocks_), 1) + block_of_raw[raw_block_of]
            _, first_at, inverse = np.unique(cell, return_index=True, return_inverse=True)
            order = np.argsort(first_at, kind="stable")
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            first, cell_of = first_at[order], rank[inverse.reshape(-1)]
        self.rows = list(map(rows.__getitem__, first.tolist()))
        self.keys = list(map(keys_.__getitem__, key_of[first].tolist()))
        self.blocks = list(map(block_tuples.__getitem__, raw_block_of[first].tolist()))
        self.cell_of, self.y_run = cell_of, y_run
        self.n = np.bincount(cell_of, minlength=len(first)).astype(float)
        self.ybar = np.bincount(cell_of, y_run, minlength=len(first)) / self.n
        self.ss = np.bincount(cell_of, (y_run - self.ybar[cell_of]) ** 2, minlength=len(first))
        self.memo: dict = {}  # (configuration, llc) -> its features and FLOPs: shared with without()'s cells
        self.source = None  # (the cells, which of them) this one was cut from by without()
        self.root = self  # the cells every without() cut comes from: its configurations' tables (words, ranges)
        # each cell's configuration: its number in the order they first ran (config_index: key -> number)
        self.config = key_of[first]
        self.config_index = {key: i for i, key in enumerate(keys_)}
        self.config_rows = [None] * len(keys_)  # each configuration's first cell's row
        for r, c in zip(reversed(self.rows), reversed(self.config.tolist())):
            self.config_rows[c] = r
        self._words: dict = {}  # key position -> (its words, each configuration's word number)
        self._sizes = None  # each configuration's sizes (fit_cells' ranges)

    def without(self, key: tuple) -> "Cells":
        """The cells of every configuration but `key` (leave-one-out), in the same order."""
        root = self.root
        keep = self.config != root.config_index.get(key, -1)
        out = Cells.__new__(Cells)
        index = np.cumsum(keep) - 1
        kept = keep.tolist()
        out.rows = list(compress(self.rows, kept))
        out.keys = list(compress(self.keys, kept))
        out.blocks = list(compress(self.blocks, kept))
        runs = keep[self.cell_of]
        out.cell_of, out.y_run = index[self.cell_of[runs]], self.y_run[runs]
        out.n, out.ybar, out.ss = self.n[keep], self.ybar[keep], self.ss[keep]
        out.memo = self.memo
        out.source = (self, keep)  # its terms are these cells' (terms())
        out.root, out.config = root, self.config[keep]
        return out

    def words(self, position: int) -> tuple[list[str], np.ndarray]:
        """The words of the configurations' keys at `position` (their distinct values, sorted) and each
        cell's word's number among them."""
        root = self.root
        got = root._words.get(position)
        if got is None:
            per_config = [key[position] for key in root.config_index]
            vocab = sorted(set(per_config))
            number = {w: i for i, w in enumerate(vocab)}
            got = root._words[position] = (vocab, np.array([number[w] for w in per_config], dtype=np.int64))
        return got[0], got[1][self.config]

    def ranges(self) -> dict:
        """Each size's (min, max) over the configurations of these cells (their first rows), where it is
        a number that matters for some of them."""
        root = self.root
        if root._sizes is None:
            values = [tuple(float(r[name]) if isinstance(r.get(name), (int, float))
                            and not isinstance(r.get(name), bool) and _matters(name, r) else None for name in SIZES)
                      for r in root.config_rows]
            has = np.array([[v is not None for v in row] for row in values],
                           dtype=bool).reshape(len(values), len(SIZES))
            arr = np.array([[0.0 if v is None else v for v in row] for row in values],
                           dtype=float).reshape(len(values), len(SIZES))
            # a NaN or a -0.0: min() and max() then depend on the values' order, kept as they were
            root._sizes = (values, has, arr, bool(np.isnan(arr).any() or (np.signbit(arr) & (arr == 0)).any()))
        values, has, arr, odd = root._sizes
        present = np.zeros(len(values), dtype=bool)
        present[self.config] = True
        if odd:  # as min() and max() over the values in the configurations' order give it
            out = {}
            for i, name in enumerate(SIZES):
                got = [values[c][i] for c in np.flatnonzero(present) if values[c][i] is not None]
                if got:
                    out[name] = (min(got), max(got))
            return out
        at = has & present[:, None]
        lows = np.where(at, arr, np.inf).min(axis=0, initial=np.inf).tolist()
        highs = np.where(at, arr, -np.inf).max(axis=0, initial=-np.inf).tolist()
        return {name: (lo, hi) for name, lo, hi, some in zip(SIZES, lows, highs, at.any(axis=0).tolist()) if some}

    def terms(self, llc_kb: float | None) -> tuple[np.ndarray, np.ndarray]:
        """features() and FLOPs per step of every cell, computed once per configuration (and for the
        cells without() cut, those of the cells they came from: the leave-one-out's refits)."""
        from common.compute import flops_per_step
        if self.source is not None:
            parent, keep = self.source
            x, f = parent.terms(llc_kb)
            return x[keep], f[keep]
        got = self.memo.get(("terms", llc_kb))
        if got is not None and got[0] is self:
            return got[1]
        memo, x, f = self.memo, [], []
        for key, r in zip(self.keys, self.rows):
            got = memo.get((key, llc_kb))
            if got is None:
                got = memo[(key, llc_kb)] = (features(r, llc_kb), float(flops_per_step(r)))
            x.append(got[0])
            f.append(got[1])
        memo[("terms", llc_kb)] = (self, (np.array(x), np.array(f, dtype=float)))
        return memo[("terms", llc_kb)][1]

    def n_configs(self) -> int:
        present = np.zeros(len(self.root.config_rows), dtype=bool)
        present[self.config] = True
        return int(present.sum())

    @property
    def n_runs(self) -> int:
        return len(self.y_run)


def fit(rows: list[dict], start: Model | None = None, *, per_run: bool = False, n_all: int | None = None) -> Model:
    """The model of one machine from its done runs (dicts with v_results' columns: every variable,
    repeat, block and step_ms_median). BenchError when there is nothing to fit. `start`: a model of
    nearly the same rows to start from (leave-one-out). Beyond FIT_MAX_RUNS runs it is fitted on
    thin()'s share of them, and says so (n_runs of n_runs_all). Fitted on the runs' (configuration,
    block) cells (Cells); `per_run`: on every run (the same numbers up to rounding: the tests' reference)."""
    rows = _done(rows)
    n_all = len(rows) if n_all is None else n_all  # given: the rows are thin()'s share of that many
    rows = thin(rows)
    if len(rows) < len(TERMS) + 1:
        raise BenchError(f"{len(rows)} done runs on this machine: the cost model needs at least {len(TERMS) + 1}")
    llc_kb = next((float(r["l3_kb"]) for r in rows if r.get("l3_kb")), None)
    return fit_cells(Cells(rows, per_run=per_run), start, n_all=n_all, llc_kb=llc_kb)


def fit_cells(cells: Cells, start: Model | None = None, *, n_all: int | None = None,
              llc_kb: float | None = None) -> Model:
    """fit() on cells: least squares weighted by each cell's runs, on their mean log time; s^2 adds the
    within-cell sum of squares and counts the runs."""
    n = cells.n_runs
    if n < len(TERMS) + 1:
        raise BenchError(f"{n} done runs on this machine: the cost model needs at least {len(TERMS) + 1}")
    counted, fixed = factor_settings(cells)
    reference, measured, columns = factor_columns(counted)
    groups = merged_columns(columns)
    if llc_kb is None:
        llc_kb = next((float(r["l3_kb"]) for r in cells.rows if r.get("l3_kb")), None)
    X, flops = cells.terms(llc_kb)
    rate_groups = rate_columns(groups, flops, cells.n)
    problem = LogLeastSquares(cells, X, [c for _, c in rate_groups], [c for _, c in groups], block_columns(cells))
    lower, upper = problem.bounds()
    theta = best_costs(problem, starting_points(problem, cells, start, lower, upper), lower, upper)
    p = np.concatenate([theta, problem.linear_part(theta)])
    cov, s2, dof, rss = covariance(problem, p, lower, n)
    k, K, n_factors = problem.k, problem.K, len(groups)
    model = Model(log_costs=p[:k], factors=[(g, float(b)) for (g, _), b in zip(groups, p[K:K + n_factors])],
                  reference=reference, measured=measured, ranges=cells.ranges(), cov=cov, s2=s2, dof=dof, n_runs=n,
                  n_configs=cells.n_configs(), rms_log=float(np.sqrt(rss / n)), fixed=fixed)
    model.rates = [(g, float(r)) for (g, _), r in zip(rate_groups, p[k:K])]
    model.n_runs_all = n if n_all is None else n_all
    model.llc_kb = llc_kb
    model.block_params = p[K + n_factors:]
    # Directions of the factors and blocks the data cannot tell apart (settings that only ever changed
    # together in some combination: jax and numpy runs record compile_cache=cold, say): a query whose
    # settings lean on one of them is refused (not estimable), one that takes the whole combination is not.
    if problem.D.shape[1]:
        model.null = problem.vt[problem.rank:]
    model.factor_names = [g for g, _ in groups]
    model.block_var = block_spread(p[K + n_factors:], np.diag(cov)[K + n_factors:])
    model.ranges_flops = (float(flops.min()), float(flops.max()))
    return model


# -- fit_cells()'s steps, in the order it takes them ----------------------------------------------


def factor_settings(cells: Cells) -> tuple[dict, dict]:
    """The settings that are factors: {variable: (its words, each cell's word number, each word's
    runs)} for the variables (neither sizes, structure nor ignored) with runs at two words or more,
    and {variable: its one word} for the others (factor_variables(), on the configurations: a cell's
    words are its configuration key's, numbered once per configuration by Cells.words; each word's
    runs counted at C speed)."""
    from common.variables import NAMES
    rows, w = cells.rows, cells.n
    pos = {name: i for i, name in enumerate(_key_names())}
    counted = {}
    for name in rows[0]:
        if name not in SIZES + STRUCTURE + IGNORED and name in pos:
            vocab, number = cells.words(pos[name])
            runs = np.bincount(number, weights=w, minlength=len(vocab))  # every cell holds a run or more
            if np.count_nonzero(runs) > 1:
                counted[name] = (vocab, number, runs)
    fixed = {n_: _word(rows[0][n_]) for n_ in NAMES if n_ in rows[0] and n_ not in SIZES + STRUCTURE + IGNORED
             and n_ not in counted}
    return counted, fixed


def factor_columns(counted: dict) -> tuple[dict, dict, list]:
    """Each factor's reference (its most common word over the runs: the sweep's base), its measured
    words, and a column per other word ((variable, word), 1.0 for the cells that have it)."""
    reference, measured, columns = {}, {}, []
    for name, (vocab, number, runs) in counted.items():
        present = np.flatnonzero(runs).tolist()  # the words' numbers: in sorted order (Cells.words)
        counts = {vocab[i]: runs[i] for i in present}
        reference[name] = max(counts, key=lambda x: (counts[x], x))
        measured[name] = set(counts)
        for i in present:
            if vocab[i] != reference[name]:
                columns.append(((name, vocab[i]), (number == i).astype(float)))
    return reference, measured, columns


def merged_columns(columns: list) -> list[tuple[tuple[tuple[str, str], ...], np.ndarray]]:
    """Columns that are equal in the data (settings only ever changed together) as one factor:
    [((variable, word), ...), column]."""
    groups: list[tuple[tuple[tuple[str, str], ...], np.ndarray]] = []
    for key, col in columns:
        for i, (g, c) in enumerate(groups):
            if np.array_equal(c, col):
                groups[i] = (g + (key,), c)
                break
        else:
            groups.append(((key,), col))
    return groups


def block_columns(cells: Cells) -> np.ndarray:
    """A column per block but the first (blocks in the order of their str): the machine's slow and
    fast stretches (a comparison's runs share one). A nuisance effect each; a prediction is for an
    average block, and the blocks' spread is noise a new run will meet, so it joins the interval."""
    blocks = sorted(set(cells.blocks), key=str)
    index = {b: i for i, b in enumerate(blocks)}
    B = np.zeros((len(cells.rows), max(len(blocks) - 1, 0)))
    j = np.fromiter(map(index.__getitem__, cells.blocks), dtype=np.int64, count=len(cells.rows))
    B[np.flatnonzero(j), j[j > 0] - 1] = 1.0
    return B


class LogLeastSquares:
    """The weighted least squares on the cells' mean log time, by variable projection: the
    non-linear parameters theta (the costs' and the compute factors' logs) are searched; for given
    theta the factors and blocks (D) are a linear least-squares fit of what the costs leave
    unexplained (one SVD of the weighted D gives its pseudo-inverse and its null space). Settings run
    at sizes RATE_SPAN apart in FLOPs also get a factor on the compute terms alone (R's columns):
    bf16 or another framework changes the GEMMs' rate, not the per-call overhead, and two sizes tell
    the two apart."""

    def __init__(self, cells: Cells, X: np.ndarray, rate_cols: list, factor_cols: list, B: np.ndarray):
        n_cells = len(cells.rows)
        self.X = X
        self.R = np.column_stack(rate_cols) if rate_cols else np.zeros((n_cells, 0))
        self.D = np.column_stack(factor_cols + ([B] if B.shape[1] else [])) if factor_cols or B.shape[1] \
            else np.zeros((n_cells, 0))
        self.y = cells.ybar
        self.sw = np.sqrt(cells.n)
        self.Dw = self.D * self.sw[:, None]
        # the within-cell sum of squares: a constant residual of the weighted problem (zero derivative), so
        # the optimizer sees the per-run cost itself, and stops where the per-run fit stops
        self.ss = float(cells.ss.sum())
        self.within = math.sqrt(max(self.ss, 0.0))
        self.k, self.q = len(TERMS), self.R.shape[1]
        self.K = self.k + self.q  # the non-linear parameters: the costs (log) and the compute factors (log)
        self.X_compute, self.X_other = X[:, COMPUTE], X[:, ~COMPUTE]
        self._last: list = [None, None]  # the least squares asks for the value, then the derivatives, at one theta
        if self.D.shape[1]:
            u, sv, self.vt = np.linalg.svd(self.Dw, full_matrices=False)
            self.rank = int(np.sum(sv > sv[0] * 1e-10))
            self.D_pinv = (self.vt[:self.rank].T / sv[:self.rank]) @ u[:, :self.rank].T
        else:
            self.D_pinv, self.rank, self.vt = np.zeros((0, n_cells)), 0, np.zeros((0, 0))

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """theta's bounds: they keep a cost the data cannot see from wandering to -inf (it is then
        counted as no parameter)."""
        k, q = self.k, self.q
        return np.r_[np.full(k, -40.0), np.full(q, -5.0)], np.r_[np.full(k, 10.0), np.full(q, 5.0)]

    def priced(self, theta):
        """The priced seconds per cell: (compute terms, the others, the rate factor, the total), the
        last theta's kept."""
        at = theta.tobytes()
        last, k = self._last, self.k
        if last[0] != at:
            costs_ = np.exp(theta[:k])
            compute_s, other_s = costs_[COMPUTE] * self.X_compute, costs_[~COMPUTE] * self.X_other
            scale = np.exp(self.R @ theta[k:])
            compute = compute_s.sum(axis=1) * scale
            last[0], last[1] = at, (compute_s, other_s, scale, compute, compute + other_s.sum(axis=1))
        return last[1]

    def log_priced(self, theta):
        """log of the priced seconds per cell."""
        return np.log(self.priced(theta)[4])

    def nonlinear(self, theta):
        """log of the priced seconds per cell and its derivatives by theta."""
        compute_s, other_s, scale, compute, total = self.priced(theta)
        d_costs = np.empty((len(total), self.k))
        d_costs[:, COMPUTE] = compute_s * scale[:, None]
        d_costs[:, ~COMPUTE] = other_s
        d_costs /= total[:, None]
        d_rates = self.R * (compute / total)[:, None]
        return np.log(total), np.hstack([d_costs, d_rates])

    def residuals(self, p):
        """The weighted residual of each cell at all the parameters p (theta, then D's)."""
        return self.sw * (self.log_priced(p[:self.K]) + self.D @ p[self.K:] - self.y)

    def jacobian(self, p):
        """The residuals' derivatives by p."""
        return np.hstack([self.nonlinear(p[:self.K])[1], self.D]) * self.sw[:, None]

    def linear_part(self, theta):
        """The factors' and blocks' best values for theta."""
        return self.D_pinv @ (self.sw * (self.y - self.log_priced(theta)))

    def projected(self, theta):
        """The residuals at theta with the linear part at its best, and the within-cell constant."""
        left = self.sw * (self.y - self.log_priced(theta))
        return np.append(self.Dw @ (self.D_pinv @ left) - left, self.within)

    def projected_jac(self, theta):
        """projected()'s derivatives by theta."""
        d_log = self.nonlinear(theta)[1] * self.sw[:, None]
        return np.vstack([d_log - self.Dw @ (self.D_pinv @ d_log), np.zeros((1, d_log.shape[1]))])


def starting_points(problem: LogLeastSquares, cells: Cells, start: Model | None, lower, upper) -> list:
    """Where the search starts: `start`'s costs and rates (a model of nearly the same rows), else all
    time in the GEMM FLOPs at the median rate over the runs and the other costs small, from three
    shifts of them. exp() of a free parameter keeps each cost positive."""
    k, q = problem.k, problem.q
    rate = float(np.median(np.exp(cells.y_run) / problem.X[cells.cell_of, 0]))
    starts = []
    if start is not None and len(start.log_costs) == k:
        rates0 = [r for _, r in start.rates] if len(start.rates) == q else [0.0] * q
        starts.append(np.clip(np.r_[start.log_costs, rates0], lower + 1e-3, upper - 1e-3))
    else:
        for shift in (0.0, -2.0, -4.0):
            starts.append(np.r_[np.log([rate] + [rate * 0.05] * (k - 1)) + np.r_[0, [shift] * (k - 1)], np.zeros(q)])
    return starts


def best_costs(problem: LogLeastSquares, starts: list, lower, upper) -> np.ndarray:
    """theta of the least cost over the searches from `starts` (trust-region reflective, bounded)."""
    from scipy import optimize  # here, not with the module: SCIPY_WHERE_USED

    best = None
    for s0 in starts:
        sol = optimize.least_squares(problem.projected, s0, jac=problem.projected_jac, bounds=(lower, upper),
                                     method="trf", x_scale="jac", max_nfev=2000)
        if best is None or sol.cost < best.cost:
            best = sol
    return best.x


def covariance(problem: LogLeastSquares, p: np.ndarray, lower: np.ndarray,
               n_runs: int) -> tuple[np.ndarray, float, int, float]:
    """(the parameters' covariance s^2 (J'J)^-1 at p, s^2, the residual degrees of freedom, the residual
    sum of squares over the runs). A cost pushed to its lower bound is not identified: it counts as no
    parameter, and has no covariance."""
    J = problem.jacobian(p)
    lower = np.concatenate([lower, np.full(problem.D.shape[1], -np.inf)])
    n_params = len(p)
    active = np.array([not (i < problem.k and p[i] <= lower[i] + 1e-6) for i in range(n_params)])
    dof = max(n_runs - int(active.sum()), 1)
    res = problem.residuals(p)
    rss = float(res @ res) + problem.ss
    s2 = rss / dof
    Ja = J[:, active]
    cov = np.zeros((n_params, n_params))
    cov[np.ix_(active, active)] = s2 * np.linalg.pinv(Ja.T @ Ja)
    return cov, s2, dof, rss


def block_spread(block_params: np.ndarray, block_cov_diag: np.ndarray) -> float:
    """The spread of the block effects (the first block's 0 among them) beyond their own estimation
    noise (Kalibera & Jones' second level)."""
    gamma = np.concatenate([[0.0], block_params])
    block_noise = float(np.mean(block_cov_diag)) if len(gamma) > 1 else 0.0
    return max(float(np.var(gamma)) - block_noise, 0.0) if len(gamma) > 1 else 0.0


def rate_columns(groups: list, flops: np.ndarray, weights: np.ndarray | None = None) -> list:
    """The factor groups that get a rate: those with runs of one combination of settings (the same
    value of every factor) at sizes RATE_SPAN apart in FLOPs per step: NumPy at the base and JAX at 10x
    both record compile_cache=cold, but that is no second size of anything. Groups whose larger runs
    (beyond RATE_SPAN x their smallest) are the same runs cannot be told apart there (JAX's runs also
    record compile_cache=cold, attn_backend=manual), so they are one rate, the most specific group's
    (fewest runs): JAX's, not every setting it shares. `weights`: the runs each row stands for (cells)."""
    if not groups:
        return []
    w = np.ones(len(flops)) if weights is None else weights
    combination = np.column_stack([c for _, c in groups])
    by_large: dict[bytes, tuple] = {}
    for g, c in groups:
        spans = {}
        for i in np.flatnonzero(c):
            lo, hi = spans.get(combination[i].tobytes(), (np.inf, 0.0))
            spans[combination[i].tobytes()] = (min(lo, flops[i]), max(hi, flops[i]))
        if not any(hi >= RATE_SPAN * lo for lo, hi in spans.values()):
            continue
        large = ((c > 0) & (flops >= RATE_SPAN * flops[c > 0].min())).tobytes()
        if large not in by_large or (c * w).sum() < (by_large[large][1] * w).sum():
            by_large[large] = (g, c)
    return list(by_large.values())


def costs(model: Model) -> dict[str, float]:
    """Each term's fitted cost in seconds per unit (per FLOP, per element, per call, per step)."""
    return {t: float(math.exp(v)) / s for t, v, s in zip(TERMS, model.log_costs, _SCALE)}


CHECK_MAX_CONFIGS = 60  # the check: beyond this many configurations, an even sample of them (the quick preset has 63)
CHECK_MAX_RUNS = 3_000  # and beyond this many runs, the first passes (thin): one refit per configuration


def check(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The leave-one-configuration-out check as the report shows it and `predict` calibrates on, bounded
    for a fleet's machine: at most CHECK_MAX_CONFIGS configurations (evenly spaced in the order they
    first ran), refitted on the first passes (CHECK_MAX_RUNS runs). (entries, the rows it used)."""
    keep, used = check_share(rows)
    return check_on(keep, used), used


def check_share(rows: list[dict], configs: list[tuple] | None = None) -> tuple[set | None, list[dict]]:
    """What check() refits on: the configurations it predicts (None: every one) and the rows it uses.
    `configs`: distinct_config_keys(rows), where the caller knows it."""
    configs = distinct_config_keys(rows) if configs is None else configs
    keep = None
    if len(configs) > CHECK_MAX_CONFIGS:
        step = len(configs) / CHECK_MAX_CONFIGS
        keep = {configs[int(i * step)] for i in range(CHECK_MAX_CONFIGS)}
    return keep, thin(rows, CHECK_MAX_RUNS)


def check_on(keep: set | None, used: list[dict]) -> list[dict]:
    """check()'s entries from its share (check_share): the refits."""
    return leave_one_config_out(used, only=keep)


def leave_one_config_out(rows: list[dict], only: set | None = None, *, per_run: bool = False) -> list[dict]:
    """For each configuration of the rows (or those of `only`, config_key()s): its measured median step
    time (median of its runs) and the prediction of a model fitted without any of its runs; refused
    ones carry the reason instead. Refitted on the cells of the other configurations (fit_cells); `per_run`:
    every refit on the runs themselves (fit(per_run=True), the tests' reference)."""
    rows = [r for r in rows if r.get("status", "done") == "done" and r.get("step_ms_median")]
    # the cells once (each refit takes every configuration's but one), when no refit thins its rows
    cells = Cells(rows) if len(rows) <= FIT_MAX_RUNS and not per_run else None
    keys = [cells.keys[j] for j in cells.cell_of] if cells else config_keys(rows)
    llc_kb = next((float(r["l3_kb"]) for r in rows if r.get("l3_kb")), None)
    by_config: dict[tuple, list[dict]] = {}
    for key, r in zip(keys, rows):
        by_config.setdefault(key, []).append(r)
    # the whole fit (each refit's start) on those cells: fit(rows) would group the same runs again
    whole = fit_cells(cells, n_all=len(rows), llc_kb=llc_kb) if cells is not None else fit(rows, per_run=per_run)
    out = []
    for key, own in by_config.items():
        if only is not None and key not in only:
            continue
        measured = float(np.median([r["step_ms_median"] for r in own]))
        entry = {"config": own[0], "measured_ms": measured, "runs": len(own)}
        try:
            if cells is not None:
                rest = cells.without(key)
                if rest.n_runs < len(TERMS) + 1:
                    raise BenchError(f"{rest.n_runs} done runs on this machine: the cost model needs at least "
                                     f"{len(TERMS) + 1}")
                model = fit_cells(rest, start=whole, llc_kb=llc_kb)
            else:
                model = fit([r for k, r in zip(keys, rows) if k != key], start=whole, per_run=per_run)
            pred = model.predict(own[0])
        except BenchError as error:
            entry["refused"] = str(error)
        else:
            entry.update(predicted_ms=pred.step_ms, low_ms=pred.step_ms_low, high_ms=pred.step_ms_high,
                         error=pred.step_ms / measured - 1)
        out.append(entry)
    return out


# -- model error: the interval's share for what the model gets wrong, calibrated on leave-one-out ---
#
# The interval above counts the runs' noise and the parameters' uncertainty, not the model's own error:
# a form that misses something (a cache effect, a setting measured at one size) is as confident 200x
# beyond its data as at its centre. calibrate() adds a variance in log
#     tau0 + tau_size * d_size^2 + tau_set * d_set^2
# d_size: how far (log FLOPs per step) the configuration lies from the nearest measured run of any
# settings (a size beyond the data); d_set: from the nearest run sharing each of its settings, the
# largest (a setting carried beyond the sizes it ran at), fitted by maximum likelihood to the
# leave-one-configuration-out errors of the machine's own runs: each left-out configuration is a
# prediction at known distances from what the rest measured, with a known error. Two distances, because
# the two extrapolations fail differently: a bf16 model 4x beyond bf16's runs but among fp32 runs of its
# size borrows their shape, a model 5x beyond every run borrows nothing.

CALIBRATION_MIN = 5  # left-out configurations below which the model error stays unestimated (0)


def support_of(rows: list[dict]) -> dict:
    """What extrapolation_distances() measures from: per factor variable the rows' words, and their log
    FLOPs per step."""
    from common.compute import flops_per_step
    varied = factor_variables(rows) if rows else []
    return {"log_flops": np.log(np.array([float(flops_per_step(r)) for r in rows])),
            "words": {n: np.array(_words_of(column(rows, n))) for n in varied}}


def _words_of(values: list) -> list[str]:
    """[_word(v) for v in values], _word() once per distinct value."""
    words = {v: _word(v) for v in set(values)}
    return list(map(words.__getitem__, values))


def extrapolation_distances(config: dict, support: dict, keep: np.ndarray | None = None) -> tuple[float, float]:
    """(d_size, d_set) of `config` from the runs (the support's rows, those of `keep`): |log FLOPs| to the
    nearest run; and for each setting variable |log FLOPs| to the nearest run with the config's value of
    it, the largest (at least d_size). A bf16 model 38x the base, where bf16 ran at the base and at 11x and
    fp32 at 37x: (log(38/37), log(38/11))."""
    from common.compute import flops_per_step
    x = math.log(flops_per_step(config))
    lf = support["log_flops"]
    keep = np.ones(len(lf), bool) if keep is None else keep
    d_size = float(np.abs(lf[keep] - x).min()) if keep.any() else 0.0
    d_set = d_size
    for name, words in support["words"].items():
        same = keep & (words == _word(config.get(name)))
        if same.any():
            d_set = max(d_set, float(np.abs(lf[same] - x).min()))
    return d_size, d_set


def model_error_var(model: Model, config: dict) -> float:
    """The calibrated model-error variance (log) of a prediction of `config`; 0 uncalibrated."""
    if not any(model.model_error) or model.support is None:
        return 0.0
    d_size, d_set = extrapolation_distances(config, model.support)
    tau0, tau_size, tau_set = model.model_error
    return tau0 + tau_size * d_size ** 2 + tau_set * d_set ** 2


def calibrate(model: Model, rows: list[dict], loo: list[dict] | None = None) -> Model:
    """`model` (fitted on `rows`) with its model error estimated from the leave-one-configuration-out
    errors of the rows (leave_one_config_out(rows), or the `loo` entries a caller already has):
    maximum likelihood of log errors e_i ~ N(0, v_i + tau0 + tau_size d_size_i^2 + tau_set d_set_i^2),
    v_i each left-out prediction's own interval variance, d_i its distances from the rest; each tau >= 0.
    Too few predicted configurations: the model as it was. Returns the same model object, calibrated."""
    rows = [r for r in rows if r.get("status", "done") == "done" and r.get("step_ms_median")]
    if loo is None:
        loo = leave_one_config_out(rows)
    support = support_of(rows)
    keys = np.array([hash(k) for k in config_keys(rows)])
    got = [e for e in loo if "predicted_ms" in e]
    if len(got) < CALIBRATION_MIN:
        model.calibration_text = f"; model error not calibrated ({len(got)} configurations predictable left out)"
        return model
    t = _t_quantile(model.dof)
    e = np.array([math.log(x["predicted_ms"] / x["measured_ms"]) for x in got])
    v = np.array([(math.log(x["high_ms"] / x["predicted_ms"]) / t) ** 2 for x in got])
    d2 = np.array([extrapolation_distances(x["config"], support, keys != hash(config_key(x["config"])))
                   for x in got]) ** 2

    def nll(theta):
        var = v + math.exp(theta[0]) + d2 @ np.exp(theta[1:])
        return float(np.sum(np.log(var) + e * e / var))

    from scipy import optimize  # SCIPY_WHERE_USED

    best = min((optimize.minimize(nll, s0, method="Nelder-Mead") for s0 in ([-8.0] * 3, [-5.0, -3.0, -3.0])),
               key=lambda r: r.fun)
    # a variance the likelihood pushes to nothing is nothing
    model.model_error = tuple(float(math.exp(z)) if math.exp(z) > 1e-6 else 0.0 for z in best.x)
    model.support = support
    sd = [math.sqrt(x) for x in model.model_error]
    model.calibration_text = (f"; model error from {len(got)} configurations left out: sd {sd[0]:.3f} in the data, "
                              f"+ {sd[1]:.3f} per log FLOPs beyond every run, + {sd[2]:.3f} per log FLOPs beyond "
                              f"a setting's runs" if any(sd) else
                              f"; model error from {len(got)} configurations left out: none beyond the runs' noise")
    return model
