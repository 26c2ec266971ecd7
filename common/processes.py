"""A process that must not outlive its parent: the worker's training children (worker/spawn.py, the
fork server, the distributed ranks) and the watcher's report process (orchestrator/report/live.py) ask Linux
for a signal when their parent dies (PR_SET_PDEATHSIG), so a kill -9 of the parent leaves none behind.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child


def set_parent_death_signal(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """`signum` to this process when its parent dies; exit now if the parent is already gone."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
