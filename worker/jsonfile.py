"""The worker's small JSON caches on disk (probe facts, GEMM peaks): read forgivingly, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


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
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # as a plain write would leave it (mkstemp's is 0600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
