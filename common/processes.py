"""Processes: one that must not outlive its parent (the worker's training children: worker/spawn.py,
the fork server, the distributed ranks; the watcher's report process, orchestrator/report/watch.py)
asks Linux for a signal when its parent dies (PR_SET_PDEATHSIG), so a kill -9 of the parent leaves
none behind; and fork_child, the one way to fork a child that runs a function and exits (the report's
children, the fork server's jobs, the watcher's report process), with Child to wait for one.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child


def set_parent_death_signal(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """`signum` to this process when its parent dies; exit now if the parent is already gone."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def fork_child(run: Callable[[], int | None], *, close: Iterable[int] = (), nice: int = 0,
               die_with_parent: bool = False) -> int:
    """Fork a child that dies with this process where `die_with_parent`, closes the descriptors `close`
    (this process's ends of its pipes), lowers its priority by `nice` (os.nice) and runs run(). The child
    never returns into the caller's code: it exits with run()'s value (0 for None), or 1 where it raised.
    Here: the child's pid."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        if die_with_parent:
            set_parent_death_signal(parent)
        for fd in close:
            os.close(fd)
        if nice:
            os.nice(nice)
        code = run() or 0
    finally:
        os._exit(code)


@dataclass
class Child:
    """A child of this process (fork_child's pid), waited for: ended() says whether it has ended, waiting
    up to timeout_s for it (None: until it does); then `code` is its exit code (negative: the signal that
    killed it). Reaps it once: ask this, not os.waitpid."""

    pid: int
    code: int | None = None

    def ended(self, timeout_s: float | None = 0.0) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.code is None:
            pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.01)
        return True
