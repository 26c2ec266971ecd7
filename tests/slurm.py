"""A real single-node SLURM for tests: munged and slurmctld + slurmd on localhost, everything
(key, socket, config, state, spool, logs) under one temp dir, every daemon stopped on exit.
`python -m tests.slurm` starts one and runs `sinfo` (a manual check)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def why_not() -> str | None:
    """Why a SLURM cannot be started here, or None."""
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "squeue") if shutil.which(b) is None]
    if missing:
        return f"SLURM or munge is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p}\n" + (p.read_text(errors="replace")[-2000:] if p.exists() else "(none)") for p in logs)
    raise RuntimeError(f"{what} did not come up in {timeout:.0f} s\n{tails}")


@contextmanager
def local_slurm(cpus: int | None = None) -> Iterator[dict[str, str]]:
    """Start munged, slurmctld and slurmd; yield the environment clients need (SLURM_CONF)."""
    reason = why_not()
    if reason:
        raise RuntimeError(reason)
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    os.chmod(root, 0o755)
    host = socket.gethostname()
    cpus = cpus or os.cpu_count() or 1
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    procs: list[subprocess.Popen] = []
    try:
        key, sock = root / "munge.key", root / "munge.socket"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chmod(key, 0o600)
        munge_log = root / "munged.log"
        procs.append(subprocess.Popen(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                                       f"--pid-file={root / 'munged.pid'}", f"--log-file={munge_log}",
                                       f"--seed-file={root / 'munge.seed'}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(sock.exists, 15, "munged", [munge_log])
        for d in ("state", "spool"):
            (root / d).mkdir()
        conf = root / "slurm.conf"
        conf.write_text(f"""ClusterName=bench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root / 'slurmd.log'}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=bench Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        env = {**os.environ, "SLURM_CONF": str(conf)}
        logs = [root / "slurmctld.log", root / "slurmd.log"]
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=open(root / "slurmctld.err", "w")))
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=open(root / "slurmd.err", "w")))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated")

        _wait(idle, 60, "slurmctld + slurmd (node idle)", [*logs, root / "slurmctld.err", root / "slurmd.err"])
        yield {"SLURM_CONF": str(conf), "BENCH_SLURM_ROOT": str(root)}
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    with local_slurm() as env:
        print(subprocess.run(["sinfo"], env={**os.environ, **env}, capture_output=True, text=True).stdout)
        out = subprocess.run(["sbatch", "--array=0-1", "--wrap", "echo task $SLURM_ARRAY_TASK_ID; taskset -pc $$",
                              f"--output={env['BENCH_SLURM_ROOT']}/t-%a.out", "--cpus-per-task=1"],
                             env={**os.environ, **env}, capture_output=True, text=True)
        print(out.stdout, out.stderr)
        time.sleep(5)
        for p in sorted(Path(env["BENCH_SLURM_ROOT"]).glob("t-*.out")):
            print(p.name, p.read_text())
