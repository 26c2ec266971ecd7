"""What the command line promises, kept in one place: bad input writes nothing, and a command that
only reads (or a dry run) creates no file.

bench.py calls these before it opens (and so perhaps creates) a database. Pure checks and counts:
no printing, no typer, no rich (docs/layout.md: only bench.py does those).
"""

from __future__ import annotations

from pathlib import Path

from common.errors import BadInput
from orchestrator.queue.store import EnqueueResult, database_url


def sqlite_file(db: str) -> Path | None:
    """The SQLite file `--db` names, or None for a server URL (or an in-memory database)."""
    url = database_url(db)
    if not url.startswith("sqlite"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    return Path(path) if path and path != ":memory:" else None


def require_database(db: str, command: str) -> None:
    """A command that works on what is in a database (retry, work) refuses a file that is not
    there, instead of creating an empty one and reporting nothing to do: a typo is bad input."""
    path = sqlite_file(db)
    if path is not None and not path.exists():
        raise BadInput(f"{command}: no database file {path} (`bench.py enqueue --db {path}` creates one)")


def missing(db: str) -> bool:
    """True when `--db` is an SQLite file that does not exist yet."""
    path = sqlite_file(db)
    return path is not None and not path.exists()


def first_job(plan) -> None:
    """A sweep must plan at least one job: one whose every combination is rejected is bad input,
    refused before anything is written. Lazy: usually the first combination answers."""
    for _job in plan.iter_jobs():
        return
    reasons = "; ".join(f"{reason} ({n})" for reason, n in plan.rejected.most_common()) or "it has no combination"
    raise BadInput(f"sweep {plan.name} ({plan.source}): every job is rejected: {reasons}")


def dry_run_without_database(plan) -> EnqueueResult:
    """A dry run against a database that does not exist yet: every planned job would be new, and
    the file is not created."""
    total = sum(1 for _job in plan.iter_jobs())
    return EnqueueResult(new=total, present=0, sweep_id=None)


def check_out_dir(out_dir: Path) -> None:
    """`report --out` must be a folder (made if missing), not an existing file."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out {out_dir} is a file: give a folder for the report (it is made if missing)")
    for parent in out_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(f"--out {out_dir}: {parent} is a file, not a folder")
            break


