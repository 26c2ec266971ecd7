"""The one trainer contract: what every training child reads, how it times, what it prints.

A trainer (worker/trainers/torch, .../jax, .../numpy) is a package whose `__main__` calls
`serve(run)`: one JSON request on stdin, exactly one JSON result line on stdout, everything else
(library chatter included) on stderr. The worker knows nothing of the framework inside; it only picks
the package by `framework` (trainer_module()) and reads the result back.

Request (the worker writes it):
    config             the resolved job config (every catalogue variable)
    run_id             the run's id, or None outside the queue (`bench.py once`)
    output_dir         where to save the model (None: do not save); output_root: where saved models live
    data_dir           the prepared corpora (worker/data.py)
    peak_gflops        {"fp32": .., "bf16": .., "basis", "provisional"} GEMM peak of the run's CPU set, or None
    compile_cache_dir  a shared compiler cache (torch inductor's warm cache)
Result (the trainer prints it; result() and skipped() build it):
    status "done" | "skipped", reason, metrics (EVERY name of TRAINER_METRICS, None where it cannot
    measure), gemm_format (what the run's GEMMs computed, in words; a simulated format says so), applied (the settings read back, at least READBACK), timed_window ({start_unix_s,
    end_unix_s}: time.time() around the timed steps, for sensors averaged over exactly that window),
    dataset_used, output_path, torch_version (None where torch did not run: the framework's own
    version goes in build_info), python_version, build_info.
On an exception: traceback on stderr, non-zero exit, no result line.

Imports nothing but the standard library and common/ at module level: the children start fast.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable

from common.compute import (INT4_GROUP, INT4_N_MULTIPLE, NOT_OFFERED, SIMULATED, int4_unsupported,  # noqa: F401
                            linear_shapes, mlp_hidden)
# The analytic counts live in common/compute.py (the worker, the ETA, the memory estimate and the cost
# model share one formula); the trainers and tests know them by these names here.
from common.compute import (MERGED_LORA_PRECISIONS, attended_positions, block_matmul_params,  # noqa: F401
                            flops_per_step, lora_params, matmul_params, param_counts)
from common.metrics import METRICS, TRAINER_METRICS, WORKER_METRICS  # noqa: F401 (the contract's names)

# Read back by every trainer (common_read_back()); each adds its framework's own (threads, BLAS...).
READBACK = ("affinity", "main_thread_affinity", "allocator_lib", "uid")
# The trainer package per `framework`; the worker starts `python -m <module>` (or forks it).
TRAINERS = {"torch": "worker.trainers.torch", "jax": "worker.trainers.jax", "numpy": "worker.trainers.numpy"}
# The GEMM peak each precision's MFU is taken against; int8 and bitnet (integer forward GEMMs) and q4
# (int4 weights x bf16) wait for peaks of their own in the probe (no such key yet: their mfu is NULL
# rather than a ratio against the fp32 peak they are not bound by).
PEAK_KEY = {"fp32": "fp32", "q8": "fp32", "q4": "int4", "bitnet": "int8", "int8": "int8", "bf16": "bf16",
            "mixed": "bf16"}
LOSS_LAST_STEPS = 3  # loss_last averages this many final steps: one step's loss is noisy


class Skip(Exception):
    """A value this trainer cannot honour: the run is recorded as skipped with this reason."""


def trainer_module(framework: str) -> str:
    return TRAINERS[framework]


# -- the protocol ------------------------------------------------------------------------------


def _claim_stdout():
    """Keep the real stdout for the result; point fd 1 (Python and C prints alike) at stderr."""
    result_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(result_fd, "w")


def serve(run: Callable[[dict], dict]) -> None:
    """A trainer's main: read the request, run it, print exactly one result line."""
    out = _claim_stdout()
    request = json.loads(sys.stdin.read())
    result = run(request)
    out.write(json.dumps(result) + "\n")
    out.flush()


def skipped(reason: str, applied: dict | None = None, torch_version: str | None = None) -> dict:
    return {"status": "skipped", "reason": reason, "metrics": {}, "gemm_format": None, "applied": applied or {},
            "timed_window": None,
            "dataset_used": None, "output_path": None, "torch_version": torch_version,
            "python_version": platform.python_version(), "build_info": None}


def result(metrics: dict, *, applied: dict, timed_window: dict, dataset_used: str | None, output_path: str | None,
           torch_version: str | None, build_info: dict | None, gemm_format: str | None = None) -> dict:
    """A done result; raises if a trainer metric is missing or an unknown one is present. gemm_format:
    what the GEMMs computed (every trainer says; None only from test stubs that train nothing)."""
    missing = [m for m in TRAINER_METRICS if m not in metrics]
    unknown = [m for m in metrics if m not in TRAINER_METRICS]
    if missing or unknown:
        raise RuntimeError(f"trainer result: missing metrics {missing}, unknown metrics {unknown}")
    return {"status": "done", "reason": None, "metrics": {m: metrics[m] for m in TRAINER_METRICS},
            "gemm_format": gemm_format, "applied": applied, "timed_window": timed_window, "dataset_used": dataset_used,
            "output_path": output_path, "torch_version": torch_version,
            "python_version": platform.python_version(), "build_info": build_info}


# -- the timed loop ----------------------------------------------------------------------------


