"""The worker's small JSON caches on disk (probe facts, GEMM peaks): read forgivingly, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from common.files import write_atomic


def read(file: Path) -> dict:
    """The file's JSON object, or {} when it is missing or unreadable (a cache is rebuilt, never trusted half)."""
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return {}


def write(file: Path, data: dict) -> None:
    """Write through a temporary file of this writer's own and a rename: a killed process never leaves half a
    cache, and workers that write the same cache at once (a SLURM array's tasks on one machine) never take
    each other's temporary file away."""
    write_atomic(file, json.dumps(data, indent=1, sort_keys=True), mode=0o644)  # (as a plain write leaves it)
