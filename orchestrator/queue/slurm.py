"""`bench.py submit --slurm`: start `work` on N nodes as one SLURM job array, every task against
the same database. The batch script cd's to this project and runs this same Python (the nodes
share the filesystem); the database URL travels in the job's environment (BENCH_DB, sbatch's
default --export=ALL), never in the script or on a command line, so its password is not written
to disk by us nor shown by `ps` or `scontrol show job`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.paths import REPO
from common.errors import BadInput, BenchError
from orchestrator.queue.store import database_url, safe_url

PROJECT_ROOT = REPO


@dataclass
class Submitted:
    job_id: str
    tasks: int
    script: Path
    logs: Path  # the tasks' output files: logs / cpubench-<job>_<task>.out


def batch_script(*, nodes: int, pool: str | None, partition: str | None, time_limit: str | None,
                 cpus_per_task: int | None, timeout: float, log_dir: Path, together: bool = False) -> str:
    """The sbatch script: N array tasks, one node each (the whole node unless --cpus-per-task); together:
    one allocation of N nodes whose batch step (the first node) runs the worker, so a job with nodes > 1
    starts a launcher on each of them through srun (worker/trainers/torch/distributed.py)."""
    if together:
        # --no-kill: a node lost mid-run ends the step on it, not the allocation, so the worker on the first
        # node records the run as failed (naming the node) and goes on with the queue
        lines = ["#!/bin/bash", "#SBATCH --job-name=cpubench", f"#SBATCH --nodes={nodes}",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --no-kill", f"#SBATCH --output={log_dir}/cpubench-%j.out"]
    else:
        lines = ["#!/bin/bash", "#SBATCH --job-name=cpubench", f"#SBATCH --array=0-{nodes - 1}",
                 "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
                 f"#SBATCH --output={log_dir}/cpubench-%A_%a.out"]
    lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}" if cpus_per_task else "#SBATCH --exclusive")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    work = [sys.executable, str(PROJECT_ROOT / "bench.py"), "work", "--timeout", f"{timeout:g}"]
    if pool:
        work += ["--pool", pool]
    lines += ["set -eu", f"cd {shlex.quote(str(PROJECT_ROOT))}",
              ': "${BENCH_DB:?BENCH_DB is not set: submit passes it in the job environment}"',
              'echo "cpubench task ${SLURM_ARRAY_TASK_ID:-0} of job ${SLURM_ARRAY_JOB_ID:-?} on $(hostname)"',
              "exec " + shlex.join(work)]
    return "\n".join(lines) + "\n"


def submit(db: str, *, nodes: int, pool: str | None = None, partition: str | None = None,
           time_limit: str | None = None, cpus_per_task: int | None = None, timeout: float = 900.0,
           log_dir: Path = Path("slurm"), together: bool = False) -> Submitted:
    url = database_url(db)
    if nodes < 1:
        raise BadInput(f"--nodes {nodes}: expected at least 1")
    if url.startswith("sqlite") and nodes > 1 and not together:  # together: only the first node writes
        raise BadInput(f"--db {safe_url(url)}: an SQLite file cannot be shared by {nodes} nodes; give a PostgreSQL "
                       "URL (--db postgresql+psycopg://user@host/db) that every node can reach")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise BenchError("sbatch not found: submit needs SLURM's client commands (Debian: slurm-wlm-client)")
    log_dir = log_dir.expanduser().resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    script = log_dir / f"cpubench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch"
    script.write_text(batch_script(nodes=nodes, pool=pool, partition=partition, time_limit=time_limit,
                                   cpus_per_task=cpus_per_task, timeout=timeout, log_dir=log_dir, together=together))
    env = {**os.environ, "BENCH_DB": url}
    proc = subprocess.run([sbatch, "--parsable", str(script)], env=env, capture_output=True, text=True,
                          cwd=PROJECT_ROOT)
    if proc.returncode != 0:
        raise BenchError(f"sbatch refused {script}: {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    return Submitted(job_id=job_id, tasks=1 if together else nodes, script=script, logs=log_dir)
