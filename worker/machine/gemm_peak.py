"""The GEMM peak of the exact CPU set a job uses, per precision: what its MFU is taken against.

Measured in a child (`python -m worker.machine.gemm_peak --measure`, so the worker never imports torch)
pinned to one CPU of each physical core of the set (SMT siblings share one core's FMA units), one
thread per physical core bound to it (GOMP_CPU_AFFINITY), fp32 and bf16 at the machine's full ISA,
in each of the trainers' GEMM libraries (torch's MKL on its Intel path where it can take it, as
torch's blas=auto does, / oneDNN, JAX's XLA, NumPy's OpenBLAS): the peak
is the fastest of them, and the run records which one and the others' figures. One library alone is
not the machine's peak: on an AVX-512 AMD EPYC, MKL takes a generic path at 208 GFLOP/s (2 cores)
while XLA reaches 473, so a JAX run measured against MKL's figure showed an MFU of 1.16.

Cached in the worker state dir (probe-peaks.json, beside the probe's limits) per machine (fingerprint,
torch version, quick/full) and, inside that, per (sorted CPU set, clock settings, precision): the clock
knobs (freq_mhz, governor, turbo) are in force while it is measured and change the peak, so a set
measured at a pinned low clock never stands for the same set at the default one.

A measurement is trusted only from a quiet machine: the child reads /proc/stat busy and steal ticks
of the whole set around the timed GEMMs and takes its own CPU time out. When other processes or
the hypervisor took more than sensors.DISTURBED_SHARE of the set's CPU time meanwhile, the figure is used for
the run that asked, recorded as provisional with the reason, and not cached (the worker retries
after RETRY_S). Where no measurement can be had the probe's 1-core / all-core peaks are scaled to
the set (loop._peaks), and the basis says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common.paths import REPO
from common.metrics import peak_text
from worker import jsonfile
from worker.knobs.system import SYSTEM_KNOBS
from worker.machine import sensors
from worker.trainers.torch import gemm_route

PRECISIONS = ("fp32", "bf16")
# Every system knob sets the CPUs' clock (worker/knobs/system.py), so each is part of a peak's key.
CLOCK_KNOBS = tuple(sorted(knob.name for knob in SYSTEM_KNOBS))
MIN_WINDOW_S = 0.5  # the timed GEMMs last at least this long (quick ones are repeated)
RETRY_S = 300.0  # a worker re-measures a provisional peak at most this often
CACHE_FILE = "probe-peaks.json"


def thread_cpus(cpus: list[int], core_cpus: list[list[int]] | None) -> list[int]:
    """One CPU per physical core of the set (the lowest of its siblings in the set), in order.
    Without topology every CPU counts as its own core."""
    used = set(cpus)
    cores = core_cpus or [[c] for c in sorted(used)]
    picked = [min(used & set(core)) for core in cores if used & set(core)]
    picked += [c for c in sorted(used) if not any(c in core for core in cores)]  # outside the topology
    return sorted(picked)


def set_key(cpus: list[int], config: dict, precision: str) -> str:
    clock = ",".join(f"{k}={config.get(k, 'default')}" for k in CLOCK_KNOBS)
    return f"cpus={','.join(map(str, sorted(set(cpus))))}/{clock}/{precision}"


def machine_key(facts: dict, quick: bool) -> str:
    """The cache's machine: its fingerprint, torch and the measurement's size. (`fastest-intel-path`:
    the peaks are the fastest library's, torch's MKL on its Intel path; a cache from before, torch's
    alone or MKL as shipped, is not read as one.)"""
    return (f"{facts.get('fingerprint')}/torch-{facts.get('torch_version')}/{'quick' if quick else 'full'}"
            "/fastest-intel-path")


def loaded_reason(m: dict) -> str | None:
    """Why a measurement was taken under load (sensors.disturbance over the timed GEMMs), or None
    when the machine was quiet."""
    return sensors.disturbance(m.get("other_cpu_s"), m.get("steal_s"), len(m["cpus"]), float(m["window_s"]),
                               " during the measurement")


def measure_set(cpus: list[int], threads_on: list[int], quick: bool, timeout_s: float = 300) -> dict:
    """The GEMM peaks of `cpus`, measured in a child pinned to `threads_on` with one thread each."""
    argv = [sys.executable, "-m", "worker.machine.gemm_peak", "--measure", "--cpus", ",".join(map(str, cpus))]
    argv += ["--quick"] if quick else []
    n = str(len(threads_on))
    env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
           "GOMP_CPU_AFFINITY": " ".join(map(str, threads_on)), "PYTHONPATH": str(REPO)}
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "KMP_AFFINITY", "OMP_PROC_BIND"):
        env.pop(name, None)  # the full ISA, and nothing that overrides the binding above
    if gemm_route.unavailable("mkl_intel_path") is None:  # torch's fastest route, its auto: MKL on its Intel path
        env.update(gemm_route.start_env("mkl_intel_path", env))
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=lambda: os.sched_setaffinity(0, threads_on))
    if done.returncode != 0:
        raise RuntimeError(f"GEMM peak measurement on CPUs {threads_on} failed: "
                           f"{(done.stderr.strip().splitlines() or [str(done.returncode)])[-1]}")
    return json.loads(done.stdout)


def peak_for(cpus: list[int], config: dict, facts: dict, state_dir: Path, *, quick: bool,
             provisional: dict | None = None, measure: Callable[..., dict] = measure_set) -> dict:
    """{"fp32": .., "bf16": .., "library", "by_library", "basis": .., "provisional": reason or None} for
    the job's CPU set, each peak the fastest of the trainers' GEMM libraries (library_products):
    the cached quiet figure, else a fresh measurement (cached when quiet). `provisional` is the
    worker's memory of loaded measurements (key -> (peak, time)): reused for RETRY_S, never saved.
    Raises RuntimeError when the measurement fails (the caller falls back to scaled peaks)."""
    threads_on = thread_cpus(cpus, facts.get("core_cpus"))
    keys = {p: set_key(cpus, config, p) for p in PRECISIONS}
    file = Path(state_dir) / CACHE_FILE
    mkey = machine_key(facts, quick)
    cached = jsonfile.read(file).get(mkey, {})
    where = f"CPUs {sorted(set(cpus))}: {len(threads_on)} thread(s), one per physical core, pinned to {threads_on}"
    if all(k in cached for k in keys.values()):
        at = time.strftime("%Y-%m-%d %H:%M", time.gmtime(cached[keys["fp32"]]["measured_at"]))
        peak = answer({p: cached[k] for p, k in keys.items()})
        return {**peak, "basis": f"GEMM peak measured on {where}, the fastest of the trainers' libraries: "
                f"{peak_text(peak)} (cached, measured {at} UTC on a quiet machine)", "provisional": None}
    memo_key = "|".join(keys.values())
    if provisional is not None and memo_key in provisional and time.time() - provisional[memo_key][1] < RETRY_S:
        return dict(provisional[memo_key][0])
    m = measure(sorted(set(cpus)), threads_on, quick)
    why = loaded_reason(m)
    entries = {p: {"gflops": m["gflops"][p], "library": (m.get("fastest") or {}).get(p),
                   "by_library": {lib: g[p] for lib, g in (m.get("by_library") or {}).items() if p in g}}
               for p in PRECISIONS}
    out = answer(entries)
    text = f"GEMM peak measured on {where}, the fastest of the trainers' libraries: {peak_text(out)}"
    if m.get("library_errors"):
        text += "; left out, failing here: " + "; ".join(f"{lib} ({why})" for lib, why in m["library_errors"].items())
    if why is None:
        all_cached = jsonfile.read(file)  # re-read: another worker on other CPUs may have added its sets
        saved = all_cached.setdefault(mkey, {})
        for p, k in keys.items():
            saved[k] = {**entries[p], "measured_at": time.time(), "threads_on": threads_on,
                        "window_s": m["window_s"], "other_cpu_s": m["other_cpu_s"], "steal_s": m["steal_s"]}
        jsonfile.write(file, all_cached)
        out.update(basis=f"{text} (measured now on a quiet machine, cached)", provisional=None)
    else:
        out.update(basis=f"{text} (provisional, not cached: {why})", provisional=why)
        if provisional is not None:
            provisional[memo_key] = (dict(out), time.time())
    return out


def answer(entries: dict) -> dict:
    """peak_for's figures from per-precision entries: the peaks, and which library gave each."""
    return {**{p: entries[p]["gflops"] for p in PRECISIONS},
            "library": {p: entries[p].get("library") for p in PRECISIONS},
            "by_library": {p: entries[p].get("by_library") or {} for p in PRECISIONS}}


