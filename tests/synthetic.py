"""A made-up machine with a known law of step time, for testing the statistics end to end.

The real `quick` preset is planned (orchestrator.queue.sweep.load with a fixed 2-CPU Machine) and enqueued
through the real Store; every job then gets a step time from LAW with multiplicative noise and is
finished through the Store, as a worker would. The awkward cases are built in:
- followers: threads follow cores, head_dim and kv_heads follow d_model / n_heads, and the preset
  also varies omp_threads, head_dim and kv_heads on their own axes, with effects of their own;
- unequal noise: one level (NOISY) is far noisier than the rest;
- correlated repeats: every run of a repeat pass shares that pass's drift (DRIFT);
- heavy tails (build(tail=TAIL)): a share of runs is slowed by 20-100% and no sensor saw it;
- disturbed runs (build(disturbed=DISTURBED)): a share of runs is slowed as much, and their
  `other_cpu_s` says another process took 40% of the job's CPUs during the window.

`truth()` says what each comparison of the report should find: the ratio of a value's step time to
the baseline's, and the elasticity of size-like variables, with their followers at derived values.
"""

from __future__ import annotations

import math
import os
import random

from orchestrator.queue.store import Store
from orchestrator.queue.sweep import JOINT, Machine, load
from tests.conftest import done_fields

CPUS = 2
BASE_MS = 40.0

# Power laws: step time ~ value^exponent, per variable, holding everything else.
POWER = {
    "cores": -0.1,  # with omp_threads^-0.7 below: -0.8 when the threads follow cores
    "omp_threads": -0.7,
    "d_model": 1.2,  # with head_dim^0.3: 1.5 when head_dim follows d_model
    "head_dim": 0.3,
    "n_heads": 0.4,  # with head_dim^0.3 and kv_heads^0.1: 0.4 - 0.3 + 0.1 = 0.2 when they follow
    "kv_heads": 0.1,
    "n_layers": 0.9,
    "mlp_ratio": 0.4,
    "vocab_size": 0.3,
    "seq_len": 1.1,
    "batch_size": 0.85,
    "grad_accum": 1.0,
}
# The quick base's values: BASE_MS is the step time there.
REFERENCE = {"cores": 2, "omp_threads": 2, "d_model": 64, "head_dim": 16, "n_heads": 4, "kv_heads": 4, "n_layers": 2,
             "mlp_ratio": 4.0, "vocab_size": 1024, "seq_len": 64, "batch_size": 8, "grad_accum": 1}
# Factors on the step time of a value, relative to the catalogue value of the quick base; values
# not listed (pin_threads, numa, allocator, onednn, optimizer, task, dataset, dropout, ...) have
# no effect at all: the report must not call them significant more often than it says.
FACTOR = {
    ("isa", "baseline"): 2.0, ("isa", "avx2"): 1.3,
    ("framework", "jax"): 1.5, ("framework", "numpy"): 3.0,
    ("compile", "inductor"): 0.7,
    ("attn_backend", "manual"): 1.3, ("attn_backend", "sdpa_math"): 1.1,
    ("activation", "relu"): 0.95, ("activation", "swiglu"): 1.15,
    ("attention", "local"): 0.8, ("attention", "sliding"): 0.9,
    ("precision", "bf16"): 1.6, ("precision", "mixed"): 1.3, ("precision", "int8"): 1.25,
    ("precision", "q4"): 1.25, ("precision", "bitnet"): 1.4,
}
# Written out here, not taken from the code under test: what follows what when left on "auto".
FOLLOWS = {"cores": ("omp_threads", "intra_threads", "inter_threads"), "omp_threads": ("intra_threads",),
           "d_model": ("head_dim",), "n_heads": ("head_dim", "kv_heads"),
           "optimizer": ("lr",), "max_tokens": ("eval_every",),  # lr: the optimizer's stated default
           # on jax/numpy the torch-only variables say what runs there (variables.elsewhere()); blas
           # is each framework's own library (variables.BLAS_OF)
           "framework": ("attn_backend", "onednn", "fusion", "compile_cache", "compile", "blas")}
