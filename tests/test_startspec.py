"""The child's start spec per trainer and the read-back check per framework (no sysfs, no child)."""

import pytest

from common.variables import resolve
from worker.knobs import settings as knobs, startspec, verify

FACTS = {"arch": "x86_64", "isa_flags": "sse4_1 avx2 fma avx512f avx512bw avx512vl avx512dq", "numa_nodes": 1,
         "core_cpus": [[0], [1]], "torch": {"mkldnn_available": True}}


def config(**partial):
    c, why = resolve(partial, 2)
    assert not why, why
    return c


def test_each_trainer_gets_its_own_environment():
    torch_env = startspec.spec_for(config(pin_threads=True, isa="avx2", omp_threads=2), FACTS, [0, 1]).env
    assert torch_env["OMP_NUM_THREADS"] == torch_env["MKL_NUM_THREADS"] == "2"
    assert (torch_env["OMP_PROC_BIND"], torch_env["OMP_PLACES"]) == ("close", "{0},{1}")
    assert (torch_env["ATEN_CPU_CAPABILITY"], torch_env["ONEDNN_MAX_CPU_ISA"]) == ("avx2", "AVX2")
    jax_env = startspec.spec_for(config(framework="jax", cores=1), FACTS, [0]).env
    assert jax_env["JAX_PLATFORMS"] == "cpu" and "MKL_NUM_THREADS" not in jax_env and "OMP_PROC_BIND" not in jax_env
    numpy_env = startspec.spec_for(config(framework="numpy", cores=2, intra_threads=1), FACTS, [0, 1]).env
    assert numpy_env["OPENBLAS_NUM_THREADS"] == "1" and "ATEN_CPU_CAPABILITY" not in numpy_env


@pytest.mark.parametrize("framework", ["jax", "numpy"])
def test_settings_only_torch_can_honour_are_unavailable_elsewhere_saying_so(framework):
    why = knobs.unavailable(config(framework=framework, pin_threads=True, isa="avx2"), FACTS, [0, 1])
    assert f"pin_threads=on: framework={framework} cannot bind its threads" in why
    assert (f"isa=avx2: the ISA caps reach torch's ATen, oneDNN and MKL only; framework={framework} "
            "has no such cap") in why
    assert knobs.unavailable(config(framework=framework), FACTS, [0, 1]) is None


def test_the_read_back_is_judged_by_the_frameworks_own_settings():
    numpy_config = config(framework="numpy", cores=2, intra_threads=1)
    spec = startspec.spec_for(numpy_config, FACTS, [0, 1])
    honest = {"affinity": [0, 1], "blas": "openblas", "blas_threads": 1, "jit": False, "omp_num_threads": "2",
              "allocator_lib": None}
    assert verify.not_in_force(numpy_config, spec, honest) == []
    assert verify.not_in_force(numpy_config, spec, {**honest, "blas_threads": 2}) == ["blas_threads=2 (asked 1)"]
    mkl_config = config(framework="numpy", cores=2, intra_threads=1, blas="mkl")  # products on MKL, or failed
    assert verify.not_in_force(mkl_config, spec, honest) == ["blas='openblas' (asked 'mkl')"]
    assert verify.not_in_force(mkl_config, spec, {**honest, "blas": "mkl"}) == []
    jax_config = config(framework="jax")  # compile follows framework: xla, jax.jit
    # torch's keys are not judged on a jax child (it has no torch_threads), its CPUs are
    assert verify.not_in_force(jax_config, startspec.spec_for(jax_config, FACTS, [0, 1]),
                               {"affinity": [0], "torch_threads": 99, "xla_threads": jax_config["cores"],
                                "jit": True}) == ["affinity=[0] (asked [0, 1])"]
    # a JAX/NumPy child that does not say how many threads it ran, or whether it compiled, has not shown it
    assert verify.not_in_force(numpy_config, spec, {"affinity": [0, 1]}) == [
        "blas=None (asked 'openblas')", "blas_threads=None (asked 1)", "jit=None (asked False)"]


def test_cc_flags_lto_is_unavailable_with_its_reason_and_the_ladder_is_not():
    why = knobs.unavailable(config(compile="inductor", cc_flags="lto"), FACTS, [0, 1])
    assert why.startswith("cc_flags=lto: link-time optimisation needs the framework built from source")
    for value in ("default", "O2", "O3", "native", "native_fastmath"):
        assert knobs.unavailable(config(compile="inductor", cc_flags=value), FACTS, [0, 1]) is None