def timed_loop(step: Callable, sync: Callable, next_batch: Callable, config: dict,
               compilations: Callable[[], int] | None = None) -> tuple[dict, dict, float]:
    """Warm up, then time each step on its own: (metrics, timed_window, first_step_start).

    `step(micro_batches)` runs one optimizer step over grad_accum (inputs, targets) micro-batches and
    returns its loss; `sync(loss)` waits for the step's work to finish (JAX's block_until_ready) and
    returns the loss (a float, or anything float() takes): it runs inside the timed region.
    Batches are drawn before the clock starts. warmup_steps are untimed (let the loop settle:
    allocator, caches, kernel selection); the first step alone is first_step_s (compilation
    included): the first warmup step, or with warmup_steps=0 the first timed step.
    `compilations()`: the framework's count of compilations so far (None: it has no such count);
    timed_window records how many happened during the timed steps and the slowest step over the
    median, so a run that timed its compiler is failed by the worker (compiled_while_timed), not done.
    """
    accum = config["grad_accum"]
    losses = []
    first: dict = {}

    def one_step() -> int:
        micro = [next_batch() for _ in range(accum)]  # drawn before the clock starts
        if not first:
            first["start"] = time.perf_counter()
        t = time.perf_counter_ns()
        loss = sync(step(micro))
        elapsed_ns = time.perf_counter_ns() - t
        first.setdefault("s", elapsed_ns / 1e9)
        losses.append(loss)
        return elapsed_ns

    for _ in range(config["warmup_steps"]):
        one_step()
    compiled_before = compilations() if compilations is not None else None
    before = resource.getrusage(resource.RUSAGE_SELF)
    start_unix_s = time.time()
    times_ns = [one_step() for _ in range(config["steps"])]
    end_unix_s = time.time()
    after = resource.getrusage(resource.RUSAGE_SELF)
    compiled = compilations() - compiled_before if compilations is not None else None

    ms = [t / 1e6 for t in times_ns]
    median = statistics.median(ms)
    qs = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) > 1 else [ms[0]] * 9
    tokens = config["batch_size"] * accum * config["seq_len"]
    values = [float(v) for v in losses]
    metrics = {
        "first_step_s": first["s"],
        "step_ms_median": median, "step_ms_p10": qs[0], "step_ms_p90": qs[-1],
        "step_ms_mean": statistics.fmean(ms), "step_ms_std": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        "train_s": sum(ms) / 1e3,
        "tokens_per_s": tokens / (median / 1e3), "samples_per_s": config["batch_size"] * accum / (median / 1e3),
        "loss_first": values[0], "loss_last": statistics.fmean(values[-LOSS_LAST_STEPS:]),
        "peak_rss_mb": after.ru_maxrss / 1024,  # KiB on Linux
        "cpu_user_s": after.ru_utime - before.ru_utime, "cpu_sys_s": after.ru_stime - before.ru_stime,
        "ctx_switches": after.ru_nivcsw - before.ru_nivcsw,
        # one process; the torch trainer's data-parallel launch (torch/distributed.py) replaces these
        "world_size": 1, "global_batch": config["batch_size"] * accum, "allreduce_ms": None, "allreduce_share": None,
    }
    window = {"start_unix_s": start_unix_s, "end_unix_s": end_unix_s, "compilations": compiled,
              "slowest_step_x_median": max(ms) / median if median > 0 else None}
    return metrics, window, first["start"]


def compiled_while_timed(window: dict | None) -> str | None:
    """Why a run's timed steps measured a compiler (its timed_window counted compilations), or None.
    A step far above the median alone is no proof (a shared machine has such steps); a framework's
    own compilation count is."""
    n = (window or {}).get("compilations")
    if not n:
        return None
    slowest = window.get("slowest_step_x_median")
    worst = f" (the slowest timed step {slowest:.1f}x the median)" if slowest else ""
    return (f"{n} compilation(s) during the timed steps{worst}: the run timed the compiler, not training "
            f"(a trainer that recompiles every step, or too few warm-up steps)")


def check_finite(metrics: dict) -> None:
    if not all(math.isfinite(metrics[k]) for k in ("loss_first", "loss_last")):
        raise RuntimeError(f"loss is not finite: first {metrics['loss_first']}, last {metrics['loss_last']}")


def throughput(metrics: dict, config: dict, peak_gflops: dict | None) -> dict:
    """params, trainable_params, flops_per_step, gflops and mfu, from the config (every framework
    counts alike) and the median step; mfu against the measured peak of the run's precision."""
    counts = param_counts(config)
    flops = flops_per_step(config)
    gflops = flops / (metrics["step_ms_median"] / 1e3) / 1e9
    peak = (peak_gflops or {}).get(PEAK_KEY.get(config["precision"], "fp32"))
    return {"params": counts["params"], "trainable_params": counts["trainable_params"], "flops_per_step": flops,
            "gflops": gflops, "mfu": gflops / peak if peak else None}


# -- what every trainer reads back -------------------------------------------------------------


def loaded_allocator() -> str | None:
    """The malloc replacement mapped into this process, from /proc/self/maps, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                name = os.path.basename(path)
                if name.startswith(("libjemalloc", "libtcmalloc")):
                    return path
    except OSError:
        return None
    return None


def threads_affinity() -> list[int]:
    """The CPUs any thread of this process may run on. With OpenMP binding each thread is pinned to
    its own place, so the main thread alone shows only the first one."""
    cpus: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            cpus |= os.sched_getaffinity(int(task))
        except OSError:
            pass  # the thread ended meanwhile
    return sorted(cpus)


def common_read_back() -> dict:
    """The READBACK settings, read in this process."""
    return {"affinity": threads_affinity(), "main_thread_affinity": sorted(os.sched_getaffinity(0)),
            "allocator_lib": loaded_allocator(), "uid": os.getuid()}
