"""common/scratch.py: a folder whose process was killed with kill -9 is removed by the next one made; a
live process's folder is not."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from common import scratch

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; from common import scratch; "
        "print(scratch.make('cpubench-test-', sys.argv[1]), flush=True); time.sleep(600)")


def holder(base: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(base)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())
    (path / "stdin").write_text("{}")
    return proc, path


def test_a_folder_left_by_a_kill_9_goes_with_the_next_one_made_and_a_live_ones_stays(tmp_path):
    killed, left = holder(tmp_path)
    live, kept = holder(tmp_path)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert left.exists() and left.name.startswith(f"cpubench-test-{os.uname().nodename}-{killed.pid}-")
        other = tmp_path / "cpubench-other-host-1-x"  # another prefix: not this sweep's
        other.mkdir()
        with scratch.folder("cpubench-test-", tmp_path) as mine:
            assert mine.is_dir() and not left.exists() and (kept / "stdin").exists() and other.exists()
        assert not mine.exists()
    finally:
        live.kill()
        live.wait()
