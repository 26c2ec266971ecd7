"""Scratch folders a kill -9 cannot leak for long: the worker's per-run folder (worker/spawn.py), a merge's
copy of the other database (orchestrator/queue/merge.py) and a data-parallel launcher's ranks folder
(worker/trainers/torch/distributed.py). Each is named PREFIX-HOST-PID-random after the process that made
it; a process killed with -9 cannot remove its own, so the next folder made with that prefix on that host
removes those whose process is gone. A live process's folder is never touched (a reused PID only delays
the removal); another user's, which this process may not remove, is left.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import tempfile
from pathlib import Path


def make(prefix: str, dir: str | Path | None = None) -> Path:
    """A new folder PREFIXHOST-PID-random under `dir` (the system's temporary folder by default), after
    removing the folders of this prefix and host whose process has died."""
    base = Path(dir) if dir is not None else Path(tempfile.gettempdir())
    mine = f"{prefix}{socket.gethostname()}-"
    remove_orphans(base, mine)
    return Path(tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}-", dir=base))


@contextlib.contextmanager
def folder(prefix: str, dir: str | Path | None = None):
    """make(), removed again on leaving the block (a kill -9 leaves it to the next make())."""
    path = make(prefix, dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_orphans(base: Path, mine: str) -> None:
    """Remove base/MINE-PID-* where process PID is gone."""
    for name in glob.glob(glob.escape(str(base / mine)) + "*-*"):
        pid = Path(name).name[len(mine):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(name, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