SIGMA = 0.02  # run-to-run noise of log step time (2%): a quiet machine, apart from the drift
NOISY = ("precision", "bf16")  # this level's runs are far noisier
NOISY_SIGMA = 0.15
DRIFT = (0.0, 0.12, -0.08)  # log step time added to every run of pass 0, 1, 2 (the VM's slow drift)
# (share of runs, lowest and highest log slow-down): slow runs no sensor saw, as on the shared VM
# (the adaptive runs there: 5 of 20 runs of one value 40-50% slower, other_cpu_s ~0).
TAIL = (0.06, math.log(1.2), math.log(2.0))
DISTURBED = (0.05, math.log(1.2), math.log(2.0))  # runs slowed by another process the sensors saw
TRAIN_S = 3.0  # every synthetic run's timed window, in seconds


def law(config: dict) -> float:
    """The true (noise-free, drift-free) step time of a config, in ms."""
    log_t = math.log(BASE_MS)
    for name, exponent in POWER.items():
        log_t += exponent * math.log(float(config[name]) / REFERENCE[name])
    for (name, value), factor in FACTOR.items():
        if config[name] == value:
            log_t += math.log(factor)
    return math.exp(log_t)


def sigma_of(config: dict) -> float:
    return NOISY_SIGMA if config[NOISY[0]] == NOISY[1] else SIGMA


def plan():
    return load(preset="quick", machine=Machine(cpu_count=CPUS, freq_limits=None))


def base_config() -> dict:
    """The quick preset's [base], resolved on the 2-CPU machine (repeat left out)."""
    from common import variables as V
    from orchestrator.queue.sweep import preset_path, read_sweep_file

    doc, _ = read_sweep_file(preset_path("quick"))
    partial = {k: V.parse_value(k, v) for k, v in doc["base"].items()}
    config, why = V.resolve(partial, CPUS)
    assert not why, why
    config.pop("repeat")
    return config


def truth_by_label() -> dict[tuple, float]:
    """truth() keyed as the effects table writes it: (kind, variable, value as text or None)."""
    from orchestrator.stats import effects as fx

    return {(kind, name, None if v is None else fx.label(name, fx.value_of(name, v))): t
            for (kind, name, v), t in truth(base_config()).items()}


def facts(name: str = "synthetic") -> dict:
    return {"fingerprint": f"fp-{name}", "hostname": name, "cpu_model": "Synthetic CPU", "vendor": "GenuineIntel",
            "sockets": 1, "physical_cores": CPUS, "logical_cores": CPUS, "numa_nodes": 1, "isa_flags": "avx2 avx512f",
            "kernel": "6.1.0-test"}


def step_ms(config: dict, rng: random.Random, drift: tuple = DRIFT) -> float:
    shift = drift[config["repeat"]] if config["repeat"] < len(drift) else 0.0
    return law(config) * math.exp(shift + rng.gauss(0.0, sigma_of(config)))


def slowed(rng: random.Random, share_low_high: tuple | None) -> float | None:
    """The log slow-down of one run: None (not hit), or with the given share a uniform draw in [low, high]."""
    if share_low_high is None:
        return None
    share, low, high = share_low_high
    return rng.uniform(low, high) if rng.random() < share else None


def metrics(config: dict, ms: float) -> dict:
    tokens = config["seq_len"] * config["batch_size"] * config["grad_accum"]
    return {"step_ms_median": ms, "step_ms_p10": ms * 0.96, "step_ms_p90": ms * 1.05, "step_ms_std": ms * 0.03,
            "tokens_per_s": tokens / (ms / 1000), "wall_s": 3.0, "params": 1000, "loss_first": 7.0, "loss_last": 6.5}


def build(store: Store, seed: int = 0, *, dataset_used=lambda config: config["dataset"], repeats: int | None = None,
          drift: tuple = DRIFT, tail: tuple | None = None, disturbed: tuple | None = None) -> int:
    """Enqueue the quick preset into `store` and finish every job with a step time from the law;
    the machine id. `dataset_used(config)` says what each run really trained on; `tail` and
    `disturbed` ((share, low, high) log slow-downs, e.g. TAIL and DISTURBED) slow a share of runs,
    unseen or seen by other_cpu_s."""
    p = load(preset="quick", repeats=repeats, machine=Machine(cpu_count=CPUS, freq_limits=None))
    # The quick preset's joint block (the cost model's) enters no comparison (effects.analyse leaves
    # it out): these tests are about the comparisons, and without its jobs every other job draws the
    # noise it drew before the block existed.
    jobs = [j for j in p.jobs if j["block"] != JOINT]
    store.enqueue(name=p.name, source=p.source, sweep_text=p.text, jobs=jobs, notes=p.notes)
    machine_id = store.register_machine(facts())
    finish_queued(store, machine_id, random.Random(seed), drift=drift, tail=tail, disturbed=disturbed,
                  dataset_used=dataset_used)
    return machine_id


