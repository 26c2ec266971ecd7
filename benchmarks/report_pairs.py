"""Two checkouts' reports of the same database, interleaved (A B, B A, ...): each report in a fresh
process, as `write_report` in a child of its own (its wall time and the process's max RSS) or as the
whole `bench.py report` command (its wall time). Prints each run, then per checkout the median and
range, and the paired differences (first checkout minus second); never asserts. The VM's noise is
correlated in time, so only figures taken side by side here are compared.

    git archive <base> | tar -x -C /tmp/base && ln -s $PWD/venv /tmp/base/venv
    venv/bin/python benchmarks/report_pairs.py DB --pairs 2 /tmp/base .
    venv/bin/python benchmarks/report_pairs.py DB --pairs 6 --command /tmp/base .
    venv/bin/python benchmarks/report_pairs.py DB --realistic /tmp/real.db --pairs 3 /tmp/base .

--realistic COPY: first write a copy of DB (a tests/scaledb.py database) made to look like a real sweep's
(benchmarks/realistic.py: every metric and fact a real run records, distinct values per run, and each
done run's ~3 KB applied, which a scaled run leaves NULL), and report on the copy. Both checkouts must
hold the same data/builtin/train.txt (or none): the cost model counts that corpus's tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from realistic import copy_sqlite, fill

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {code!r})
from pathlib import Path
from orchestrator.report import write_report
from orchestrator.queue.store import Store
t = time.perf_counter()
write_report(Store({db!r}, read_only=True), Path({out!r}), plots=True)
print(json.dumps({{"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

def realistic(db: str, copy: str) -> int:
    """Write `copy`: db made to look like a real sweep's (realistic.fill); a done run's non-NULL columns."""
    copy_sqlite(db, copy)
    return fill(f"sqlite:///{Path(copy).resolve()}")


def once(code: Path, db: str, out: Path, command: bool) -> dict:
    if command:
        t = time.perf_counter()
        subprocess.run([str(code / "venv" / "bin" / "python"), str(code / "bench.py"), "report", "--db", db,
                        "--out", str(out)], cwd=code, check=True, capture_output=True)
        return {"s": time.perf_counter() - t}
    done = subprocess.run([str(code / "venv" / "bin" / "python"), "-c",
                           CHILD.format(code=str(code), db=db, out=str(out))],
                          cwd=code, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db")
    parser.add_argument("checkouts", nargs=2, type=Path)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--command", action="store_true", help="time the whole `bench.py report` command")
    parser.add_argument("--realistic", metavar="COPY", help="report on a copy with every metric and fact filled")
    args = parser.parse_args()
    db = args.db
    if args.realistic:
        print(f"{args.realistic}: a done run has {realistic(db, args.realistic)} non-NULL columns", flush=True)
        db = args.realistic
    codes = [c.resolve() for c in args.checkouts]
    got: dict[Path, list[dict]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for code in codes if i % 2 == 0 else codes[::-1]:
                r = once(code, db, Path(tmp) / "result", args.command)
                got[code].append(r)
                rss = f", max RSS {r['rss_mb']:,.0f} MB" if "rss_mb" in r else ""
                print(f"{code}: {r['s']:.2f} s{rss}", flush=True)
    for code, rs in got.items():
        s = [r["s"] for r in rs]
        peaks = ", ".join(f"{r['rss_mb']:,.0f}" for r in rs) if "rss_mb" in rs[0] else ""
        rss = f"; max RSS {peaks} MB" if peaks else ""
        print(f"{code}: median {statistics.median(s):.2f} s ({min(s):.2f}-{max(s):.2f}){rss}")
    d = sorted(a["s"] - b["s"] for a, b in zip(*got.values()))
    print(f"paired ({codes[0]} - {codes[1]}): median {statistics.median(d):.2f} s ({d[0]:.2f}..{d[-1]:.2f})")


if __name__ == "__main__":
    main()
