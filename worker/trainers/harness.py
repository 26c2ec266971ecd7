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
    curve_path         a learning run (max_tokens) appends each evaluation here as one JSON line, as it goes
    proven             {key: proof} what earlier children of the same fork server (or, executed, of the
                       same worker and start settings) proved once for later ones (the torch trainer:
                       which library ran a GEMM route's products, worker/trainers/torch/gemm_route.py)
Result (the trainer prints it; result() and skipped() build it):
    status "done" | "skipped", reason, metrics (EVERY name of TRAINER_METRICS, None where it cannot
    measure), gemm_format (what the run's GEMMs computed, in words; a simulated format says so),
    applied (the settings read back, at least READBACK), timed_window ({start_unix_s, end_unix_s}:
    time.time() around the timed steps, for sensors averaged over exactly that window),
    dataset_used, output_path, torch_version (None where torch did not run: the framework's own
    version goes in build_info), python_version, build_info, proven (what this run proved for later
    children, {key: proof}; the worker hands it to them in `proven` while their start stays the same).
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
from dataclasses import dataclass

# the precisions' vocabulary, re-exported: the trainers know it by these names here
from common.compute import (INT4_GROUP, INT4_N_MULTIPLE, NOT_OFFERED, SIMULATED, int4_unsupported,  # noqa: F401
                            linear_shapes, mlp_hidden)
# The analytic counts live in common/compute.py (the worker, the ETA, the memory estimate and the cost
# model share one formula); the trainers and tests know them by these names here.
from common.compute import (MERGED_LORA_PRECISIONS, attended_positions, block_matmul_params,  # noqa: F401
                            flops_per_step, lora_params, matmul_params, param_counts)
from common.metrics import METRICS, TRAINER_METRICS, WORKER_METRICS  # noqa: F401 (the contract's names)
from common.variables import BY_NAME, NONE, allocator_of, is_learning, run_seed, steps_trained, tokens_per_step

# Read back by every trainer (common_read_back()); each adds its framework's own (threads, BLAS...).
READBACK = ("affinity", "main_thread_affinity", "allocator_lib", "uid")
# The trainer package per `framework` (the catalogue's choices); the worker starts `python -m <module>`
# (or forks it). A framework's package is worker/trainers/<framework>/ (worker/trainers/session.py).
TRAINERS = {name: f"worker.trainers.{name}" for name in BY_NAME["framework"].choices}
# A skip's reason opens with one of two kinds: what this machine lacks (a compiler, a library build, a
# corpus long enough: another machine may run the value), or what the trainer does not do anywhere.
UNAVAILABLE = "unavailable here"
NOT_SUPPORTED = "not supported"
# The GEMM peak each precision's MFU is taken against; int8 and bitnet (integer forward GEMMs) and q4
# (int4 weights x bf16) wait for peaks of their own in the probe (no such key yet: their mfu is NULL
# rather than a ratio against the fp32 peak they are not bound by).
PEAK_KEY = {"fp32": "fp32", "q8": "fp32", "q4": "int4", "bitnet": "int8", "int8": "int8", "bf16": "bf16",
            "mixed": "bf16"}
LOSS_LAST_STEPS = 3  # loss_last averages this many final steps: one step's loss is noisy
# lr_schedule=cosine (nanoGPT's recipe): a linear warm-up over this share of the optimizer steps, then a
# cosine decay that ends at LR_FLOOR of the peak on the last step (nanoGPT's min_lr = lr / 10)
LR_WARMUP_SHARE = 0.1
LR_FLOOR = 0.1
# Held-out windows per forward in evaluate(): fixed, so every batch size evaluates in the same chunks
EVAL_BATCH = 16


class Skip(Exception):
    """A value this trainer cannot honour: the run is recorded as skipped with this reason."""


def unavailable(why: str) -> Skip:
    """The Skip of what this machine lacks (another may run the value)."""
    return Skip(f"{UNAVAILABLE}: {why}")


def not_supported(why: str) -> Skip:
    """The Skip of what the trainer does not do on any machine."""
    return Skip(f"{NOT_SUPPORTED}: {why}")


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
    seed = run_seed(request["config"])  # a learning run's repeat trains with a seed of its own
    request["config"] = request["config"] | {"seed": seed}
    result = run(request)
    if result.get("status") == "done" and "applied" in result:  # (a prewarm-only process has none)
        result["applied"]["seed"] = seed
    out.write(json.dumps(result) + "\n")
    out.flush()


def skipped(reason: str, applied: dict | None = None, torch_version: str | None = None) -> dict:
    return {"status": "skipped", "reason": reason, "metrics": {}, "gemm_format": None, "applied": applied or {},
            "timed_window": None,
            "dataset_used": None, "output_path": None, "torch_version": torch_version,
            "python_version": platform.python_version(), "build_info": None}


def result(metrics: dict, *, applied: dict, timed_window: dict, dataset_used: str | None, output_path: str | None,
           torch_version: str | None, build_info: dict | None, gemm_format: str | None = None,
           proven: dict | None = None) -> dict:
    """A done result; raises if a trainer metric is missing or an unknown one is present. gemm_format:
    what the GEMMs computed (every trainer says; None only from test stubs that train nothing)."""
    missing = [m for m in TRAINER_METRICS if m not in metrics]
    unknown = [m for m in metrics if m not in TRAINER_METRICS]
    if missing or unknown:
        raise RuntimeError(f"trainer result: missing metrics {missing}, unknown metrics {unknown}")
    return {"status": "done", "reason": None, "metrics": {m: metrics[m] for m in TRAINER_METRICS},
            "gemm_format": gemm_format, "applied": applied, "timed_window": timed_window, "dataset_used": dataset_used,
            "output_path": output_path, "torch_version": torch_version,
            "python_version": platform.python_version(), "build_info": build_info, "proven": proven or {}}


# -- the timed loop ----------------------------------------------------------------------------


def lr_factor(step: int, total: int, schedule: str) -> float:
    """The learning rate of optimizer step `step` (0-based, of `total`) as a share of the peak."""
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"lr_schedule={schedule!r}: expected constant or cosine")
    warm = max(1, math.ceil(LR_WARMUP_SHARE * total))
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm + 1) / max(1, total - warm))  # reaches 1 at the last step
    return LR_FLOOR + (1.0 - LR_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Learning:
    """What a learning run (max_tokens set) evaluates with as it trains, and where its curve goes."""

    loss_of: Callable  # (inputs, targets) -> the mean loss of held-out windows (the session's eval_loss)
    held_out: Callable  # () -> (inputs, targets): the fixed held-out windows (worker/data.py validation_windows)
    curve_path: str | None = None  # each evaluation appended as a JSON line: a failed attempt's curve survives
    applied: dict | None = None  # the run's read-back: val_tokens, how many held-out tokens each evaluation takes


def timed_loop(step: Callable, sync: Callable, next_batch: Callable, config: dict,
               compilations: Callable[[], int] | None = None,
               set_lr: Callable[[float], None] | None = None,
               learning: Learning | None = None) -> tuple[dict, dict, float]:
    """Warm up, then time each step on its own: (metrics, timed_window, first_step_start).

    `step(micro_batches)` runs one optimizer step over grad_accum (inputs, targets) micro-batches and
    returns its loss; `sync(loss)` waits for the step's work to finish (JAX's block_until_ready) and
    returns the loss (a float, or anything float() takes): it runs inside the timed region.
    Batches are drawn before the clock starts. warmup_steps are untimed (let the loop settle:
    allocator, caches, kernel selection); the first step alone is first_step_s (compilation
    included): the first warmup step, or with warmup_steps=0 the first timed step.
    `set_lr(factor)`: scales the session's learning rate to `factor` x its peak before each step (before
    the clock starts), following lr_schedule over the run's steps; never called for a constant one.
    `compilations()`: the framework's count of compilations so far (None: it has no such count);
    timed_window records how many happened during the timed steps and the slowest step over the
    median, so a run that timed its compiler is failed by the worker (compiled_while_timed), not done.
    `learning`: a learning run (max_tokens set, learning_steps()) trains its token budget instead of
    `steps`, evaluating every eval_every tokens and stopping at the first evaluation at or below
    target_loss; its metrics add the curve's outcome (val_loss, reached, ..._to_target).
    """
    accum = config["grad_accum"]
    losses = []
    first: dict = {}
    schedule = config.get("lr_schedule", "constant")
    warmup, steps = config["warmup_steps"], config["steps"]
    if learning is not None:
        warmup, steps = learning_steps(config)
    scheduled = set_lr is not None and schedule != "constant"
    evaluations: dict = {"compilations": 0}

    def one_step() -> int:
        micro = [next_batch() for _ in range(accum)]  # drawn before the clock starts
        if scheduled:
            set_lr(lr_factor(len(losses), warmup + steps, schedule))
        if not first:
            first["start"] = time.perf_counter()
        t = time.perf_counter_ns()
        loss = sync(step(micro))
        elapsed_ns = time.perf_counter_ns() - t
        first.setdefault("s", elapsed_ns / 1e9)
        losses.append(loss)
        return elapsed_ns

    marks: dict = {}

    def start_timing() -> None:  # after the warm-up: the timed window's sensors, CPU times and compiles
        marks.update(compiled=compilations() if compilations is not None else None,
                     rusage=resource.getrusage(resource.RUSAGE_SELF), unix_s=time.time())
        evaluations["compilations"] = 0  # the evaluations' compiles inside the window, from here

    if learning is None:
        for _ in range(warmup):
            one_step()
        start_timing()
        times_ns = [one_step() for _ in range(steps)]
        outcome = {"val_loss": None, "eval_s": None}  # validation() measures them after the timed steps
    else:
        times_ns, outcome = _learn(one_step, start_timing, losses, config, learning, compilations, evaluations)
    compiled_before, before, start_unix_s = marks["compiled"], marks["rusage"], marks["unix_s"]
    end_unix_s = time.time()
    after = resource.getrusage(resource.RUSAGE_SELF)
    compiled = (compilations() - compiled_before - evaluations["compilations"]
                if compilations is not None else None)

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
        "train_tokens": tokens * len(values),
        "reached": None, "tokens_to_target": None, "steps_to_target": None, "time_to_target_s": None,
    } | outcome
    window = {"start_unix_s": start_unix_s, "end_unix_s": end_unix_s, "compilations": compiled,
              "slowest_step_x_median": max(ms) / median if median > 0 else None}
    return metrics, window, first["start"]


