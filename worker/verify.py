"""The read-back, checked: which of the job's settings the child did NOT run under, from what the
trainer read back in its own process (worker/trainers/<framework>: affinity, threads, allocator,
ISA...). A run with any is recorded failed: its numbers would belong to other settings. A key the
trainer did not report is not judged (a framework has no such setting).
"""

from __future__ import annotations

import os

from worker.startspec import DEFAULT, ISA_CAPS, ChildSpec


def _expected_torch(config: dict, spec: ChildSpec) -> dict:
    expected = {
        "torch_threads": config["intra_threads"],
        "interop_threads": config["inter_threads"],
        "mkldnn": bool(config["onednn"]),
        "omp_num_threads": spec.env.get("OMP_NUM_THREADS"),
        "omp_proc_bind": spec.env.get("OMP_PROC_BIND"),
        "omp_places": spec.env.get("OMP_PLACES"),
    }
    if config["isa"] != DEFAULT:
        expected["cpu_capability"] = ISA_CAPS[config["isa"]][1].upper()
    return expected


def _expected_jax(config: dict, spec: ChildSpec) -> dict:
    return {}  # XLA's pool follows the affinity, checked for every framework


def _expected_numpy(config: dict, spec: ChildSpec) -> dict:
    return {"blas_threads": int(config["intra_threads"]), "omp_num_threads": spec.env.get("OMP_NUM_THREADS")}


EXPECTED = {"torch": _expected_torch, "jax": _expected_jax, "numpy": _expected_numpy}


def not_in_force(config: dict, spec: ChildSpec, child: dict) -> list[str]:
    """The job's settings the child did NOT run under, each as 'key=what it read (asked what)'."""
    expected = {"affinity": sorted(spec.cpus)} | EXPECTED[config.get("framework", "torch")](config, spec)
    wrong = [f"{key}={child.get(key)!r} (asked {want!r})" for key, want in expected.items()
             if key in child and child[key] != want]
    lib = child.get("allocator_lib")
    if config["allocator"] != DEFAULT and "allocator_lib" in child and (
            lib is None or not os.path.basename(lib).startswith(f"lib{config['allocator']}")):
        wrong.append(f"allocator_lib={lib!r} (asked {config['allocator']})")
    return wrong