def test_the_kernel_flags_the_compiler_got_are_judged_when_cc_flags_is_set():
    asked = config(compile="inductor", cc_flags="native_fastmath")
    spec = startspec.spec_for(asked, FACTS, [0, 1])
    honest = {"affinity": [0, 1], "cc_kernel_flags": ["-O3 -march=native -ffast-math"]}
    assert verify.not_in_force(asked, spec, honest) == []
    assert verify.not_in_force(asked, spec, {**honest, "cc_kernel_flags": ["-O3 -march=native"]}) == [
        "cc_kernel_flags=['-O3 -march=native'] (asked ['-O3 -march=native -ffast-math'])"]
    # a kernel built otherwise, or none reported at all, is a run under other settings
    assert verify.not_in_force(asked, spec, {**honest, "cc_kernel_flags": ["-O2", "-O3 -march=native -ffast-math"]})
    assert verify.not_in_force(asked, spec, {"affinity": [0, 1]}) == [
        "cc_kernel_flags=None (asked ['-O3 -march=native -ffast-math'])"]
    # default is inductor's own choice: read back, not judged
    plain = config(compile="inductor")
    assert verify.not_in_force(plain, spec, {"affinity": [0, 1], "cc_kernel_flags": ["-O3 -march=native"]}) == []


@pytest.mark.parametrize("line, flags", [
    ("g++ a.cpp -O3 -DNDEBUG -ffp-contract=off -march=native -fPIC -o a.so", "-O3 -march=native"),
    ("g++ a.cpp -O2 -DNDEBUG -mavx512f -mfma -o a.so", "-O2"),
    ("g++ a.cpp -O3 -march=native -O2 -march=x86-64 -o a.so", "-O2 -march=x86-64"),  # the last one counts
    ("g++ a.cpp -O3 -march=native -ffast-math -o a.so", "-O3 -march=native -ffast-math"),
    ("g++ main.cpp -O1 -march=native -o main.so", None),  # glue, not a kernel
    ("g++ --version", None),
])
def test_a_compile_command_reduces_to_its_effective_flags(line, flags):
    from worker.knobs import ccflags

    assert ccflags.effective(line) == flags


def test_the_kernel_compiler_is_judged_from_the_compile_commands():
    clang = config(compile="inductor", compiler="clang", cc_flags="O2")
    spec = startspec.spec_for(clang, FACTS, [0, 1])
    honest = {"affinity": [0, 1], "cc_kernel_flags": ["-O2"], "cc_kernel_compilers": ["clang++"]}
    assert verify.not_in_force(clang, spec, honest) == []
    assert verify.not_in_force(clang, spec, {**honest, "cc_kernel_compilers": ["g++"]}) == [
        "cc_kernel_compilers=['g++'] (asked ['clang++'])"]
    assert verify.not_in_force(clang, spec, {"affinity": [0, 1], "cc_kernel_flags": ["-O2"]}) == [
        "cc_kernel_compilers=None (asked ['clang++'])"]  # clang asked, nothing shown: not shown it ran
    gcc = config(compile="inductor")
    assert verify.not_in_force(gcc, spec, {"affinity": [0, 1]}) == []
    assert verify.not_in_force(gcc, spec, {"affinity": [0, 1], "cc_kernel_compilers": ["clang++"]}) == [
        "cc_kernel_compilers=['clang++'] (asked ['g++'])"]


def test_a_compiler_without_its_openmp_headers_is_unavailable_saying_why(tmp_path, monkeypatch):
    from worker.knobs import ccflags

    fake = tmp_path / "clang++"  # a driver that cannot preprocess omp.h
    fake.write_text("#!/bin/sh\necho 'fatal error: omp.h file not found' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    ccflags.compiler_unavailable.cache_clear()
    try:
        why = knobs.unavailable(config(compile="inductor", compiler="clang", blas="mkl"), FACTS, [0, 1])
    finally:
        ccflags.compiler_unavailable.cache_clear()
    assert why == ("compiler=clang: clang++ finds no omp.h with -fopenmp, which every inductor kernel includes "
                   "(apt install libomp-dev)")


def test_a_run_whose_optimizer_got_another_learning_rate_or_schedule_is_not_in_force():
    numpy_config = config(framework="numpy", cores=2, intra_threads=1, lr=0.003, lr_schedule="cosine")
    spec = startspec.spec_for(numpy_config, FACTS, [0, 1])
    honest = {"affinity": [0, 1], "blas": "openblas", "blas_threads": 1, "jit": False, "omp_num_threads": "2",
              "allocator_lib": None, "lr": 0.003, "lr_schedule": "cosine"}
    assert verify.not_in_force(numpy_config, spec, honest) == []
    assert verify.not_in_force(numpy_config, spec, {**honest, "lr": 0.001}) == ["lr=0.001 (asked 0.003)"]
    assert verify.not_in_force(numpy_config, spec, {**honest, "lr_schedule": "constant"}) == [
        "lr_schedule='constant' (asked 'cosine')"]
    finetune = config(framework="numpy", cores=2, intra_threads=1, task="finetune", optimizer="sgd")
    # lr: a tenth of sgd's 0.05
    assert verify.not_in_force(finetune, spec, {**honest, "lr": 0.005, "lr_schedule": "constant"}) == []
