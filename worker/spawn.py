"""Spawning the training child: its whitelisted environment, affinity, privileges and parent-death
signal, the heartbeat while it runs, the timeout, and turning what it printed into an outcome.

The child is a trainer, `python -m worker.trainers.<framework>` (worker/trainers/harness.py: the
job on stdin and exactly one JSON line on stdout).
It is pinned before it starts (sched_setaffinity in the fork), gets SIGKILL when the worker dies
(PR_SET_PDEATHSIG, so a killed worker never leaves a child training), and runs in its own process
group so a timeout kills whatever it started too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import scratch
from common.processes import set_parent_death_signal

# Variables a child may inherit from the worker; everything else it gets is built on purpose.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER", "LOGNAME", "TZ")
STDERR_TAIL_LINES = 12


@dataclass
class Outcome:
    status: str  # done | failed | skipped; queued: given back with a strike, to be tried again (worker/loop.py)
    reason: str | None = None
    metrics: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)  # runs columns besides metrics: dataset_used, output_path...
    applied: dict = field(default_factory=dict)
    stderr_tail: str = ""
    timed_window: dict | None = None  # {start_unix_s, end_unix_s} of the child's timed steps
    curve: list = field(default_factory=list)  # a learning run's evaluations, as far as it got
    # failed by a signal the worker did not send (the OOM killer, a crash, someone's kill): the job's
    # own process the likely cause, maybe a passing one: a strike against the job, tried again
    # (worker/loop.py), where its other failures are final at once
    strike: bool = False
    proven: dict = field(default_factory=dict)  # what the child proved once for later ones (harness `proven`)


def oom_kills() -> int | None:
    """The kernel's count of processes the OOM killer has killed since boot (/proc/vmstat), or None."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


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


def become_job_process(cpus: list[int], user: tuple[int, int] | None, parent_pid: int) -> None:
    """In a freshly forked child: its own process group, pinned, the invoking user, and killed with
    its parent. Shared by the exec path (preexec_fn) and the fork server's children."""
    os.setpgrp()
    if cpus:
        os.sched_setaffinity(0, cpus)
    if user is not None:
        os.setgid(user[1])
        os.setuid(user[0])
    set_parent_death_signal(parent_pid)  # after setuid: a credential change clears it


def _preexec(cpus: list[int], user: tuple[int, int] | None, parent_pid: int) -> Callable[[], None]:
    return lambda: become_job_process(cpus, user, parent_pid)


def run_exec(job: dict, *, module: str, argv_prefix: list[str], env: dict[str, str], cpus: list[int], cwd: Path,
              timeout_s: float, heartbeat_s: float, on_heartbeat: Callable[[int], None]) -> Outcome:
    """Run one child to completion (or timeout) and return what happened; never raises for the
    child's own failures. `on_heartbeat(child_pid)` is called every heartbeat_s while it runs."""
    argv = [*argv_prefix, sys.executable, "-m", module]
    started = time.perf_counter()
    ooms = oom_kills()
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
                    _kill_pgid(proc.pid)
                    out, err = proc.communicate()
                    break
                on_heartbeat(proc.pid)
    except BaseException:
        _kill_pgid(proc.pid)
        proc.wait()
        raise
    wall_s = time.perf_counter() - started
    outcome = _outcome(proc.returncode, out, err, wall_s=wall_s, timed_out=timed_out, timeout_s=timeout_s,
                       child_pid=proc.pid, oom_kills_before=ooms)
    outcome.applied["spawn"] = "exec"
    return outcome


def _tail(err: bytes) -> str:
    lines = err.decode(errors="replace").strip().splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _outcome(rc: int, out: bytes, err: bytes, *, wall_s: float, timed_out: bool, timeout_s: float,
             child_pid: int, oom_kills_before: int | None = None) -> Outcome:
    tail = _tail(err)
    base = {"wall_s": wall_s}
    if timed_out:
        return Outcome("failed", f"timed out after {timeout_s:g} s\n{tail}".strip(), base, {"child_pid": child_pid},
                       stderr_tail=tail)
    if rc != 0:
        if rc < 0:
            what = f"child killed by signal {signal.Signals(-rc).name}"
            ooms = oom_kills()
            if -rc == signal.SIGKILL and None not in (ooms, oom_kills_before) and ooms > oom_kills_before:
                what += " (by the OOM killer: the kernel's oom_kill count rose while it ran)"
        else:
            what = f"child exited with code {rc}"
        return Outcome("failed", f"{what}\n{tail}".strip(), base, {"child_pid": child_pid}, stderr_tail=tail,
                       strike=rc < 0)
    try:
        result = json.loads(out.decode())
        status = result["status"]
        assert status in ("done", "skipped"), status
    except (ValueError, KeyError, AssertionError, UnicodeDecodeError):
        return Outcome("failed", f"child printed no result line\n{tail}".strip(), base, {"child_pid": child_pid},
                       stderr_tail=tail)
    metrics = {**(result.get("metrics") or {}), **base}
    facts = {k: result.get(k) for k in ("dataset_used", "output_path", "torch_version", "python_version", "build_info",
                                        "gemm_format")}
    facts["child_pid"] = child_pid
    return Outcome(status, result.get("reason"), metrics, facts, result.get("applied") or {}, stderr_tail=tail,
                   timed_window=result.get("timed_window"),
                   proven=(result.get("proven") or {}) if status == "done" else {})


