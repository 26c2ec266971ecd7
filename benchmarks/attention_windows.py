"""Step time of full, local and sliding attention at T=1024 for windows 64/128/256, interleaved.

    python benchmarks/attention_windows.py [--rounds 5] [--steps 3] [--code PATH]

Config: d_model 128, 2 layers, 4 heads of 32, seq 1024, batch 4, vocab 4096, fp32, sdpa, AdamW.
Each round runs every variant for `steps` timed training steps (after one warm-up step), in a
rotating order, so drift of the shared machine hits all alike. Prints the median step time over
rounds with the min-max spread, and the ratio to full attention. --code runs another checkout's
model (worker/trainers/torch/model.py, or worker/model.py before the trainer layout, e.g.
/work/baseline) for a before/after. Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

D, LAYERS, HEADS, T, B, VOCAB = 128, 2, 4, 1024, 4, 4096
VARIANTS = [("full", 64), ("local", 64), ("local", 128), ("local", 256),
            ("sliding", 64), ("sliding", 128), ("sliding", 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]))
    args = ap.parse_args()
    sys.path.insert(0, args.code)
    try:
        from worker.trainers.torch.model import GPT, ModelConfig
    except ModuleNotFoundError:  # a checkout from before the trainer layout
        from worker.model import GPT, ModelConfig

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (B, T), generator=g)
    y = torch.randint(0, VOCAB, (B, T), generator=g)
    runs = {}
    for kind, window in VARIANTS:
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=VOCAB, seq_len=T, n_layers=LAYERS, d_model=D, n_heads=HEADS,
                                head_dim=D // HEADS, kv_heads=HEADS, attention=kind, window=window,
                                attn_backend=args.backend))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        runs[(kind, window)] = (model, opt)
    times = {v: [] for v in VARIANTS}

    def step(model, opt):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for v in VARIANTS:
        step(*runs[v])
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for v in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(*runs[v])
            times[v].append((time.perf_counter() - t0) / args.steps)
    full = statistics.median(times[("full", 64)])
    print(f"code: {args.code}  backend {args.backend}  T={T} d={D} L={LAYERS} B={B}, "
          f"{args.rounds} rounds x {args.steps} steps, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'attention':<10}{'window':>7}{'median ms':>11}{'min':>8}{'max':>8}{'x full':>8}")
    for kind, window in VARIANTS:
        ts = times[(kind, window)]
        med = statistics.median(ts)
        print(f"{kind:<10}{window if kind != 'full' else '-':>7}{med * 1e3:>11.1f}{min(ts) * 1e3:>8.1f}"
              f"{max(ts) * 1e3:>8.1f}{med / full:>8.2f}")


if __name__ == "__main__":
    main()
