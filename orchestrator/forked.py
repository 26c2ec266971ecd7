"""Work done beside the report in a forked child, so that the report's parts that do not depend on
each other use both CPUs of a small machine (issue 31: the PNGs are drawn and the cost model's
section fitted while the parent analyses and writes the page).

`Worker()` forks at once, while the report's process is still small, and the child waits; later
`submit(fn, *args)` sends it the work (pickled: the arguments should be small, plain data; the
report's compact rows travel as their columns and values), and `result()` returns what fn returned,
or raises with the child's traceback. Forking before the runs are read matters: a child forked from a
process holding a million rows keeps its own copy of every page the parent writes to afterwards (and
of every page it touches itself), which doubles the report's memory; this one holds only what it is
sent. Leaving the Worker's `with` block stops a child that is still running. The child touches no
database connection and exits with os._exit, running none of the parent's finalizers. Where the
platform cannot fork, the work runs in the caller when result() is asked for.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import struct
import traceback
from functools import lru_cache

from orchestrator.rows import CompactRow, row_class


class ChildFailed(RuntimeError):
    """The forked child raised or died: its traceback, or how it ended."""


@lru_cache(maxsize=None)
def _row_class(columns: tuple[str, ...]):
    return row_class(columns)


def _row(columns: tuple[str, ...], items: dict) -> CompactRow:
    return _row_class(columns)(items)


class _Pickler(pickle.Pickler):
    """Pickles a compact row (a class made per query, which pickle cannot find by name) as its
    columns and its non-NULL values."""

    def reducer_override(self, obj):
        if isinstance(obj, CompactRow):
            return _row, (type(obj).COLUMNS, dict(dict.items(obj)))
        return NotImplemented


def _dumps(value) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


def _send(fd: int, payload: bytes) -> None:
    """One message: its length, then its bytes. Not up to end-of-file: a process forked later (another
    worker, the CSV writer) inherits this end of the pipe, and the reader would see no end until it exits."""
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(struct.pack("<Q", len(payload)))
        pipe.write(payload)


def _receive(fd: int) -> bytes:
    """One message (_send), or b"" where the other end closed before sending it."""
    with os.fdopen(fd, "rb") as pipe:
        head = pipe.read(8)
        if len(head) < 8:
            return b""
        (size,) = struct.unpack("<Q", head)
        payload = pipe.read(size)
        return payload if len(payload) == size else b""


def _serve(task_fd: int, result_fd: int, warm) -> None:
    """The child: one task in, its result (or its failure) out."""
    try:
        if warm is not None:  # while the parent reads the runs: imports its task will need
            warm()
        payload = _receive(task_fd)
        if not payload:  # the parent went on without it
            return
        fn, args = pickle.loads(payload)
        out = _dumps(("ok", fn(*args)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        out = _dumps(("error", traceback.format_exc()))
    _send(result_fd, out)


class Worker:
    """A child forked now that runs one task given later (submit), in parallel with this process."""

    def __init__(self, warm=None, nice: int = 0):
        """warm: called in the child as soon as it is forked, before it waits for its task (imports);
        nice: how much lower the child's scheduling priority is than this process's (os.nice), for work
        whose answer is wanted late: it then takes what CPU the others leave."""
        self._pid = None
        self._task = None  # (fn, args) where there is no child
        if not hasattr(os, "fork"):
            return
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(task_w)
                os.close(result_r)
                if nice:
                    os.nice(nice)
                _serve(task_r, result_w, warm)
            finally:
                os._exit(0)
        os.close(task_r)
        os.close(result_w)
        self._pid, self._task_w, self._result_r = pid, task_w, result_r

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def submit(self, fn, *args) -> "Worker":
        if self._pid is None:
            self._task = (fn, args)
            return self
        task_w, self._task_w = self._task_w, None
        _send(task_w, _dumps((fn, args)))  # the child reads it whole, then works
        return self

    def result(self):
        if self._pid is None:  # no fork here: the work runs now, in the caller
            fn, args = self._task
            return fn(*args)
        result_r, self._result_r = self._result_r, None
        payload = _receive(result_r)  # before waiting: a large result would fill the pipe
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if not payload:
            raise ChildFailed(f"the report's child process ended without a result (wait status {status})")
        kind, value = pickle.loads(payload)
        if kind == "error":
            raise ChildFailed(f"the report's child process failed:\n{value}")
        return value

    def cancel(self) -> None:
        """Stop the child if it still runs (the parent failed, or had nothing to give it)."""
        if self._pid is None:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self._pid, 0)
        for fd in (self._task_w, self._result_r):
            if fd is not None:
                os.close(fd)
        self._pid = None
