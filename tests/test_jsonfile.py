"""The worker's JSON caches (worker/jsonfile.py): written whole, by several processes at once too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from worker import jsonfile

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys
from pathlib import Path
from worker import jsonfile
for i in range(400):
    jsonfile.write(Path(sys.argv[1]), {"writer": sys.argv[2], "i": i, "pad": "x" * 2000})
"""


def test_two_processes_writing_one_cache_at_once_both_succeed_and_leave_it_whole(tmp_path):
    """A SLURM array's tasks on one machine write the same probe cache at once: neither may take the other's
    temporary file away (each writer has its own), and the file is always one writer's whole JSON."""
    cache = tmp_path / "cache" / "probe-limits.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(cache), name], cwd=ROOT, stderr=subprocess.PIPE,
                                text=True) for name in ("a", "b")]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    data = json.loads(cache.read_text())
    assert data["writer"] in ("a", "b") and data["i"] == 399
    assert jsonfile.read(cache) == data
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no temporary file left behind
    assert cache.stat().st_mode & 0o777 == 0o644


def test_an_unreadable_cache_reads_as_empty(tmp_path):
    (tmp_path / "c.json").write_text("{half")
    assert jsonfile.read(tmp_path / "c.json") == {} == jsonfile.read(tmp_path / "missing.json")