# -- the measuring child ----------------------------------------------------------------------------

def library_products() -> dict[str, dict[str, Callable[[int], Callable[[], object]]]]:
    """The trainers' GEMM libraries that import here, per precision: n -> a call running one n x n x n
    product to completion. NumPy's own BLAS (OpenBLAS, fp32), JAX (XLA, jitted) and torch (MKL for
    fp32, oneDNN for bf16). On some CPUs they differ by 2x or more (MKL takes a generic path on AMD
    while XLA uses AVX-512), and a peak taken from one alone would put another framework's MFU above 1.

    Imported in this order on purpose: OpenBLAS starts its threads when it loads and XLA sizes its
    pool from this thread's affinity when its client starts, and torch's OpenMP binds this thread to
    the first CPU of GOMP_CPU_AFFINITY as soon as it loads."""
    import numpy as np

    def numpy_product(n: int):
        x, y = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
        return lambda: x @ y

    out = {"numpy": {"fp32": numpy_product}}
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        pass
    else:
        jax.devices()  # the client and its thread pool start now, on the whole set
        matmul = jax.jit(jnp.matmul)

        def jax_product(dtype):
            def product(n: int):
                x, y = jnp.asarray(np.random.rand(n, n), dtype), jnp.asarray(np.random.rand(n, n), dtype)
                return lambda: matmul(x, y).block_until_ready()
            return product

        out["jax"] = {"fp32": jax_product(jnp.float32), "bf16": jax_product(jnp.bfloat16)}
    import torch

    from worker.machine.probe import torch_product

    out["torch"] = {"fp32": torch_product(torch, torch.float32), "bf16": torch_product(torch, torch.bfloat16)}
    return out


