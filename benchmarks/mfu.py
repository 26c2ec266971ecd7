"""MFU of the d256 config, fp32 and bf16, for two source trees (before / after), interleaved.

    python benchmarks/mfu.py [--rounds 6] [--steps 4] [--threads N] [--before REF|DIR] [--after DIR]
                             [--precisions fp32,bf16] [--nanogpt] [--profile]

Config: d_model 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192, eager, AdamW (fused), the
trainer's own make_optimizer / make_step. --before is a source tree or a git ref (default: where
this branch left main), exported with git archive. Each round starts one child process per
(tree, precision) in rotating order; a child builds the model from its tree's worker/ package,
runs one warm-up step and `steps` timed steps, then measures a GEMM peak (a 2048^3 torch.mm, best
of a few, the probe's shape) on the same threads. Steps and peak are timed on two clocks: wall
(perf_counter), and the process's CPU time, which on a shared machine counts the work and not the
waiting: with --threads 1 it is the steady measure when other jobs load the cores (with more
threads it also counts OpenMP's spin-waits). Prints per variant the median over rounds of the
children's median step, min-max over rounds, tokens/s, GFLOP/s (the after tree's flops_per_step,
the same count for every variant) and MFU = GFLOP/s over the peak: the best any child of that
precision measured (load only slows a GEMM, so the best is the machine's; a median step under
load makes the MFU a lower bound), per clock. bf16x: the fp32 / bf16 ratio of median wall steps
within a tree. --nanogpt adds a third variant: a minimal nanoGPT-style model and step of the same
shape (NANOGPT below), the yardstick.
--profile prints the after tree's op breakdowns (torch.profiler, top 15 by self CPU).
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
precision, steps, profile, threads = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
if sys.argv[1] == "nanogpt":
    exec(sys.argv[6])
    model = NanoGPT()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    def step(micro):
        for x, y in micro:
            model(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
else:
    try:
        from worker.trainers.torch import train
        from worker.trainers.torch.model import GPT, ModelConfig
    except ModuleNotFoundError:  # a tree from before the trainer layout
        from worker import train
        from worker.model import GPT, ModelConfig
    model = GPT(ModelConfig(vocab_size=8192, seq_len=256, n_layers=4, d_model=256, n_heads=4, head_dim=64, kv_heads=4))
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    opt = train.make_optimizer(model, {"optimizer": "adamw"}, 1e-4)
    step = train.make_step(model, opt, precision)
g = torch.Generator().manual_seed(0)
micro = [(torch.randint(0, 8192, (8, 256), generator=g), torch.randint(0, 8192, (8, 256), generator=g))]
step(micro)
if profile:
    from torch.profiler import profile as prof
    with prof(record_shapes=True) as p:
        for _ in range(steps):
            step(micro)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


times = [timed(lambda: step(micro)) for _ in range(steps)]
dt = torch.bfloat16 if precision == "bf16" else torch.float32
a, b = torch.randn(2048, 2048).to(dt), torch.randn(2048, 2048).to(dt)
torch.mm(a, b)
mm = [timed(lambda: torch.mm(a, b)) for _ in range(4)]
flops = 2 * 2048 ** 3 / 1e9
print(json.dumps({"wall_s": statistics.median(t[0] for t in times), "cpu_s": statistics.median(t[1] for t in times),
                  "peak_wall": flops / min(t[0] for t in mm), "peak_cpu": flops / min(t[1] for t in mm),
                  "threads": torch.get_num_threads()}))
"""

# --nanogpt: a minimal nanoGPT-style model of the same shape (Karpathy's model.py, trimmed): biased
# Linear and LayerNorm layers, erf GELU, SDPA, tied head, F.cross_entropy over the full logits,
# fused AdamW on every parameter; the same matmul weights, so the same flops_per_step
NANOGPT = """
import torch.nn as nn
import torch.nn.functional as F
V, T, C, L, H = 8192, 256, 256, 4, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B = x.size(0)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h, self.ln_f = nn.ModuleList(Block() for _ in range(L)), nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))
"""


def child(tree: str, precision: str, steps: int, threads: int, profile: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, precision, str(steps), "1" if profile else "0",
                          str(threads), NANOGPT], capture_output=True, text=True, check=True)
    if profile:
        print(f"\n--- profile {tree} {precision} ---\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def source_tree(ref: str) -> str:
    """A directory as is; otherwise a git ref of this repository, its worker/ exported to a temp dir."""
    if Path(ref).is_dir():
        return ref
    out = Path(tempfile.mkdtemp(prefix="cpubench-mfu-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "worker"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the children (0: torch's default)")
    ap.add_argument("--before", default=None, help="a source tree or a git ref (default: merge-base with main)")
    ap.add_argument("--after", default=str(ROOT))
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--nanogpt", action="store_true", help="add a minimal nanoGPT-style step to the rotation")
    args = ap.parse_args()
    before = args.before or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                                           capture_output=True, text=True, check=True).stdout.strip()

    sys.path.insert(0, args.after)
    from worker.trainers.torch.model import GPT, ModelConfig, flops_per_step

    model = GPT(ModelConfig(vocab_size=8192, seq_len=256, n_layers=4, d_model=256, n_heads=4, head_dim=64, kv_heads=4))
    flops = flops_per_step(model, 8, 1)
    precisions = args.precisions.split(",")
    if args.profile:
        for p in precisions:
            child(args.after, p, args.steps, args.threads, profile=True)

    variants = [(t, p) for t in ("before", "after") + (("nanogpt",) if args.nanogpt else ()) for p in precisions]
    tree = {"before": source_tree(before), "after": args.after, "nanogpt": "nanogpt"}
    runs = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            runs[v].append(child(tree[v[0]], v[1], args.steps, args.threads))

    threads = runs[variants[0]][0]["threads"]
    print(f"\nd256 config, {args.rounds} rounds x {args.steps} steps, threads {threads}, {flops / 1e9:.2f} GFLOP/step; "
          f"before = {before}")
    print(f"{'tree':<8}{'prec':<6}{'clock':<6}{'median ms':>10}{'min':>8}{'max':>8}{'tok/s':>8}{'GFLOP/s':>9}"
          f"{'peak':>7}{'MFU':>6}{'bf16x':>7}")
    for t, p in variants:
        for clock in ("wall", "cpu"):
            steps = [c[f"{clock}_s"] for c in runs[(t, p)]]
            med = statistics.median(steps)
            peak = max(c[f"peak_{clock}"] for v in variants if v[1] == p for c in runs[v])
            mfu = flops / med / 1e9 / peak
            ratio = (statistics.median(c["wall_s"] for c in runs[(t, "fp32")]) / med
                     if p == "bf16" and clock == "wall" and "fp32" in precisions else float("nan"))
            print(f"{t:<8}{p:<6}{clock:<6}{med * 1e3:>10.1f}{min(steps) * 1e3:>8.1f}{max(steps) * 1e3:>8.1f}"
                  f"{8 * 256 / med:>8.0f}{flops / med / 1e9:>9.1f}{peak:>7.1f}{mfu:>6.2f}{ratio:>7.2f}")


if __name__ == "__main__":
    main()
