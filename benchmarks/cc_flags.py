"""Step time of an inductor-compiled model under each cc_flags value, and the flags its kernels got.

    python benchmarks/cc_flags.py [--rounds 7] [--steps 3] [--values default,O2,native_fastmath]

Config: d_model 128, 2 layers, 4 heads, seq 128, batch 8, vocab 2048, fp32, sdpa, AdamW (not
compiled), torch.compile of the model, a cold inductor cache per variant. Each value is its own
long-lived child process (apply() patches inductor process-wide), all compiled first, then asked in
turn, rotating the order each round, for `steps` timed steps, so drift of the shared machine hits all
alike. GEMMs run in MKL whatever the flags; the flags reach inductor's fused pointwise/reduction
kernels only. Prints each child's read-back (cc_kernel_flags), its compile time, medians, min-max
spread and the ratio to default. Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="cpubench-ccflags-")
import torch
from worker.trainers.torch import ccflags
from worker.trainers.torch.model import GPT, ModelConfig
ccflags.apply(sys.argv[2])
D, LAYERS, HEADS, T, B, VOCAB = 128, 2, 4, 128, 8, 2048
g = torch.Generator().manual_seed(0)
x = torch.randint(0, VOCAB, (B, T), generator=g); y = torch.randint(0, VOCAB, (B, T), generator=g)
torch.manual_seed(0)
model = GPT(ModelConfig(vocab_size=VOCAB, seq_len=T, n_layers=LAYERS, d_model=D, n_heads=HEADS,
                        head_dim=D // HEADS, kv_heads=HEADS))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
compiled = torch.compile(model)
def step():
    _, loss = compiled(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return float(loss.detach())
t0 = time.perf_counter(); loss = step(); compile_s = time.perf_counter() - t0
print(json.dumps({"flags": ccflags.read_back(), "compile_s": compile_s, "loss": loss}), flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
        loss = step()
    print(json.dumps({"s": (time.perf_counter() - t0) / n, "loss": loss}), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--values", default="default,O2,native_fastmath")
    args = ap.parse_args()
    names = args.values.split(",")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    kids = {name: subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), name], env=env, cwd=tempfile.gettempdir(),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in names}
    for name in names:
        info = json.loads(kids[name].stdout.readline())
        print(f"{name:<16} kernels {info['flags']}  compile {info['compile_s']:.0f} s  first loss {info['loss']:.4f}")
    times, last_loss = {n: [] for n in names}, {}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            kids[name].stdin.write(f"{args.steps}\n")
            kids[name].stdin.flush()
            got = json.loads(kids[name].stdout.readline())
            times[name].append(got["s"])
            last_loss[name] = got["loss"]
    for kid in kids.values():
        kid.stdin.close()
        kid.wait()
    ref = statistics.median(times[names[0]])
    print(f"d128 L2 T128 B8 fp32 inductor, {args.rounds} rounds x {args.steps} steps, interleaved (rotating order)")
    print(f"{'cc_flags':<16}{'median ms':>10}{'min':>8}{'max':>8}{'x ' + names[0]:>12}{'last loss':>11}")
    for name in names:
        ts = times[name]
        med = statistics.median(ts)
        print(f"{name:<16}{med * 1e3:>10.1f}{min(ts) * 1e3:>8.1f}{max(ts) * 1e3:>8.1f}{med / ref:>12.2f}"
              f"{last_loss[name]:>11.4f}")


if __name__ == "__main__":
    main()
