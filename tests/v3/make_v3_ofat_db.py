"""How tests/v3/results-v3-ofat.db was made: with the last release of schema version 3 (commit c6a4c6a,
before jobs.block), run from a pristine checkout of it. Kept for the record; the tests use the
file, never this script (a clean clone has no old checkout to run it with).

    git worktree add --detach /tmp/rel3 c6a4c6a
    venv/bin/python tests/v3/make_v3_ofat_db.py --release /tmp/rel3

An ofat sweep of that release (SWEEP: its order a shuffle of each whole pass, no blocks) with two
repeats, enqueued and worked by the old code's own commands with the stub child (tests/stub_child.py
of that release: quick honest results), so every job has a done run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWEEP = """
[sweep]
name = "v3-ofat"
mode = "ofat"
repeats = 2
[base]
d_model = 64
steps = 2
dataset = "builtin"
[axes]
d_model = [32, 64, 128]
n_layers = [1, 2]
framework = ["torch", "jax"]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, required=True, help="checkout of the version-3 release")
    args = parser.parse_args()
    release = args.release.resolve()
    out = HERE / "results-v3-ofat.db"
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "v3-ofat.toml"
        sweep.write_text(SWEEP)
        env = {**os.environ, "BENCH_CHILD_MODULE": "tests.stub_child", "BENCH_PROBE_QUICK": "1",
               "BENCH_STATE_DIR": str(Path(tmp) / "state"), "BENCH_OUTPUT_DIR": str(Path(tmp) / "output"),
               "BENCH_PEAK_PER_SET": "0"}
        for command in (["enqueue", str(sweep)], ["work"]):
            subprocess.run([sys.executable, "bench.py", *command, "--db", str(out)], cwd=release, env=env, check=True)
        subprocess.run(["sqlite3", str(out), "PRAGMA wal_checkpoint(TRUNCATE); VACUUM;"], check=True)


if __name__ == "__main__":
    sys.exit(main())
