"""How a trainer's child is started: its CPU set, the environment it gets, the allocator it preloads,
the numactl prefix. START names each catalogue variable that shapes the start, with the check of why
a job's value cannot be honoured here (or None); one plain function per trainer builds the spec
(spec_for). Nothing here changes the machine or the parent's os.environ: the worker spawns the child
with the spec (worker/spawn.py).

    torch   OMP_NUM_THREADS/MKL_NUM_THREADS, OpenMP binding (OMP_PROC_BIND/OMP_PLACES: torch's
            GNU libgomp and Intel's libiomp5 both read them), ATen/oneDNN ISA caps; the child sets
            its intra/inter-op pools itself (worker/trainers/torch/readback.py)
    jax     JAX_PLATFORMS=cpu; XLA sizes its intra-op pool from the affinity (the CPU set), which
            is how cores binds it; no per-thread binding, no ISA cap
    numpy   OPENBLAS_NUM_THREADS = intra_threads, OMP_NUM_THREADS; OpenBLAS runs pthreads, so no
            OpenMP binding; no ISA cap
Shared: the CPU set (physical cores first), LD_PRELOAD allocator, numactl memory policy.
cc_flags and compiler are applied inside the torch child (worker/trainers/torch/ccflags.py); here only
whether they can be (lto cannot; clang needs LLVM's omp.h: worker/knobs/ccflags.py).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field

from worker.knobs import ccflags, isa_check
from worker.trainers.torch import gemm_route

DEFAULT = "default"


@dataclass
class ChildSpec:
    cpus: list[int]  # the child's affinity set, in preference order (physical cores first)
    env: dict[str, str]  # variables to ADD to the child's whitelisted environment
    argv_prefix: list[str]  # e.g. ["/usr/bin/numactl", "--interleave=all"] or []
    applied: dict = field(default_factory=dict)  # what the parent set and read back


def choose_cpus(cores: int, facts: dict, cpu_pool: list[int]) -> list[int]:
    """`cores` CPUs of the pool: one per physical core first, then their SMT siblings, so cores=N
    means N real cores for as long as there are any."""
    pool = set(cpu_pool)
    core_cpus = facts.get("core_cpus") or [[cpu] for cpu in sorted(pool)]
    order = [core[i] for i in range(max(map(len, core_cpus), default=0))
             for core in core_cpus if i < len(core) and core[i] in pool]
    order += sorted(pool - set(order))  # CPUs the topology did not list (it should list all)
    return order[:cores]


def job_cpus(config: dict, facts: dict, cpu_pool: list[int]) -> list[int]:
    return choose_cpus(int(config.get("cores") or len(cpu_pool)), facts, cpu_pool)


# -- allocator ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Library:
    """An allocator's system library: preloaded (LD_PRELOAD), read back from the child's mapped files."""

    files: tuple[str, ...]  # its file names, the first found in LIB_DIRS wins
    package: str  # Debian's package that installs it
    env: dict = field(default_factory=dict)  # what it reads at start


# Known system libraries only, per arch: a sweep file names a word (variables.ALLOCATORS), never a path.
# Debian/Ubuntu multiarch, then Fedora/RHEL (lib64) and Arch (lib).
LIB_DIRS = ("/usr/lib/{triple}", "/usr/lib64", "/usr/lib")
TRIPLES = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu",
           "s390x": "s390x-linux-gnu"}
# Intel's tuned settings for training (IPEX launcher and Intel's model-zoo scripts): huge decay times
# keep freed pages mapped, so each step does not pay page faults again. torch's own launcher
# (torch/backends/xeon/run_cpu.py in 2.13) uses the first three fields only.
JEMALLOC_CONF = ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                 "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000")
# One per allocator of the catalogue. tcmalloc: gperftools' minimal build, else the full one
# (libgoogle-perftools4).
ALLOCATOR_LIBS = {
    "jemalloc": Library(("libjemalloc.so.2",), "libjemalloc2", {"MALLOC_CONF": JEMALLOC_CONF}),
    "tcmalloc": Library(("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "libtcmalloc-minimal4"),
    "mimalloc": Library(("libmimalloc.so.2",), "libmimalloc2.0"),
}


def allocator_paths(kind: str) -> list[str]:
    """Where the allocator's library is looked for on this arch, in order."""
    triple = TRIPLES.get(platform.machine(), f"{platform.machine()}-linux-gnu")
    return [f"{folder.format(triple=triple)}/{name}" for folder in LIB_DIRS for name in ALLOCATOR_LIBS[kind].files]


