"""How the queue scales: enqueue time and claim latency at 1k, 10k and 100k jobs on SQLite and
PostgreSQL, a stub worker's jobs/min on a fresh 1k queue and on a 100k queue that is 99% done, and
8 stub workers draining one PostgreSQL database (every job exactly once).

    venv/bin/python benchmarks/queue_scale.py                   # everything (about 10 minutes on 2 cores)
    venv/bin/python benchmarks/queue_scale.py --only enqueue,claims --sizes 1000,10000
    venv/bin/python benchmarks/queue_scale.py --root /work/baseline --only enqueue,claims,worker
                                                                # the same figures for another checkout

Prints figures with their spread (median and min over --rounds, interleaved); asserts nothing.
PostgreSQL is a throwaway server started here (Debian's postgresql), as the tests start one. The
stub child (tests/stub_child.py) sleeps 50 ms per job: what is left is the queue and the worker.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
AXES = {  # 10 values each: 1k = three axes, 10k = four, 100k = four and 10 repeats
    "d_model": [32 + 8 * i for i in range(10)],
    "n_layers": list(range(1, 11)),
    "batch_size": list(range(1, 11)),
    "vocab_size": [256 + 64 * i for i in range(10)],
}
SETS = ["steps=1", "warmup_steps=0", "dataset=builtin", "cores=1", "seq_len=32"]


def sweep_args(n: int) -> tuple[list[str], int]:
    axes = list(AXES.items())[:3 if n == 1000 else 4]
    repeats = {1000: 1, 10_000: 1, 100_000: 10}[n]
    return [f"{k}={','.join(map(str, v))}" for k, v in axes], repeats


def load_code(root: Path):
    """The store and planner of the checkout under test (this one, or --root)."""
    sys.path.insert(0, str(root))
    from orchestrator.queue.store import Store
    from orchestrator.queue.sweep import Machine, load

    return Store, Machine, load


def plan_jobs(load, Machine, n: int):
    axes, repeats = sweep_args(n)
    kwargs = {"max_jobs": 10 * n} if "max_jobs" in load.__code__.co_varnames else {}
    plan = load(None, sets=SETS, axes=axes, repeats=repeats, machine=Machine(cpu_count=2), **kwargs)
    return plan, (plan.iter_jobs() if hasattr(plan, "iter_jobs") else plan.jobs)


def pg_server():
    spec = importlib.util.spec_from_file_location("pgserver", HERE / "tests" / "pgserver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    values = [v * scale for v in values]
    if len(values) == 1:
        return f"{values[0]:.3g} {unit}"
    return f"{statistics.median(values):.3g} {unit} (min {min(values):.3g}, max {max(values):.3g}, n={len(values)})"


class Databases:
    """Fresh databases: SQLite files in a temp dir, PostgreSQL databases on one throwaway server."""

    def __init__(self, stack: ExitStack, dialects: list[str]):
        self.tmp = Path(tempfile.mkdtemp(prefix="cpubench-scale-"))
        stack.callback(shutil.rmtree, self.tmp, ignore_errors=True)
        self.pg = None
        if "postgresql" in dialects:
            self.server = pg_server()
            self.pg = stack.enter_context(self.server.throwaway_postgres("-c max_connections=200"))
        self.n = 0

    def new(self, dialect: str) -> str:
        self.n += 1
        if dialect == "sqlite":
            return str(self.tmp / f"q{self.n}.db")
        return self.server.create_database(self.pg, f"q{self.n}")


# -- enqueue -------------------------------------------------------------------------------------

def bench_enqueue(code, dbs: Databases, sizes, dialects, rounds: int) -> None:
    Store, Machine, load = code
    print("\n## enqueue (plan + insert, in process; a fresh database each time)\n")
    print("| jobs | database | time | jobs/s |")
    print("|---:|---|---|---:|")
    results = {(n, d): [] for n in sizes for d in dialects}
    for _ in range(rounds):
        for n in sizes:
            for dialect in dialects:
                store = Store(dbs.new(dialect))
                start = time.perf_counter()
                plan, jobs = plan_jobs(load, Machine, n)
                result = store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=jobs)
                results[(n, dialect)].append(time.perf_counter() - start)
                assert result.new == n, (result, n)
                store.engine.dispose()
    for (n, dialect), times in results.items():
        print(f"| {n:,} | {dialect} | {spread(times, 's')} | {n / statistics.median(times):,.0f} |")


# -- claims --------------------------------------------------------------------------------------

def mark_done(store, machine_id: int, pool_id: int | None, n_done: int) -> None:
    """Finished runs for the first n_done jobs in run order, written directly (a benchmark's setup,
    not a claim path): the state of a queue that far along."""
    from sqlalchemy import text

    with store.transaction(write=True) as conn:
        if pool_id is None:  # a release without pools
            conn.execute(text("INSERT INTO runs (job_id, machine_id, status, attempts, claimed, heartbeat, finished) "
                              "SELECT job_id, :m, 'done', 1, 0, 0, 0 FROM jobs ORDER BY run_order, job_id LIMIT :n"),
                         {"m": machine_id, "n": n_done})
        else:
            conn.execute(text("INSERT INTO runs (job_id, machine_id, pool_id, status, attempts, claimed, heartbeat, "
                              "finished) SELECT job_id, :m, :p, 'done', 1, 0, 0, 0 FROM jobs "
                              "ORDER BY run_order, job_id LIMIT :n"),
                         {"m": machine_id, "p": pool_id, "n": n_done})


def own_pool(store, machine_id: int) -> int | None:
    return store.pool_id(machine_id) if hasattr(store, "pool_id") else None


FACTS = {"fingerprint": "scale-bench", "hostname": "bench", "logical_cores": 2, "cpu_model": "bench"}


def bench_claims(code, dbs: Databases, sizes, dialects, rounds: int, claims: int) -> None:
    Store, Machine, load = code
    from orchestrator.queue.store import METRICS  # a done run names every metric (this checkout's or --root's list)
    print(f"\n## claim latency ({claims} claims per round, each followed by its finish; {rounds} rounds interleaved)\n")
    print("| jobs | done before | database | claim p50 | claim p99 | finish p50 |")
    print("|---:|---:|---|---|---|---|")
    stores, done_before = {}, {}
    for n in sizes:
        for dialect in dialects:
            store = Store(dbs.new(dialect))
            plan, jobs = plan_jobs(load, Machine, n)
            store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=jobs)
            machine = store.register_machine(FACTS)
            queued = max(n // 100, claims * rounds + 1)  # 99% done where there are enough jobs
            mark_done(store, machine, own_pool(store, machine), n - queued)
            first = store.claim(machine, pid=1, host="bench", max_cores=2)  # a pool's first claim makes its queue
            store.finish(first.run_id, pid=1, status="done", fields=dict.fromkeys(METRICS))
            stores[(n, dialect)] = (store, machine)
            done_before[(n, dialect)] = (n - queued + 1) / n
    timings = {key: ([], []) for key in stores}
    for _ in range(rounds):
        for key, (store, machine) in stores.items():
            claim_s, finish_s = timings[key]
            for _ in range(claims):
                t0 = time.perf_counter()
                claim = store.claim(machine, pid=1, host="bench", max_cores=2)
                t1 = time.perf_counter()
                store.finish(claim.run_id, pid=1, status="done",
                             fields=dict.fromkeys(METRICS) | {"step_ms_median": 1.0})
                t2 = time.perf_counter()
                claim_s.append(t1 - t0)
                finish_s.append(t2 - t1)
    for (n, dialect), (claim_s, finish_s) in timings.items():
        q = statistics.quantiles(claim_s, n=100)
        per_round = [statistics.median(claim_s[i * claims:(i + 1) * claims]) for i in range(rounds)]
        print(f"| {n:,} | {done_before[(n, dialect)]:.0%} | {dialect} | {statistics.median(claim_s) * 1e3:.2f} ms "
              f"(round medians {min(per_round) * 1e3:.2f}-{max(per_round) * 1e3:.2f}) | {q[98] * 1e3:.2f} ms | "
              f"{statistics.median(finish_s) * 1e3:.2f} ms |")
    for store, _ in stores.values():
        store.engine.dispose()


# -- a real stub worker --------------------------------------------------------------------------

def worker_env(tmp: Path, name: str) -> dict:
    state = tmp / f"state-{name}"
    seed = tmp / "state-seed"
    if seed.exists() and not state.exists():
        shutil.copytree(seed, state)  # the probe's cache: every worker skips the probe's measurement
    return {**os.environ, "BENCH_CHILD_MODULE": "tests.stub_child", "BENCH_STATE_DIR": str(state),
            "BENCH_OUTPUT_DIR": str(tmp / "output"), "BENCH_PROBE_QUICK": "1"}


def rate_from_runs(store, after_run: int) -> tuple[float, int]:
    """jobs/min from the database's own clock: first claim to last claim of the runs after_run."""
    from sqlalchemy import text

    with store.transaction() as conn:
        claimed = [r[0] for r in conn.execute(text("SELECT claimed FROM runs WHERE run_id > :r ORDER BY claimed"),
                                              {"r": after_run})]
    return 60 * (len(claimed) - 1) / (claimed[-1] - claimed[0]), len(claimed)


