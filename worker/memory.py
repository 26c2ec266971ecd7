"""A job's peak training memory, estimated from its config before it runs, and the enqueue check
that refuses a sweep with a job this machine could not hold.

The estimate (bytes; every count from the resolved config):

    peak = FRAMEWORK_BASE + MARGIN * FRAMEWORK_FACTOR * (state + activations + logits)

    state        weights (every parameter, harness.param_counts, in the parameters' dtype: bf16 2
                 bytes, else 4) + gradient and optimizer state of each trainable one (AdamW two
                 moments, SGD one momentum); mixed adds autocast's bf16 weight copies (2 bytes a
                 parameter), q8/q4/bitnet/int8 a quantized copy (4, conservatively), finetune tasks
                 the loaded checkpoint (one more copy).
    activations  what backward keeps of one micro-batch (N = batch_size * seq_len tokens; grad_accum
                 does not add): per layer and token 4 d_model + 3 q_width + 2 kv_width + fc_out +
                 mlp_hidden values (swiglu: one more mlp_hidden), plus the attention probabilities,
                 n_heads * keys of them (keys = seq_len for full, window for local, 2 window for
                 sliding), except in torch's fused sdpa kernel (dropout 0, no GQA, full attention:
                 O(seq_len) per head); dropout adds its 1-byte masks. Times n_layers, plus the layer
                 being computed with 3 copies of its scores (scores, probabilities, gradient), plus
                 the embeddings' 2 N d_model. 2 bytes a value under bf16, else 4.
    logits       N * vocab_size * 16 bytes: the logits, their fp32 copy, log-softmax and gradient.
    FRAMEWORK_BASE   the child's RSS at a tiny config: interpreter, framework, tokenizer, data.
    FRAMEWORK_FACTOR JAX keeps more than the counts above (eager 1.56x measured, XLA 1.3x); torch and
                     NumPy 1.
    MARGIN       1.5: allocator fragmentation, temporaries no count names, and runs longer than the
                 three steps measured. Params-dominated models need it most: the d_model 2048 run
                 measured 1.02x its margin-less estimate, so a margin below ~1.2 could refuse too
                 little.

Validated against `bench.py once ... steps=2 warmup_steps=1 dataset=builtin --json` (peak_rss_mb:
the child's ru_maxrss) on the 2-vCPU development VM (23.5 GiB, torch 2.13.0+cpu): CALIBRATION
below, one row per config; estimate / measured ranges from 1.38 to 2.2, median 1.68, over torch
fp32/bf16/mixed/q8, AdamW and SGD, written-out and sliding attention, vocab 32768, d_model 2048,
32 layers, JAX eager and XLA, NumPy (tests/test_memory.py keeps every ratio between 1 and 4). The
estimate errs high on purpose: a refused job that would have fit costs a --mem-limit-gb; an
accepted one that does not costs a swapping or OOM-killed machine.

The check (check_plan) runs over a plan's combinations before the store is opened, so a refused
sweep writes nothing, not even a new database; it costs about a third of planning (0.14 s vs 0.40 s
for 4000 jobs) and estimates each distinct model once (cached by the variables it reads). The limit
is this machine's MemTotal (psutil), or `--mem-limit-gb` / BENCH_MEM_LIMIT_GB when the jobs will
run elsewhere (a pool of bigger nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from common import variables as V
from common.errors import BadInput
from worker.trainers import harness

MIB = 2**20
GIB = 2**30
# The child's peak RSS at d_model 128, 2 layers, seq 128, batch 8, vocab 2048 (where the tensors are
# ~75 MB), measured: torch 371-386 MB, JAX eager 672 (XLA 393), NumPy 105.
FRAMEWORK_BASE = {"torch": 400 * MIB, "jax": 700 * MIB, "numpy": 150 * MIB}
FRAMEWORK_FACTOR = {"jax": 1.6}
MARGIN = 1.5
LOGIT_BYTES = 16  # logits, fp32 copy, log-softmax, gradient: 4 bytes each
# The variables the estimate reads: its cache key and what a refusal names.
SHAPE = ("framework", "precision", "optimizer", "task", "lora_rank", "n_layers", "d_model", "n_heads", "head_dim",
         "kv_heads", "mlp_ratio", "activation", "attention", "window", "attn_backend", "dropout", "vocab_size",
         "seq_len", "batch_size")

# (config, peak_rss_mb measured by bench.py once ... steps=2 warmup_steps=1 dataset=builtin), the
# defaults filling the rest; tests/test_memory.py checks the estimate against each.
_MEDIUM = dict(d_model=512, n_layers=8, n_heads=8, seq_len=512, batch_size=8, vocab_size=8192)
CALIBRATION: tuple[tuple[dict, float], ...] = (
    (dict(d_model=128, n_layers=2, n_heads=4, seq_len=128, batch_size=8, vocab_size=2048), 371.2),
    (_MEDIUM, 2315.2),
    (dict(_MEDIUM, optimizer="sgd"), 2212.7),
    (dict(_MEDIUM, precision="bf16"), 1508.9),
    (dict(_MEDIUM, precision="mixed"), 1850.2),
    (dict(_MEDIUM, precision="q8"), 2853.7),
    (dict(_MEDIUM, framework="jax"), 5147.8),
    (dict(_MEDIUM, framework="jax", compile="xla"), 4142.5),
    (dict(d_model=256, n_layers=4, n_heads=8, seq_len=1024, batch_size=4, vocab_size=2048, attn_backend="manual"),
     1548.8),
    (dict(d_model=256, n_layers=4, n_heads=8, seq_len=2048, batch_size=4, vocab_size=2048, attn_backend="manual",
          attention="sliding", window=256), 1973.1),
    (dict(d_model=256, n_layers=2, n_heads=4, seq_len=512, batch_size=8, vocab_size=32768), 2148.8),
    (dict(d_model=2048, n_layers=2, n_heads=16, seq_len=128, batch_size=2, vocab_size=4096), 2196.1),
    (dict(d_model=256, n_layers=32, n_heads=4, seq_len=256, batch_size=8, vocab_size=4096), 1960.4),
    (dict(d_model=256, n_layers=4, n_heads=4, seq_len=256, batch_size=8, vocab_size=4096, framework="numpy"), 449.9),
)


@dataclass(frozen=True)
class Estimate:
    framework: int
    factor: float
    state: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.framework + int(MARGIN * self.factor * (self.state + self.activations + self.logits))

    def describe(self) -> str:
        gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731 - a one-line formatter
        return (f"{gib(self.total)} GiB (framework {gib(self.framework)} + {MARGIN * self.factor:g} x (weights, "
                f"gradients and optimizer {gib(self.state)} + activations {gib(self.activations)} + logits "
                f"{gib(self.logits)}))")


def _score_copies(c: dict) -> int:
    """Copies of the attention scores backward keeps per layer: none in torch's fused sdpa kernel
    (dropout 0, no GQA, full attention: it keeps O(seq_len) per head), else the probabilities."""
    fused = (c["framework"] == "torch" and c["attn_backend"] == "sdpa" and c["dropout"] == 0
             and c["kv_heads"] == c["n_heads"] and c["attention"] == "full")
    return 0 if fused else 1


def estimate(c: dict) -> Estimate:
    """The peak memory of a resolved config's training run (see the module docstring)."""
    value = 2 if c["precision"] == "bf16" else 4
    counts = harness.param_counts(c)
    extra = {"mixed": 2, "q8": 4, "q4": 4, "bitnet": 4, "int8": 4}.get(c["precision"], 0)
    extra += value if c["task"] != "pretrain" else 0  # the loaded checkpoint
    per_trainable = value * (3 if c["optimizer"] == "adamw" else 2)  # gradient + moments / momentum
    state = counts["params"] * (value + extra) + counts["trainable_params"] * per_trainable

    C, T = c["d_model"], c["seq_len"]
    tokens = c["batch_size"] * T
    hidden = harness.mlp_hidden(c)
    swiglu = c["activation"] == "swiglu"
    fc_out = 2 * hidden if swiglu else hidden
    q, kv = c["n_heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    keys = {"full": T, "local": min(c["window"], T), "sliding": 2 * min(c["window"], T)}[c["attention"]]
    scores = c["n_heads"] * keys
    layer = value * (4 * C + 3 * q + 2 * kv + fc_out + (2 if swiglu else 1) * hidden)  # per token
    if c["dropout"] > 0:
        layer += 2 * C + scores  # bool masks: residual, MLP, attention probabilities
    saved = layer + value * _score_copies(c) * scores
    live = layer + value * 3 * scores  # the layer being computed: scores, probabilities, their gradient
    activations = tokens * (c["n_layers"] * saved + live + 2 * C * value)
    logits = tokens * c["vocab_size"] * LOGIT_BYTES
    framework = c["framework"]
    r = int(c.get("ranks", 1))  # data parallelism: every rank on this machine holds all of it for its micro-batch
    return Estimate(r * FRAMEWORK_BASE[framework], FRAMEWORK_FACTOR.get(framework, 1.0), r * state, r * activations,
                    r * logits)


def machine_limit(limit_gb: float | None) -> tuple[int, str]:
    """Bytes a job may use and where that figure comes from."""
    if limit_gb is not None:
        if not 0 < limit_gb < float("inf"):
            raise BadInput(f"--mem-limit-gb {limit_gb:g}: expected a positive number of GiB")
        return int(limit_gb * GIB), f"the limit of {limit_gb:g} GiB given (--mem-limit-gb / BENCH_MEM_LIMIT_GB)"
    total = psutil.virtual_memory().total
    return total, f"this machine's {total / GIB:.1f} GiB (MemTotal; --mem-limit-gb to plan for other machines)"


def check(configs: Iterable[dict], limit: int, where: str, label: str) -> int:
    """The largest estimate over the resolved configs (bytes); BadInput naming the first config over
    `limit` (bytes, described by `where`), its estimate, and how many of them are over."""
    cache: dict[tuple, int] = {}
    worst, first, over = 0, None, 0
    for config in configs:
        key = tuple(config[name] for name in SHAPE)
        need = cache.get(key)
        if need is None:
            need = cache[key] = estimate(config).total
            if need > limit:
                over += 1
                first = first or config
        worst = max(worst, need)
    if first is not None:
        shape = " ".join(f"{name}={first[name]}" for name in SHAPE)
        more = f"; {over - 1} more configuration(s) too" if over > 1 else ""
        raise BadInput(f"{label}: the job {shape} needs about {estimate(first).describe()} of memory, more than "
                       f"{where}{more}: refused, nothing written; shrink it (batch_size, seq_len, d_model, "
                       f"vocab_size) or leave it out")
    return worst


def check_plan(plan, limit: int, where: str) -> int:
    """check() over a sweep plan's combinations (each resolved once, repeats aside; violators skipped)."""
    resolved = (V.resolve(combo, plan.cpu_count) for _block, combo in plan.combinations())
    return check((config for config, why in resolved if not why), limit, where, f"sweep {plan.name} ({plan.source})")
