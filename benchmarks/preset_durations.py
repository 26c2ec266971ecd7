"""Estimated duration and largest memory estimate of each preset, on 2 cores and on 16.

    python benchmarks/preset_durations.py [--gflops-2c G] [--speedup-16c S] [--overhead-s O] [PRESET ...]

A preset is planned as enqueue would (orchestrator.queue.sweep.load on a 2- and a 16-CPU machine, no
cpufreq) and each job's wall time estimated as

    overhead_s + flops_per_step * (steps + warmup_steps) * slowdown(precision, framework) / gflops(cores)

flops_per_step is the trainers' analytic count (worker/trainers/harness.flops_per_step).
gflops(2), --gflops-2c (default 50), is the fp32 training throughput of 2 quiet cores of the
development VM: MFU 0.2 of its measured 251 GFLOP/s fp32 GEMM peak (README). Checks, not a quiet
measurement (none could be had: the VM ran at a load of 7-13 on its 2 vCPUs): a d512 L8 seq512 step
ran at 21 GFLOP/s of wall time there under that load; the memory calibration runs (orchestrator/
memory.py) did 27-88 GFLOP per CPU-second for fp32 torch models of d_model 256-2048, i.e. 38-123
GFLOP/s on 2 cores at the 0.7 efficiency measured from 1 to 2 cores: 50 sits in the lower half, so
the estimates lean long for the larger models. Two `scale` jobs timed end to end (`/usr/bin/time
bench.py once ...`, exec spawn, load 7.7-8.2 on the 2 vCPUs): the base 26.7 s (estimate 6.2 s quiet;
its steps ran at 13 GFLOP/s under that load), d_model 1024 81.7 s (estimate 57 s; its steps ran at
48 GFLOP/s even under that load). gflops(16) = gflops(2) * --speedup-16c (default 4), an assumption:
no 16-core machine was measured; 8x the cores at about half efficiency for these mid-size models
(1 -> 2 cores measured 1.39x on a small step). Fewer cores than the machine's (a `cores` axis) scale
by the same power law. overhead_s (--overhead-s, default 2) is the per-job cost besides the steps
(child start, data, tokenizer): with it the quick preset's estimate, 8 min, matches its measured 7
to 8.5 min. Compiling adds 30 s a job for inductor, 10 s for XLA (guesses). slowdown: bf16 and
mixed 2.6x (README: bf16 is emulated on a CPU without AVX512_BF16), q8/q4/bitnet 1.5x (quantize on
every forward), jax/numpy 2x (guesses). Jobs the machine cannot run (skipped at run time) are
counted as if they ran: an upper bound.
Prints one line per preset; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import memory
from orchestrator.queue.sweep import PRESETS_DIR, Machine, load
from worker.trainers.harness import flops_per_step

SLOWDOWN = {"bf16": 2.6, "mixed": 2.6, "q8": 1.5, "q4": 1.5, "bitnet": 1.5}
COMPILE_S = {"inductor": 30.0, "xla": 10.0}  # compiling the step, once per job
FRAMEWORK_SLOWDOWN = {"jax": 2.0, "numpy": 2.0}


def job_seconds(config: dict, gflops_2c: float, speedup_16c: float, overhead_s: float) -> float:
    cores = config["cores"]
    # throughput ~ cores^k with k from the 2 -> 16 core speedup (k = log(S) / log(8))
    k = math.log(speedup_16c) / math.log(8)
    gflops = gflops_2c * (cores / 2) ** k
    slow = SLOWDOWN.get(config["precision"], 1.0) * FRAMEWORK_SLOWDOWN.get(config["framework"], 1.0)
    flops = flops_per_step(config) * (config["steps"] + config["warmup_steps"])
    return overhead_s + COMPILE_S.get(config["compile"], 0.0) + flops * slow / (gflops * 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("presets", nargs="*", default=sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
    parser.add_argument("--gflops-2c", type=float, default=50.0, help="training GFLOP/s on 2 quiet cores")
    parser.add_argument("--speedup-16c", type=float, default=4.0, help="16 cores vs 2 (assumed)")
    parser.add_argument("--overhead-s", type=float, default=2.0, help="seconds per job besides its steps")
    args = parser.parse_args()
    for name in args.presets:
        line = [f"{name:9s}"]
        for cpus in (2, 16):
            plan = load(None, preset=name, machine=Machine(cpu_count=cpus, freq_limits=None))
            jobs = [j["config"] for j in plan.iter_jobs()]
            total = sum(job_seconds(c, args.gflops_2c, args.speedup_16c, args.overhead_s) for c in jobs)
            line.append(f"{cpus:2d} cores: {len(jobs):4d} jobs {total / 60:7.1f} min")
        worst = memory.check_plan(plan, 1 << 50, "-")
        line.append(f"largest memory estimate {worst / memory.GIB:.1f} GiB")
        print("  ".join(line))


if __name__ == "__main__":
    main()
