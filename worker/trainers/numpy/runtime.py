"""What the NumPy trainer runs under: its GEMM library (`blas`: blas.py) and that library's threads,
set in the child and read back.

NumPy's wheel carries its own OpenBLAS (scipy-openblas, pthreads); blas=mkl and blas=blis call PyPI's
MKL and BLIS for every product of the model instead. Which library, its version, its kernel set
(`blas_architecture`) and how many threads it runs are read back and recorded per run (threadpoolctl
sees OpenBLAS and MKL; BLIS answers through its own API). NumPy's elementwise ufuncs run on the
calling thread; only the GEMMs are threaded.
"""

from __future__ import annotations

import os

from worker.trainers.harness import unavailable
from worker.trainers.numpy import blas

_LIMITS = []  # the threadpoolctl limiter of NumPy's own OpenBLAS stays alive (and in force)


def apply_in_child(config: dict) -> None:
    """NumPy's OpenBLAS pool to intra_threads (also when another library runs the GEMMs: nothing then
    wakes its threads), and the job's GEMM library active at intra_threads; a library that cannot
    run so here is a skip."""
    import numpy  # noqa: F401  (threadpoolctl limits only the libraries already loaded)
    from threadpoolctl import threadpool_limits

    threads = int(config["intra_threads"])
    _LIMITS.append(threadpool_limits(limits=threads, user_api="blas"))
    try:
        blas.use(config.get("blas", "openblas"), threads)
    except blas.Unavailable as why:
        raise unavailable(str(why)) from None


def read_back() -> dict:
    """The settings in force, by the names runs.applied uses (blas: the library every product ran on)."""
    from worker.trainers.harness import loaded_allocator, threads_affinity

    return {
        "affinity": threads_affinity(),
        "main_thread_affinity": sorted(os.sched_getaffinity(0)),
        **blas.active.info(),
        "allocator_lib": loaded_allocator(),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "jit": False,
        "uid": os.getuid(),
    }


def build_info() -> dict:
    import numpy

    info = blas.active.info()
    return {"framework": f"numpy {numpy.__version__}",
            "blas": " ".join(str(info[k]) for k in ("blas", "blas_version") if info.get(k)) or None,
            "blas_threading": info.get("blas_threading"),
            "blas_architecture": info.get("blas_architecture"),
            "numpy_simd": _numpy_simd()}


def _numpy_simd() -> str | None:
    """The SIMD targets NumPy's own ufunc kernels found on this CPU (its runtime dispatch)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return None
    return ",".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f)) or None
