"""What the JAX trainer runs under: XLA CPU's thread pool, jit on/off, read back.

Measured with jaxlib 0.10.2 (the newest for Python 3.11): XLA CPU sizes its intra-op Eigen pool
(threads named `tf_XLAEigen`) from the process's CPU affinity when the client starts -- 2 threads
under 2 CPUs, 1 under `taskset -c 0` -- and `--xla_cpu_multi_thread_eigen=false` is NOT honoured any
more (still 2 pool threads, 2 CPUs busy). No client option sets the pool size. So the job's `cores`
(the affinity the worker gives the child) is what binds XLA's threads; an intra_threads other than
cores cannot be honoured and is refused at enqueue. The read-back counts the pool's threads.
"""

from __future__ import annotations

import os

XLA_POOL_THREAD = "tf_XLAEigen"  # the name XLA CPU gives its intra-op pool's threads


def thread_names() -> dict[str, int]:
    """How many threads of this process carry each name (/proc/self/task/*/comm)."""
    names: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        names[name] = names.get(name, 0) + 1
    return names


_COMPILED = [0]
_LISTENING = []
# JAX's monitoring event for one XLA backend compilation (jax 0.4 and later).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def compilations() -> int:
    """XLA backend compilations in this process since the first call (a listener on JAX's
    monitoring events, registered at that call): the harness counts them during the timed steps."""
    if not _LISTENING:
        import jax

        def count(event: str, _duration_s: float, **_kw) -> None:
            if event == COMPILE_EVENT:
                _COMPILED[0] += 1

        jax.monitoring.register_event_duration_secs_listener(count)
        _LISTENING.append(count)
    return _COMPILED[0]


def read_back(jit: bool) -> dict:
    """The settings in force; call after the first step (XLA starts its pool on first use)."""
    import jax

    from worker.trainers.harness import loaded_allocator, threads_affinity

    return {
        "affinity": threads_affinity(),
        "main_thread_affinity": sorted(os.sched_getaffinity(0)),
        "xla_threads": thread_names().get(XLA_POOL_THREAD, 0),
        # XLA CPU emits its dots as calls into Eigen's tensor contraction, run on the Eigen pool
        # counted above: the `blas` a jax run records (variables.BLAS_OF), never a choice
        "blas": "eigen",
        "jit": jit,
        "jax_backend": jax.default_backend(),
        "jax_devices": len(jax.devices()),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "allocator_lib": loaded_allocator(),
        "uid": os.getuid(),
    }


def build_info() -> dict:
    import jax
    import jaxlib

    return {"framework": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}",
            "blas": "XLA CPU dot emitter (Eigen contraction)", "openmp": None}
