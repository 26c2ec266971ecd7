"""Files written whole: through a temporary file of the writer's own beside the target and a rename, so that a
reader sees the old file or the new one, never half of one, a killed writer leaves no half file, and writers
of one file at once (workers sharing a cache) never take each other's temporary file away."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Write `data` (text as UTF-8) to `path`, its folder made if missing; `mode`: the file's permissions
    (mkstemp's 0600 otherwise)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
