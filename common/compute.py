"""What a configuration computes, where the catalogue (constraints at enqueue), the trainers, the ETA,
the memory estimate and the cost model need to know: its Linear layers' shapes, the int4 kernel's
limits, which precisions are still simulated, what no variable offers, and the exact counts: parameters
(param_counts), training FLOPs per step (flops_per_step) and the operations of one step with their
shapes, FLOPs and memory-bound elements (operations: what the cost model, orchestrator/stats/cost_model.py,
prices one by one). Imports nothing from the project: one formula for every part.
"""

from __future__ import annotations

from dataclasses import dataclass

# What no variable offers, and why: `bench.py machine` and docs/backends.md say so.
NOT_OFFERED = {
    "ipex": "Intel Extension for PyTorch is not offered: its last release targets torch 2.8, and an IPEX built "
            "for another torch refuses to load into this project's torch 2.13",
    "distributed=ccl": "oneCCL's torch bindings (oneccl_bind_pt, backend 'ccl') are not offered: they are not on "
                       "PyPI (Intel's own wheel index only), each release is built for one torch version and none "
                       "for torch 2.13; PyPI's oneccl runtime is the C library alone, no torch backend. Ranks "
                       "all-reduce over gloo",
}
# Precisions whose arithmetic is still a simulation, and what really runs: every place that names the
# mode (the report's tables, the plots) says so next to it; runs.gemm_format records each run's own words.
# q8 enqueues as int8 since release 6 (variables.PRECISION_ALIASES): only older runs are q8.
SIMULATED = {"q8": "simulated: fp32 GEMMs"}
# The int4 weight-only CPU kernel (torch.ops.aten._weight_int4pack_mm_for_cpu, precision=q4) packs
# each Linear's weight in groups of INT4_GROUP inputs and needs output widths divisible by
# INT4_N_MULTIPLE; a config whose widths it cannot take is refused at enqueue (int4_unsupported).
INT4_GROUP = 32  # the smallest group the kernel takes: the closest to per-weight scales
INT4_N_MULTIPLE = 16


def mlp_hidden(config: dict) -> int:
    """MLP hidden width. swiglu has three matrices instead of two, so its hidden width is 2/3 of
    mlp_ratio * d_model: the parameter count stays that of the two-matrix MLP (LLaMA's rule)."""
    if config["activation"] == "swiglu":
        return int(2 / 3 * config["mlp_ratio"] * config["d_model"])
    return int(config["mlp_ratio"] * config["d_model"])


def linear_shapes(config: dict) -> list[tuple[str, int, int]]:
    """(name, inputs, outputs) of each block's Linear layers: qkv, attention out, MLP in, MLP out."""
    d, hidden = config["d_model"], mlp_hidden(config)
    q_width = config["n_heads"] * config["head_dim"]
    kv_width = config["kv_heads"] * config["head_dim"]
    fc_out = 2 * hidden if config["activation"] == "swiglu" else hidden
    return [("attn.qkv", d, q_width + 2 * kv_width), ("attn.proj", q_width, d), ("mlp.fc", d, fc_out),
            ("mlp.proj", hidden, d)]


def int4_unsupported(config: dict) -> str | None:
    """Why precision=q4's int4 kernel cannot take this config's Linear shapes, or None."""
    for name, n_in, n_out in linear_shapes(config):
        if n_out % INT4_N_MULTIPLE or n_in % INT4_GROUP:
            return (f"precision=q4 needs Linear outputs divisible by {INT4_N_MULTIPLE} and inputs by {INT4_GROUP} "
                    f"(the int4 CPU kernel)")
    return None

# The precisions whose LoRA adapters run merged into the frozen weight (model.py's MergedLoRA: plain
# Linear bases of the weights' own dtype, no autocast); the others run the adapter as a second path.
MERGED_LORA_PRECISIONS = ("fp32", "bf16")


# -- analytic counts: from the config alone, the same for every framework ----------------------


