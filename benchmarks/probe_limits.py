"""Measure this machine's limits and the core scaling of a fixed training-like workload; print them.

    python benchmarks/probe_limits.py [--state-dir .bench] [--reps 3]

Prints the probe's triad bandwidth (1 thread / all CPUs) and GEMM peaks (fp32 / bf16, 1 core / all),
re-measured, then runs a fixed MLP training step (forward, backward, SGD; matmul-bound like a
transformer's MLP) in child processes under cores=1 and cores=2 (threads pinned), `reps` children
each, and prints the median step time of each and the speedup. Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.variables import resolve
from worker.knobs import settings as knobs
from worker.machine import probe

REPO = Path(__file__).resolve().parents[1]

# A fixed step: batch 64 x seq 32 tokens through a d_model 256 -> 1024 -> 256 MLP, as in a small
# transformer block; 3 warm-up steps let the thread pool and allocator settle before 20 timed steps.
WORKLOAD = textwrap.dedent("""
    import json, statistics, time, torch
    from worker.trainers.torch import readback
    torch.manual_seed(0)
    readback.apply_in_child({"intra_threads": THREADS, "inter_threads": THREADS, "onednn": True})
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64 * 32, 256), torch.randn(64 * 32, 256)
    times = []
    for step in range(23):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"step_ms": 1000 * statistics.median(times),
                      "affinity": sorted(readback.read_back()["affinity"])}))
""")


def run_workload(cores: int, facts: dict, pool: list[int], journal: Path) -> dict:
    config, _ = resolve({"cores": cores, "pin_threads": True}, len(pool))
    with knobs.applied(config, facts, pool, journal_path=journal) as spec:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **spec.env}
        code = WORKLOAD.replace("THREADS", str(cores))
        done = subprocess.run(spec.argv_prefix + [sys.executable, "-c", code], cwd=REPO, env=env,
                              capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, spec.cpus))
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", default=".bench")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    facts = probe.probe(Path(args.state_dir), remeasure=True)
    print(f"machine: {facts['cpu_model']}, {facts['physical_cores']} cores / {facts['logical_cores']} CPUs, "
          f"torch {facts['torch_version']} ({facts['torch'].get('blas')}, "
          f"oneDNN {facts['torch'].get('onednn_version')}, "
          f"{facts['torch'].get('openmp')}, {facts['torch'].get('cpu_capability')})")
    print(f"probe (measured, first run): {facts['probe_s']:.1f} s")
    print(f"triad bandwidth  1 thread: {facts['mem_bw_gbs_1t']:7.1f} GB/s   all: {facts['mem_bw_gbs_all']:7.1f} GB/s")
    print(f"GEMM fp32        1 core:   {facts['gemm_gflops_fp32_1c']:7.1f} GFLOP/s  "
          f"all: {facts['gemm_gflops_fp32_all']:7.1f} GFLOP/s")
    print(f"GEMM bf16        1 core:   {facts['gemm_gflops_bf16_1c']:7.1f} GFLOP/s  "
          f"all: {facts['gemm_gflops_bf16_all']:7.1f} GFLOP/s")

    pool = sorted(os.sched_getaffinity(0))
    if len(pool) < 2:
        print("1-vs-2-core speedup: needs two CPUs")
        return
    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "journal.json"
        step_ms = {1: [], 2: []}
        for _ in range(args.reps):  # interleaved, so slow drift of the machine hits both alike
            for cores in (1, 2):
                step_ms[cores].append(run_workload(cores, facts, pool, journal)["step_ms"])
    one, two = statistics.median(step_ms[1]), statistics.median(step_ms[2])
    print(f"MLP training step cores=1: {one:7.2f} ms  cores=2: {two:7.2f} ms  (medians of {args.reps} children; "
          f"all: 1={['%.1f' % t for t in step_ms[1]]} 2={['%.1f' % t for t in step_ms[2]]})")
    print(f"1-vs-2-core speedup: {one / two:.2f}x")


if __name__ == "__main__":
    main()
