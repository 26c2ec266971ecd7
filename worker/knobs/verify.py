"""The read-back, checked: which of the job's settings the child did NOT run under, from what the
trainer read back in its own process (worker/trainers/<framework>: affinity, threads, allocator,
ISA...). A run with any is recorded failed: its numbers would belong to other settings. A key the
trainer did not report is not judged (a framework has no such setting), except the keys in REQUIRED:
a JAX or NumPy child that cannot say how many threads its library runs, or whether it compiled, has
not shown it ran under the job's settings.

    torch   with compile=inductor and cc_flags off its default: cc_kernel_flags, the effective flags
            of every kernel compile command, is exactly [worker.knobs.ccflags.expected(cc_flags)]; with
            compile=inductor, cc_kernel_compilers (the driver of every kernel command) is exactly the
            `compiler`'s (required for clang; for gcc, judged where any kernel was built)
    numpy   blas == the job's blas (the library every product ran on) and blas_threads ==
            intra_threads (threadpoolctl for OpenBLAS and MKL, BLIS's own API), jit is False
    jax     xla_threads == cores (XLA sizes its pool from the affinity), jit == (compile == "xla")
Every trainer: lr == variables.peak_lr(config) and lr_schedule == the job's (its optimizer's own), and
seed == variables.run_seed(config) (a learning run's repeat r trains with seed + r).
torch and jax record `blas` (applied.blas: BLAS_INFO of torch's build, XLA's Eigen) without it being
judged: it is their build's, not the job's choice (a torch wheel for ARM runs OpenBLAS).
"""

from __future__ import annotations

import math

from common.variables import allocator_of, peak_lr, run_seed
from worker.knobs import ccflags, isa_check
from worker.knobs.startspec import DEFAULT, ISA_CAPS, ChildSpec


def _expected_torch(config: dict, spec: ChildSpec) -> dict:
    expected = {
        "torch_threads": config["intra_threads"],
        "interop_threads": config["inter_threads"],
        "mkldnn": bool(config["onednn"]),
        "blas": config.get("blas", "mkl"),  # the GEMM route read back (gemm_route.py: MKL's branch, calls)
        "omp_num_threads": spec.env.get("OMP_NUM_THREADS"),
        "omp_proc_bind": spec.env.get("OMP_PROC_BIND"),
        "omp_places": spec.env.get("OMP_PLACES"),
    }
    if config.get("ranks", 1) * config.get("nodes", 1) > 1:
        expected.pop("omp_places")  # each rank's own slice: judged per rank in not_in_force
    if config["isa"] != DEFAULT:
        expected["cpu_capability"] = ISA_CAPS[config["isa"]][1].upper()
    flags = ccflags.expected(config.get("cc_flags", DEFAULT)) if config["compile"] == "inductor" else None
    if flags:  # every kernel compiled with the value's flags, and at least one (judged even if unreported)
        expected["cc_kernel_flags"] = [flags]
    if config["compile"] == "inductor":
        expected["cc_kernel_compilers"] = [ccflags.COMPILERS[config.get("compiler", "gcc")]]
    return expected


def _expected_jax(config: dict, spec: ChildSpec) -> dict:
    return {"xla_threads": int(config["cores"]), "jit": config["compile"] == "xla"}


def _expected_numpy(config: dict, spec: ChildSpec) -> dict:
    return {"blas": config.get("blas", "openblas"), "blas_threads": int(config["intra_threads"]), "jit": False,
            "omp_num_threads": spec.env.get("OMP_NUM_THREADS")}


EXPECTED = {"torch": _expected_torch, "jax": _expected_jax, "numpy": _expected_numpy}
REQUIRED = {"torch": (), "jax": ("xla_threads", "jit"), "numpy": ("blas", "blas_threads", "jit")}


def _same(read, want) -> bool:
    """A read-back value equals the asked one (a float, such as lr, up to its last bits' rounding)."""
    if isinstance(want, float) and isinstance(read, (int, float)) and not isinstance(read, bool):
        return math.isclose(read, want, rel_tol=1e-9)
    return read == want


def not_in_force(config: dict, spec: ChildSpec, child: dict) -> list[str]:
    """The job's settings the child did NOT run under, each as 'key=what it read (asked what)'."""
    framework = config.get("framework", "torch")
    expected = {"affinity": sorted(spec.cpus)} | EXPECTED[framework](config, spec)
    # the optimizer's own peak learning rate and the schedule it followed (every trainer records both)
    expected["lr_schedule"] = config.get("lr_schedule", "constant")
    if "optimizer" in config:
        expected["lr"] = peak_lr(config)
    if "seed" in config:
        expected["seed"] = run_seed(config)
    required = REQUIRED[framework] + (("cc_kernel_flags",) if "cc_kernel_flags" in expected else ()) + (
        ("cc_kernel_compilers",) if framework == "torch" and config.get("compiler", "gcc") != "gcc"
        and "cc_kernel_compilers" in expected else ())
    if framework == "torch" and "cc_kernel_compilers" not in required and not child.get("cc_kernel_compilers"):
        expected.pop("cc_kernel_compilers", None)  # gcc, no kernel seen: nothing to judge
    wrong = [f"{key}={child.get(key)!r} (asked {want!r})" for key, want in expected.items()
             if (key in child or key in required) and not _same(child.get(key), want)]
    if framework == "torch":
        wrong += isa_check.disobeyed(config["isa"], child)  # the ISA MKL and oneDNN really dispatched to
    for rank in child.get("ranks") or []:  # data parallelism: every rank on its own slice, its threads the job's
        if rank.get("affinity") is not None and rank["affinity"] != rank["slice"]:
            wrong.append(f"rank {rank['rank']} affinity={rank['affinity']!r} (asked its slice {rank['slice']!r})")
        if rank.get("torch_threads") is not None and rank["torch_threads"] != config["intra_threads"]:
            wrong.append(f"rank {rank['rank']} torch_threads={rank['torch_threads']!r} "
                         f"(asked {config['intra_threads']!r})")
    lib = child.get("allocator_lib")
    if config["allocator"] != DEFAULT and "allocator_lib" in child and allocator_of(lib) != config["allocator"]:
        wrong.append(f"allocator_lib={lib!r} (asked {config['allocator']})")
    return wrong
