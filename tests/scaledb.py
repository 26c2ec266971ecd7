"""Synthetic results databases of any size, fast: the plan enqueued through the real Store (its bulk
path), the runs written by one bulk INSERT per chunk (SQLite: executemany; PostgreSQL: COPY), as if
--machines machines (each its own pool, so each runs every job) had run it. 1M runs in about a minute.

    venv/bin/python -m tests.scaledb /tmp/r100k.db --runs 100000
    venv/bin/python -m tests.scaledb postgresql://... --runs 1000000

The sweep: a grid of d_model x n_layers x seq_len x batch_size (1,000 configurations; --shape grid5
adds cores: 5,000), repeated until --runs runs are made; a step time from a power law with 5%
noise, machine k (1 + 0.4 k) times slower; 2% of runs failed and 1% skipped with reasons, as a real
sweep has; every --disturbed-th run disturbed (other processes' CPU time in its window) and every
--read-back-th run read back with other threads than it asked for, so the report's regrouping has
work to do. Used by benchmarks/report_scale.py and tests/test_report_scale.py (small sizes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.queue.store import Store  # noqa: E402
from orchestrator.stats.applied_cut import read_text  # noqa: E402
from common.variables import config_hash, derived_words, resolve  # noqa: E402

CPUS = 8
AXES = {"d_model": [32, 48, 64, 96, 128, 192, 256, 384], "n_layers": [1, 2, 3, 4, 6],
        "seq_len": [32, 64, 128, 256, 512], "batch_size": [1, 2, 4, 8, 16]}  # 1000 configurations
SHAPES = {"grid": AXES, "grid5": {**AXES, "cores": [1, 2, 4, 6, 8]},
          "small": {"d_model": [32, 64, 128], "n_layers": [1, 2], "batch_size": [2, 4, 8], "cores": [2, 4]}}
BASE = {"d_model": 64, "n_layers": 2, "seq_len": 64, "batch_size": 4, "steps": 5}
RUN_COLUMNS = ("job_id", "machine_id", "pool_id", "status", "attempts", "worker_pid", "worker_host", "claimed",
               "heartbeat", "finished", "reason", "step_ms_median", "step_ms_p10", "step_ms_p90", "tokens_per_s",
               "wall_s", "params", "loss_first", "loss_last", "mfu", "train_s", "other_cpu_s", "applied",
               "applied_read")


def machine_facts(name: str, cpu: str) -> dict:
    return {"fingerprint": f"fp-{name}", "hostname": name, "cpu_model": cpu, "vendor": "GenuineIntel",
            "sockets": 1, "physical_cores": CPUS, "logical_cores": CPUS, "numa_nodes": 1,
            "isa_flags": "avx2 avx512f", "l3_kb": 16384, "mem_total_gb": 24.0, "mem_bw_gbs_all": 20.5,
            "gemm_gflops_fp32_all": 150.0, "kernel": "6.1.0-test"}


def law(c: dict) -> float:
    return (0.002 * c["d_model"] ** 1.6 * c["n_layers"] ** 0.9 * (c["seq_len"] / 64) ** 1.1
            * (c["batch_size"] / 4) ** 0.85 * (c["cores"] / 8) ** -0.7)


def _plan(n_jobs: int, axes: dict) -> list[dict]:
    """n_jobs jobs: every configuration of the grid once per repeat pass, passes in order."""
    partials = [dict(BASE)]
    for name, values in axes.items():
        partials = [{**p, name: v} for p in partials for v in values]
    resolved = []
    for p in partials:
        config, why = resolve(p, CPUS)
        assert not why, why
        resolved.append((config, derived_words(p)))
    jobs = []
    for rep in range(math.ceil(n_jobs / len(resolved))):
        for c, derived in resolved:
            if len(jobs) == n_jobs:
                return jobs
            config = {**c, "repeat": rep}
            jobs.append({"config": config, "config_hash": config_hash(config), "run_order": len(jobs),
                         "derived": derived})
    return jobs


def build(db: str, runs: int, machines: int = 2, *, shape: str = "grid", seed: int = 0,
          chunk: int = 20_000, quiet: bool = False, disturbed: int = 0, read_back: int = 0) -> Store:
    """A database of `runs` runs over `machines` machines; returns its Store."""
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    store = Store(db)
    t0 = time.perf_counter()
    jobs = _plan(math.ceil(runs / machines), SHAPES[shape])
    store.enqueue(name="scale", source="benchmarks/synthetic_db.py", sweep_text=f"scale {runs} {shape}", jobs=jobs)
    say(f"enqueued {len(jobs):,} jobs in {time.perf_counter() - t0:.1f} s")
    with store.transaction() as conn:
        job_ids = [r[0] for r in conn.exec_driver_sql("SELECT job_id FROM jobs ORDER BY run_order")]
    configs = [j["config"] for j in jobs]
    laws = {}
    rng = random.Random(seed)
    pid = os.getpid()
    t_start = store.clock() - 3600.0
    mark = "%s" if store.dialect == "postgresql" else "?"
    insert = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join([mark] * len(RUN_COLUMNS))})"
    made = 0
    for k in range(machines):
        if made >= runs:
            break
        m = store.register_machine(machine_facts(f"node{k}", f"Synthetic CPU {k}"))
        pool = store.pool_id(m)
        speed = 1.0 + 0.4 * k
        host = f"node{k}"
        t0 = time.perf_counter()
        todo = min(len(jobs), runs - made)
        for start in range(0, todo, chunk):
            rows = []
            for i in range(start, min(todo, start + chunk)):
                c = configs[i]
                key = (c["d_model"], c["n_layers"], c["seq_len"], c["batch_size"], c["cores"])
                base_ms = laws.get(key) or laws.setdefault(key, law(c))
                t = t_start + i * 0.01
                u = rng.random()
                if u < 0.02:
                    reason = "RuntimeError: out of memory" if c["d_model"] >= 256 else "killed: timeout"
                    rows.append((job_ids[i], m, pool, "failed", 1, pid, host, t, t, t, reason) + (None,) * 13)
                elif u < 0.03:
                    rows.append((job_ids[i], m, pool, "skipped", 1, pid, host, t, t, t,
                                 "allocator: libtcmalloc not found") + (None,) * 13)
                else:
                    ms = base_ms * speed * math.exp(rng.gauss(0, 0.05))
                    tokens = c["seq_len"] * c["batch_size"] * c["grad_accum"]
                    train_s = ms * c["steps"] / 1000
                    other = train_s * c["cores"] * 0.5 if disturbed and i % disturbed == 7 else 0.0
                    applied = (json.dumps({"torch_threads": max(1, c["intra_threads"] - 1)})
                               if read_back and i % read_back == 3 else None)
                    rows.append((job_ids[i], m, pool, "done", 1, pid, host, t, t, t, None, ms, ms * 0.95, ms * 1.05,
                                 tokens / (ms / 1000), 2.0 + ms * (c["steps"] + c["warmup_steps"]) / 1000, 1000,
                                 8.0, 7.0, 0.3, train_s, other, applied, read_text(applied)))
            with store.transaction(write=True) as conn:
                if store.dialect == "postgresql":
                    with conn.connection.driver_connection.cursor() as cursor:
                        with cursor.copy(f"COPY runs ({', '.join(RUN_COLUMNS)}) FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)
                else:
                    conn.exec_driver_sql(insert, rows)
            made += len(rows)
        say(f"machine {k}: {todo:,} runs in {time.perf_counter() - t0:.1f} s")
    if store.dialect == "postgresql":
        with store.transaction(write=True) as conn:
            conn.exec_driver_sql("ANALYZE")
    return store


def configurations_a_float_apart(store: Store) -> None:
    """The last four jobs made two pairs whose configurations differ only in a float's last digit (0.3 and
    0.1 + 0.2) and only in 0.0's sign: a reader that keys a configuration by anything less than its
    values' exact text would give both of a pair one configuration."""
    own = {"job_id", "config_hash", "repeat", "run_order", "sweep_id"}
    mark = "%s" if store.dialect == "postgresql" else "?"
    with store.transaction() as conn:
        conf = [f'"{c}"' for c in conn.exec_driver_sql("SELECT * FROM jobs WHERE 1 = 0").keys() if c not in own]
        job_ids = [r[0] for r in conn.exec_driver_sql("SELECT job_id FROM jobs ORDER BY job_id")]
        for (one, other), (x, y) in zip([job_ids[-4:-2], job_ids[-2:]], [(0.3, 0.1 + 0.2), (0.0, -0.0)]):
            conn.exec_driver_sql(f"UPDATE jobs SET ({', '.join(conf)}) = (SELECT {', '.join(conf)} FROM jobs "
                                 f"WHERE job_id = {mark}) WHERE job_id = {mark}", (one, other))
            for job_id, value in ((one, x), (other, y)):
                conn.exec_driver_sql(f"UPDATE jobs SET dropout = {mark} WHERE job_id = {mark}", (value, job_id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="a file path or an SQLAlchemy URL")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="grid")
    parser.add_argument("--disturbed", type=int, default=0, help="every Nth run disturbed (0: none)")
    parser.add_argument("--read-back", type=int, default=0, help="every Nth run read back other threads (0: none)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    build(args.db, args.runs, args.machines, shape=args.shape, disturbed=args.disturbed, read_back=args.read_back)
    print(json.dumps({"runs": args.runs, "build_s": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
