"""Riding out a database outage (a PostgreSQL restart or failover, SQLite's lock held past the busy
timeout): the long-running commands, `work` (worker/loop.py) and `report --watch` (orchestrator/report/watch.py),
try a call that raised DatabaseUnavailable again, with backoff, for up to --db-retry / BENCH_DB_RETRY_S
seconds; every other command reports it at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from common.errors import BadInput, BenchError, DatabaseUnavailable

DB_RETRY_S = 600.0  # how long an outage is ridden out by default


def retry_seconds(value: str | float | None) -> float:
    """--db-retry's seconds (None: BENCH_DB_RETRY_S, else DB_RETRY_S); BadInput where not a number >= 0."""
    if value is None:
        value = os.environ.get("BENCH_DB_RETRY_S", str(DB_RETRY_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise BadInput(f"--db-retry / BENCH_DB_RETRY_S {value!r}: expected seconds >= 0")
    return seconds


class Patience:
    """Rides out a database outage: a call that raises DatabaseUnavailable is tried again, after
    0.5 s, 1 s, then every 2 s, until the outage has lasted retry_s; then the error
    goes on, saying so. One per worker (shared with its heartbeat thread, so an outage is counted once
    from when either first saw it, and the worker knows when it ended: settled()) or watcher
    (orchestrator/report/watch.py).
    `emit` is told, in a line, when an outage begins and when it ends."""

    MAX_DELAY_S = 2.0  # a connection attempt every 2 s is nothing to a server; a worker idle longer is waste

    def __init__(self, retry_s: float, emit: Callable[[str], None] = lambda text: None):
        self.retry_s = retry_s
        self.emit = emit
        self.failing_since: float | None = None  # time.monotonic() when the outage was first seen
        self.back_at = float("-inf")  # when the last outage ended
        self.outages = 0
        self.lost_s = 0.0  # outages so far, in seconds, all together (from first failure to first success)

    def call(self, fn: Callable, *args, **kwargs):
        delay = 0.5
        while True:
            try:
                result = fn(*args, **kwargs)
            except DatabaseUnavailable as error:
                waited = time.monotonic() - self.failed(error)
                if waited + delay > self.retry_s:
                    raise DatabaseUnavailable(f"{error}; gave up after {waited:.0f} s of retries "
                                              f"(--db-retry {self.retry_s:g})") from None
                time.sleep(delay)
                delay = min(2 * delay, self.MAX_DELAY_S)
                continue
            self.ok()
            return result

    def failed(self, error: BenchError) -> float:
        """Note an outage (once); when it began."""
        since = self.failing_since
        if since is None:
            since = self.failing_since = time.monotonic()
            self.emit(f"{error}; retrying for up to {self.retry_s:g} s")
        return since

    def gave_up(self) -> bool:
        since = self.failing_since
        return since is not None and time.monotonic() - since > self.retry_s

    def ok(self) -> None:
        since = self.failing_since
        if since is not None:
            self.failing_since = None
            self.back_at = time.monotonic()
            self.outages += 1
            self.lost_s += self.back_at - since
            self.emit(f"database back after {self.back_at - since:.1f} s")

    def settled(self, for_s: float) -> bool:
        """The database has answered for for_s since the last outage: other workers have had time to
        beat again, so a run whose heartbeat is old now is a dead worker's."""
        return self.failing_since is None and time.monotonic() - self.back_at >= for_s