def xla_pool_threads() -> int:
    """How many threads XLA's intra-op pool started with (read back: its size follows the affinity
    this thread had when the client started)."""
    from worker.trainers.jax.runtime import XLA_POOL_THREAD, thread_names

    return thread_names().get(XLA_POOL_THREAD, 0)


def measure_here(cpus: list[int], quick: bool) -> dict:
    """In the child: GEMM peaks at this process's affinity and thread count, per library and the
    fastest of them per precision, with what else ran on the whole set (`cpus`, SMT siblings
    included) over the timed GEMMs."""
    from worker.machine.probe import best_gflops

    products = library_products()
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    sizes = (64, 128) if quick else (512, 1024, 2048)
    budget = 0.2 if quick else 1.5
    window = sensors.OwnWindow.start(cpus)
    by_library = {lib: dict.fromkeys(kinds, 0.0) for lib, kinds in products.items()}
    errors = {}  # a library that fails here is left out with why; torch's failure fails the measurement
    while True:  # at least MIN_WINDOW_S: over a few ticks, load on the set cannot be told from none
        for lib, kinds in products.items():
            for name, product in kinds.items():
                if lib in errors:
                    continue
                try:
                    got = round(best_gflops(product, sizes, budget_s=budget), 1)
                except Exception as error:  # one library's failure is recorded, not fatal
                    if lib == "torch":
                        raise
                    errors[lib] = f"{type(error).__name__}: {error}"[:300]
                    continue
                by_library[lib][name] = max(by_library[lib][name], got)
        if time.perf_counter() - window.t0 >= MIN_WINDOW_S:
            break
    for lib in errors:
        by_library.pop(lib)
    other_s, steal_s, window_s = window.load()
    fastest = {p: max((lib for lib in by_library if p in by_library[lib]), key=lambda lib: by_library[lib][p])
               for p in PRECISIONS}
    return {"gflops": {p: by_library[lib][p] for p, lib in fastest.items()}, "fastest": fastest,
            "by_library": by_library, "library_errors": errors, "cpus": cpus, "threads": torch.get_num_threads(),
            "xla_pool_threads": xla_pool_threads() if "jax" in products else None,
            **torch_route(),
            "main_thread_affinity": sorted(os.sched_getaffinity(0)), "window_s": round(window_s, 3),
            "other_cpu_s": round(other_s or 0.0, 3), "steal_s": round(steal_s or 0.0, 3),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def torch_route() -> dict:
    """The route torch's MKL took in this child, read back as the trainer reads it (gemm_route.route_ran:
    MKL's own branch and vendor answer), with them: mkl_intel_path only where its preload took."""
    asked = "mkl_intel_path" if "libmkl_intel_path" in os.environ.get("LD_PRELOAD", "") else "mkl"
    branch = gemm_route.mkl_branch()
    return {"torch_route": gemm_route.route_ran(asked, {}, branch), **branch}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.machine.gemm_peak", description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true", help="(internal) measure in this process, print JSON")
    parser.add_argument("--cpus", required=True, help="the job's CPU set, comma-separated (load is read on all of it)")
    parser.add_argument("--quick", action="store_true", help="tiny matrices")
    args = parser.parse_args(argv)
    cpus = sorted({int(c) for c in args.cpus.split(",") if c.strip()})
    print(json.dumps(measure_here(cpus, args.quick)))


if __name__ == "__main__":
    main()
