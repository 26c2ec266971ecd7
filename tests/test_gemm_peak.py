"""MFU's peak measured on the job's own CPU set (worker/machine/gemm_peak.py): one pinned thread per physical
core, cached per (set, clock, precision), and never cached when measured under load (a real busy
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.machine import gemm_peak

CPUS = sorted(os.sched_getaffinity(0))
FACTS = {"fingerprint": "fp-test", "torch_version": "t", "core_cpus": [[c] for c in CPUS]}
DEFAULT = {"freq_mhz": "default", "governor": "default", "turbo": "default"}


def test_one_thread_per_physical_core_of_the_set():
    cores = [[0, 2], [1, 3]]  # two cores with SMT siblings
    assert gemm_peak.thread_cpus([0, 1, 2], cores) == [0, 1]
    assert gemm_peak.thread_cpus([2, 3], cores) == [2, 3]
    assert gemm_peak.thread_cpus([0, 2], cores) == [0]  # siblings: one core's FMA units
    assert gemm_peak.thread_cpus([1, 5], None) == [1, 5]  # no topology: each CPU its own core


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
@pytest.mark.slow
def test_a_small_gemm_runs_pinned_with_one_thread_per_physical_core():
    """A fake topology makes the two CPUs SMT siblings: one thread, on the first of them."""
    cpus = CPUS[:2]
    on = gemm_peak.thread_cpus(cpus, [cpus])
    m = gemm_peak.measure_set(cpus, on, quick=True)
    assert on == [cpus[0]] and m["threads"] == 1 and m["main_thread_affinity"] == [cpus[0]]
    assert m["cpus"] == cpus and m["gflops"]["fp32"] > 0 and m["gflops"]["bf16"] > 0
    assert m["window_s"] >= gemm_peak.MIN_WINDOW_S
    assert m["xla_pool_threads"] == 1


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
@pytest.mark.slow
def test_the_peak_is_the_fastest_of_the_trainers_libraries_each_on_the_whole_set():
    """torch's MKL is not the machine's peak (on an AVX-512 AMD EPYC it gave 208 GFLOP/s where XLA gave
    452): every trainer library is measured and the fastest taken. XLA's pool must span both CPUs:
    torch's OpenMP pins this thread to the first CPU as it loads, and a pool started after that had
    one thread (XLA at its 1-CPU figure)."""
    cpus = CPUS[:2]
    m = gemm_peak.measure_set(cpus, cpus, quick=True)
    assert set(m["by_library"]) == {"torch", "jax", "numpy"}
    assert set(m["by_library"]["numpy"]) == {"fp32"}  # NumPy's BLAS has no bf16 GEMM
    for p in ("fp32", "bf16"):
        figures = {lib: g[p] for lib, g in m["by_library"].items() if p in g}
        assert m["gflops"][p] == max(figures.values()) and m["fastest"][p] == max(figures, key=figures.get)
    assert m["threads"] == 2 and m["xla_pool_threads"] == 2
    assert m["torch_route"] == "mkl_intel_path"  # torch measured on its auto route (a C compiler is here)


def fake_measure(calls: list, *, other_cpu_s: float = 0.0):
    def measure(cpus, threads_on, quick):
        calls.append(tuple(cpus))
        n = len(threads_on)
        return {"gflops": {"fp32": 100.0 * n, "bf16": 200.0 * n}, "fastest": {"fp32": "jax", "bf16": "torch"},
                "by_library": {"torch": {"fp32": 40.0 * n, "bf16": 200.0 * n},
                               "jax": {"fp32": 100.0 * n, "bf16": 50.0 * n},
                               "numpy": {"fp32": 30.0 * n}},
                "cpus": cpus, "threads": n, "window_s": 1.0, "other_cpu_s": other_cpu_s, "steal_s": 0.0}
    return measure


def test_the_cache_is_keyed_by_cpu_set_clock_and_precision(tmp_path):
    calls = []
    facts = {**FACTS, "core_cpus": [[0], [1], [2]]}
    first = gemm_peak.peak_for([1, 0], DEFAULT, facts, tmp_path, quick=True, measure=fake_measure(calls))
    assert first["fp32"] == 200.0 and first["bf16"] == 400.0 and first["provisional"] is None
    assert "measured now on a quiet machine, cached" in first["basis"]
    assert "fastest of the trainers' libraries: fp32 200 (jax; numpy 60, torch 80), bf16 400 (torch; jax 100)" \
        in first["basis"]
    again = gemm_peak.peak_for([0, 1], DEFAULT, facts, tmp_path, quick=True, measure=fake_measure(calls))
    assert (again["fp32"], again["bf16"]) == (200.0, 400.0) and "cached, measured" in again["basis"]
    assert again["library"] == first["library"] == {"fp32": "jax", "bf16": "torch"}
    assert again["by_library"]["fp32"] == {"torch": 80.0, "jax": 200.0, "numpy": 60.0}
    assert calls == [(0, 1)]  # the same set in another order: the cache
    other = gemm_peak.peak_for([2], DEFAULT, facts, tmp_path, quick=True, measure=fake_measure(calls))
    assert other["fp32"] == 100.0 and calls == [(0, 1), (2,)]
    gemm_peak.peak_for([2], {**DEFAULT, "freq_mhz": 1200}, facts, tmp_path, quick=True, measure=fake_measure(calls))
    assert calls == [(0, 1), (2,), (2,)]  # a pinned clock is another peak
    keys = set(json.loads((tmp_path / gemm_peak.CACHE_FILE).read_text())["fp-test/torch-t/quick/fastest-intel-path"])
    assert "cpus=0,1/freq_mhz=default,governor=default,turbo=default/bf16" in keys
    assert "cpus=2/freq_mhz=1200,governor=default,turbo=default/fp32" in keys and len(keys) == 6


def test_a_library_that_fails_to_measure_is_left_out_and_named(tmp_path):
    calls = []

    def measure(cpus, threads_on, quick):
        m = fake_measure(calls)(cpus, threads_on, quick)
        del m["by_library"]["jax"]
        return {**m, "gflops": {"fp32": 40.0, "bf16": 200.0}, "fastest": {"fp32": "torch", "bf16": "torch"},
                "library_errors": {"jax": "XlaRuntimeError: no CPU client"}}
    peak = gemm_peak.peak_for([0], DEFAULT, FACTS, tmp_path, quick=True, measure=measure)
    assert peak["fp32"] == 40.0 and peak["library"]["fp32"] == "torch"
    assert "left out, failing here: jax (XlaRuntimeError: no CPU client)" in peak["basis"]


def test_a_loaded_measurement_is_used_once_marked_provisional_and_not_cached(tmp_path):
    calls, memo = [], {}
    loaded = gemm_peak.peak_for([0], DEFAULT, FACTS, tmp_path, quick=True, provisional=memo,
                                measure=fake_measure(calls, other_cpu_s=0.5))
    assert loaded["fp32"] == 100.0 and "other processes used 0.50 s" in loaded["provisional"]
    assert "provisional, not cached" in loaded["basis"]
    assert not (tmp_path / gemm_peak.CACHE_FILE).exists()
    gemm_peak.peak_for([0], DEFAULT, FACTS, tmp_path, quick=True, provisional=memo, measure=fake_measure(calls))
    assert calls == [(0,)]  # the worker's memory: not re-measured within RETRY_S (and still not cached)
    assert not (tmp_path / gemm_peak.CACHE_FILE).exists()


@pytest.mark.slow
def test_a_busy_process_on_the_set_makes_a_real_measurement_provisional(tmp_path):
    cpu = CPUS[0]
    spin = f"import os,time\nos.sched_setaffinity(0,{{{cpu}}})\nt=time.time()\nwhile time.time()-t<60: pass\n"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        peak = gemm_peak.peak_for([cpu], DEFAULT, FACTS, tmp_path, quick=True)
    finally:
        spinner.kill()
        spinner.wait()
    assert peak["provisional"] and "other processes used" in peak["provisional"], peak
    assert peak["fp32"] > 0
    assert not (tmp_path / gemm_peak.CACHE_FILE).exists()


@pytest.mark.probe
@pytest.mark.slow
def test_a_run_records_the_peak_of_its_set_and_its_basis(tmp_path, monkeypatch):
    from common.variables import resolve
    from worker.loop import WorkerOptions, measure_once

    monkeypatch.setenv("BENCH_PEAK_PER_SET", "1")
    config, why = resolve({}, 1)
    assert not why
    options = WorkerOptions(cpus=[CPUS[0]], child_module="tests.stub_child", spawn="exec",
                            state_dir=Path(os.environ["BENCH_STATE_DIR"]), output_dir=tmp_path / "out",
                            probe_quick=True)
    result = measure_once(config, options)
    peak = result["applied"]["peak_gflops"]
    assert result["status"] == "done", result["reason"]
    assert f"GEMM peak measured on CPUs [{CPUS[0]}]: 1 thread(s)" in peak["basis"]
    assert peak["fp32"] > 0 and peak["bf16"] > 0
    assert peak["fp32"] == max(peak["by_library"]["fp32"].values())
    assert peak["library"]["fp32"] in ("torch", "jax", "numpy")
    assert (peak["provisional"] is None) == ("quiet machine" in peak["basis"])  # this machine may be loaded
