"""Two checkouts' reports of the same database, interleaved (A B, B A, ...): each report in a fresh
process, as `write_report` in a child of its own (its wall time and the process's max RSS) or as the
whole `bench.py report` command (its wall time). Prints each run, then per checkout the median and
range, and the paired differences (first checkout minus second); never asserts. The VM's noise is
correlated in time, so only figures taken side by side here are compared.

    git archive <base> | tar -x -C /tmp/base && ln -s $PWD/venv /tmp/base/venv
    venv/bin/python benchmarks/report_pairs.py DB --pairs 2 /tmp/base .
    venv/bin/python benchmarks/report_pairs.py DB --pairs 6 --command /tmp/base .
    venv/bin/python benchmarks/report_pairs.py DB --realistic /tmp/real.db --pairs 3 /tmp/base .

--realistic COPY: first write a copy of DB (a tests/scaledb.py database) whose done runs carry every
metric a real run records (distinct values per run) and whose machines carry every fact, as a real
sweep's rows are (a scaled run leaves most of them NULL), and report on the copy. Both checkouts must
hold the same data/builtin/corpus.txt (or none): the cost model counts that corpus's tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {code!r})
from pathlib import Path
from orchestrator.report import write_report
from orchestrator.store import Store
t = time.perf_counter()
write_report(Store({db!r}, read_only=True), Path({out!r}), plots=True)
print(json.dumps({{"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

# What a real run records and the scaled databases leave NULL (tests/scaledb.py fills the rest).
RUN_METRICS = ("setup_s", "first_step_s", "step_ms_mean", "step_ms_std", "wall_s", "samples_per_s", "loss_first",
               "loss_last", "peak_rss_mb", "cpu_user_s", "cpu_sys_s", "ctx_switches", "freq_mhz_avg", "gflops",
               "trainable_params", "flops_per_step", "load_before")
MACHINE_FACTS = {"smt": 1, "l1d_kb": 48, "l2_kb": 2048, "mem_bw_gbs_1t": 10.0, "gemm_gflops_fp32_1c": 50.0,
                 "gemm_gflops_bf16_1c": 80.0, "gemm_gflops_bf16_all": 300.0, "freq_driver": "'acpi-cpufreq'",
                 "freq_min_mhz": 800, "freq_max_mhz": 3000}


# A done run's `applied` as a real worker writes it (a quick sweep's, 3.1 KB): the same for every run but
# its timed window, setup phases and read-back time, which are each run's own.
APPLIED = json.loads(r"""{"affinity": [0, 1], "allocator": "default", "allocator_lib": null, "argv_prefix": [],
 "aten_cpu_capability": null, "autocast": null, "blas": "mkl", "compile": "eager", "corpus_tokens": 95313,
 "cpu_capability": "AVX512", "cpus": [0, 1], "env": {"MKL_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
 "OMP_PROC_BIND": "false"}, "freq_mhz": null, "gemm_route": {"asked": "default", "calls_one_step": {"mkl SGEMM":
 {"calls": 251, "gflop": 1.407}, "onednn eltwise jit:avx512_core_bf16": {"calls": 4, "gflop": null}},
 "mkl_branch": "AVX512_E1", "mkl_vendor_check": "not Intel (MKL's generic path unless answered yes)", "ran": "mkl",
 "read_back_s": 0.577}, "gemm_route_applied": null, "governor": null, "init": "shared (worker/trainers/params.py)",
 "inter_threads": 2, "interop_threads": 2, "intra_threads": 2, "isa": "default", "library_isas_read": "once per fork
 server, in a probe child forked from it like this one", "loss_path": "chunked: HeadCrossEntropy, 512-row chunks, no
 (N, vocab) tensor", "lr": 0.001, "main_thread_affinity": [0, 1], "mkl_enable_instructions": null, "mkl_isa":
 "Architecture processors", "mkldnn": true, "numa": "default", "numa_nodes": 1, "omp_num_threads": "2", "omp_places":
 null, "omp_proc_bind": "false", "onednn_isa": "Intel AVX-512 with Intel DL Boost and bfloat16 support",
 "onednn_max_cpu_isa": null, "optimizer": "AdamW(lr=0.001, fused)", "param_dtype": "float32", "peak_gflops":
 {"basis": "GEMM peak measured on CPUs [0, 1]: 2 thread(s), one per physical core, pinned to [0, 1], the fastest of
 the trainers' libraries: fp32 500 (torch; jax 463, numpy 251), bf16 974 (torch; jax 434) (cached, measured
 2026-11-27 01:17 UTC on a quiet machine)", "bf16": 973.9, "by_library": {"bf16": {"jax": 434.3, "torch": 973.9},
 "fp32": {"jax": 463.4, "numpy": 250.9, "torch": 499.7}}, "fp32": 499.7, "library": {"bf16": "torch", "fp32":
 "torch"}, "measure_s": 0.0, "provisional": null}, "precision": "fp32", "sdpa_kernel": "FLASH_ATTENTION",
 "sensor_notes": {"energy_j": "no RAPL powercap domains in sysfs (VMs do not expose them)", "freq_mhz_avg": "no
 cpufreq (scaling_cur_freq); /proc/cpuinfo 'cpu MHz' here is the nominal clock, not a measurement", "temp_c_max": "no
 readable temperature sensor in /sys/class/thermal or hwmon"}, "sensor_sources": {"other_cpu_s": "/proc/stat
 user+nice+system of the job's CPUs minus the child's utime+stime (/proc/PID/stat, all its threads), clamped at 0,
 over the timed window", "steal_s": "/proc/stat steal of the job's CPUs, over the timed window"}, "setup_phases_s":
 {"data": 0.2366312759986613, "imports": 0.0028511489999800688, "model": 0.03282451199993375, "optimizer":
 0.001675003000855213, "read_back": 0.5781032940012665, "save": 0.006865844001367805}, "spawn": "fork server",
 "sysfs": {}, "sysfs_written": [], "timed_window": {"compilations": null, "end_unix_s": 1795755858.4292557,
 "slowest_step_x_median": 1.0861578149958253, "start_unix_s": 1795755858.3499424}, "torch_threads": 2, "turbo":
 null, "uid": 0}""".replace("\n", " "))
BUILD_INFO = '{"blas": "mkl", "cpu_capability": "AVX512", "onednn": "v3.12.0", "openmp": "OpenMP 201511"}'


def applied_of(run_id: int, finished: float, train_s: float) -> str:
    """A run's applied: APPLIED with a timed window, setup phases and read-back time of its own."""
    applied = json.loads(json.dumps(APPLIED))
    applied["timed_window"].update(start_unix_s=finished - train_s - 1.0, end_unix_s=finished - 1.0,
                                   slowest_step_x_median=1.0 + (run_id % 997) * 1e-4)
    applied["setup_phases_s"] = {k: v * (1 + (run_id % 991) * 1e-4) for k, v in APPLIED["setup_phases_s"].items()}
    applied["gemm_route"]["read_back_s"] = round(0.5 + (run_id % 389) * 1e-3, 3)
    return json.dumps(applied, sort_keys=True)


