"""What the NumPy trainer runs under: OpenBLAS's threads, set before start and in the child, read back.

NumPy's wheel carries its own OpenBLAS (scipy-openblas, pthreads); torch's wheel uses MKL. Which
BLAS, which of its kernels (`architecture`: the CPU type OpenBLAS dispatched to) and how many
threads are read back through threadpoolctl and recorded per run: the "MKL vs OpenBLAS" axis.
NumPy's elementwise ufuncs run on the calling thread; only the GEMMs are threaded.
"""

from __future__ import annotations

import os

_LIMITS = []  # the threadpoolctl limiter stays alive (and in force) for the child's lifetime


def apply_in_child(config: dict) -> None:
    """Set OpenBLAS's pool to intra_threads through threadpoolctl (also where the variable was not set)."""
    import numpy  # noqa: F401  (threadpoolctl limits only the libraries already loaded)
    from threadpoolctl import threadpool_limits

    _LIMITS.append(threadpool_limits(limits=int(config["intra_threads"]), user_api="blas"))


def blas_info() -> dict | None:
    """threadpoolctl's entry for the BLAS NumPy loaded, or None."""
    import numpy  # noqa: F401  (loads the BLAS)
    from threadpoolctl import threadpool_info

    for entry in threadpool_info():
        if entry.get("user_api") == "blas":
            return entry
    return None


def read_back() -> dict:
    """The settings in force, by the names runs.applied uses."""
    from worker.trainers.harness import loaded_allocator, threads_affinity

    blas = blas_info() or {}
    return {
        "affinity": threads_affinity(),
        "main_thread_affinity": sorted(os.sched_getaffinity(0)),
        "blas": blas.get("internal_api"),
        "blas_threads": blas.get("num_threads"),
        "blas_architecture": blas.get("architecture"),
        "allocator_lib": loaded_allocator(),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "jit": False,
        "uid": os.getuid(),
    }


def build_info() -> dict:
    import numpy

    blas = blas_info() or {}
    return {"framework": f"numpy {numpy.__version__}",
            "blas": " ".join(str(blas[k]) for k in ("internal_api", "version") if blas.get(k)) or None,
            "blas_threading": blas.get("threading_layer"),
            "blas_architecture": blas.get("architecture"),
            "numpy_simd": _numpy_simd()}


def _numpy_simd() -> str | None:
    """The SIMD targets NumPy's own ufunc kernels found on this CPU (its runtime dispatch)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return None
    return ",".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f)) or None
