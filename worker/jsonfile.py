"""The worker's small JSON caches on disk (probe facts, GEMM peaks): read forgivingly, written atomically."""

from __future__ import annotations

import json
from pathlib import Path


def read(file: Path) -> dict:
    """The file's JSON object, or {} when it is missing or unreadable (a cache is rebuilt, never trusted half)."""
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return {}


def write(file: Path, data: dict) -> None:
    """Write through a temporary file and a rename: a killed process never leaves half a cache."""
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(file)