def allocator_lib(kind: str) -> str | None:
    return next((path for path in allocator_paths(kind) if os.path.exists(path)), None)


def allocator_unavailable(kind: str) -> str | None:
    if kind == DEFAULT or allocator_lib(kind):
        return None
    return f"allocator={kind}: no {kind} library on the known paths (apt-get install {ALLOCATOR_LIBS[kind].package})"


# -- ISA cap --------------------------------------------------------------------------------------

# isa value -> (CPU flags it needs, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA).
# ATen distinguishes only default/avx2/avx512 on x86 (an unknown word falls back to the best the
# CPU has, so every AVX-512 flavour maps to "avx512"); oneDNN distinguishes each step, so on one
# machine avx512, avx512_vnni, avx512_bf16 and amx differ only in oneDNN's kernels.
ISA_CAPS = {
    "baseline": (("sse4_1", "sse4_2"), "default", "SSE41"),  # MKL's lowest path is SSE4.2
    "avx2": (("avx2", "fma"), "avx2", "AVX2"),
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx512", "AVX512_CORE"),
    "avx512_vnni": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"), "avx512", "AVX512_CORE_VNNI"),
    "avx512_bf16": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"), "avx512",
                    "AVX512_CORE_BF16"),
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile", "amx_bf16", "amx_int8"), "avx512",
            "AVX512_CORE_AMX"),
}


def isa_unavailable(isa: str, facts: dict, framework: str = "torch", onednn: bool = True) -> str | None:
    """Why the cap cannot be applied and confirmed here: a non-torch framework, another arch, a CPU
    without the ISA, or (known from the probe's read of the libraries' banners) a library that names
    no ISA on this CPU, so no run could confirm the cap: refused at claim, before any setup."""
    if isa == DEFAULT:
        return None
    if framework != "torch":
        return f"isa={isa}: the ISA caps reach torch's ATen, oneDNN and MKL only; framework={framework} has no such cap"
    arch = facts.get("arch") or platform.machine()
    if arch != "x86_64":
        return f"isa={isa}: the ISA caps are defined for x86-64 only (this is {arch})"
    flags = set((facts.get("isa_flags") or "").split())
    missing = [f for f in ISA_CAPS[isa][0] if f not in flags]
    if missing:
        return f"isa={isa}: this CPU lacks {' '.join(missing)}"
    return isa_check.unconfirmable_here(isa, facts.get("library_isas"), onednn)


# -- NUMA memory policy ---------------------------------------------------------------------------

NUMA_OPTIONS = {"local": "--localalloc", "interleave": "--interleave=all"}
_numactl_ok: dict[str, str | None] = {}


def _numactl_works(numactl: str, option: str) -> str | None:
    """Containers often forbid set_mempolicy (seccomp): try the policy once per process."""
    if option not in _numactl_ok:
        try:
            done = subprocess.run([numactl, option, "true"], capture_output=True, text=True, timeout=10)
            _numactl_ok[option] = None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")
        except OSError as err:
            _numactl_ok[option] = str(err)
    return _numactl_ok[option]


def numa_unavailable(numa: str) -> str | None:
    """Memory policy through numactl in front of the child's argv (the CPUs stay the ones the worker
    set). No fallback: taskset binds CPUs but sets no memory policy."""
    if numa == DEFAULT:
        return None
    numactl = shutil.which("numactl")
    if not numactl:
        return f"numa={numa}: numactl is not installed (apt-get install numactl); taskset sets no memory policy"
    why = _numactl_works(numactl, NUMA_OPTIONS[numa])
    return f"numa={numa}: numactl {NUMA_OPTIONS[numa]} is not allowed here: {why}" if why else None


