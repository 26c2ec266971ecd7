"""MFU of candidate bases for the quick preset, measured so that a shared machine cannot fake it.

    python benchmarks/quick_base.py [--steps 15] [--threads 1] [--config "d_model=256 seq_len=64 ..."]...

Each candidate trains in its own child with the torch trainer's own model, optimizer and step
(worker/trainers/torch), `--threads` torch threads, one warm-up step and `--steps` timed steps, then
measures a GEMM peak (torch.mm of 512, 1024 and 2048 squares, the probe's sizes) on the same threads.
Both are timed on the process's CPU time, which on a loaded machine counts the work and not the
waiting (with one thread: with more, OpenMP's spin-waits count too), and on the wall clock. MFU =
the trainer's analytic flops_per_step (harness.flops_per_step, what the runs' mfu column uses) over
the step time, over the peak. Prints, per candidate: the median and best step (CPU time and wall),
the MFU of each, and the share of the step's flops that are GEMMs of the blocks and the head.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CANDIDATES = (
    "d_model=64 n_layers=2 n_heads=4 seq_len=64 batch_size=8 vocab_size=1024",  # the quick base until now
    "d_model=128 n_layers=2 n_heads=4 seq_len=64 batch_size=8 vocab_size=1024",
    "d_model=256 n_layers=2 n_heads=4 seq_len=64 batch_size=4 vocab_size=1024",
    "d_model=256 n_layers=2 n_heads=4 seq_len=64 batch_size=8 vocab_size=1024",
    "d_model=256 n_layers=2 n_heads=4 seq_len=128 batch_size=8 vocab_size=2048",
)

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from common.variables import parse_value, resolve
from worker.trainers import harness
from worker.trainers.torch import train
from worker.trainers.torch.model import GPT, ModelConfig
threads, steps, text = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(0)
partial = {k: parse_value(k, v) for k, v in (item.split("=") for item in text.split())}
config, why = resolve(partial, threads)
assert not why, why
model = GPT(ModelConfig.from_config(config))
opt = train.make_optimizer(model, config, 1e-3)
step = train.make_step(model, opt, config["precision"])
g = torch.Generator().manual_seed(0)
B, T, V = config["batch_size"], config["seq_len"], config["vocab_size"]
micro = [(torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g))]
step(micro)


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


times = [timed(lambda: step(micro)) for _ in range(steps)]
best = {"wall": 0.0, "cpu": 0.0}
for n in (512, 1024, 2048):
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    for _ in range(3):
        w, c = timed(lambda: torch.mm(a, b))
        best["wall"] = max(best["wall"], 2 * n**3 / w / 1e9)
        best["cpu"] = max(best["cpu"], 2 * n**3 / (c / threads) / 1e9)
print(json.dumps({"flops": harness.flops_per_step(config), "wall": [t[0] for t in times],
                  "cpu": [t[1] / threads for t in times], "peak_wall": best["wall"], "peak_cpu": best["cpu"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", action="append", help="a candidate as 'K=V K=V ...' (repeatable)")
    args = ap.parse_args()
    for text in args.config or CANDIDATES:
        done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(args.threads), str(args.steps), text],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{text}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.splitlines()[-1])
        gf = r["flops"] / 1e9
        line = [f"{text}: {gf:.2f} GFLOP/step"]
        for clock in ("cpu", "wall"):
            ts = sorted(r[clock])
            med, best = ts[len(ts) // 2], ts[0]
            line.append(f"{clock}: median {med * 1e3:.0f} ms (best {best * 1e3:.0f}), "
                        f"MFU {gf / med / r['peak_' + clock]:.2f} "
                        f"(best {gf / best / r['peak_' + clock]:.2f}) of {r['peak_' + clock]:.0f} GFLOP/s")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
