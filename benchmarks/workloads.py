"""Step time of pretrain vs finetune vs finetune_lora, and of fp32 vs int8 vs bf16, interleaved.

    python benchmarks/workloads.py [--rounds 5] [--steps 3] [--only tasks|precision]

tasks:     d_model 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192, fp32, AdamW (the d256
           config); pretrain and finetune run the same step (all weights); finetune_lora (rank 8)
           freezes the base: no weight-gradient GEMMs, an optimizer over the adapters only;
           "lora two-path" is the same without MergedLoRA (x W^T + (x A^T) B^T), for comparison.
precision: d_model 512, 4 layers, 8 heads, seq 256, batch 8, vocab 8192: fp32, int8 (int8 forward
           GEMMs in the blocks, fp32 backward), bf16 (weights and activations in bf16).
Each round runs every variant for `steps` timed steps in rotating order (one warm-up step first),
so drift of the shared machine hits all alike. Prints the median step over rounds, min-max, the
ratio to the first variant, and the analytic FLOPs and GFLOP/s. Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.trainers.torch.model import (GPT, LoRALinear, ModelConfig, add_lora, flops_per_step,
                                        trainable_params)

T, B, VOCAB = 256, 8, 8192


def build(d, layers, heads, precision="fp32", lora_rank=0, merged=True):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=VOCAB, seq_len=T, n_layers=layers, d_model=d, n_heads=heads,
                            head_dim=d // heads, kv_heads=heads, precision="int8" if precision == "int8" else "fp32"))
    if lora_rank:
        add_lora(model, lora_rank)
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.merged = merged
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, fused=True)
    return model, opt


def run(variants: dict, rounds: int, steps: int, title: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (B, T), generator=g)
    y = torch.randint(0, VOCAB, (B, T), generator=g)

    def step(model, opt):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    names = list(variants)
    times = {n: [] for n in names}
    for n in names:
        step(*variants[n])
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(steps):
                step(*variants[n])
            times[n].append((time.perf_counter() - t0) / steps)
    first = statistics.median(times[names[0]])
    print(f"\n{title}  ({rounds} rounds x {steps} steps, threads {torch.get_num_threads()})")
    print(f"{'variant':<16}{'median ms':>10}{'min':>8}{'max':>8}{'x first':>8}{'GFLOP/step':>11}{'GFLOP/s':>9}"
          f"{'trainable':>11}")
    for n in names:
        model, _ = variants[n]
        med = statistics.median(times[n])
        flops = flops_per_step(model, B, 1)
        print(f"{n:<16}{med * 1e3:>10.1f}{min(times[n]) * 1e3:>8.1f}{max(times[n]) * 1e3:>8.1f}{med / first:>8.2f}"
              f"{flops / 1e9:>11.2f}{flops / med / 1e9:>9.1f}{trainable_params(model):>11}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", choices=("tasks", "precision"))
    args = ap.parse_args()
    if args.only != "precision":
        run({"pretrain": build(256, 4, 4), "finetune": build(256, 4, 4),
             "finetune_lora r8": build(256, 4, 4, lora_rank=8),
             "lora two-path": build(256, 4, 4, lora_rank=8, merged=False)},
            args.rounds, args.steps, "tasks on the d256 config (finetune = pretrain's step on loaded weights)")
    if args.only != "tasks":
        run({"fp32": build(512, 4, 8), "int8": build(512, 4, 8, "int8"), "bf16": build(512, 4, 8, "bf16")},
            args.rounds, args.steps, "precision on the d512 config")


if __name__ == "__main__":
    main()