def max_run(store) -> int:
    from sqlalchemy import text

    with store.transaction() as conn:
        return conn.execute(text("SELECT COALESCE(MAX(run_id), 0) FROM runs")).scalar_one()


def bench_worker(code, dbs: Databases, root: Path, dialects, rounds: int, jobs: int) -> None:
    Store, Machine, load = code
    print(f"\n## one stub worker (`bench.py work --max-jobs {jobs}`, 50 ms child), {rounds} rounds interleaved\n")
    print("| queue | database | jobs/min | 100k / 1k |")
    print("|---|---|---|---:|")
    env = worker_env(dbs.tmp, "one")
    rates = {}
    setups = {}
    for dialect in dialects:
        for n, label in ((1000, "1k, fresh"), (100_000, "100k, 99% done")):
            store = Store(dbs.new(dialect))
            plan, planned = plan_jobs(load, Machine, n)
            store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=planned)
            subprocess.run([sys.executable, "bench.py", "status", "--db", store.url], cwd=root, env=env, check=True,
                           capture_output=True)  # registers this machine (and probes it, once)
            if not (dbs.tmp / "state-seed").exists():
                shutil.copytree(env["BENCH_STATE_DIR"], dbs.tmp / "state-seed")
            from sqlalchemy import text

            with store.transaction() as conn:
                machine = conn.execute(text("SELECT MAX(machine_id) FROM machines")).scalar_one()
            if n > 1000:
                mark_done(store, machine, own_pool(store, machine), n - n // 100)
            setups[(label, dialect)] = store
            rates[(label, dialect)] = []
    for _ in range(rounds):
        for (label, dialect), store in setups.items():
            before = max_run(store)
            subprocess.run([sys.executable, "bench.py", "work", "--db", store.url, "--max-jobs", str(jobs)], cwd=root,
                           env=env, check=True, capture_output=True)
            rates[(label, dialect)].append(rate_from_runs(store, before)[0])
    for dialect in dialects:
        small, big = rates[("1k, fresh", dialect)], rates[("100k, 99% done", dialect)]
        print(f"| 1k, fresh | {dialect} | {spread(small, 'jobs/min')} | |")
        print(f"| 100k, 99% done | {dialect} | {spread(big, 'jobs/min')} | "
              f"{statistics.median(big) / statistics.median(small):.2f} |")
    for store in setups.values():
        store.engine.dispose()


def bench_eight(code, dbs: Databases, root: Path, workers: int, jobs: int) -> None:
    Store, Machine, load = code
    print(f"\n## {workers} stub workers on one PostgreSQL database (`work --pool bench`), {jobs} jobs\n")
    store = Store(dbs.new("postgresql"))
    plan = load(None, sets=SETS, axes=[f"d_model={','.join(str(32 + 4 * i) for i in range(jobs))}"],
                machine=Machine(cpu_count=2))
    store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.iter_jobs())
    envs = [{**worker_env(dbs.tmp, f"w{i}"), "BENCH_OUTPUT_DIR": str(dbs.tmp / "output-eight")}
            for i in range(workers)]  # own state dirs: own CPU locks
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "bench.py", "work", "--db", store.url, "--pool", "bench"], cwd=root,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for env in envs]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    from sqlalchemy import text

    with store.transaction() as conn:
        runs, distinct, done = conn.execute(text("SELECT COUNT(*), COUNT(DISTINCT job_id), "
                                                 "SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END) FROM runs")).one()
        per_worker = conn.execute(text("SELECT worker_pid, COUNT(*) FROM runs GROUP BY worker_pid")).all()
    markers = len(list((dbs.tmp / "output-eight" / "markers").iterdir()))
    rate, _ = rate_from_runs(store, 0)
    print(f"exit codes {sorted(set(codes))}; runs {runs}, distinct jobs {distinct}, done {done}, "
          f"child executions {markers} (every job exactly once: {runs == distinct == done == markers == jobs})")
    print(f"jobs per worker: {sorted(n for _, n in per_worker)}")
    print(f"{rate:,.0f} jobs/min (first to last claim); {60 * jobs / wall:,.0f} jobs/min including the workers' start")
    store.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="enqueue,claims,worker,eight")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dialects", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--worker-jobs", type=int, default=120)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--eight-jobs", type=int, default=800)
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout to measure")
    args = parser.parse_args()
    only = args.only.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    dialects = args.dialects.split(",")
    root = args.root.resolve()
    code = load_code(root)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"# queue scale: {root} ({commit}), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    with ExitStack() as stack:
        dbs = Databases(stack, dialects + (["postgresql"] if "eight" in only else []))
        if "enqueue" in only:
            bench_enqueue(code, dbs, sizes, dialects, args.rounds)
        if "claims" in only:
            bench_claims(code, dbs, sizes, dialects, args.rounds, args.claims)
        if "worker" in only:
            bench_worker(code, dbs, root, dialects, args.rounds, args.worker_jobs)
        if "eight" in only:
            bench_eight(code, dbs, root, args.workers, args.eight_jobs)
    print(f"\nload at the end {os.getloadavg()[0]:.1f} (other work on this machine disturbs every figure)")


if __name__ == "__main__":
    main()