def finish_queued(store: Store, machine_id: int, rng: random.Random, *, drift: tuple = DRIFT, tail: tuple | None = None,
                  disturbed: tuple | None = None, dataset_used=lambda config: config["dataset"]) -> int:
    """Claim and finish every queued job as a worker of the synthetic machine would; the runs finished."""
    finished = 0
    while (claim := store.claim(machine_id, pid=os.getpid(), host="synthetic", max_cores=CPUS)) is not None:
        c = claim.config
        unseen, seen = slowed(rng, tail), slowed(rng, disturbed)
        ms = step_ms(c, rng, drift) * math.exp((unseen or 0.0) + (seen or 0.0))
        fields = {**done_fields(**metrics(c, ms)), "dataset_used": dataset_used(c),
                  "applied": {"torch_threads": c["intra_threads"], "interop_threads": c["inter_threads"]}}
        if tail is not None or disturbed is not None:  # the sensors' view of the window
            other = 0.4 if seen is not None else 0.002  # share of the job's CPU time another process took
            fields.update(train_s=TRAIN_S, steal_s=0.0, other_cpu_s=other * TRAIN_S * c["cores"])
        store.finish(claim.run_id, pid=os.getpid(), status="done", fields=fields)
        finished += 1
    return finished


def job_seconds(config: dict) -> float:
    """What a synthetic job costs a budget: its steps at the law's step time and a fixed overhead."""
    return 0.3 + law(config) / 1e3 * (config["steps"] + config["warmup_steps"])


def truth(base: dict) -> dict[tuple, float]:
    """The true effects around the quick base config (resolved): ("ratio", variable, value) -> the
    step-time ratio of that value to the base, and ("elasticity", variable, None) -> the exponent,
    with the variable's followers at their derived values."""
    from common import variables as V

    out = {}
    p = plan()
    axes = {}
    bases = {}  # an axis that carries its own changes to the base (lora_rank on task=finetune_lora)
    for job in p.jobs:  # each job's one varied variable; what follows it moved along
        c = job["config"]
        differ = {n for n in V.NAMES if n != "repeat" and c[n] != base[n]}
        roots = {n for n in differ if not any(n in FOLLOWS.get(m, ()) for m in differ)}
        if roots == {"lora_rank", "task"} or (roots == {"task"} and job.get("block") == "lora_rank"):
            bases["lora_rank"] = {"task": c["task"]}
            roots = {"lora_rank"}
        if len(roots) == 1:
            (n,) = roots
            axes.setdefault(n, set()).add(c[n])
    for name, values in axes.items():
        own = {**_partial(base), **bases.get(name, {})}
        ref, _ = V.resolve(own, CPUS)
        for v in values:
            config, why = V.resolve({**own, name: v}, CPUS)
            assert not why, (name, v, why)
            if name in bases and v == V.BY_NAME[name].default:
                continue  # the axis's own baseline
            out[("ratio", name, v)] = law(config) / law(ref)
        if (name in POWER or name in ("cores", "d_model", "n_heads", "lora_rank")) and len(values | {base[name]}) >= 3:
            # (a size tried at two values has only its ratio: the same test is not made twice)
            xs = sorted(values | {base[name]})
            ys = []
            for v in xs:
                config, _ = V.resolve({**own, name: v}, CPUS)
                ys.append(math.log(law(config)))
            lx = [math.log(x) for x in xs]
            mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
            out[("elasticity", name, None)] = (sum((a - mx) * (b - my) for a, b in zip(lx, ys))
                                               / sum((a - mx) ** 2 for a in lx))
    return out


def _partial(base: dict) -> dict:
    """The base as the user wrote it: the derived values left on their words again."""
    from common import variables as V

    out = dict(base)
    for name in ("omp_threads", "intra_threads", "inter_threads", "head_dim", "kv_heads", "blas"):
        out[name] = V.AUTO
    for name in V.TORCH_ONLY:  # left unset, as the preset does: they follow the framework
        out.pop(name)
    out.pop("repeat", None)
    return out