def block_matmul_params(config: dict) -> int:
    """The weights of one block's Linear layers: fused QKV, attention out, MLP in (x2 for swiglu), MLP out."""
    d, hidden = config["d_model"], mlp_hidden(config)
    q_width = config["n_heads"] * config["head_dim"]
    kv_width = config["kv_heads"] * config["head_dim"]
    fc_out = 2 * hidden if config["activation"] == "swiglu" else hidden
    return d * (q_width + 2 * kv_width) + q_width * d + d * fc_out + hidden * d


def matmul_params(config: dict) -> int:
    """Weights that take part in a matmul: every Linear of the blocks, plus the head (vocab x d).
    Embedding lookups, positions and LayerNorm gains are not GEMMs."""
    return config["n_layers"] * block_matmul_params(config) + config["vocab_size"] * config["d_model"]


def lora_params(config: dict) -> int:
    """The adapter weights of task=finetune_lora: rank r pairs (A: r x in, B: out x r) on each
    block's qkv, attention out, MLP in and MLP out; 0 for any other task."""
    if config.get("task") != "finetune_lora":
        return 0
    d, hidden, r = config["d_model"], mlp_hidden(config), config["lora_rank"]
    q_width = config["n_heads"] * config["head_dim"]
    qkv_out = q_width + 2 * config["kv_heads"] * config["head_dim"]
    fc_out = 2 * hidden if config["activation"] == "swiglu" else hidden
    return config["n_layers"] * r * ((d + qkv_out) + (q_width + d) + (d + fc_out) + (hidden + d))


def param_counts(config: dict) -> dict:
    """params: every weight, the tied head counted once (token and position embeddings, the blocks'
    Linear weights, 2 LayerNorm gains per block and the final one; no biases; LoRA adapters included).
    trainable_params: the ones the optimizer updates (all of them when pretraining or finetuning all
    weights; only the adapters with task=finetune_lora)."""
    d = config["d_model"]
    params = (config["vocab_size"] * d + config["seq_len"] * d
              + config["n_layers"] * (block_matmul_params(config) + 2 * d) + d)
    lora = lora_params(config)
    return {"params": params + lora, "trainable_params": lora or params}


def attended_positions(kind: str, seq_len: int, window: int) -> int:
    """How many (query, key) pairs the attention mask allows, summed over the sequence: never the
    future; local: only inside the query's block of `window` tokens; sliding: the last `window`."""
    def tri(n: int) -> int:
        return n * (n + 1) // 2

    if kind == "full" or window >= seq_len and kind == "sliding":
        return tri(seq_len)
    if kind == "local":
        full_blocks, rest = divmod(seq_len, window)
        return full_blocks * tri(window) + tri(rest)
    assert kind == "sliding", kind
    return tri(window) + (seq_len - window) * window


