"""How tests/v1/results-v1.db was made: with the release before schema versions (no schema_version
table: version 1), run from a pristine checkout of that release. Kept for the record; the tests use
the file, never this script (a clean clone has no old checkout to run it with).

    venv/bin/python tests/v1/make_v1_db.py --release /work/baseline --out tests/v1/results-v1.db

What it holds, all written by the old code's own commands and Store:
- machine 1 (this machine, probed): the stub child (tests.stub_child) in `bench.py work`: done runs,
  four kinds of failure (segfault, exit 3, raise, garbage), skipped runs (freq_mhz without cpufreq);
  two real tiny training runs (worker.train); a run left 'running' by a worker killed with -9 and a
  run taken back to 'queued' after a dead worker (attempt count 1); then `bench.py report`.
- machine 2 (facts made up, registered through the old Store): done runs with synthetic metrics.
It also copies the release's schema.sql next to the database (the PostgreSQL migration test builds
a version-1 database from it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, required=True, help="checkout of the old release")
    parser.add_argument("--out", type=Path, default=HERE / "results-v1.db")
    args = parser.parse_args()
    release = args.release.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="cpubench-v1-"))
    db = str(tmp / "results.db")
    env = {**os.environ, "BENCH_STATE_DIR": str(tmp / "state"), "BENCH_OUTPUT_DIR": str(tmp / "output"),
           "BENCH_PROBE_QUICK": "1", "BENCH_DB": db}
    env.pop("BENCH_CHILD_MODULE", None)
    stub = {**env, "BENCH_CHILD_MODULE": "tests.stub_child"}
    python = str(release / "venv" / "bin" / "python")

    def bench(*argv, env=env, check=True):
        return subprocess.run([python, "bench.py", *argv], cwd=release, env=env, check=check,
                              capture_output=True, text=True)

    tiny = ["--set", "n_layers=1", "--set", "seq_len=32", "--set", "batch_size=2", "--set", "vocab_size=256",
            "--set", "warmup_steps=1", "--set", "dataset=builtin", "--set", "cores=1"]
    # The stub child: seed 0 = done, 1 segfault, 2 exit 3, 4 raise, 5 garbage (tests/stub_child.py).
    bench("enqueue", "--axis", "seed=0,1,2,4,5", "--set", "d_model=32", "--repeats", "2", "--set", "steps=3", *tiny)
    bench("enqueue", "--axis", "freq_mhz=1200,1600", "--set", "steps=1", "--set", "d_model=40", *tiny)
    bench("work", env=stub)
    # Real tiny training runs through the old child.
    bench("enqueue", "--axis", "d_model=32,64", "--set", "steps=3", "--set", "seed=7", *tiny)
    bench("work")
    # A hanging stub child whose worker is killed with -9: its run stays 'running' for a dead pid.
    bench("enqueue", "--axis", "seed=3", "--set", "steps=1", "--set", "d_model=56", *tiny)
    worker = subprocess.Popen([python, "bench.py", "work"], cwd=release, env=stub,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not _running(db):
        time.sleep(0.2)
    time.sleep(1)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(1)  # its child dies with it (parent-death signal)
    bench("report", "--out", str(tmp / "result"))
    _old_store_part(python, release, db)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        print(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, args.out)
    shutil.copyfile(release / "schema.sql", args.out.parent / "schema-v1.sql")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


def _running(db: str) -> bool:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'running'").fetchone()[0] > 0
    except sqlite3.Error:
        return False


# Run by the old release's interpreter, in its checkout: a second machine's runs, and a run taken
# back to 'queued' from a dead worker, through the old Store itself.
OLD_STORE_PART = r"""
import sys
from orchestrator.queue.store import Store
from common.variables import config_hash, resolve
from tests.reportdb import machine_facts, metrics

store = Store(sys.argv[1])
other = store.register_machine(machine_facts("node-b", "Other CPU"))
jobs = []
for d_model in (32, 48):
    config, why = resolve({"d_model": d_model, "n_layers": 1, "seq_len": 32, "batch_size": 2, "vocab_size": 256,
                           "warmup_steps": 1, "steps": 3, "dataset": "builtin", "cores": 1}, 8)
    assert not why, why
    jobs.append({"config": config, "config_hash": config_hash(config), "run_order": 0})
store.enqueue(name="tiny-real", source="command line", sweep_text="tiny", jobs=jobs)
while (claim := store.claim(other, pid=4242, host="node-b", max_cores=8)) is not None:
    if claim.config["seed"] == 3:  # the hanging stub: its worker died, the run goes back to the queue
        store.take_back_stale(other, host="node-b", grace_s=1e9, max_attempts=3, is_alive=lambda pid: False)
        break
    status = "done" if claim.config["steps"] == 3 else "skipped"
    store.finish(claim.run_id, pid=4242, status=status, reason=None if status == "done" else "not on node-b",
                 fields=metrics(2.0 + claim.config["d_model"] / 64, claim.config))
"""


def _old_store_part(python: str, release: Path, db: str) -> None:
    subprocess.run([python, "-c", OLD_STORE_PART, db], cwd=release, check=True)


if __name__ == "__main__":
    sys.exit(main())
