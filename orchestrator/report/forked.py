"""Work done beside the report in a forked child, so that the report's parts that do not depend on
each other use both CPUs of a small machine (the PNGs are drawn and the cost model's section
fitted while the parent analyses and writes the page).

`Worker()` forks at once, while the report's process is still small, and the child waits; later
`submit(fn, *args)` sends it the work (pickled: the arguments should be small, plain data; the
report's compact rows travel as their columns and values), and `result()` returns what fn returned,
or raises with the child's traceback. Forking before the runs are read matters: a child forked from a
process holding a million rows keeps its own copy of every page the parent writes to afterwards (and
of every page it touches itself), which doubles the report's memory; this one holds only what it is
sent. Leaving the Worker's `with` block stops a child that is still running. The child touches no
database connection and exits with os._exit, running none of the parent's finalizers. Where the
platform cannot fork, the work runs in the caller when result() is asked for. `Family` forks several
such workers from one child that made their shared imports once. `Worker(task=fn)` instead forks a
child that runs fn at once on what the parent holds (nothing sent); such a child may send a worker
forked before it that worker's task (`sent_elsewhere`).
"""

from __future__ import annotations

import fcntl
import io
import os
import pickle
import signal
import struct
import traceback
from functools import lru_cache, partial
from operator import add, attrgetter

from common.processes import fork_child
from orchestrator.stats.columns import CompactRow, JoinedRow, gc_frozen_as_made, present, row_class


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
            return _row, (type(obj).COLUMNS, dict(present(obj)))
        return NotImplemented


def _dumps(value) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(_packed(value, {}, {}))
    return buf.getvalue()


# -- lists of rows, packed ---------------------------------------------------------------------------
# The cost model's fitter is sent ~20k rows a machine. Pickled one by one (reducer_override), each
# is a dict of its 80-odd columns: 0.32 s to pickle at 100k runs, 0.54 s to load. Packed, the rows of
# one class are a table: their columns' names as one tuple per distinct set of non-NULL columns (pickled
# once, then referred to), and a tuple of values per row; a list of them is its rows' places in the
# table. A row in several lists (the fit's and the check's) is one row on arrival, as it was in the memo.


class _RowTable:
    """The distinct rows of one class met in the value being pickled, each once; loads as a list of rows."""

    def __init__(self, cls):
        self.cls, self.rows, self.at = cls, [], {}

    def place(self, row) -> int:
        at = self.at.get(id(row))
        if at is None:
            at = self.at[id(row)] = len(self.rows)
            self.rows.append(row)
        return at

    def __reduce__(self):
        names = {}.setdefault  # one tuple per set of columns: pickled once, then referred to
        keys, values = list(map(tuple, map(dict.keys, self.rows))), list(map(tuple, map(dict.values, self.rows)))
        if issubclass(self.cls, JoinedRow):  # its shared rows' columns too: the child's rows are whole
            for part in self.cls.PARTS:
                shared = list(map(attrgetter(part), self.rows))
                keys = list(map(add, keys, map(tuple, map(dict.keys, shared))))
                values = list(map(add, values, map(tuple, map(dict.values, shared))))
        return _unpack_table, (self.cls.COLUMNS, [names(k, k) for k in keys], values)


def _unpack_table(columns: tuple[str, ...], keys: list[tuple], values: list[tuple]) -> list:
    Row = _row_class(columns)
    return list(map(Row, map(zip, keys, values)))


class _RowList:
    """A list (or tuple) of rows of one class, as their places in their table."""

    def __init__(self, table: _RowTable, rows, kind: type):
        self.table, self.places, self.kind = table, list(map(table.place, rows)), kind

    def __reduce__(self):
        return _unpack_list, (self.table, self.places, self.kind is tuple)


def _unpack_list(table: list, places: list[int], as_tuple: bool):
    rows = list(map(table.__getitem__, places))
    return tuple(rows) if as_tuple else rows


def _packed(value, tables: dict, seen: dict):
    """`value` with each list or tuple of rows of one class (in dicts, lists and tuples, however deep)
    replaced by a _RowList; the same list met twice is one _RowList. Tuples are walked, and lists of
    anything else where their first item is a container."""
    kind = type(value)
    if kind is dict:
        return {k: _packed(v, tables, seen) for k, v in value.items()}
    if kind is not list and kind is not tuple or not value:
        return value
    if id(value) in seen:
        return seen[id(value)]
    first = type(value[0])
    if issubclass(first, CompactRow) and all(type(r) is first for r in value):
        table = tables.get(first) or tables.setdefault(first, _RowTable(first))
        out = _RowList(table, value, kind)
    elif kind is tuple or first in (dict, list, tuple):
        out = kind(_packed(v, tables, seen) for v in value)
    else:
        return value
    seen[id(value)] = out
    return out


