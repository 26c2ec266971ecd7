"""The JAX and NumPy trainers' thread pools follow the job, and their read-back says what really ran.

Real child processes: the pools are sized when the libraries load, so only a fresh process shows it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parent.parent
CPUS = sorted(os.sched_getaffinity(0))


def child_read_back(code: str, env: dict | None = None, cpus: list[int] | None = None) -> dict:
    """Run `code` (which prints one JSON line) in a fresh interpreter under env and CPU affinity."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=full_env,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


NUMPY_READ_BACK = """
import json
from worker.trainers.numpy import runtime
if {apply}:
    runtime.apply_in_child({{"intra_threads": {threads}}})
import numpy as np
np.ones((256, 256), np.float32) @ np.ones((256, 256), np.float32)
print(json.dumps(runtime.read_back() | {{"build": runtime.build_info()}}))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to tell 1 thread from all")
def test_numpy_child_runs_openblas_with_the_jobs_threads_and_names_its_blas():
    config = {"framework": "numpy", "intra_threads": 1, "omp_threads": 1}
    from worker.knobs.startspec import numpy_spec

    spec = numpy_spec(config | {"allocator": "default", "numa": "default"}, {}, CPUS[:2])
    by_env = child_read_back(NUMPY_READ_BACK.format(apply=False, threads=1), env=spec.env)
    assert by_env["blas_threads"] == 1 and by_env["openblas_num_threads"] == "1"
    by_call = child_read_back(NUMPY_READ_BACK.format(apply=True, threads=1), env={"OPENBLAS_NUM_THREADS": "2"})
    assert by_call["blas_threads"] == 1  # threadpoolctl overrides what the environment said
    free = child_read_back(NUMPY_READ_BACK.format(apply=True, threads=2))
    assert free["blas_threads"] == 2
    assert free["blas"] == "openblas" and free["build"]["blas"].startswith("openblas ")
    assert free["blas_architecture"] and free["jit"] is False


LIBRARY_READ_BACK = """
import json
from worker.trainers.harness import Skip
from worker.trainers.numpy import blas, runtime
from worker.trainers.numpy.model import mm
import numpy as np
{pre}
try:
    runtime.apply_in_child({{"intra_threads": {threads}, "blas": "{blas}"}})
except Skip as why:
    print(json.dumps({{"skip": str(why)}}))
else:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(20, dtype=np.float32).reshape(5, 4)
    same = bool(np.array_equal(mm(a, b.T), a @ b.T)) and bool(np.array_equal(mm(a[None], b.T[None]), (a @ b.T)[None]))
    print(json.dumps(runtime.read_back() | {{"build": runtime.build_info(), "same": same, "active": blas.active.name}}))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to tell 1 thread from all")
@pytest.mark.parametrize("threads", [1, 2])
def test_mkl_runs_the_products_with_the_jobs_threads_read_back_by_threadpoolctl(threads):
    got = child_read_back(LIBRARY_READ_BACK.format(threads=threads, blas="mkl", pre=""))
    assert (got["active"], got["blas"], got["blas_threads"], got["same"]) == ("mkl", "mkl", threads, True)
    assert got["blas_version"].startswith("Intel(R) oneAPI Math Kernel Library") and got["blas_lib"].endswith(
        tuple(f"libmkl_rt.so{s}" for s in ("", ".2", ".3")))


NO_DEBIAN_BLIS = "blas.DEBIAN_BLIS = ()  # as on a machine without Debian's BLIS packages"


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to tell 1 thread from all")
@pytest.mark.skipif(__import__("worker.trainers.numpy.blas", fromlist=["x"]).debian_blis() is None,
                    reason="Debian's threaded BLIS is not installed (apt-get install libblis4-openmp)")
