"""MFU of the d256 config, fp32 and bf16, for two source trees (before / after), interleaved.

    python benchmarks/mfu.py [--rounds 6] [--steps 4] [--before /work/baseline] [--after .] [--profile]

Config: d_model 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192, eager, AdamW (fused), the
trainer's own make_optimizer / make_step. Each round starts one child process per (tree, precision)
in rotating order; a child builds the model from its tree's worker/ package, runs one warm-up step
and `steps` timed steps and prints the median step. Prints per variant the median over rounds of
those medians, min-max over rounds, tokens/s, GFLOP/s (the after tree's flops_per_step, the same
count for both trees) and MFU against the fp32 / bf16 torch.mm peaks measured here once (the
probe's _gemm_gflops). bf16 / fp32 is the ratio of median step times within a tree.
--profile prints the after tree's fp32 and bf16 op breakdowns (torch.profiler, top 15 by self CPU).
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
try:
    from worker.trainers.torch import child as train
    from worker.trainers.torch.model import GPT, ModelConfig
except ModuleNotFoundError:  # a tree from before the trainer layout
    from worker import train
    from worker.model import GPT, ModelConfig
precision, steps, profile = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
torch.manual_seed(0)
model = GPT(ModelConfig(vocab_size=8192, seq_len=256, n_layers=4, d_model=256, n_heads=4, head_dim=64, kv_heads=4))
if precision == "bf16":
    model = model.to(torch.bfloat16)
config = {"optimizer": "adamw"}
opt = train.make_optimizer(model, config, 1e-4)
step = train.make_step(model, opt, precision)
g = torch.Generator().manual_seed(0)
micro = [(torch.randint(0, 8192, (8, 256), generator=g), torch.randint(0, 8192, (8, 256), generator=g))]
step(micro)
if profile:
    from torch.profiler import profile as prof
    with prof() as p:
        for _ in range(steps):
            step(micro)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)
times = []
for _ in range(steps):
    t = time.perf_counter()
    step(micro)
    times.append(time.perf_counter() - t)
print(json.dumps({"median_s": statistics.median(times)}))
"""


def child(tree: str, precision: str, steps: int, profile: bool = False) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, precision, str(steps), "1" if profile else "0"],
                         capture_output=True, text=True, check=True)
    if profile:
        print(f"\n--- profile {tree} {precision} ---\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])["median_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--before", default="/work/baseline")
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    sys.path.insert(0, args.after)
    import torch

    from worker.trainers.torch.model import GPT, ModelConfig, flops_per_step
    from worker.probe import _gemm_gflops

    model = GPT(ModelConfig(vocab_size=8192, seq_len=256, n_layers=4, d_model=256, n_heads=4, head_dim=64, kv_heads=4))
    flops = flops_per_step(model, 8, 1)
    peak = {p: _gemm_gflops(torch, dt, (512, 1024, 2048), 6.0) for p, dt in (("fp32", torch.float32),
                                                                             ("bf16", torch.bfloat16))}
    if args.profile:
        for p in ("fp32", "bf16"):
            child(args.after, p, args.steps, profile=True)

    variants = [(t, p) for t in ("before", "after") for p in ("fp32", "bf16")]
    tree = {"before": args.before, "after": args.after}
    times = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            times[v].append(child(tree[v[0]], v[1], args.steps))

    print(f"\nd256 config, {args.rounds} rounds x {args.steps} steps, threads {torch.get_num_threads()}, "
          f"{flops / 1e9:.2f} GFLOP/step; GEMM peak fp32 {peak['fp32']:.1f}, bf16 {peak['bf16']:.1f} GFLOP/s")
    print(f"{'tree':<8}{'prec':<6}{'median ms':>10}{'min':>8}{'max':>8}{'tok/s':>8}{'GFLOP/s':>9}{'MFU':>6}{'bf16x':>7}")
    for t, p in variants:
        med = statistics.median(times[(t, p)])
        ratio = statistics.median(times[(t, "fp32")]) / med if p == "bf16" else 1.0
        print(f"{t:<8}{p:<6}{med * 1e3:>10.1f}{min(times[(t, p)]) * 1e3:>8.1f}{max(times[(t, p)]) * 1e3:>8.1f}"
              f"{8 * 256 / med:>8.0f}{flops / med / 1e9:>9.1f}{flops / med / 1e9 / peak[p]:>6.2f}{ratio:>7.2f}")


if __name__ == "__main__":
    main()