# -- availability ---------------------------------------------------------------------------------

def cores_unavailable(cores: int, cpu_pool: list[int]) -> str | None:
    if cores > len(cpu_pool):
        return f"cores={cores} but this worker may use {len(cpu_pool)} CPUs ({','.join(map(str, sorted(cpu_pool)))})"
    return None


def onednn_unavailable(on: bool, facts: dict) -> str | None:
    if on and (facts.get("torch") or {}).get("mkldnn_available") is False:
        return "onednn=on: this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    return None


def blas_unavailable(name: str) -> str | None:
    """Why the NumPy trainer cannot load this GEMM library here (PyPI's mkl / blis not installed), or
    None; the child confirms it (worker/trainers/numpy/blas.py: a library that does not load, or
    cannot run the job's threads, is a skip there)."""
    import importlib.util
    import sys

    if name == "mkl" and not any(os.path.exists(os.path.join(sys.prefix, "lib", f"libmkl_rt.so{s}"))
                                 for s in ("", ".2", ".3")):
        return f"blas=mkl: no libmkl_rt in {os.path.join(sys.prefix, 'lib')} (pip install the mkl of requirements.txt)"
    if name == "blis" and importlib.util.find_spec("blis") is None:
        from worker.trainers.numpy.blas import debian_blis

        if debian_blis() is None:
            return ("blas=blis: neither Debian's threaded BLIS (apt-get install libblis4-openmp) nor PyPI's blis "
                    "(pip install the blis of requirements.txt) is installed")
    return None


def pinning_unavailable(pin: bool, framework: str) -> str | None:
    if pin and framework != "torch":
        why = ("XLA's pool follows the CPU set; no per-thread binding" if framework == "jax"
               else "OpenBLAS runs pthreads, which OMP_PROC_BIND does not bind")
        return f"pin_threads=on: framework={framework} cannot bind its threads ({why})"
    return None


def nodes_unavailable(nodes: int) -> str | None:
    """nodes > 1 runs only inside a SLURM allocation of that many nodes (the child starts one launcher
    per node through srun: worker/trainers/torch/distributed.py)."""
    have = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    if nodes <= have:
        return None
    return (f"nodes={nodes}: this worker runs in no SLURM allocation of {nodes} nodes "
            f"(bench.py submit --slurm --nodes {nodes} --together)")


# The catalogue variables that shape the child's start, each declared here once (the machine's state is
# system.py's Knobs' and interconnect.py's): name -> why the job's value cannot be honoured here (None: it
# can), or None where every value can. The spec functions below apply them; a skip's reasons come in this order.
START = {
    "cores": lambda c, facts, pool: cores_unavailable(int(c["cores"]), pool),
    "numa": lambda c, facts, pool: numa_unavailable(c["numa"]),
    "allocator": lambda c, facts, pool: allocator_unavailable(c["allocator"]),
    "isa": lambda c, facts, pool: isa_unavailable(c["isa"], facts, c.get("framework", "torch"),
                                                  bool(c.get("onednn", True))),
    "pin_threads": lambda c, facts, pool: pinning_unavailable(bool(c["pin_threads"]), c.get("framework", "torch")),
    "nodes": lambda c, facts, pool: nodes_unavailable(int(c.get("nodes", 1))),
    # the torch trainer's launcher starts them, each rank on its slice (worker/trainers/torch/distributed.py)
    "ranks": None,
    "omp_threads": None,
    "intra_threads": None,
    "inter_threads": None,
}


def unavailable(config: dict, facts: dict, cpu_pool: list[int]) -> list[str]:
    """Why each of the job's start settings cannot be honoured here (empty: all can)."""
    framework = config.get("framework", "torch")
    checks = [check(config, facts, cpu_pool) for check in START.values() if check]
    if framework == "numpy" and config.get("blas", "openblas") != "openblas":
        checks.append(blas_unavailable(config["blas"]))
    if framework == "torch":
        checks.append(gemm_route.unavailable(config.get("blas", "mkl"), facts))
        checks.append(onednn_unavailable(bool(config["onednn"]), facts))
        checks.append(ccflags.unavailable(config.get("cc_flags", DEFAULT)))
        if config.get("compile") == "inductor" and config.get("compiler", "gcc") != "gcc":
            checks.append(ccflags.compiler_unavailable(config["compiler"]))
    return [why for why in checks if why]