class ForkServers:
    """One fork server per trainer module: a JAX child must never carry torch's OpenMP runtime, and
    a sweep that alternates frameworks must not restart a server every job. Each is still restarted
    when a job of its trainer needs other process-start settings."""

    def __init__(self):
        self.servers: dict[str, ForkServer] = {}

    def run(self, job: dict, *, module: str, **kwargs) -> Outcome:
        return self.servers.setdefault(module, ForkServer()).run(job, module=module, **kwargs)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


class ForkServer:
    """The worker's side of worker/forkserver.py for one trainer: one server per distinct
    process-start settings, restarted when a job needs other settings, closed with the worker.
    `proven`: what its children proved once for the later ones (harness `proven`), handed to each
    child; a new server starts with nothing proved."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.key: tuple | None = None
        self.proven: dict = {}
        self._buffer = b""
        self._stderr = None

    def close(self) -> None:
        if self.proc is not None:
            _kill_pgid(self.proc.pid)
            self.proc.wait()
            self.proc = None
            self._stderr.close()

    def _start(self, key: tuple, module: str, argv_prefix: list[str], env: dict, cpus: list[int], cwd: Path) -> None:
        self.close()
        self.proven = {}
        self._buffer = b""
        self._stderr = tempfile.TemporaryFile()
        argv = [*argv_prefix, sys.executable, "-m", "worker.forkserver", module]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     cwd=cwd, env={**env, "BENCH_FORKSERVER_PARENT": str(os.getpid())},
                                     close_fds=True, preexec_fn=_preexec(cpus, drop_to_invoking_user(), os.getpid()))
        self.key = key
        ready = self._read_line(timeout_s=300)
        if ready is None or "ready" not in ready:
            tail = self._stderr_tail()
            self.close()
            raise ChildStartError(f"fork server did not start\n{tail}".strip())

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return _tail(self._stderr.read())

    def _read_line(self, timeout_s: float) -> dict | None:
        """The server's next reply, or None on timeout; raises ChildStartError if the server died."""
        deadline = time.perf_counter() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ChildStartError(f"fork server died\n{self._stderr_tail()}".strip())
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, job: dict, *, module: str, argv_prefix: list[str], env: dict[str, str], cpus: list[int],
            cwd: Path, timeout_s: float, heartbeat_s: float, on_heartbeat: Callable[[int], None]) -> Outcome:
        key = (module, tuple(sorted(env.items())), tuple(argv_prefix), tuple(cpus), str(cwd))
        try:
            if self.proc is None or self.proc.poll() is not None or key != self.key:
                self._start(key, module, argv_prefix, env, cpus, cwd)
        except ChildStartError as error:
            return Outcome("failed", str(error), {}, {})
        with scratch.folder("cpubench-child-") as tmp:
            paths = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_text(json.dumps({**job, "proven": self.proven}))
            for name in ("stdout", "stderr"):
                paths[name].touch()
            if drop_to_invoking_user() is not None:
                os.chmod(tmp, 0o777)
                for path in paths.values():
                    os.chmod(path, 0o666)
            request = {name: str(path) for name, path in paths.items()}
            request.update(cpus=cpus, user=None)  # the server already runs as the invoking user
            started = time.perf_counter()
            ooms = oom_kills()
            timed_out = False
            pid = None
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
                pid = self._read_line(timeout_s=60)["pid"]
                on_heartbeat(pid)
                while True:
                    left = timeout_s - (time.perf_counter() - started)
                    reply = self._read_line(timeout_s=max(0.01, min(heartbeat_s, left)))
                    if reply is not None:
                        break
                    if time.perf_counter() - started >= timeout_s:
                        timed_out = True
                        _kill_pgid(pid)
                        reply = self._read_line(timeout_s=60)
                        break
                    on_heartbeat(pid)
            except ChildStartError as error:
                self.close()
                return Outcome("failed", str(error), {"wall_s": time.perf_counter() - started}, {"child_pid": pid})
            except BaseException:
                if pid is not None:
                    _kill_pgid(pid)
                self.close()
                raise
            wall_s = time.perf_counter() - started
            outcome = _outcome(reply["returncode"], paths["stdout"].read_bytes(), paths["stderr"].read_bytes(),
                               wall_s=wall_s, timed_out=timed_out, timeout_s=timeout_s, child_pid=pid,
                               oom_kills_before=ooms)
        self.proven.update(outcome.proven)
        outcome.applied["spawn"] = "fork server"
        return outcome


class ChildStartError(Exception):
    """The fork server could not start or died: the job fails with this message."""


def _kill_pgid(pid: int) -> None:
    """Kill a child and whatever it started (its own process group, once it made one)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