def flops_per_step(config: dict) -> int:
    """Training FLOPs of one optimizer step (forward + backward), counted like PaLM / nanoGPT:

        tokens        = batch_size * grad_accum * seq_len
        flops_per_step = 6 * N_matmul * tokens
                       + 12 * n_layers * n_heads * head_dim * A * batch_size * grad_accum

    N_matmul = matmul_params(): 2 FLOPs per weight per token forward, 4 backward. Attention scores
    (QK^T) and the weighted sum (AV) are each 2 * head_dim FLOPs per query head per attended
    (query, key) pair forward, x3 with backward: 12 * n_heads * head_dim per pair. A =
    attended_positions(): only pairs the mask allows count (T(T+1)/2 for full causal, fewer for
    local/sliding windows), so this counts useful work, not the masked half a kernel may compute.
    GQA shrinks the K/V projections (fewer matmul weights) but not the score/sum work: that follows
    the query heads. Elementwise work (softmax, norms, activations, optimizer) is not counted.

    With task=finetune_lora only what runs is counted. Every frozen matrix does its forward (2) and
    input-gradient (2) GEMMs but no weight-gradient GEMM; the first block's qkv (qkv_0 weights) needs
    no input gradient either, since nothing below it trains. The adapters (N_lora = lora_params()
    weights, rank r) run in one of two forms (worker/trainers/torch/model.py, LoRALinear):
      merged (fp32, bf16: MergedLoRA), x (W + B A)^T: per token x A^T forward (2 r in), and dB, g B,
        dA backward (2 r out, 2 r out, 2 r in): 4 FLOPs per adapter weight, no input gradient of
        their own (it is folded into the merged GEMM); plus the merge W + B A itself, 2 r in out per
        adapted matrix once per micro-batch (M_blocks = n_layers * block_matmul_params()):
            (4 N_matmul - 2 qkv_0 + 4 N_lora) * tokens + 2 r M_blocks * grad_accum + attention
      two paths (mixed's autocast, quantized bases), x W^T + (x A^T) B^T: forward, input and weight
        gradients of both factors (6 per adapter weight), less the first qkv adapter's input
        gradient (2 r d):
            (4 N_matmul - 2 qkv_0 + 6 N_lora - 2 r d_model) * tokens + attention
    """
    sequences = config["batch_size"] * config["grad_accum"]
    tokens = sequences * config["seq_len"]
    pairs = attended_positions(config["attention"], config["seq_len"], config["window"])
    attention = 12 * config["n_layers"] * config["n_heads"] * config["head_dim"] * pairs * sequences
    n_lora = lora_params(config)
    if not n_lora:
        return 6 * matmul_params(config) * tokens + attention
    d, r = config["d_model"], config["lora_rank"]
    qkv_0 = d * (config["n_heads"] + 2 * config["kv_heads"]) * config["head_dim"]
    if config["precision"] in MERGED_LORA_PRECISIONS:
        merges = 2 * r * config["n_layers"] * block_matmul_params(config) * config["grad_accum"]
        return (4 * matmul_params(config) - 2 * qkv_0 + 4 * n_lora) * tokens + merges + attention
    per_token = 4 * matmul_params(config) - 2 * qkv_0 + 6 * n_lora - 2 * r * d
    return per_token * tokens + attention



# -- the operations of one step: what the cost model prices -------------------------------------


@dataclass(frozen=True)
class Op:
    """One kind of kernel call of a training step, `calls` times per step.

    kind: "gemm" (a Linear's forward, input-gradient or weight-gradient GEMM, an adapter's, the LM
    head's: m x k times k x n), "attention" (the scores QK^T and the weighted sum AV, forward and
    backward, `batch` small GEMMs of m x k times k x n per call) or "memory" (elementwise and
    reduction work that streams `elements` values: norms, activations, residual adds, softmax,
    dropout, the loss, the optimizer update; it costs bandwidth, not FLOPs).
    flops: per call, counted as flops_per_step counts them (the GEMM ops of a step sum to it exactly).
    elements: values one call reads and writes (for a GEMM its three matrices, m k + k n + m n per
    batch element: what it moves when it does not fit in cache).
    """
    name: str
    kind: str
    calls: int
    flops: int = 0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    elements: int = 0


def _gemm(name: str, calls: int, m: int, n: int, k: int, batch: int = 1, kind: str = "gemm") -> Op:
    return Op(name, kind, calls, 2 * m * n * k * batch, m, n, k, batch, batch * (m * k + k * n + m * n))