# -- the spec, one function per trainer -----------------------------------------------------------

def _shared(config: dict, facts: dict, cpus: list[int]) -> ChildSpec:
    """The CPU set, the allocator and the numactl prefix: the same for every trainer."""
    spec = ChildSpec(cpus=list(cpus), env={}, argv_prefix=[], applied={"cpus": list(cpus)})
    lib = allocator_lib(config["allocator"]) if config["allocator"] != DEFAULT else None
    if lib:
        spec.env["LD_PRELOAD"] = lib
        spec.env.update(ALLOCATOR_LIBS[config["allocator"]].env)
    spec.applied["allocator_lib"] = lib
    if config["numa"] != DEFAULT:
        spec.argv_prefix = [shutil.which("numactl"), NUMA_OPTIONS[config["numa"]]]
    spec.applied["numa_nodes"] = facts.get("numa_nodes")
    return spec


def torch_spec(config: dict, facts: dict, cpus: list[int]) -> ChildSpec:
    spec = _shared(config, facts, cpus)
    omp = str(int(config["omp_threads"]))
    spec.env.update(OMP_NUM_THREADS=omp, MKL_NUM_THREADS=omp)
    spec.applied.update(intra_threads=int(config["intra_threads"]), inter_threads=int(config["inter_threads"]))
    if config["pin_threads"]:
        # one place per CPU in the spec's preference order: thread i sits on the i-th chosen CPU
        spec.env.update(OMP_PROC_BIND="close", OMP_PLACES=",".join(f"{{{cpu}}}" for cpu in cpus))
    else:
        spec.env["OMP_PROC_BIND"] = "false"  # explicit, so the read-back says so
    if config["isa"] != DEFAULT:
        _, aten, onednn = ISA_CAPS[config["isa"]]
        spec.env.update(ATEN_CPU_CAPABILITY=aten, ONEDNN_MAX_CPU_ISA=onednn, **isa_check.extra_env(config["isa"]))
    spec.env.update(gemm_route.start_env(config.get("blas", "mkl"), spec.env))  # mkl_intel_path: its preload
    if int(config.get("nodes", 1)) > 1:
        spec.env.update(slurm_env())
    return spec


def slurm_env() -> dict[str, str]:
    """What a child of nodes > 1 needs to start the other nodes' launchers with srun inside the worker's
    allocation: SLURM's job variables (SLURM_JOB_ID, SLURM_JOB_NODELIST...) and SLURM_CONF where set."""
    return {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}


def jax_spec(config: dict, facts: dict, cpus: list[int]) -> ChildSpec:
    spec = _shared(config, facts, cpus)
    spec.env["JAX_PLATFORMS"] = "cpu"  # no probing for GPU/TPU plugins: faster start, one device
    spec.env["OMP_NUM_THREADS"] = str(int(config["omp_threads"]))  # libraries jaxlib loads that use OpenMP
    spec.applied.update(intra_threads=int(config["intra_threads"]))
    return spec


def numpy_spec(config: dict, facts: dict, cpus: list[int]) -> ChildSpec:
    spec = _shared(config, facts, cpus)
    spec.env.update(OPENBLAS_NUM_THREADS=str(int(config["intra_threads"])),
                    OMP_NUM_THREADS=str(int(config["omp_threads"])))
    spec.applied.update(intra_threads=int(config["intra_threads"]))
    return spec


SPECS = {"torch": torch_spec, "jax": jax_spec, "numpy": numpy_spec}


def spec_for(config: dict, facts: dict, cpus: list[int]) -> ChildSpec:
    return SPECS[config.get("framework", "torch")](config, facts, cpus)
