"""How `bench.py report` scales with the runs: 10k, 100k and 1M synthetic runs (tests/scaledb.py: 2
machines, 1,000 configurations, 2% failed, 1% skipped) on SQLite and PostgreSQL. For each: the
report's wall time and peak memory (write_report in a child process of its own, PNG plots included, as
`bench.py report` does), the page's size, and how long headless Chromium takes to open it (to
`window.cpubench.ready`: runs inflated, table and first plot drawn; first load and the median of the
warm ones). Prints one line per case and a JSON document at the end; never asserts.

    venv/bin/python benchmarks/report_scale.py --sizes 10000,100000 --backends sqlite,postgresql
    venv/bin/python benchmarks/report_scale.py --sizes 1000000 --backends sqlite --mem-cap-gb 6

--grid 10x10x10x10x10 instead makes one SQLite database of a grid with one run per configuration on one machine
(d_model, n_layers, seq_len, batch_size and lr, each with as many values as its number; 100k configurations),
the case where the report's cost follows the configurations rather than the runs; kept as grid{shape}.db.

--realistic fills each database as a real sweep's (benchmarks/realistic.py: every metric and fact a real
run records and each done run's ~3 KB applied, which a scaled run leaves NULL); its SQLite databases are
kept as real{runs}.db. --keep DIR keeps the SQLite databases (reused when present). A report past --mem-cap-gb of PSS or
--timeout seconds is stopped and said so (the machine is shared: a runaway report must not take it).

The report runs twice: once timed, with only its tree's summed RSS polled (cheap: the cap), and once for its
memory, the peak PSS of its process tree sampled every half second beside the summed RSS. Reading a 2 GB
process's PSS walks its page tables (~45 ms of kernel time), so a sampler every half second takes several
CPU-seconds from a 1M-run report on 2 CPUs: the time of that second run is printed beside, not as the
report's. --one-run times the sampled run alone. The machine's speed (machine_speed.py) is printed before and
after the cases: a timing from another VM, or from this one an hour before, compares only beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_speed import describe, machine_speed  # noqa: E402
from realistic import copy_sqlite, fill  # noqa: E402
from tests.scaledb import SHAPES, build  # noqa: E402

GRID_AXES = {"d_model": [32 + 16 * i for i in range(16)], "n_layers": list(range(1, 17)),
             "seq_len": [32 + 32 * i for i in range(16)], "batch_size": list(range(1, 17)),
             "lr": [round(1e-4 * 1.5 ** i, 8) for i in range(16)]}


def grid_shape(text: str) -> tuple[str, int]:
    """--grid AxBxCxDxE as a tests/scaledb.py shape (registered there) and its number of configurations."""
    counts = [int(x) for x in text.lower().split("x")]
    if len(counts) > len(GRID_AXES) or not all(1 <= n <= 16 for n in counts):
        raise SystemExit(f"--grid {text}: at most {len(GRID_AXES)} axes of 1 to 16 values")
    name = f"grid-{text}"
    SHAPES[name] = {axis: values[:n] for (axis, values), n in zip(GRID_AXES.items(), counts)}
    return name, math.prod(counts)

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from orchestrator.report import write_report
from orchestrator.queue.store import Store
if {no_predictions!r}:  # the cost model's section left out (--no-predictions): the rest of the report measured
    from orchestrator.report.sections import prediction as prediction_report
    prediction_report.data = lambda ctx: {{"machines": {{}}}}
t0 = time.perf_counter()
rep = write_report(Store({db!r}, read_only=True), Path({out!r}), plots={plots!r})
print(json.dumps({{"report_s": time.perf_counter() - t0,
                  "child_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "effects": len(rep.effects), "page": str(rep.html_path)}}))
"""


