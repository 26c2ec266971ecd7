"""torch's fp32 GEMM routes on this CPU: GFLOP/s of mkl, mkl_intel_path and onednn at a model's shapes.

    python benchmarks/gemm_routes.py [--threads 2,16] [--rounds 5] [--tokens 2048] [--d-model 512]

What `blas=auto` rests on (common/variables.BLAS_AUTO): is MKL on its Intel code path faster than MKL
as shipped on this CPU, and is oneDNN? Each (route, threads) runs in a fresh process, as the trainer
runs it (worker/trainers/torch/gemm_route.py: mkl_intel_path preloads its one-line library before
torch loads), and times the forward and both backward products of every Linear of a d_model block
and the LM head (tokens x d_model x {3d, d, 4d} and d x 8192 vocab), each product once warm, then
`calls` times; it reads back MKL's branch (COMPATIBLE = its generic path) and the threads. Rounds
rotate the routes' order, so a slow stretch of a shared machine hits all alike. Prints the median
over rounds and min-max per route and thread count, and the ratio to mkl. Measures; asserts nothing.
Needs torch and, for mkl_intel_path, a C compiler; no database, no other project package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = """
import json, sys, time
import torch
sys.path.insert(0, sys.argv[5])
from worker.trainers.torch import gemm_route
route, threads, tokens, d, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), 10
torch.set_num_threads(threads)
torch.manual_seed(0)
linear = torch.nn.functional.linear
if route == "onednn":
    mm = lambda a, b: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [None], "")
else:
    mm = linear
flops, seconds = 0, 0.0
for n, k in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d), (8192, d)):
    x, w, g = torch.randn(tokens, k), torch.randn(n, k), torch.randn(tokens, n)
    # forward x W^T; input grad g W; weight grad g^T x: each as a @ b^T
    products = [(x, w), (g, w.t().contiguous()), (g.t().contiguous(), x.t().contiguous())]
    for a, b in products:
        mm(a, b)
    for a, b in products:
        best = float("inf")
        for _ in range(calls):
            t = time.perf_counter()
            mm(a, b)
            best = min(best, time.perf_counter() - t)
        seconds += best
        flops += 2 * a.shape[0] * a.shape[1] * b.shape[0]
print(json.dumps({"gflops": flops / seconds / 1e9, "threads": torch.get_num_threads(), **gemm_route.mkl_branch()}))
"""


def one(route: str, threads: int, tokens: int, d: int) -> dict:
    from worker.trainers.torch import gemm_route

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    why = gemm_route.unavailable(route)
    if why:
        return {"skipped": why}
    env.update(gemm_route.start_env(route, env))
    proc = subprocess.run([sys.executable, "-c", CHILD, route, str(threads), str(tokens), str(d), str(ROOT)],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode:
        return {"skipped": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048, help="rows of the activations (batch x seq_len)")
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--routes", default="mkl,mkl_intel_path,onednn")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    args = ap.parse_args()
    routes = args.routes.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; d_model {args.d_model}, {args.tokens} tokens; "
          f"{args.rounds} rounds, routes rotated", flush=True)
    got: dict = {}
    for t in threads:
        for r in range(args.rounds):
            for route in routes[r % len(routes):] + routes[:r % len(routes)]:
                got.setdefault((route, t), []).append(one(route, t, args.tokens, args.d_model))
    print("| threads | route | GFLOP/s median [min-max] | vs mkl | MKL branch | threads read back |")
    print("|---|---|---|---|---|---|")
    for t in threads:
        base = statistics.median(m["gflops"] for m in got[("mkl", t)] if "gflops" in m) if ("mkl", t) in got else None
        for route in routes:
            ms = got[(route, t)]
            ok = [m for m in ms if "gflops" in m]
            if not ok:
                print(f"| {t} | {route} | skipped: {ms[0]['skipped']} | | | |")
                continue
            rates = [m["gflops"] for m in ok]
            med = statistics.median(rates)
            ratio = f"{med / base:.2f}x" if base else ""
            print(f"| {t} | {route} | {med:.1f} [{min(rates):.1f}-{max(rates):.1f}] | {ratio} | "
                  f"{ok[0].get('mkl_branch')} | {sorted({m['threads'] for m in ok})} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({f"{r}@{t}": v for (r, t), v in got.items()}, indent=1))


if __name__ == "__main__":
    main()
