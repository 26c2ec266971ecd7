"""A two-node SLURM cluster on this machine (tests/netcluster.py: a network namespace, address, hostname,
CPU and slurmd per node; slurmctld, munged and PostgreSQL on a bridge), to try `submit --slurm --nodes 2
--together` by hand and to see what the link does to data parallelism: the all-reduce share of a step
at two model sizes, one node with two ranks (`once`, loopback) beside two nodes with one rank each,
over the link as it is and shaped to a rate with tbf (this VM's kernel has tbf and htb, not netem:
no added delay). Prints; asserts nothing; leaves nothing behind (it says so at the end). Needs root.

    flock /work/cpu.lock venv/bin/python benchmarks/slurm_cluster.py [--rates none,1gbit,100mbit] [--keep]

--keep: build the cluster, print how to use it, and wait for Enter before tearing it down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import netcluster  # noqa: E402
from tests.pgserver import create_database  # noqa: E402

BASE = dict(n_layers=2, n_heads=2, seq_len=64, vocab_size=512, warmup_steps=2, dataset="builtin", cores=1,
            ranks=1, batch_size=4, steps=30)
SIZES = (64, 256)


def bench(*args: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})
    if proc.returncode != 0:
        raise SystemExit(f"bench {' '.join(args)}: {proc.stderr[-2000:]}")
    return proc


def two_nodes(cluster, rate: str | None, state: Path) -> dict[int, dict]:
    cluster.shape(rate)
    url = create_database(cluster.db_url(), f"b{time.time_ns()}")
    env = {**cluster.env, "BENCH_STATE_DIR": str(state), "BENCH_PEAK_PER_SET": "0"}
    sets = [a for k, v in BASE.items() for a in ("--set", f"{k}={v}")]
    bench("enqueue", "--db", url, *sets, "--set", "nodes=2", "--axis", "d_model=" + ",".join(map(str, SIZES)), env=env)
    logs = state / "logs"
    job = bench("submit", "--slurm", "--nodes", "2", "--together", "--logs", str(logs), "--db", url, env=env)
    job_id = job.stdout.strip()
    while subprocess.run(["squeue", "-h", "-j", job_id], env={**os.environ, **cluster.env}, capture_output=True,
                         text=True).stdout.strip():
        time.sleep(1)
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace(cluster.head, "127.0.0.1"))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT j.d_model, r.status, r.reason, r.step_ms_median, r.allreduce_ms, "
                                 "r.allreduce_share, r.applied FROM runs r JOIN jobs j USING (job_id)")).all()
    engine.dispose()
    cluster.shape(None)
    out = {}
    for r in rows:
        applied = json.loads(r.applied) if isinstance(r.applied, str) else (r.applied or {})
        out[r.d_model] = {"status": r.status, "reason": r.reason, "step_ms": r.step_ms_median,
                          "allreduce_ms": r.allreduce_ms, "share": r.allreduce_share,
                          "nodes": [(x["host"], x["address"], x["affinity"], x["torch_threads"])
                                    for x in applied.get("ranks", [])]}
    return out


def one_node(d_model: int, state: Path) -> dict:
    settings = [f"{k}={v}" for k, v in (BASE | {"cores": 2, "ranks": 2, "d_model": d_model}).items()]
    got = json.loads(bench("once", "--json", *settings, env={"BENCH_STATE_DIR": str(state)}).stdout)
    return {"step_ms": got["step_ms_median"], "allreduce_ms": got["allreduce_ms"], "share": got["allreduce_share"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="none,1gbit,100mbit", help="tbf rates of the links ('none': as is)")
    parser.add_argument("--keep", action="store_true", help="build, wait for Enter, tear down")
    args = parser.parse_args()
    reason = netcluster.why_not()
    if reason:
        raise SystemExit(reason)
    print("queueing disciplines:", {k: netcluster.qdisc_support(k) or "yes" for k in ("tbf", "htb", "netem")})
    state = Path(tempfile.mkdtemp(prefix="cbn-bench-"))
    with netcluster.namespace_cluster(2) as cluster:
        tag = cluster.tag
        print("nodes:", [(n.name, n.address, n.cpus) for n in cluster.nodes], "database:", cluster.db_url())
        if args.keep:
            print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}; srun -N2 hostname\n"
                  f"python bench.py submit --slurm --nodes 2 --together --db {cluster.db_url()}")
            input("Enter tears it down> ")
        else:
            print(f"\n{'link':>9} {'d_model':>7} {'where':>16} {'step ms':>8} {'all-reduce ms':>13} {'share':>6}")
            for d_model in SIZES:
                m = one_node(d_model, state)
                print(f"{'loopback':>9} {d_model:>7} {'1 node x 2 ranks':>16} {m['step_ms']:8.2f} "
                      f"{m['allreduce_ms']:13.3f} {m['share']:6.3f}")
            for rate in args.rates.split(","):
                got = two_nodes(cluster, None if rate == "none" else rate, state)
                for d_model, m in sorted(got.items()):
                    if m["status"] != "done":
                        print(f"{rate:>9} {d_model:>7} {m['status']}: {m['reason']}")
                        continue
                    print(f"{rate:>9} {d_model:>7} {'2 nodes x 1 rank':>16} {m['step_ms']:8.2f} "
                          f"{m['allreduce_ms']:13.3f} {m['share']:6.3f}   {m['nodes']}")
    subprocess.run(["rm", "-rf", str(state)])
    print("left behind:", netcluster.leftovers(tag) or "nothing")


if __name__ == "__main__":
    main()