RESULT_PIPE_BYTES = 1 << 20  # Linux's largest pipe without privileges (/proc/sys/fs/pipe-max-size)


def _result_pipe() -> tuple[int, int]:
    """A pipe for a child's result, as large as Linux allows without privileges: a child whose result
    fits writes it and exits at once, its memory with it, instead of waiting for the parent to read it
    (the cost model's fitter: ~190 KB, then ~180 MB held idle for 14 s of a 1M report, through the peak)."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
    except (AttributeError, OSError):  # not Linux, or a lower limit: the default pipe
        pass
    return r, w


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


def _serve(task_fd: int, result_fd: int, warm, task=None) -> None:
    """The child: one task in (or `task`, given at the fork), its result (or its failure) out."""
    try:
        if warm is not None:  # while the parent reads the runs: imports its task will need
            warm()
        if task is None:
            payload = _receive(task_fd)
            if not payload:  # the parent went on without it
                return
            with gc_frozen_as_made():  # (a task's data: kept to the child's end)
                fn, args = pickle.loads(payload)
        else:
            fn, args = task, ()
        out = _dumps(("ok", fn(*args)))
    except BaseException:  # every failure goes back to the parent
        out = _dumps(("error", traceback.format_exc()))
    _send(result_fd, out)


class Worker:
    """A child forked now that runs one task given later (submit), in parallel with this process."""

    def __init__(self, warm=None, nice: int = 0, task=None):
        """warm: called in the child as soon as it is forked, before it waits for its task (imports);
        nice: how much lower the child's scheduling priority is than this process's (os.nice), for work
        whose answer is wanted late: it then takes what CPU the others leave. task: a callable the child
        runs at once, on what this process holds now (not sent: the child has its own copy of every page,
        so it suits a small report's rows, whose pages it then copies as it reads them); submit is then
        not called."""
        self._task = (task, ()) if task is not None else None  # (fn, args) where there is no child
        self._forked = hasattr(os, "fork")
        self._pid = None  # this process's child, until reaped
        self._family = None  # (Family, index): a worker a Family forked, reaped there
        self._task_w = self._result_r = None
        if not self._forked:
            return
        task_r, task_w = os.pipe()
        result_r, result_w = _result_pipe()
        pid = fork_child(lambda: _serve(task_r, result_w, warm, task), close=(task_w, result_r), nice=nice)
        os.close(task_r)
        os.close(result_w)
        if task is not None:  # nothing to send
            os.close(task_w)
            task_w = None
        self._pid, self._task_w, self._result_r = pid, task_w, result_r

    @classmethod
    def _of(cls, family: "Family", index: int, task_w: int, result_r: int) -> "Worker":
        """The handle of a Family's worker: its pipes' ends here; its pid asked of the Family."""
        worker = cls.__new__(cls)
        worker._task, worker._forked, worker._pid, worker._family = None, True, None, (family, index)
        worker._task_w, worker._result_r = task_w, result_r
        return worker

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def submit(self, fn, *args) -> "Worker":
        if not self._forked:
            self._task = (fn, args)
            return self
        task_w, self._task_w = self._task_w, None
        _send(task_w, _dumps((fn, args)))  # the child reads it whole, then works
        return self

    def sent_elsewhere(self) -> None:
        """Its task is sent by a child forked since (which holds the task pipe's end too): this process's
        end closed, so that the worker sees the pipe end should that child never send it."""
        if self._forked and self._task_w is not None:
            os.close(self._task_w)
            self._task_w = None

    def result(self):
        if not self._forked:  # no fork here: the work runs now, in the caller
            fn, args = self._task
            return fn(*args)
        result_r, self._result_r = self._result_r, None
        payload = _receive(result_r)  # before waiting: a large result would fill the pipe
        status = "unknown: a Family's worker, reaped there"
        if self._family is None:
            status = os.waitpid(self._pid, 0)[1]
            self._pid = None
        if not payload:
            raise ChildFailed(f"the report's child process ended without a result (wait status {status})")
        kind, value = pickle.loads(payload)
        if kind == "error":
            raise ChildFailed(f"the report's child process failed:\n{value}")
        return value

    def cancel(self) -> None:
        """Stop the child if it still runs (the parent failed, or had nothing to give it)."""
        if self._family is not None:  # running until its result is taken; its Family reaps it
            pid = self._family[0].pid_of(self._family[1]) if self._result_r is not None else None
        else:
            pid, self._pid = self._pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self._family is None:
                os.waitpid(pid, 0)
        for fd in (self._task_w, self._result_r):
            if fd is not None:
                os.close(fd)
        self._task_w = self._result_r = None


class Family:
    """Workers forked from one child that ran warm() first, so that the imports they share are made
    once (a report's PNG drawers and its cost model's fitter each imported matplotlib: ~0.4 CPU-seconds
    apiece, on a second CPU the report keeps busy). `Family(warm, nices)` forks that child at once; it
    warms, forks one worker per entry of `nices` (each at that nice), and reaps them when the Family ends.
    `workers` are their Worker handles, used as Worker's own (submit, result); a task submitted before
    its worker is forked waits in the pipe. Leaving the `with` block stops every worker still running
    and reaps the first child. Without fork, workers run their tasks in the caller, as Worker does."""

    def __init__(self, warm, nices: list[int]):
        self._pid = None
        if not hasattr(os, "fork"):
            self.workers = [Worker() for _ in nices]
            return
        pipes = [(os.pipe(), _result_pipe()) for _ in nices]  # ((task_r, task_w), (result_r, result_w)) each
        pids_r, pids_w = os.pipe()  # the first child tells the workers' pids
        stop_r, stop_w = os.pipe()  # this process tells the first child to reap them
        theirs = [pids_r, stop_w] + [fd for (_, task_w), (result_r, _) in pipes for fd in (task_w, result_r)]
        pid = fork_child(lambda: self._forks(warm, nices, pipes, pids_w, stop_r), close=theirs)
        os.close(pids_w)
        os.close(stop_r)
        for (task_r, _), (_, result_w) in pipes:
            os.close(task_r)
            os.close(result_w)
        self._pid, self._pids_r, self._pids, self._stop_w = pid, pids_r, None, stop_w
        self.workers = [Worker._of(self, k, task_w, result_r) for k, ((_, task_w), (result_r, _)) in enumerate(pipes)]

    def pid_of(self, index: int) -> int | None:
        """Worker `index`'s pid (read once from the first child, which sends them when it has forked
        them all), or None where the first child died before."""
        if self._pids is None:
            pids_r, self._pids_r = self._pids_r, None
            raw = _receive(pids_r)
            self._pids = struct.unpack(f"<{len(raw) // 8}q", raw) if raw else ()
        return self._pids[index] if index < len(self._pids) else None

    @staticmethod
    def _forks(warm, nices: list[int], pipes: list, pids_w: int, stop_r: int) -> None:
        """The first child: warm, fork the workers (each keeping its own pipes' ends), tell the parent
        their pids, and reap them when the parent says (until then an ended worker keeps its pid, so
        that the parent's kill can never reach another process that took it)."""
        try:
            warm()
        except BaseException:  # the workers import what they need when their task comes
            pass
        pids = []
        for k, nice in enumerate(nices):
            others = [fd for j, ((task_r, _), (_, result_w)) in enumerate(pipes) if j != k
                      for fd in (task_r, result_w)]
            (task_r, _), (_, result_w) = pipes[k]
            pids.append(fork_child(partial(_serve, task_r, result_w, None),
                                   close=[pids_w, stop_r] + others, nice=nice))
        for (task_r, _), (_, result_w) in pipes:
            os.close(task_r)
            os.close(result_w)
        _send(pids_w, struct.pack(f"<{len(pids)}q", *pids))
        os.read(stop_r, 1)  # a byte, not end-of-file: a process the parent forks later holds the other end too
        for pid in pids:
            os.waitpid(pid, 0)

    def __enter__(self) -> "Family":
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.cancel()  # one whose result was taken has exited: nothing to stop
        if self._pid is not None:
            if self._pids_r is not None:
                os.close(self._pids_r)
            try:
                os.write(self._stop_w, b".")  # reap them now
            except BrokenPipeError:  # the first child is gone already
                pass
            os.close(self._stop_w)
            os.waitpid(self._pid, 0)
            self._pid = None
