"""The one error family library code raises; only bench.py turns it into a message and an exit code."""


class BenchError(Exception):
    """A failure the user can act on; the message says what and where. Exit code 1."""

    exit_code = 1


class BadInput(BenchError):
    """Bad user input (a sweep file, an option, a value): exit code 2, nothing written."""

    exit_code = 2


class Busy(BenchError):
    """Another worker already holds this machine (or these CPUs)."""

    exit_code = 1


class Stopped(BenchError):
    """SIGTERM asked the worker to stop: settings restored, the unfinished run put back."""

    exit_code = 143  # 128 + SIGTERM, as a shell reports a process ended by it


class DatabaseUnavailable(BenchError):
    """The database cannot be used for now: the connection was lost, the server is restarting, or
    (SQLite) another connection holds the lock past the busy timeout. It may come back: a worker and
    `report --watch` retry for a while (common/patience.py); any other command reports it at once.
    Exit code 1."""

    exit_code = 1