def realistic(db: str, copy: str) -> int:
    """Write `copy`: db with every run metric and machine fact filled where NULL, and what a real worker
    writes of a done run (its applied, read-backs, pids, times); a done run's non-NULL columns in v_results."""
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as c:
        c.create_function("applied_of", 3, applied_of, deterministic=True)
        c.execute("UPDATE runs SET applied = COALESCE(applied, applied_of(run_id, finished, COALESCE(train_s, 1.0))), "
                  f"build_info = COALESCE(build_info, '{BUILD_INFO}'), dataset_used = COALESCE(dataset_used, 'builtin'), "
                  "gemm_format = COALESCE(gemm_format, 'fp32 GEMMs'), worker_started = COALESCE(worker_started, finished - 3600), "
                  "child_pid = COALESCE(child_pid, 10000 + run_id % 50000), worker_pid = COALESCE(worker_pid, 9000 + machine_id) "
                  "WHERE status = 'done'")
        # one run in 50 shared its CPUs with another process, a few of them enough to be disturbed: their
        # timed windows are read (ran.disturbed), the others' are not
        c.execute("UPDATE runs SET other_cpu_s = 0.03 + (run_id % 7) * 0.2 * COALESCE(train_s, 1.0) "
                  "WHERE status = 'done' AND run_id % 50 = 0")
        sets = ", ".join(f"{m} = COALESCE({m}, {1.0 + k} + run_id * 1e-7)" for k, m in enumerate(RUN_METRICS))
        c.execute(f"UPDATE runs SET {sets}, output_path = COALESCE(output_path, 'output/run-' || run_id), "
                  "torch_version = COALESCE(torch_version, '2.13.0'), python_version = COALESCE(python_version, '3.11.7'), "
                  "claimed = COALESCE(claimed, finished - 10), world_size = COALESCE(world_size, 1), "
                  "global_batch = COALESCE(global_batch, 8) WHERE status = 'done'")
        c.execute("UPDATE machines SET " + ", ".join(f"{k} = COALESCE({k}, {v})" for k, v in MACHINE_FACTS.items()))
        row = c.execute("SELECT * FROM v_results WHERE status = 'done' LIMIT 1").fetchone()
    return sum(v is not None for v in row)


def once(code: Path, db: str, out: Path, command: bool) -> dict:
    if command:
        t = time.perf_counter()
        subprocess.run([str(code / "venv" / "bin" / "python"), str(code / "bench.py"), "report", "--db", db,
                        "--out", str(out)], cwd=code, check=True, capture_output=True)
        return {"s": time.perf_counter() - t}
    done = subprocess.run([str(code / "venv" / "bin" / "python"), "-c", CHILD.format(code=str(code), db=db, out=str(out))],
                          cwd=code, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db")
    parser.add_argument("checkouts", nargs=2, type=Path)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--command", action="store_true", help="time the whole `bench.py report` command")
    parser.add_argument("--realistic", metavar="COPY", help="report on a copy with every metric and fact filled")
    args = parser.parse_args()
    db = args.db
    if args.realistic:
        print(f"{args.realistic}: a done run has {realistic(db, args.realistic)} non-NULL columns", flush=True)
        db = args.realistic
    codes = [c.resolve() for c in args.checkouts]
    got: dict[Path, list[dict]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for code in codes if i % 2 == 0 else codes[::-1]:
                r = once(code, db, Path(tmp) / "result", args.command)
                got[code].append(r)
                rss = f", max RSS {r['rss_mb']:,.0f} MB" if "rss_mb" in r else ""
                print(f"{code}: {r['s']:.2f} s{rss}", flush=True)
    for code, rs in got.items():
        s = [r["s"] for r in rs]
        peaks = ", ".join(f"{r['rss_mb']:,.0f}" for r in rs) if "rss_mb" in rs[0] else ""
        rss = f"; max RSS {peaks} MB" if peaks else ""
        print(f"{code}: median {statistics.median(s):.2f} s ({min(s):.2f}-{max(s):.2f}){rss}")
    d = sorted(a["s"] - b["s"] for a, b in zip(*got.values()))
    print(f"paired ({codes[0]} - {codes[1]}): median {statistics.median(d):.2f} s ({d[0]:.2f}..{d[-1]:.2f})")


if __name__ == "__main__":
    main()
