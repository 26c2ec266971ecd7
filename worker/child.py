"""Spawning the training child: its whitelisted environment, affinity, privileges and parent-death
signal, the heartbeat while it runs, the timeout, and turning what it printed into an outcome.

The child is `python -m worker.train` with the job on stdin and exactly one JSON line on stdout.
It is pinned before it starts (sched_setaffinity in the fork), gets SIGKILL when the worker dies
(PR_SET_PDEATHSIG, so a killed worker never leaves a child training), and runs in its own process
group so a timeout kills whatever it started too.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child

# Variables a child may inherit from the worker; everything else it gets is built on purpose.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER", "LOGNAME", "TZ")
STDERR_TAIL_LINES = 12


@dataclass
class Outcome:
    status: str  # done | failed | skipped
    reason: str | None = None
    metrics: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)  # runs columns besides metrics: dataset_used, output_path...
    applied: dict = field(default_factory=dict)
    stderr_tail: str = ""


def child_env(extra: dict[str, str], project_root: Path, data_dir: Path) -> dict[str, str]:
    """The child's environment: a whitelist of the worker's, then the job's own variables."""
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update({
        "PYTHONPATH": str(project_root),
        "PYTHONHASHSEED": "0",
        "HF_HOME": str(data_dir / "hf"),
        # Inductor compiles in-process: no compile-worker pool outliving the child or using CPUs
        # outside the job's affinity set.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    })
    env.update(extra)
    return env


def drop_to_invoking_user() -> tuple[int, int] | None:
    """(uid, gid) the child should run as: the sudo caller when the worker runs as root, else None."""
    if os.geteuid() != 0 or "SUDO_UID" not in os.environ:
        return None
    return int(os.environ["SUDO_UID"]), int(os.environ.get("SUDO_GID", os.environ["SUDO_UID"]))


def _preexec(cpus: list[int], user: tuple[int, int] | None, parent_pid: int) -> Callable[[], None]:
    def setup() -> None:
        os.setpgrp()
        if cpus:
            os.sched_setaffinity(0, cpus)
        if user is not None:
            os.setgid(user[1])
            os.setuid(user[0])
        # After setuid: a credential change clears the parent-death signal.
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the worker died before prctl took effect
            os._exit(1)

    return setup


def run_child(job: dict, *, module: str = "worker.train", argv_prefix: list[str], env: dict[str, str], cpus: list[int], cwd: Path,
              timeout_s: float, heartbeat_s: float, on_heartbeat: Callable[[int], None]) -> Outcome:
    """Run one child to completion (or timeout) and return what happened; never raises for the
    child's own failures. `on_heartbeat(child_pid)` is called every heartbeat_s while it runs."""
    argv = [*argv_prefix, sys.executable, "-m", module]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=env, close_fds=True,
                            preexec_fn=_preexec(cpus, drop_to_invoking_user(), os.getpid()))
    payload: bytes | None = json.dumps(job).encode()
    timed_out = False
    try:
        on_heartbeat(proc.pid)
        while True:
            left = timeout_s - (time.perf_counter() - started)
            try:
                out, err = proc.communicate(payload, timeout=max(0.01, min(heartbeat_s, left)))
                break
            except subprocess.TimeoutExpired:
                payload = None
                if time.perf_counter() - started >= timeout_s:
                    timed_out = True
                    _kill_group(proc)
                    out, err = proc.communicate()
                    break
                on_heartbeat(proc.pid)
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    wall_s = time.perf_counter() - started
    return _outcome(proc.returncode, out, err, wall_s=wall_s, timed_out=timed_out, timeout_s=timeout_s,
                    child_pid=proc.pid)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _tail(err: bytes) -> str:
    lines = err.decode(errors="replace").strip().splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _outcome(rc: int, out: bytes, err: bytes, *, wall_s: float, timed_out: bool, timeout_s: float,
             child_pid: int) -> Outcome:
    tail = _tail(err)
    base = {"wall_s": wall_s}
    if timed_out:
        return Outcome("failed", f"timed out after {timeout_s:g} s\n{tail}".strip(), base, {"child_pid": child_pid},
                       stderr_tail=tail)
    if rc != 0:
        if rc < 0:
            what = f"child killed by signal {signal.Signals(-rc).name}"
        else:
            what = f"child exited with code {rc}"
        return Outcome("failed", f"{what}\n{tail}".strip(), base, {"child_pid": child_pid}, stderr_tail=tail)
    try:
        result = json.loads(out.decode())
        status = result["status"]
        assert status in ("done", "skipped"), status
    except (ValueError, KeyError, AssertionError, UnicodeDecodeError):
        return Outcome("failed", f"child printed no result line\n{tail}".strip(), base, {"child_pid": child_pid},
                       stderr_tail=tail)
    metrics = {**(result.get("metrics") or {}), **base}
    facts = {k: result.get(k) for k in ("dataset_used", "output_path", "torch_version", "python_version", "build_info")}
    facts["child_pid"] = child_pid
    return Outcome(status, result.get("reason"), metrics, facts, result.get("applied") or {}, stderr_tail=tail)