def learning_steps(config: dict) -> tuple[int, int]:
    """A learning run's (warm-up steps, steps after them): its token budget in whole optimizer steps,
    at least one of them after the warm-up (whose steps train and count tokens like any other)."""
    total = steps_trained(config)
    warmup = min(config["warmup_steps"], total - 1)
    return warmup, total - warmup


def _learn(one_step: Callable, start_timing: Callable, losses: list, config: dict, learning: Learning,
           compilations: Callable | None, evaluations: dict) -> tuple[list, dict]:
    """The steps of a learning run: an evaluation every eval_every tokens (and at the last step), each
    a curve row, until the validation loss is at or below target_loss or the budget is trained. The
    warm-up steps train and are evaluated like the rest; the step times are those after them (all
    of them, for a run that reached its target within its warm-up). (step times, the outcome's metrics)"""
    try:
        inputs, targets = learning.held_out()
    except ValueError as e:
        raise not_supported(f"a learning run evaluates on held-out text ({e})") from None
    if learning.applied is not None:
        learning.applied["val_tokens"] = int(inputs.size)
    per_step = tokens_per_step(config)
    warmup, steps = learning_steps(config)
    every = max(1, round(config["eval_every"] / per_step))
    target = None if config.get("target_loss", NONE) == NONE else float(config["target_loss"])
    step_ns: list[int] = []
    eval_s, since, curve = 0.0, 0, []

    def evaluate_now(trained: int) -> float:
        nonlocal eval_s, since
        counted = compilations() if compilations is not None else 0
        val_loss, seconds = evaluate(learning.loss_of, inputs, targets)
        if compilations is not None:  # an evaluation's own graph (jit) is not the timed steps' compiler
            evaluations["compilations"] += compilations() - counted
        eval_s += seconds
        row = {"step": trained, "tokens": trained * per_step, "train_s": sum(step_ns) / 1e9,
               "eval_s": eval_s, "train_loss": statistics.fmean(float(v) for v in losses[since:]),
               "val_loss": val_loss}
        since = len(losses)
        curve.append(row)
        if learning.curve_path:
            os.makedirs(os.path.dirname(learning.curve_path) or ".", exist_ok=True)
            with open(learning.curve_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        return val_loss

    for trained in range(1, warmup + steps + 1):
        if trained == warmup + 1:
            start_timing()
        step_ns.append(one_step())
        if (trained % every == 0 or trained == warmup + steps) and evaluate_now(trained) <= (target or -math.inf):
            break
    if len(step_ns) <= warmup:  # reached within the warm-up: its steps are all there is to time
        start_timing()
        times_ns = step_ns
    else:
        times_ns = step_ns[warmup:]
    last = curve[-1]
    reached = None if target is None else last["val_loss"] <= target
    outcome = {"val_loss": last["val_loss"], "eval_s": eval_s, "reached": reached}
    if reached:
        outcome |= {"tokens_to_target": last["tokens"], "steps_to_target": last["step"],
                    "time_to_target_s": last["train_s"] + last["eval_s"]}
    return times_ns, outcome


def evaluate(loss_of: Callable, inputs, targets) -> tuple[float, float]:
    """(mean loss, seconds) over the fixed held-out windows (worker/data.py val_windows), EVAL_BATCH
    windows per call of `loss_of(inputs, targets)`, which returns the mean loss of its windows (eval
    mode: no dropout, no gradients). Between steps, never inside one: no step time holds it."""
    started = time.perf_counter()
    total = 0.0
    for i in range(0, len(inputs), EVAL_BATCH):
        x, y = inputs[i:i + EVAL_BATCH], targets[i:i + EVAL_BATCH]
        total += float(loss_of(x, y)) * len(x)
    return total / len(inputs), time.perf_counter() - started


def learning_for(config: dict, request: dict, loss_of: Callable, held_out: Callable,
                 applied: dict | None = None) -> Learning | None:
    """The Learning of a learning run (max_tokens set), or None for a step-time run."""
    if not is_learning(config):
        return None
    return Learning(loss_of, held_out, request.get("curve_path"), applied)


def validation(loss_of: Callable, held_out: Callable, applied: dict) -> dict:
    """val_loss and eval_s of a trained model on its corpus's held-out windows (`held_out()`: worker/
    data.py validation_windows: a step-time run's are the first STEP_TIME_EVAL_TOKENS of a learning
    run's), for the result's metrics, and applied["val_tokens"]; both None, with the reason in
    applied["val_loss_missing"], where the held-out split is too short for one window."""
    try:
        inputs, targets = held_out()
    except ValueError as e:
        applied["val_loss_missing"] = str(e)
        return {"val_loss": None, "eval_s": None}
    applied["val_tokens"] = int(inputs.size)
    val_loss, eval_s = evaluate(loss_of, inputs, targets)
    return {"val_loss": val_loss, "eval_s": eval_s}


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
    losses = [metrics[k] for k in ("loss_first", "loss_last", "val_loss") if metrics.get(k) is not None]
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"loss is not finite: first {metrics['loss_first']}, last {metrics['loss_last']}, "
                           f"validation {metrics.get('val_loss')}")


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
                if allocator_of(path):
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
