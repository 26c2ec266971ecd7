"""The machine probe: what this machine is (the `machines` row of schema.sql) and what it can do.

Two kinds of facts, cached differently:
- static facts read from /proc and /sys (CPU model, topology, ISA flags, caches, memory, cpufreq):
  cheap, cached per boot (boot_id), because hotplug, a kernel update or a BIOS change needs a reboot;
- measured limits (triad memory bandwidth, GEMM peak, torch build info): a few seconds, measured in a
  subprocess (`python -m worker.machine.probe --measure`) so the worker parent never imports torch, cached
  per (fingerprint, torch version) across boots and re-measured on demand. Limits measured while
  other processes or the hypervisor took more than sensors.DISTURBED_SHARE of the CPUs are
  provisional (`limits_disturbed` says why): used, and measured again by a probe RETRY_S later.
Knob availability is recomputed on every call: it is cheap and changes when a package is installed.

The fingerprint hashes only what identifies the hardware, never a measurement, so re-measuring or
rebooting keeps the same `machines` row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from common.paths import REPO
from common.errors import BenchError
from worker import jsonfile
from worker.machine import noise
from worker.knobs import sysfs


# The ISA flags worth recording (the rest of /proc/cpuinfo's flags say nothing about kernels), in
# the order of the x86 dispatch ladder; arm64 names come from the "Features" line.
ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "fma", "f16c", "avx2", "avx_vnni", "avx_vnni_int8",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi",
    "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm", "sme",
)

# The `machines` columns (schema.sql) that describe the hardware and so make the fingerprint.
FINGERPRINT_KEYS = ("hostname", "cpu_model", "vendor", "sockets", "physical_cores", "logical_cores",
                    "numa_nodes", "isa_flags", "mem_total_gb_rounded")

RETRY_S = 300.0  # limits measured under load are used, and measured again by a probe this much later
LIMIT_KEYS = ("mem_bw_gbs_1t", "mem_bw_gbs_all", "gemm_gflops_fp32_1c", "gemm_gflops_fp32_all",
              "gemm_gflops_bf16_1c", "gemm_gflops_bf16_all", "noise_cv", "noise", "library_isas")


# -- static facts ---------------------------------------------------------------------------------

def _cpuinfo(root: str) -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per processor block."""
    blocks, block = [], {}
    for line in (sysfs.read(root, "/proc/cpuinfo") or "").splitlines():
        if not line.strip():
            if block:
                blocks.append(block)
            block = {}
            continue
        key, _, value = line.partition(":")
        block[key.strip()] = value.strip()
    if block:
        blocks.append(block)
    return blocks


def topology(root: str = "/") -> dict:
    """Online CPUs, physical cores (each a list of sibling CPUs, ordered by first CPU), packages."""
    online = sysfs.parse_cpulist(sysfs.read(root, f"{sysfs.CPU}/online"))
    if not online:
        online = sorted(os.sched_getaffinity(0)) if root in ("", "/") else []
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in online:
        top = f"{sysfs.CPU}/cpu{cpu}/topology"
        package = sysfs.read_int(root, f"{top}/physical_package_id")
        core = sysfs.read_int(root, f"{top}/core_id")
        # Without topology files (some containers) every CPU counts as its own core.
        key = (package if package is not None else 0, core if core is not None else cpu)
        cores.setdefault(key, []).append(cpu)
    core_cpus = sorted((sorted(c) for c in cores.values()), key=lambda c: c[0])
    return {
        "cpus": online,
        "core_cpus": core_cpus,
        "packages": len({k[0] for k in cores}) or 1,
    }


def _numa(root: str, cpus: list[int]) -> dict[str, list[int]]:
    nodes = {}
    for name in sysfs.listdir(root, sysfs.NODE):
        if name.startswith("node") and name[4:].isdigit():
            nodes[name[4:]] = sysfs.parse_cpulist(sysfs.read(root, f"{sysfs.NODE}/{name}/cpulist"))
    return nodes or {"0": cpus}


def _caches(root: str, cpu: int) -> list[dict]:
    """The caches cpu0 sees: level, type, size of one instance, how many CPUs share it."""
    out = []
    base = f"{sysfs.CPU}/cpu{cpu}/cache"
    for index in sysfs.listdir(root, base):
        if not index.startswith("index"):
            continue
        size = sysfs.read(root, f"{base}/{index}/size") or ""
        kb = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[:-1].isdigit() else None
        out.append({
            "level": sysfs.read_int(root, f"{base}/{index}/level"),
            "type": sysfs.read(root, f"{base}/{index}/type"),
            "size_kb": kb,
            "shared_cpus": sysfs.parse_cpulist(sysfs.read(root, f"{base}/{index}/shared_cpu_list")),
        })
    return out


