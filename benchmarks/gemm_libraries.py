"""The NumPy trainer's GEMM libraries alone: sgemm GFLOP/s of OpenBLAS, MKL and BLIS at 1 and 2 threads.

    python benchmarks/gemm_libraries.py [--rounds 5] [--n 1024] [--calls 10]

Each (library, threads) runs in a fresh process (a library's pool is sized when it loads) through
worker/trainers/numpy/blas.py, exactly as the trainer calls it: an n x n x n float32 product with
the second operand transposed (the layout of x @ W^T). Rounds rotate the order, so drift of a
shared machine hits all alike; each process reports the best of `calls` products (the least
disturbed) and the threads read back. Prints the median over rounds and min-max. A combination the
library cannot run (BLIS from PyPI: one thread) is printed with its reason. Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
import numpy as np
from worker.trainers.numpy import blas
name, threads, n, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    lib = blas.use(name, threads)
except blas.Unavailable as why:
    print(json.dumps({"skip": str(why)})); sys.exit()
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
w = rng.standard_normal((n, n), dtype=np.float32)
out = np.empty((n, n), np.float32)
blas.matmul(a, w.T, out)
best = 0.0
for _ in range(calls):
    t = time.perf_counter()
    blas.matmul(a, w.T, out)
    best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
info = lib.info()
print(json.dumps({"gflops": best, "threads": info["blas_threads"], "blas": info["blas"],
                  "arch": info.get("blas_architecture")}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    combos = [(lib, t) for lib in ("openblas", "mkl", "blis") for t in (1, 2)]
    seen: dict[tuple, list[float]] = {c: [] for c in combos}
    notes: dict[tuple, str] = {}
    for r in range(args.rounds):
        for lib, threads in combos[r % len(combos):] + combos[:r % len(combos)]:
            out = subprocess.run([sys.executable, "-c", CHILD, lib, str(threads), str(args.n), str(args.calls)],
                                 cwd=ROOT, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if "skip" in got:
                notes[(lib, threads)] = got["skip"]
            else:
                seen[(lib, threads)].append(got["gflops"])
                notes[(lib, threads)] = f"read back: {got['blas']}, {got['threads']} thread(s), kernels {got['arch']}"
    print(f"| blas | threads | sgemm GFLOP/s, median of {args.rounds} rounds [min-max] | |")
    print("|---|---|---|---|")
    for (lib, threads), values in seen.items():
        figure = (f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]" if values else "-")
        print(f"| {lib} | {threads} | {figure} | {notes.get((lib, threads), '')} |")


if __name__ == "__main__":
    main()