def operations(config: dict) -> list[Op]:
    """The operations of one optimizer step of `config` (forward, backward, optimizer), per kind of
    call. sum(op.calls * op.flops) == flops_per_step(config) (tests/test_flops.py checks it).

    Per micro-batch of M = batch_size * seq_len tokens, each trained Linear (n_in -> n_out) runs its
    forward GEMM (M x n_in times n_in x n_out), its input gradient (M x n_out times n_out x n_in) and
    its weight gradient (n_out x M times M x n_in); a frozen one (task=finetune_lora) no weight
    gradient, and the first block's qkv no input gradient when nothing below it trains. Attention's
    scores and weighted sum are batch_size * n_heads GEMMs of seq_len x head_dim times head_dim x
    (attended keys per query, on average), three times over (forward, two gradients). Elementwise
    work is counted in values streamed, by what the model does (worker/trainers/torch/model.py): two
    LayerNorms, two residual adds, the activation (and swiglu's gate), dropout where p > 0, the softmax
    of the attended pairs, the loss over M x vocab logits, and the optimizer's pass over the trained
    weights.
    """
    b, t, accum, layers = config["batch_size"], config["seq_len"], config["grad_accum"], config["n_layers"]
    d, vocab, heads, hd = config["d_model"], config["vocab_size"], config["n_heads"], config["head_dim"]
    m = b * t
    per_mb = accum  # calls per step of a per-micro-batch op
    lora = config.get("task") == "finetune_lora"
    r = config.get("lora_rank") or 0
    merged = lora and config["precision"] in MERGED_LORA_PRECISIONS
    ops: list[Op] = []
    for name, n_in, n_out in linear_shapes(config):
        calls = per_mb * layers
        ops.append(_gemm(f"{name}.forward", calls, m, n_out, n_in))
        first_frozen = lora and name == "attn.qkv"  # block 0's qkv: no input gradient
        ops.append(_gemm(f"{name}.grad_input", calls - (per_mb if first_frozen else 0), m, n_in, n_out))
        if not lora:
            ops.append(_gemm(f"{name}.grad_weight", calls, n_out, n_in, m))
            continue
        # the adapter: A (r x n_in), B (n_out x r)
        ops.append(_gemm(f"{name}.lora_a.forward", calls, m, r, n_in))
        ops.append(_gemm(f"{name}.lora_b.grad_weight", calls, n_out, r, m))
        ops.append(_gemm(f"{name}.lora_b.grad_input", calls, m, r, n_out))
        ops.append(_gemm(f"{name}.lora_a.grad_weight", calls, r, n_in, m))
        if merged:
            ops.append(_gemm(f"{name}.lora.merge", calls, n_out, n_in, r))
        else:
            ops.append(_gemm(f"{name}.lora_b.forward", calls, m, n_out, r))
            ops.append(_gemm(f"{name}.lora_a.grad_input", calls - (per_mb if first_frozen else 0), m, n_in, r))
    ops.append(_gemm("head.forward", per_mb, m, vocab, d))
    ops.append(_gemm("head.grad_input", per_mb, m, d, vocab))
    if not lora:
        ops.append(_gemm("head.grad_weight", per_mb, vocab, d, m))
    pairs = attended_positions(config["attention"], t, config["window"])
    # (queries x head_dim) times (head_dim x keys) with keys = pairs / t on average: 2 hd pairs FLOPs
    # per head, exact even when pairs is not a multiple of t (counted through _attention below)
    ops.append(Op("attention.scores_and_sum", "attention", per_mb * layers, 12 * heads * hd * pairs * b,
                  t, max(1, pairs // t), hd, 6 * b * heads, 6 * b * heads * (2 * t * hd + pairs)))
    hidden = mlp_hidden(config)
    gated = config["activation"] == "swiglu"
    # forward + backward of each elementwise op streams its values about three times (read, write,
    # gradient): the fit's bandwidth coefficient absorbs the exact factor, the proportions stay
    act = m * (2 * d + 2 * d + hidden * (3 if gated else 1) + (2 * d + hidden if config["dropout"] > 0 else 0))
    ops.append(Op("block.elementwise", "memory", per_mb * layers, elements=3 * act))
    ops.append(Op("attention.softmax", "memory", per_mb * layers, elements=3 * b * heads * pairs))
    ops.append(Op("loss.softmax", "memory", per_mb, elements=3 * m * vocab + 3 * m * d))
    trained = param_counts(config)["trainable_params"]
    # adamw reads weight, gradient and two moments and writes three; sgd reads two and writes one
    ops.append(Op("optimizer.update", "memory", 1, elements=(7 if config.get("optimizer", "adamw") == "adamw" else 3)
                  * trained))
    return ops
