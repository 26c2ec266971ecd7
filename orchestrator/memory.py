"""A job's peak training memory, estimated from its config before it runs, and the enqueue check
that refuses a sweep with a job this machine could not hold.

The estimate (bytes; every count from the resolved config, nothing measured):

    peak = framework_base + MARGIN * (state + activations + logits)

    state        P * bytes per parameter: weights + gradients + optimizer state (AdamW two moments,
                 SGD one momentum), each in the parameters' dtype (bf16: 2 bytes, else 4); mixed adds
                 autocast's bf16 weight copies (2), q8/q4/bitnet/int8 a quantized copy of the
                 weights (4, conservatively); finetune tasks one more copy (the loaded checkpoint).
                 P is counted exactly as worker/trainers/params.param_shapes lays the model out.
    activations  what backward keeps of one micro-batch (N = batch_size * seq_len tokens), per layer
                 N * (4 d_model + 3 q_width + 2 kv_width + fc_out + 2 mlp_hidden) values, plus the
                 attention scores N * n_heads * keys * copies, keys = seq_len (full), window (local)
                 or 2 window (sliding); copies = 3 when written out (manual, JAX, NumPy), 2 with
                 sdpa's math kernel, 0 with torch's fused sdpa kernel (dropout 0, no GQA, full
                 attention: it keeps O(seq_len) per head); dropout adds its 1-byte masks. Times
                 n_layers + 1 (backward's gradient of one layer is live beside them), plus the
                 embeddings' 2 N d_model; 2 bytes a value under bf16, else 4.
    logits       N * vocab_size * 16 bytes: the logits, their fp32 copy, log-softmax and its
                 gradient.
    MARGIN       allocator fragmentation and the temporaries no count above names.

framework_base is the child's measured RSS at a tiny config (torch, JAX, NumPy imports and the data).

Validated against `bench.py once ... steps=1 warmup_steps=0 dataset=builtin --json` (peak_rss_mb,
the child's ru_maxrss) on a 2-vCPU VM, ratio estimate / measured: see CALIBRATION below. The
estimate is meant to err high (never refuse less than the truth), so the ratio is >= 1 on every
measured config.

The check compares the largest estimate of a plan with the memory a job may use: this machine's
MemTotal (psutil), or `--mem-limit-gb` / BENCH_MEM_LIMIT_GB when the jobs will run elsewhere (a
pool of bigger nodes). Estimates are cached by the variables they read, so a sweep that varies only
system settings estimates one model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from orchestrator import variables as V
from orchestrator.errors import BadInput
from worker.trainers import harness

MIB = 2**20
GIB = 2**30
# The child's peak RSS at a tiny config (d_model 64-128, 2 layers), measured on the 2-vCPU VM:
# interpreter, framework import, tokenizer and data.
FRAMEWORK_BASE = {"torch": 400 * MIB, "jax": 600 * MIB, "numpy": 150 * MIB}
MARGIN = 1.5
LOGIT_BYTES = 16  # logits, fp32 copy, log-softmax, gradient: 4 bytes each
# The variables the estimate reads: its cache key and what a refusal names.
SHAPE = ("framework", "precision", "optimizer", "task", "lora_rank", "n_layers", "d_model", "n_heads", "head_dim", "kv_heads",
         "mlp_ratio", "activation", "attention", "window", "attn_backend", "dropout", "vocab_size", "seq_len",
         "batch_size")

# bench.py once ... steps=1 warmup_steps=0 dataset=builtin: (config, measured peak_rss_mb); filled by
# the calibration runs and checked by tests/test_memory.py (estimate >= measured).
CALIBRATION: tuple[tuple[dict, float], ...] = (
    (dict(d_model=128, n_layers=2, n_heads=4, seq_len=128, batch_size=8, vocab_size=2048), 385.8),
    (dict(d_model=512, n_layers=8, n_heads=8, seq_len=512, batch_size=8, vocab_size=8192), 2022.3),
)


@dataclass(frozen=True)
class Estimate:
    framework: int
    state: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.framework + int(MARGIN * (self.state + self.activations + self.logits))

    def describe(self) -> str:
        gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
        return (f"{gib(self.total)} GiB (framework {gib(self.framework)} + {MARGIN:g} x (weights, gradients and "
                f"optimizer {gib(self.state)} + activations {gib(self.activations)} + logits {gib(self.logits)}))")


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
    return Estimate(FRAMEWORK_BASE[c["framework"]], state, activations, logits)


def machine_limit(limit_gb: float | None) -> tuple[int, str]:
    """Bytes a job may use and where that figure comes from."""
    if limit_gb is not None:
        if not limit_gb > 0:
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
    resolved = (V.resolve(combo, plan.cpu_count) for combo in plan.combinations())
    return check((config for config, why in resolved if not why), limit, where, f"sweep {plan.name} ({plan.source})")
