"""A scaled database (tests/scaledb.py) made to look like a real sweep's: every run metric a real run
records, every machine fact, and what a real worker writes of a done run (its ~3 KB `applied` with a
timed window, setup phases and read-back time of its own, its read-backs, pids and times), where the
scaled runs leave them NULL. One run in 50 shared its CPUs with another process (other_cpu_s), a few of
them enough to be disturbed. Plain SQL, for SQLite and PostgreSQL alike (report_pairs.py --realistic,
report_scale.py --realistic)."""

from __future__ import annotations

import json
import sqlite3
import sys
from contextlib import closing

from pathlib import Path

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.stats.applied_cut import read_text

# What a real run records and the scaled databases leave NULL.
RUN_METRICS = ("setup_s", "first_step_s", "step_ms_mean", "step_ms_std", "wall_s", "samples_per_s", "loss_first",
               "loss_last", "peak_rss_mb", "cpu_user_s", "cpu_sys_s", "ctx_switches", "freq_mhz_avg", "gflops",
               "trainable_params", "flops_per_step", "load_before")
MACHINE_FACTS = {"smt": "TRUE", "l1d_kb": 48, "l2_kb": 2048, "mem_bw_gbs_1t": 10.0, "gemm_gflops_fp32_1c": 50.0,
                 "gemm_gflops_bf16_1c": 80.0, "gemm_gflops_bf16_all": 300.0, "freq_driver": "'acpi-cpufreq'",
                 "freq_min_mhz": 800, "freq_max_mhz": 3000}

# A done run's applied as a real worker writes it (a quick sweep's, 3.1 KB), its own parts as placeholders.
APPLIED = {
    "affinity": [0, 1], "allocator": "default", "allocator_lib": None, "argv_prefix": [], "aten_cpu_capability": None,
    "autocast": None, "blas": "mkl", "compile": "eager", "corpus_tokens": 95313, "cpu_capability": "AVX512",
    "cpus": [0, 1], "env": {"MKL_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "false"},
    "freq_mhz": None,
    "gemm_route": {"asked": "default",
                   "calls_one_step": {"mkl SGEMM": {"calls": 251, "gflop": 1.407},
                                      "onednn eltwise jit:avx512_core_bf16": {"calls": 4, "gflop": None}},
                   "mkl_branch": "AVX512_E1", "mkl_vendor_check": "not Intel (MKL's generic path unless answered yes)",
                   "ran": "mkl", "read_back_s": "@READ_BACK@"},
    "gemm_route_applied": None, "governor": None, "init": "shared (worker/trainers/params.py)", "inter_threads": 2,
    "interop_threads": 2, "intra_threads": 2, "isa": "default",
    "library_isas_read": "once per fork server, in a probe child forked from it like this one",
    "loss_path": "chunked: HeadCrossEntropy, 512-row chunks, no (N, vocab) tensor", "lr": 0.001,
    "main_thread_affinity": [0, 1], "mkl_enable_instructions": None, "mkl_isa": "Architecture processors",
    "mkldnn": True, "numa": "default", "numa_nodes": 1, "omp_num_threads": "2", "omp_places": None,
    "omp_proc_bind": "false", "onednn_isa": "Intel AVX-512 with Intel DL Boost and bfloat16 support",
    "onednn_max_cpu_isa": None, "optimizer": "AdamW(lr=0.001, fused)", "param_dtype": "float32",
    "peak_gflops": {"basis": "GEMM peak measured on CPUs [0, 1]: 2 thread(s), one per physical core, pinned to [0, 1], "
                             "the fastest of the trainers' libraries: fp32 500 (torch; jax 463, numpy 251), bf16 974 "
                             "(torch; jax 434) (cached, measured 2026-11-27 01:17 UTC on a quiet machine)",
                    "bf16": 973.9, "by_library": {"bf16": {"jax": 434.3, "torch": 973.9},
                                                  "fp32": {"jax": 463.4, "numpy": 250.9, "torch": 499.7}},
                    "fp32": 499.7, "library": {"bf16": "torch", "fp32": "torch"}, "measure_s": 0.0,
                    "provisional": None},
    "precision": "fp32", "sdpa_kernel": "FLASH_ATTENTION",
    "sensor_notes": {"energy_j": "no RAPL powercap domains in sysfs (VMs do not expose them)",
                     "freq_mhz_avg": "no cpufreq (scaling_cur_freq); /proc/cpuinfo 'cpu MHz' here is the nominal "
                                     "clock, not a measurement",
                     "temp_c_max": "no readable temperature sensor in /sys/class/thermal or hwmon"},
    "sensor_sources": {"other_cpu_s": "/proc/stat user+nice+system of the job's CPUs minus the child's utime+stime "
                                      "(/proc/PID/stat, all its threads), clamped at 0, over the timed window",
                       "steal_s": "/proc/stat steal of the job's CPUs, over the timed window"},
    "setup_phases_s": {"data": "@DATA@", "imports": 0.0028511489999800688, "model": "@MODEL@",
                       "optimizer": 0.001675003000855213, "read_back": 0.5781032940012665,
                       "save": 0.006865844001367805},
    "spawn": "fork server", "sysfs": {}, "sysfs_written": [],
    "timed_window": {"compilations": None, "end_unix_s": "@END@", "slowest_step_x_median": "@SLOWEST@",
                     "start_unix_s": "@START@"},
    "torch_threads": 2, "turbo": None, "uid": 0}
BUILD_INFO = '{"blas": "mkl", "cpu_capability": "AVX512", "onednn": "v3.12.0", "openmp": "OpenMP 201511"}'
# each placeholder -> its run's value, in SQL
OWN = {"@READ_BACK@": "0.5 + (run_id % 389) * 0.001", "@DATA@": "0.2366312759986613 * (1 + (run_id % 991) * 0.0001)",
       "@MODEL@": "0.03282451199993375 * (1 + (run_id % 983) * 0.0001)",
       "@END@": "finished - 1.0", "@SLOWEST@": "1.0 + (run_id % 997) * 0.0001",
       "@START@": "finished - 1.0 - COALESCE(train_s, 1.0)"}


def applied_sql() -> str:
    """SQL for a done run's applied: APPLIED with its own values put in."""
    return _own_sql(json.dumps(APPLIED, sort_keys=True))


def applied_read_sql() -> str:
    """SQL for a done run's applied_read, as the worker writes it beside that applied (applied_cut.read_text)."""
    return _own_sql(read_text(json.dumps(APPLIED, sort_keys=True)))


def _own_sql(template: str) -> str:
    """SQL for `template` with each of OWN's placeholders replaced by its run's value."""
    expr = "'" + template.replace("'", "''") + "'"
    for mark, value in OWN.items():
        expr = f"replace({expr}, '\"{mark}\"', CAST({value} AS TEXT))"
    return expr


def copy_sqlite(db: str, copy: str | Path) -> None:
    """A consistent copy of an SQLite database, what its -wal file holds included (a file copy would miss it)."""
    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)


