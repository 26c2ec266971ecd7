"""How tests/v2/results-v2.db was made: with the release that introduced schema versions (version 2,
commit 865e974), run from a pristine checkout of it. Kept for the record; the tests use the files,
never this script (a clean clone has no old checkout to run it with).

    git worktree add --detach /work/rel2 865e974 && ln -s $PWD/venv /work/rel2/venv
    venv/bin/python tests/v2/make_v2_db.py --release /work/rel2

The database is made exactly as tests/v1/results-v1.db was (the same commands of the old code: stub
runs, four kinds of failure, skipped runs, two real tiny training runs, a worker killed with -9, a
run taken back, a second machine), so both fixtures hold the same 24 runs. Next to it:
schema-v2.sql (that release's schema.sql) and schema-v2-postgresql.sql (the statements that
release ran on a fresh PostgreSQL database), from which the PostgreSQL test builds a version-2
database.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
V1_MAKER = HERE.parent / "v1" / "make_v1_db.py"
PG_STATEMENTS = ("from orchestrator.queue.migrations import schema_statements; "
                 "print(';\\n'.join(schema_statements('postgresql')) + ';')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, required=True, help="checkout of the version-2 release")
    args = parser.parse_args()
    release = args.release.resolve()
    subprocess.run([sys.executable, str(V1_MAKER), "--release", str(release), "--out", str(HERE / "results-v2.db")],
                   check=True)
    (HERE / "schema-v1.sql").rename(HERE / "schema-v2.sql")  # the v1 maker names the copy after itself
    statements = subprocess.run([str(release / "venv" / "bin" / "python"), "-c", PG_STATEMENTS], cwd=release,
                                check=True, capture_output=True, text=True).stdout
    (HERE / "schema-v2-postgresql.sql").write_text(statements)


if __name__ == "__main__":
    sys.exit(main())
