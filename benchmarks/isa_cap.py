"""Step time of a d256 model under isa=baseline, before and after the cap reached MKL, vs no cap.

    python benchmarks/isa_cap.py [--rounds 7] [--steps 3]

Config: d_model 256, 2 layers, 4 heads of 64, seq 256, batch 8, vocab 4096, fp32, sdpa, AdamW.
The caps are environment variables read once at library load, so each variant is its own long-lived
child process (one per variant, all alive at once); the parent asks them in turn, rotating the order
each round, for `steps` timed training steps, so drift of the shared machine hits all alike.
Variants: default (no cap); baseline-old (ATEN_CPU_CAPABILITY + ONEDNN_MAX_CPU_ISA only, the cap
before MKL_ENABLE_INSTRUCTIONS); baseline (the cap now: + MKL_ENABLE_INSTRUCTIONS=SSE4_2). Each child
also prints the ISA MKL and oneDNN read back. Prints medians, min-max spread and the ratio to
default. Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from worker.trainers.torch.model import GPT, ModelConfig
from worker.knobs import isa_check
D, LAYERS, HEADS, T, B, VOCAB = 256, 2, 4, 256, 8, 4096
g = torch.Generator().manual_seed(0)
x = torch.randint(0, VOCAB, (B, T), generator=g); y = torch.randint(0, VOCAB, (B, T), generator=g)
torch.manual_seed(0)
model = GPT(ModelConfig(vocab_size=VOCAB, seq_len=T, n_layers=LAYERS, d_model=D, n_heads=HEADS,
                        head_dim=D // HEADS, kv_heads=HEADS))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    _, loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
step()
print(json.dumps({"isas": isa_check.library_isas(), "aten": torch.backends.cpu.get_cpu_capability()}), flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    print((time.perf_counter() - t0) / n, flush=True)
"""

VARIANTS = {
    "default": {},
    "baseline-old": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ONEDNN_", "ATEN_"))}
    kids = {}
    for name, extra in VARIANTS.items():
        kids[name] = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT)], env={**base_env, **extra},
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    names = list(VARIANTS)
    for name in names:
        info = json.loads(kids[name].stdout.readline())
        print(f"{name:<13} ATen {info['aten']:<8} MKL {info['isas']['mkl_isa']!r}  "
              f"oneDNN {info['isas']['onednn_isa']!r}")
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            kids[name].stdin.write(f"{args.steps}\n")
            kids[name].stdin.flush()
            times[name].append(float(kids[name].stdout.readline()))
    for kid in kids.values():
        kid.stdin.close()
        kid.wait()
    ref = statistics.median(times["default"])
    print(f"d256 L2 T256 B8 fp32, {args.rounds} rounds x {args.steps} steps, interleaved (rotating order)")
    print(f"{'variant':<13}{'median ms':>10}{'min':>8}{'max':>8}{'x default':>10}")
    for name in names:
        ts = times[name]
        med = statistics.median(ts)
        print(f"{name:<13}{med * 1e3:>10.1f}{min(ts) * 1e3:>8.1f}{max(ts) * 1e3:>8.1f}{med / ref:>10.2f}")


if __name__ == "__main__":
    main()