@pytest.mark.parametrize("threads", [1, 2])
def test_blis_runs_debians_threaded_build_with_the_jobs_threads(threads):
    got = child_read_back(LIBRARY_READ_BACK.format(threads=threads, blas="blis", pre=""))
    assert (got["active"], got["blas"], got["blas_threads"], got["same"]) == ("blis", "blis", threads, True)
    assert "Debian libblis4-" in got["blas_version"] and got["blas_threading"] in ("OpenMP", "pthreads")
    assert "/blis-" in got["blas_lib"] and got["blas_architecture"]


def test_without_debians_blis_pypis_runs_one_thread_and_refuses_two_saying_why():
    got = child_read_back(LIBRARY_READ_BACK.format(threads=1, blas="blis", pre=NO_DEBIAN_BLIS))
    assert (got["active"], got["blas"], got["blas_threads"], got["same"]) == ("blis", "blis", 1, True)
    assert got["blas_version"].startswith("BLIS 0.") and got["blas_architecture"]
    refused = child_read_back(LIBRARY_READ_BACK.format(threads=2, blas="blis", pre=NO_DEBIAN_BLIS))
    assert refused["skip"].startswith("unavailable here: blas=blis: this BLIS (PyPI blis")
    assert "built without threading; intra_threads=2 cannot run on it" in refused["skip"]


JAX_READ_BACK = """
import json
import jax.numpy as jnp
from worker.trainers.jax import runtime
(jnp.ones((512, 512)) @ jnp.ones((512, 512))).block_until_ready()
print(json.dumps(runtime.read_back(jit=True) | {"torch": __import__("sys").modules.get("torch") is not None}))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to tell 1 thread from all")
def test_xla_sizes_its_pool_from_the_affinity_and_the_read_back_counts_it():
    one = child_read_back(JAX_READ_BACK, env={"JAX_PLATFORMS": "cpu"}, cpus=CPUS[:1])
    assert one["xla_threads"] == 1 and one["affinity"] == CPUS[:1]
    two = child_read_back(JAX_READ_BACK, env={"JAX_PLATFORMS": "cpu"}, cpus=CPUS[:2])
    assert two["xla_threads"] == 2 and two["affinity"] == CPUS[:2]
    assert two["jax_backend"] == "cpu" and two["jit"] is True and two["torch"] is False


@pytest.mark.parametrize("config, child, wrong", [
    ({"framework": "numpy", "intra_threads": 2}, {"blas": "openblas", "blas_threads": 2, "jit": False}, []),
    ({"framework": "numpy", "intra_threads": 1}, {"blas": "openblas", "blas_threads": 2, "jit": False},
     ["blas_threads=2 (asked 1)"]),
    ({"framework": "numpy", "intra_threads": 1}, {"blas": "openblas", "jit": False}, ["blas_threads=None (asked 1)"]),
    ({"framework": "numpy", "intra_threads": 1, "blas": "blis"}, {"blas": "openblas", "blas_threads": 1, "jit": False},
     ["blas='openblas' (asked 'blis')"]),
    ({"framework": "jax", "cores": 2, "compile": "xla"}, {"xla_threads": 2, "jit": True}, []),
    ({"framework": "jax", "cores": 1, "compile": "xla"}, {"xla_threads": 2, "jit": True}, ["xla_threads=2 (asked 1)"]),
    ({"framework": "jax", "cores": 2, "compile": "eager"}, {"xla_threads": 2, "jit": True}, ["jit=True (asked False)"]),
    ({"framework": "torch"}, {}, []),
])
def test_a_read_back_that_contradicts_the_job_is_named(config, child, wrong):
    from worker.knobs.startspec import ChildSpec
    from worker.knobs.verify import not_in_force

    full = {"allocator": "default", "cores": 2, "compile": "eager", "intra_threads": 2, "inter_threads": 1,
            "onednn": True, "isa": "default"} | config
    spec = ChildSpec(cpus=[0], env={}, argv_prefix=[], applied={})
    assert not_in_force(full, spec, child) == wrong