def _cache_kb(caches: list[dict], level: int, types: tuple[str, ...]) -> int | None:
    for cache in caches:
        if cache["level"] == level and cache["type"] in types:
            return cache["size_kb"]
    return None


def _cpufreq(root: str, cpu: int) -> dict:
    def khz_to_mhz(name):
        khz = sysfs.read_int(root, sysfs.cpu_file(cpu, name))
        return khz // 1000 if khz is not None else None

    return {
        "freq_driver": sysfs.read(root, sysfs.cpu_file(cpu, "scaling_driver")),
        "freq_min_mhz": khz_to_mhz("cpuinfo_min_freq"),
        "freq_max_mhz": khz_to_mhz("cpuinfo_max_freq"),
        "governors": (sysfs.read(root, sysfs.cpu_file(cpu, "scaling_available_governors")) or "").split(),
        "governor": sysfs.read(root, sysfs.cpu_file(cpu, "scaling_governor")),
        "intel_pstate_status": sysfs.read(root, f"{sysfs.CPU}/intel_pstate/status"),
    }


def static_facts(sysfs_root: str = "/") -> dict:
    """Everything the probe reads from /proc and /sys: no measurement, no torch, milliseconds."""
    root = sysfs_root
    blocks = _cpuinfo(root)
    first = blocks[0] if blocks else {}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    top = topology(root)
    cpus = top["cpus"] or list(range(len(blocks)))
    caches = _caches(root, cpus[0]) if cpus else []
    numa = _numa(root, cpus)
    mem_kb = 0
    for line in (sysfs.read(root, "/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    mem_gb = round(mem_kb / 2**20, 2)  # GiB, as `free -g` counts
    facts = {
        "hostname": socket.gethostname(),
        "cpu_model": first.get("model name") or first.get("Model") or platform.processor() or None,
        "vendor": first.get("vendor_id") or first.get("CPU implementer"),
        "arch": platform.machine(),
        "sockets": top["packages"],
        "physical_cores": len(top["core_cpus"]),
        "logical_cores": len(cpus),
        "numa_nodes": len(numa),
        "smt": any(len(c) > 1 for c in top["core_cpus"]),
        "isa_flags": " ".join(f for f in ISA_FLAGS if f in flags),
        "l1d_kb": _cache_kb(caches, 1, ("Data",)),
        "l2_kb": _cache_kb(caches, 2, ("Unified", "Data")),
        "l3_kb": _cache_kb(caches, 3, ("Unified", "Data")),
        "mem_total_gb": mem_gb,
        "kernel": sysfs.read(root, "/proc/sys/kernel/osrelease") or platform.release(),
        "boot_id": sysfs.read(root, "/proc/sys/kernel/random/boot_id"),
        "cpus": cpus,
        "core_cpus": top["core_cpus"],
        "numa_cpus": numa,
        "caches": caches,
        "python_version": platform.python_version(),
    }
    if caches == [] and first.get("cache size"):  # no sysfs cache info (some VMs): cpuinfo's is the LLC
        facts["l3_kb"] = int(first["cache size"].split()[0])
    facts.update(_cpufreq(root, cpus[0]) if cpus else {})
    facts["fingerprint"] = fingerprint(facts)
    return facts


def fingerprint(facts: dict) -> str:
    ident = {k: facts.get(k) for k in FINGERPRINT_KEYS}
    ident["mem_total_gb_rounded"] = round(facts.get("mem_total_gb") or 0)  # MemTotal drifts by kernel
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


# -- measured limits (run in a subprocess: imports torch) -----------------------------------------

def _best_s(fn, reps: int) -> float:
    fn()  # warm: first call pays allocation, page faults and kernel selection
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _triad_gbs(torch, n: int, reps: int) -> float:
    """STREAM triad a = b + s*c, in float32; counts 3 arrays moved as STREAM does (no write-allocate)."""
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    seconds = _best_s(lambda: torch.add(b, c, alpha=3.0, out=a), reps)
    return 3 * n * 4 / seconds / 1e9


def _gemm_gflops(torch, dtype, sizes: tuple[int, ...], budget_s: float) -> float:
    """Peak GFLOP/s of torch.mm (best_gflops)."""
    return best_gflops(torch_product(torch, dtype), sizes, budget_s)


def torch_product(torch, dtype):
    """n -> a call running one n x n x n torch.mm of `dtype` (best_gflops' `product`)."""
    def product(n: int):
        x, y = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        return lambda: torch.mm(x, y)
    return product


def best_gflops(product, sizes: tuple[int, ...], budget_s: float) -> float:
    """Peak GFLOP/s of square n x n x n products over growing sizes (small ones miss peak, big ones
    are slow to time); `product(n)` gives a call that runs one product to completion. At each size
    the best of at least three calls after a warm one (kernel selection, packing buffers, a JIT's
    compile); a size is skipped when its predicted cost (n^3 scaling of the last one) would overrun
    the budget, so slow emulated formats stay cheap."""
    best, last_s, last_n = 0.0, None, None
    deadline = time.perf_counter() + budget_s
    for n in sizes:
        if last_s is not None and last_s * (n / last_n) ** 3 * 4 > deadline - time.perf_counter():
            break
        call = product(n)
        call()  # warm
        times, spent = [], time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - spent < 0.2 and len(times) < 10):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        last_s, last_n = min(times), n
        best = max(best, 2 * n**3 / last_s / 1e9)
    return best


def _torch_build(torch) -> dict:
    config = torch.__config__.show()
    blas = next((p.split("=", 1)[1] for p in config.replace(",", " ").split() if p.startswith("BLAS_INFO=")), None)
    onednn = next((line.split("v", 1)[-1].split()[0] for line in config.splitlines() if "MKL-DNN v" in line
                   or "oneDNN v" in line), None)
    with open("/proc/self/maps") as maps:
        libs = {os.path.basename(line.split()[-1]) for line in maps if ".so" in line}
    # torch ships its own GNU libgomp on Linux x86 wheels; Intel's libiomp5 only when preloaded.
    openmp = ("Intel libiomp5" if any(l.startswith("libiomp5") for l in libs)
              else "GNU libgomp" if any(l.startswith("libgomp") for l in libs)
              else "LLVM libomp" if any(l.startswith("libomp") for l in libs) else None)
    parallel = next((line.split(":", 1)[1].strip() for line in torch.__config__.parallel_info().splitlines()
                     if line.startswith("ATen parallel backend")), None)
    return {
        "version": torch.__version__,
        "blas": blas,
        "onednn_version": onednn,
        "openmp": openmp,
        "parallel_backend": parallel,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_available": bool(torch.backends.mkldnn.is_available()),
    }


def measure(quick: bool = False) -> dict:
    """Bandwidth and GEMM peaks, one thread and all CPUs of this process; the run-to-run noise
    (worker/machine/noise.py); torch build info."""
    import torch

    from worker.machine import sensors

    cpus = len(os.sched_getaffinity(0))
    n_triad = 2**16 if quick else 2**25  # 128 MiB per array: well past any L3 we expect
    sizes = (64, 128) if quick else (512, 1024, 2048)
    reps = 2 if quick else 4
    # Other work on the machine lowers every figure; the load says how far to trust them.
    out = {"torch": _torch_build(torch), "measured_threads": cpus, "quick": quick,
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    window = sensors.OwnWindow.start(sorted(os.sched_getaffinity(0)))
    for label, threads in (("1", 1), ("all", cpus)):
        torch.set_num_threads(threads)
        out["mem_bw_gbs_1t" if label == "1" else "mem_bw_gbs_all"] = round(_triad_gbs(torch, n_triad, reps), 2)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            key = f"gemm_gflops_{name}_{'1c' if label == '1' else 'all'}"
            out[key] = round(_gemm_gflops(torch, dtype, sizes, budget_s=0.2 if quick else 1.5), 1)
    torch.set_num_threads(cpus)
    out.update(noise.measure_noise(torch, quick))
    out["library_isas"] = _library_isas()
    out["measure_s"] = round(time.perf_counter() - t0, 2)
    other_s, steal_s, window_s = window.load()
    out["disturbed"] = sensors.disturbance(other_s, steal_s, len(window.cpus), window_s, " while the probe measured")
    return out


def _library_isas() -> dict:
    """The ISAs MKL and oneDNN name in their verbose banners, uncapped: a library that names none
    here (MKL on AMD) cannot confirm an `isa` cap, so capped runs are refused before they start."""
    from worker.knobs import isa_check

    try:
        read = isa_check.library_isas()
    except Exception as error:  # a probe fact, not a reason to fail the probe
        return {"error": f"{type(error).__name__}: {error}"}
    return {k: read.get(k) for k in ("mkl_isa", "onednn_isa")}


def _measure_in_child(quick: bool) -> dict:
    argv = [sys.executable, "-m", "worker.machine.probe", "--measure"] + (["--quick"] if quick else [])
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"machine probe measurement failed ({' '.join(argv[1:])}): "
                         f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return json.loads(done.stdout)


# -- the probe ------------------------------------------------------------------------------------

def cached_static_facts(state_dir: Path, sysfs_root: str = "/") -> dict:
    """static_facts(), cached per boot (boot_id) under state_dir: the probe's facts without its measured
    limits or its checks of the knobs (which import torch), enough to find the machine by fingerprint."""
    static_file = Path(state_dir) / "probe-static.json"
    cached = jsonfile.read(static_file)
    boot_id = sysfs.read(sysfs_root, "/proc/sys/kernel/random/boot_id")
    if cached.get("boot_id") == boot_id and boot_id and cached.get("sysfs_root") == sysfs_root:
        return cached["facts"]
    facts = static_facts(sysfs_root)
    jsonfile.write(static_file, {"boot_id": boot_id, "sysfs_root": sysfs_root, "facts": facts})
    return facts


def probe(state_dir: Path, *, remeasure: bool = False, quick: bool = False, sysfs_root: str = "/") -> dict:
    """Machine facts. Cached per boot (boot_id) under state_dir; measured limits (bandwidth, GEMM)
    cached and re-measured on demand (remeasure=True). quick=True makes the measurements tiny."""
    from worker.knobs import settings as knobs  # knobs imports nothing from here at import time

    t0 = time.perf_counter()
    state_dir = Path(state_dir)
    facts = cached_static_facts(state_dir, sysfs_root)

    try:
        torch_version = metadata.version("torch")  # the cache key, read without importing torch
    except metadata.PackageNotFoundError:
        torch_version = None
    key = f"{facts['fingerprint']}/torch-{torch_version}/{'quick' if quick else 'full'}"
    limits_file = state_dir / "probe-limits.json"
    all_limits = jsonfile.read(limits_file)
    limits = all_limits.get(key)
    stale = limits is not None and limits.get("disturbed") and time.time() - limits.get("measured_at", 0) > RETRY_S
    # an older cache lacks new figures, or was never checked for load
    if limits is None or remeasure or stale or any(k not in limits for k in (*LIMIT_KEYS, "disturbed")):
        limits = _measure_in_child(quick)
        limits["measured_at"] = time.time()
        all_limits[key] = limits
        jsonfile.write(limits_file, all_limits)

    facts = dict(facts)
    facts.update({k: limits.get(k) for k in LIMIT_KEYS})
    facts["torch"] = limits.get("torch", {})
    facts["torch_version"] = facts["torch"].get("version") or torch_version
    facts["limits_measured_at"] = limits.get("measured_at")
    facts["limits_quick"] = quick
    facts["limits_load_avg_1m"] = limits.get("load_avg_1m")
    facts["limits_disturbed"] = limits.get("disturbed")  # why the figures are provisional, or None
    facts["knobs"] = knobs.machine_knobs(facts, sysfs_root=sysfs_root)
    facts["probe_s"] = round(time.perf_counter() - t0, 3)
    return facts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.machine.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true", help="(internal) measure limits, print JSON")
    parser.add_argument("--quick", action="store_true", help="tiny measurements")
    parser.add_argument("--remeasure", action="store_true", help="ignore cached measurements")
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON document")
    parser.add_argument("--state-dir", default=os.environ.get("BENCH_STATE", ".bench"))
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(quick=args.quick)))
        return
    facts = probe(Path(args.state_dir), remeasure=args.remeasure, quick=args.quick)
    if args.json:
        print(json.dumps(facts, indent=1, sort_keys=True))
        return
    for key in sorted(facts):
        if key not in ("caches", "knobs", "numa_cpus", "core_cpus", "cpus"):
            print(f"{key:22} {facts[key]}")
    print("knobs:")
    for name, why in facts["knobs"].items():
        print(f"  {name:22} {'available' if why is None else why}")


if __name__ == "__main__":
    main()
