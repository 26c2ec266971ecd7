"""The worker's side of the JAX and NumPy trainers' settings: the environment a child must start with
(before it imports its framework) and what its read-back must show, else the run is failed.

Standard library only: the worker imports this, never the frameworks. torch's own start settings and
read-back checks stay in worker/knobs.py (OMP/MKL threads, interop threads, oneDNN, ISA caps).

    numpy   OPENBLAS_NUM_THREADS = intra_threads (OpenBLAS sizes its pool when NumPy loads it; the
            child sets it again through threadpoolctl); read back: blas_threads == intra_threads,
            no jit.
    jax     JAX_PLATFORMS=cpu (no probing for accelerator plugins); XLA CPU sizes its pool from the
            child's affinity (worker/trainers/jax/runtime.py), so read back: xla_threads == cores,
            jit == (compile == "xla").
"""

from __future__ import annotations


def start_env(config: dict) -> dict[str, str]:
    """Environment variables the job's trainer needs at process start ({} for torch: knobs.py's)."""
    if config["framework"] == "numpy":
        return {"OPENBLAS_NUM_THREADS": str(int(config["intra_threads"]))}
    if config["framework"] == "jax":
        return {"JAX_PLATFORMS": "cpu"}
    return {}


def not_in_force(config: dict, child: dict) -> list[str]:
    """The job's JAX/NumPy settings the child's read-back contradicts (a missing key contradicts too:
    a trainer that cannot say what it ran under has not shown it ran under the job's settings)."""
    if config["framework"] == "numpy":
        expected = {"blas_threads": int(config["intra_threads"]), "jit": False}
    elif config["framework"] == "jax":
        expected = {"xla_threads": int(config["cores"]), "jit": config["compile"] == "xla"}
    else:
        return []
    return [f"{key}={child.get(key)!r} (asked {want!r})" for key, want in expected.items() if child.get(key) != want]
