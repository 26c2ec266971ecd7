"""Is the report the same after a change? Two checkouts write the report of the same databases, and
their files are compared byte for byte: summary.md, results.csv, index.html (its two clock
readings set aside: the "Written <time>" stamp and the mtime in the runs' gzip header; its SVGs
drawn with a fixed salt and date) and plots/*.png. Used when the report's code moves
(orchestrator/report/ became a package): a move must change nothing a reader sees.

    git archive main | tar -x -C /tmp/old          # the reference checkout (same venv)
    venv/bin/python benchmarks/report_same.py --old /tmp/old DB [DB ...] [--plots]

With --rel R, a text file that differs only in its numbers, each within R of the other (relative),
counts as the same to R, and the largest such difference is printed: for a change meant to move the
report's floats in their last digits only (a factor computed another way), where every number the
report shows must stay what it was. The runs' table inside index.html is compared as its JSON.

Each report runs in a child process with its checkout first on sys.path, on a copy of the database
(the report rewrites the effects table). Exit status 1 when any file differs. The checkouts must
hold the same data/builtin/train.txt (or none): the cost model's days per epoch count the tokens
of that corpus (common/tokens.tokens_per_word), and a test run writes it; the script says when they
differ.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = re.compile(rb"Written \d{4}-\d\d-\d\d \d\d:\d\d UTC")  # the page's clock readings: this one,
RUNS = re.compile(rb'(id="runs-data">)([A-Za-z0-9+/=]+)(<)')  # and the gzip header's mtime of the runs
# The page inlines matplotlib SVGs (the cost model's check): their ids are random and they carry the
# date unless salted and dated, here with svg.hashsalt and SOURCE_DATE_EPOCH.
# and one hash seed: the cost model's last digits follow the order of sets of strings (str hashes).
# One BLAS thread, as write_report computes since it forks children (OpenBLAS sums in another order with
# more threads: an older checkout's last digits followed the CPU count).
ENV = {"SOURCE_DATE_EPOCH": "0", "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
CHILD = """import sys; sys.path.insert(0, sys.argv[1])
import matplotlib; matplotlib.rcParams['svg.hashsalt'] = 'report_same'
try:
    from orchestrator.queue.store import Store
except ModuleNotFoundError:  # a checkout from before orchestrator/ was split by its jobs
    from orchestrator.store import Store
from orchestrator.report import write_report
write_report(Store(sys.argv[2]), sys.argv[3], plots=sys.argv[4] == '1')"""


def write(tree: Path, db: Path, out: Path, plots: bool) -> None:
    copy = out.with_suffix(".db")
    shutil.copyfile(db, copy)
    subprocess.run([sys.executable, "-c", CHILD, str(tree), str(copy), str(out), "1" if plots else "0"],
                   cwd=tree, check=True, env={**os.environ, **ENV})


def files(out: Path) -> dict[str, bytes]:
    found = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    if "index.html" in found:
        found["index.html"] = RUNS.sub(_no_mtime, STAMP.sub(b"Written <time>", found["index.html"]))
    return found


def _no_mtime(m: re.Match) -> bytes:
    """The runs' gzip stream with its header's mtime (bytes 4-7) zeroed: every other byte compared."""
    packed = bytearray(base64.b64decode(m[2]))
    packed[4:8] = bytes(4)
    return m[1] + base64.b64encode(bytes(packed)) + m[3]


NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _texts(name: str, data: bytes) -> list[bytes]:
    """A file as the texts --rel compares: index.html as the page less its runs' table, and that table's JSON."""
    if name != "index.html" or not (m := RUNS.search(data)):
        return [data]
    return [data[:m.start(2)] + data[m.end(2):], gzip.decompress(base64.b64decode(m[2]))]


def numbers_apart(a: bytes, b: bytes) -> float | None:
    """The largest relative difference between the numbers of two texts alike but for them (0.0: alike
    throughout), or None where they differ elsewhere."""
    if NUMBER.split(a) != NUMBER.split(b):
        return None
    worst = 0.0
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
        if x != y:
            fx, fy = float(x), float(y)
            if fx != fy:
                worst = max(worst, abs(fx - fy) / max(abs(fx), abs(fy)))
    return worst


def compare(old: Path, new: Path, db: Path, plots: bool, work: Path,
            rel: float | None = None) -> tuple[list[str], dict]:
    """The names of the files that differ (or exist on one side only), and with `rel` those of them
    whose numbers alone differ, each within rel: name -> the largest relative difference."""
    a, b = work / f"{db.stem}-old", work / f"{db.stem}-new"
    write(old, db, a, plots)
    write(new, db, b, plots)
    fa, fb = files(a), files(b)
    differ = sorted(n for n in fa.keys() | fb.keys() if fa.get(n) != fb.get(n))
    close = {}
    for n in differ if rel is not None else ():
        if n in fa and n in fb and not n.endswith(".png"):
            ta, tb = _texts(n, fa[n]), _texts(n, fb[n])
            apart = [numbers_apart(x, y) for x, y in zip(ta, tb)] if len(ta) == len(tb) else [None]
            if None not in apart and max(apart) <= rel:
                close[n] = max(apart)
    return [n for n in differ if n not in close], close


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dbs", nargs="+", type=Path)
    ap.add_argument("--old", type=Path, required=True, help="the reference checkout")
    ap.add_argument("--new", type=Path, default=ROOT, help="the checkout under test (default: this one)")
    ap.add_argument("--plots", action="store_true", help="draw the PNGs too (as `bench.py report` does)")
    ap.add_argument("--keep", type=Path, help="write the reports here (default: a temporary directory)")
    ap.add_argument("--rel", type=float,
                    help="a text file whose numbers alone differ, within this (relative), is the same")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="report_same-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = [tree / "data" / "builtin" / "train.txt" for tree in (args.old, args.new)]
    if len({c.read_bytes() if c.exists() else None for c in corpus}) > 1:
        print(f"warning: {corpus[0]} and {corpus[1]} differ: the days per epoch will (copy one over the other)")
    failed = 0
    for db in args.dbs:
        differ, close = compare(args.old.resolve(), args.new.resolve(), db.resolve(), args.plots, work, args.rel)
        n = len(files(work / f"{db.stem}-new"))
        same = "SAME" if not close else f"SAME to rel {args.rel:g}"
        print(f"{db}: {same if not differ else 'DIFFERENT'} ({n} files compared)"
              + (f": {', '.join(differ)}" if differ else "")
              + (f"; numbers apart in {', '.join(f'{k} (at most {v:.1e})' for k, v in sorted(close.items()))}"
                 if close else ""))
        failed += bool(differ)
    if not args.keep:
        shutil.rmtree(work)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