def fill(url: str) -> int:
    """Fill the database at `url` as a real sweep's; a done run's non-NULL columns in v_results."""
    engine = create_engine(url)
    try:
        with engine.begin() as c:
            sets = ", ".join(f"{m} = COALESCE({m}, {1.0 + k} + run_id * 1e-7)" for k, m in enumerate(RUN_METRICS))
            c.execute(text(
                f"UPDATE runs SET {sets}, output_path = COALESCE(output_path, 'output/run-' || run_id), "
                "torch_version = COALESCE(torch_version, '2.13.0'), "
                "python_version = COALESCE(python_version, '3.11.7'), "
                "claimed = COALESCE(claimed, finished - 10), world_size = COALESCE(world_size, 1), "
                "global_batch = COALESCE(global_batch, 8), "
                f"applied = COALESCE(applied, {applied_sql()}), "
                f"applied_read = COALESCE(applied_read, {applied_read_sql()}), "
                f"build_info = COALESCE(build_info, '{BUILD_INFO}'), "
                "dataset_used = COALESCE(dataset_used, 'builtin'), gemm_format = COALESCE(gemm_format, 'fp32 GEMMs'), "
                "worker_started = COALESCE(worker_started, finished - 3600), "
                "child_pid = COALESCE(child_pid, 10000 + run_id % 50000), "
                "worker_pid = COALESCE(worker_pid, 9000 + machine_id) WHERE status = 'done'"))
            # one run in 50 shared its CPUs with another process, a few of them enough to be disturbed: their
            # timed windows are read (ran.disturbed), the others' are not
            c.execute(text("UPDATE runs SET other_cpu_s = 0.03 + (run_id % 7) * 0.2 * COALESCE(train_s, 1.0) "
                           "WHERE status = 'done' AND run_id % 50 = 0"))
            c.execute(text("UPDATE machines SET "
                           + ", ".join(f"{k} = COALESCE({k}, {v})" for k, v in MACHINE_FACTS.items())))
        with engine.connect() as c:
            row = c.execute(text("SELECT * FROM v_results WHERE status = 'done' LIMIT 1")).one()
        return sum(v is not None for v in row)
    finally:
        engine.dispose()