def run_report(db: str, out: Path, *, plots: bool, cap_gb: float, timeout_s: float,
               no_predictions: bool = False, pss: bool = True) -> dict:
    """write_report in a child; its tree's PSS sampled (pss), or only its summed RSS (an upper bound of the
    PSS, read without walking the page tables), so that it is stopped past the cap."""
    t0 = time.perf_counter()
    child = CHILD.format(root=str(ROOT), db=db, out=str(out), plots=plots, no_predictions=no_predictions)
    proc = subprocess.Popen([sys.executable, "-c", child],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, peak_pss, why = 0, 0, None
    p = psutil.Process(proc.pid)
    while proc.poll() is None:
        # The report forks children (orchestrator/report/forked.py) that share its pages until they write to
        # them: the tree's summed RSS counts shared pages once per process (an upper bound), its summed
        # PSS counts each page once (the memory the report holds). The cap applies to the PSS.
        try:
            tree = [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        rss = size = 0
        for q in tree:
            try:
                full = q.memory_full_info() if pss else q.memory_info()
                rss, size = rss + full.rss, size + (full.pss if pss else full.rss)
            except psutil.Error:
                pass
        peak, peak_pss = max(peak, rss), max(peak_pss, size)
        if peak_pss > cap_gb * 2**30:
            why = f"stopped: {'PSS' if pss else 'summed RSS'} past {cap_gb:g} GB after {time.perf_counter() - t0:.0f} s"
        elif time.perf_counter() - t0 > timeout_s:
            why = f"stopped: still running after {timeout_s:.0f} s (PSS {peak_pss / 2**30:.1f} GB)"
        if why:
            proc.kill()
            proc.wait()
            return {"error": why, "wall_s": time.perf_counter() - t0, "peak_rss_mb": peak / 2**20,
                    "peak_pss_mb": peak_pss / 2**20 if pss else None}
        time.sleep(0.5)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {stderr.strip().splitlines()[-1] if stderr.strip() else ''}",
                "wall_s": time.perf_counter() - t0, "peak_rss_mb": peak / 2**20,
                "peak_pss_mb": peak_pss / 2**20 if pss else None}
    got = json.loads(stdout.strip().splitlines()[-1])
    return {**got, "wall_s": time.perf_counter() - t0, "peak_rss_mb": max(peak / 2**20, got["child_rss_mb"]),
            "peak_pss_mb": peak_pss / 2**20 if pss else None}


def timed_and_sampled(db: str, out: Path, one_run: bool, **kwargs) -> dict:
    """The report timed with only its summed RSS polled, then run again with its PSS sampled (its memory);
    one_run: the sampled run alone, timed too."""
    if one_run:
        return run_report(db, out, **kwargs)
    timed = run_report(db, out, pss=False, **kwargs)
    if "error" in timed:
        return timed
    sampled = run_report(db, out, **kwargs)
    if "error" in sampled:
        return {**sampled, "report_s": timed["report_s"]}
    return {**timed, "peak_pss_mb": sampled["peak_pss_mb"], "peak_rss_mb": sampled["peak_rss_mb"],
            "sampled_report_s": sampled["report_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--loads", type=int, default=4, help="page loads in Chromium (the first is cold; 0: none)")
    parser.add_argument("--no-plots", action="store_true", help="leave out the PNGs")
    parser.add_argument("--mem-cap-gb", type=float, default=6.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-predictions", action="store_true",
                        help="leave out the cost model's section (prediction_report): the rest of the report alone")
    parser.add_argument("--one-run", action="store_true",
                        help="time the run whose PSS is sampled (no separate timed run)")
    parser.add_argument("--keep", type=Path, help="keep the SQLite databases here (reused when present)")
    parser.add_argument("--realistic", action="store_true", help="fill each database as a real sweep's")
    parser.add_argument("--grid", help="AxBxCxDxE: one SQLite grid of that many configurations, one run each")
    args = parser.parse_args()
    if args.grid:
        shape, n_configs = grid_shape(args.grid)
        args.sizes, args.backends = str(n_configs), "sqlite"
    results = []
    speed = {"before": machine_speed()}  # the VM's own speed, which moves (machine_speed.py): beside the timings
    print(describe(speed["before"]), flush=True)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        keep = args.keep or tmp
        keep.mkdir(parents=True, exist_ok=True)
        pg_url = None
        for backend in args.backends.split(","):
            if backend == "postgresql" and pg_url is None:
                from tests.pgserver import throwaway_postgres

                pg_url = stack.enter_context(throwaway_postgres())
            for runs in (int(x) for x in args.sizes.split(",")):
                case = {"backend": backend, "runs": runs, "realistic": args.realistic}
                t0 = time.perf_counter()
                if backend == "sqlite":
                    db = str(keep / (f"grid{args.grid}.db" if args.grid else f"scale{runs}.db"))
                    if not Path(db).exists():
                        build(db, runs, 1, shape=shape, quiet=True) if args.grid else build(db, runs, quiet=True)
                    if args.realistic:
                        real = keep / f"real{runs}.db"
                        if not real.exists():
                            copy_sqlite(db, real)
                            fill(f"sqlite:///{real.resolve()}")
                        db = str(real)
                else:
                    import psycopg

                    name = f"scale{runs}_{os.getpid()}"
                    with psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"),
                                         autocommit=True) as c:
                        c.execute(f"DROP DATABASE IF EXISTS {name}")
                        c.execute(f"CREATE DATABASE {name}")
                    db = pg_url.rsplit("/", 1)[0] + f"/{name}"
                    build(db, runs, quiet=True)
                    if args.realistic:
                        fill(db)
                case["build_s"] = time.perf_counter() - t0
                out = tmp / f"result-{backend}-{runs}"
                case.update(timed_and_sampled(db, out, args.one_run, plots=not args.no_plots, cap_gb=args.mem_cap_gb,
                                              timeout_s=args.timeout, no_predictions=args.no_predictions))
                if "page" in case:
                    case["page_mb"] = Path(case["page"]).stat().st_size / 1e6
                if "page" in case and args.loads > 0:
                    from html_report_scale import load_times

                    times = load_times(Path(case["page"]), args.loads)
                    case["load_first_s"] = times["all"]["wall_s"][0]
                    warm = times["all"]["wall_s"][1:] or times["all"]["wall_s"]
                    case["load_warm_s"] = sorted(warm)[len(warm) // 2]
                    case["load_all_s"] = times["all"]["wall_s"]
                    case["console_errors"] = len(times["errors"])
                    case["table"] = times["count"]
                results.append(case)
                if "error" in case:
                    pss = "not sampled" if case["peak_pss_mb"] is None else f"{case['peak_pss_mb']:,.0f} MB"
                    print(f"{backend} {runs:>9,} runs: build {case['build_s']:.0f} s; report {case['error']}; "
                          f"peak PSS {pss} (RSS summed {case['peak_rss_mb']:,.0f} MB)", flush=True)
                else:
                    loads = "" if "load_first_s" not in case else (
                        f"; Chromium to ready: first {case['load_first_s']:.2f} s, warm median "
                        f"{case['load_warm_s']:.2f} s ({', '.join(f'{x:.2f}' for x in case['load_all_s'])}); "
                        f"{case['table']}, {case['console_errors']} console errors")
                    sampled = (f"; the sampled run {case['sampled_report_s']:.1f} s" if "sampled_report_s" in case
                               else "")
                    print(f"{backend} {runs:>9,} runs: build {case['build_s']:.0f} s; report {case['report_s']:.1f} s "
                          f"(child wall {case['wall_s']:.1f} s{sampled}), peak PSS {case['peak_pss_mb']:,.0f} MB "
                          f"(RSS summed "
                          f"{case['peak_rss_mb']:,.0f} MB); page {case['page_mb']:.1f} MB{loads}", flush=True)
    speed["after"] = machine_speed()
    print(describe(speed["after"]), flush=True)
    print(json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(), "speed": speed, "results": results},
                     default=str))


if __name__ == "__main__":
    main()
