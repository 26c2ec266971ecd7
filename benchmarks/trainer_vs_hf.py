"""Our trainer against Hugging Face transformers' GPT-2 (SDPA) on the same config, alternating.

    python benchmarks/trainer_vs_hf.py [--rounds 6] [--steps 5] [--no-extras]

Config: d_model 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192, fp32, eager, AdamW.
Both models train on the same batches with the same optimizer settings; rounds alternate
(ours, theirs, naive ours, ours, theirs ...) so drift of the machine hits all alike. Prints tokens/s from the
median step of each side, the ratio, and MFU against an fp32 GEMM peak measured here (a large
matmul on all cores). A naive variant of ours (manual attention, for-loop AdamW, zeroed instead of
freed grads) runs in the same rotation. Then bf16, mixed and torch.compile (inductor) figures.
Measures and prints; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import data
from worker.trainers import harness
from worker.trainers.torch import train
from worker.trainers.torch.model import GPT, ModelConfig

D, LAYERS, HEADS, T, B, VOCAB = 256, 4, 4, 256, 8, 8192
TOKENS = B * T


def gemm_peak_gflops(dtype=torch.float32, n: int = 2048, seconds: float = 2.0) -> float:
    """Best GFLOP/s of an n x n x n matmul on all cores: the roofline MFU is measured against."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
    return best


def ours(attn_backend="sdpa", precision="fp32"):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, seq_len=T, n_layers=LAYERS, d_model=D, n_heads=HEADS, head_dim=D // HEADS,
                      kv_heads=HEADS, attn_backend=attn_backend, precision="fp32")
    model = GPT(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    return model


def theirs():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=D, n_layer=LAYERS, n_head=HEADS,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg)


class HFAdapter(torch.nn.Module):
    """Gives GPT-2 our forward signature: (idx, targets) -> (logits, loss)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets, return_logits=True):  # GPT-2 always makes the logits
        logits = self.model(input_ids=idx).logits
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def naive_step(model, precision="fp32"):
    """The 'before': for-loop AdamW, grads zeroed in place instead of freed."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)

    def step(micro):
        for x, y in micro:
            _, loss = model(x, y)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.detach()

    return step


def timed_steps(step, batches, n: int) -> list[float]:
    out = []
    for _ in range(n):
        micro = [tuple(map(torch.from_numpy, batches.next()))]
        t = time.perf_counter_ns()
        step(micro)
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


def report(name, ms, flops, peak):
    """One line: median step (and p10/p90, min), tokens/s and MFU from the median and from the min.
    On a shared machine the min is the better estimate of what the code can do undisturbed."""
    med, best = statistics.median(ms), min(ms)
    qs = statistics.quantiles(ms, n=10)
    print(f"{name:38s} median {med:7.1f} ms (p10 {qs[0]:6.1f} p90 {qs[-1]:6.1f} min {best:6.1f})  "
          f"{TOKENS / med * 1e3:6.0f} tok/s  MFU {flops / med / 1e6 / peak:4.2f} | at min: "
          f"{TOKENS / best * 1e3:6.0f} tok/s  MFU {flops / best / 1e6 / peak:4.2f}", flush=True)
    return TOKENS / med * 1e3, TOKENS / best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side per round")
    ap.add_argument("--no-extras", action="store_true", help="skip naive/bf16/mixed/inductor figures")
    args = ap.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    peak32 = gemm_peak_gflops(torch.float32)
    peak16 = gemm_peak_gflops(torch.bfloat16)
    print(f"measured GEMM peak: fp32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s (2048^3 matmul)")

    corpus, used = data.prepare(Path(__file__).resolve().parents[1] / "data", "builtin")
    tokens = data.load_tokens(corpus, VOCAB)
    config = {"optimizer": "adamw"}
    our_model, their_model = ours(), HFAdapter(theirs())
    flops = harness.flops_per_step(dict(vars(our_model.cfg), batch_size=B, grad_accum=1))
    print(f"config: d_model {D}, {LAYERS} layers, {HEADS} heads, seq {T}, batch {B}, vocab {VOCAB}; "
          f"ours {sum(p.numel() for p in our_model.parameters()) / 1e6:.2f} M params, GPT-2 "
          f"{sum(p.numel() for p in their_model.parameters()) / 1e6:.2f} M; {flops / 1e9:.1f} GFLOP/step; data {used}")

    sides = {
        "ours (sdpa, fused AdamW)": train.make_step(our_model, train.make_optimizer(our_model, config, 1e-3), "fp32"),
        "HF GPT-2 (sdpa, fused AdamW)": train.make_step(their_model, train.make_optimizer(their_model, config, 1e-3),
                                                        "fp32"),
        "ours naive (manual attn, loop AdamW)": naive_step(ours("manual")),
    }
    batches = {name: data.Batches(tokens, T, B, seed=0) for name in sides}
    for name, step in sides.items():  # warmup
        timed_steps(step, batches[name], 3)
    times = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, step in sides.items():
            times[name] += timed_steps(step, batches[name], args.steps)
    tps = {name: report(name, ms, flops, peak32) for name, ms in times.items()}
    (a, a_best), (b, b_best), _ = tps.values()
    print(f"ratio ours / HF: {a / b:.3f}x from medians, {a_best / b_best:.3f}x from minima  (goal >= 1.10x)")

    if args.no_extras:
        return
    variants = [
        ("ours bf16 (sdpa)", lambda: train.make_step(m := ours(precision="bf16"),
                                                     train.make_optimizer(m, config, 1e-3), "fp32"), peak16),
        ("ours mixed (autocast bf16)", lambda: train.make_step(m := ours(),
                                                               train.make_optimizer(m, config, 1e-3), "mixed"), peak16),
        ("HF GPT-2 bf16", lambda: train.make_step(m := HFAdapter(theirs()).to(torch.bfloat16),
                                                  train.make_optimizer(m, config, 1e-3), "fp32"), peak16),
    ]
    for name, make, peak in variants:
        step, bt = make(), data.Batches(tokens, T, B, seed=0)
        timed_steps(step, bt, 3)
        report(name, timed_steps(step, bt, args.rounds * args.steps), flops, peak)
    model = ours()
    step = train.make_step(torch.compile(model), train.make_optimizer(model, config, 1e-3), "fp32",
                           fused_loss=False)  # as the trainer under inductor
    bt = data.Batches(tokens, T, B, seed=0)
    t = time.perf_counter()
    timed_steps(step, bt, 1)
    print(f"ours inductor: first step (compile) {time.perf_counter() - t:.1f} s")
    timed_steps(step, bt, 2)
    report("ours inductor (fp32)", timed_steps(step, bt, args.rounds * args.steps), flops, peak32)


if __name__ == "__main__":
    main()
