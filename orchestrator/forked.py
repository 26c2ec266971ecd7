"""Work done beside the report in a forked child, so that the report's parts that do not depend on
each other use both CPUs of a small machine (issue 31: the PNGs and the cost model's section are drawn
and fitted while the parent analyses and writes the page).

`Forked(fn, *args)` forks at once; the child runs fn(*args), sends back its result (pickled; the
report's compact rows travel as their columns and values) and exits; `result()` waits for it and
returns it, or raises with the child's traceback; leaving its `with` block first stops the child. Where the platform cannot fork, fn runs in the
caller when result() is asked for. The child touches no database connection (it inherited the
parent's: it must neither use nor close them) and exits with os._exit, running no finalizer.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import signal
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


class Forked:
    """fn(*args) in a forked child; result() gives what it returned."""

    def __init__(self, fn, *args):
        self._fn, self._args = fn, args
        self._pid = None
        if not hasattr(os, "fork"):
            return
        read_end, write_end = os.pipe()
        # The parent's objects out of the child's garbage collections: a collection writes into every
        # object it visits, and each page it writes to would be copied (a million runs' rows, twice).
        gc.freeze()
        pid = os.fork()
        if pid != 0:
            gc.unfreeze()
        if pid == 0:  # the child: run, send, leave without running the parent's finalizers
            os.close(read_end)
            try:
                try:
                    payload = _dumps(("ok", fn(*args)))
                except BaseException:  # noqa: BLE001 - every failure goes back to the parent
                    payload = _dumps(("error", traceback.format_exc()))
                with os.fdopen(write_end, "wb") as out:
                    out.write(payload)
            finally:
                os._exit(0)
        os.close(write_end)
        self._pid, self._read = pid, read_end

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop the child (the parent failed before it asked for the result)."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(self._read)
            self._pid = None

    def result(self):
        if self._pid is None:  # no fork here: the work runs now, in the caller
            return self._fn(*self._args)
        with os.fdopen(self._read, "rb") as pipe:
            payload = pipe.read()  # before waiting: a large result would fill the pipe and block the child
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if not payload:
            raise ChildFailed(f"the report's child process ended without a result (wait status {status})")
        kind, value = pickle.loads(payload)
        if kind == "error":
            raise ChildFailed(f"the report's child process failed:\n{value}")
        return value
