"""Step time of full, local and sliding attention at T=1024 for windows 64/128/256, interleaved,
and the time of the attention op alone.

    python benchmarks/attention_windows.py [--rounds 5] [--steps 3] [--code PATH]

Config: d_model 128, 2 layers, 4 heads of 32, seq 1024, batch 4, vocab 4096, fp32, sdpa, AdamW,
the loss as the trainer's eager step takes it (the chunked head, no logits). Each round runs every
variant for `steps` timed training steps (after one warm-up step), in a rotating order, so
drift of the shared machine hits all alike. Prints the median step time over rounds with the
min-max spread, and the ratio to full attention.

The second table times the attention op alone, forward + backward, on the same shapes (q, k, v
of (B, T, heads, head_dim) = (4, 1024, 4, 32)), with the same rounds and rotation: the model's own
code (causal `attend` for full, `windowed_attention` for local/sliding). The step's ratios are
bounded by the work that does not change with the window (the head at vocab 4096, the linears,
the optimizer): the line under the table gives attention's share of the full-attention step
(n_layers x the op / the step) and the step ratio it would reach if attention cost nothing.

--code runs another checkout's model (worker/trainers/torch/model.py, or the model module of
worker/ before the trainer layout, e.g. /work/baseline) for a before/after; its op table needs
windowed_attention.
Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import inspect
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
        from worker.trainers.torch import model as model_code
    except ModuleNotFoundError:  # a checkout from before the trainer layout
        from worker import model as model_code
    GPT, ModelConfig = model_code.GPT, model_code.ModelConfig

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

    # the trainer's eager step: the chunked head + loss, no logits (a checkout from before it: logits)
    fused = {"return_logits": False} if "return_logits" in inspect.signature(GPT.forward).parameters else {}

    def step(model, opt):
        _, loss = model(x, y, **fused)
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
    print(f"code: {args.code}  backend {args.backend}  T={T} d={D} L={LAYERS} B={B}, "
          f"{args.rounds} rounds x {args.steps} steps, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("training step")
    table(times)
    if not hasattr(model_code, "windowed_attention"):
        print("attention op: this checkout has no windowed_attention")
        return
    ops = op_times(model_code, args.rounds, args.steps, args.backend)
    print(f"attention op alone, forward + backward, q/k/v ({B}, {T}, {HEADS}, {D // HEADS})")
    table(ops)
    step, op = statistics.median(times[("full", 64)]), statistics.median(ops[("full", 64)])
    share = LAYERS * op / step
    print(f"full attention: {LAYERS} layers x {op * 1e3:.1f} ms = {share:.0%} of the {step * 1e3:.0f} ms step; "
          f"with attention free the step would be {1 - share:.2f}x full")


def op_times(model_code, rounds: int, steps: int, backend: str) -> dict:
    """Seconds per forward + backward of the attention op alone, per variant, one entry per round."""
    g = torch.Generator().manual_seed(0)
    q0, k0, v0, dy = (torch.randn(B, T, HEADS, D // HEADS, generator=g) for _ in range(4))

    def op(kind, window):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        if kind == "full":  # as Attention.forward: heads before positions, the causal kernel
            y = model_code.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, 0.0,
                                  backend).transpose(1, 2)
        else:
            y = model_code.windowed_attention(q, k, v, kind, window, 0.0, backend)
        y.backward(dy)

    times = {v: [] for v in VARIANTS}
    for v in VARIANTS:
        op(*v)
    for r in range(rounds):
        for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            t0 = time.perf_counter()
            for _ in range(steps):
                op(*v)
            times[v].append((time.perf_counter() - t0) / steps)
    return times


def table(times: dict) -> None:
    full = statistics.median(times[("full", 64)])
    print(f"{'attention':<10}{'window':>7}{'median ms':>11}{'min':>8}{'max':>8}{'x full':>8}")
    for kind, window in VARIANTS:
        ts = times[(kind, window)]
        med = statistics.median(ts)
        print(f"{kind:<10}{window if kind != 'full' else '-':>7}{med * 1e3:>11.1f}{min(ts) * 1e3:>8.1f}"
              f"{max(ts) * 1e3:>8.1f}{med / full:>8.2f}")


if __name__ == "__main__":
    main()
