"""How result/index.html scales: build a database of --runs runs (100k by default) through the real
Store, write the report, and print the page's size (with what it is made of) and how long headless
Chromium takes to open it and to filter its runs table. Prints, never asserts.

    venv/bin/python benchmarks/html_report_scale.py                      # 100k runs, 2 machines
    venv/bin/python benchmarks/html_report_scale.py --runs 10000 --loads 5
    venv/bin/python benchmarks/html_report_scale.py --db /tmp/big.db     # keep (or reuse) the database

The database: --machines machines (each its own pool, so each runs every job) over a grid of
d_model x n_layers x seq_len x batch_size, repeated until --runs runs are claimed; a step time from
a power law with 5% noise; 2% of runs failed and 1% skipped with reasons, as a real sweep has.
Jobs are enqueued, claimed and finished through orchestrator.queue.store.Store as a worker would.
Load time: navigation to `window.cpubench.ready` (the runs inflated, the table and the forest plot
drawn), the median of --loads page loads in a fresh tab; the machine it runs on is named.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.report import write_report  # noqa: E402
from orchestrator.queue.store import Store  # noqa: E402
from tests.reportdb import CPUS, configs, enqueue, machine_facts, metrics  # noqa: E402
from tests.conftest import done_fields  # noqa: E402

AXES = {"d_model": [32, 48, 64, 96, 128, 192, 256, 384], "n_layers": [1, 2, 3, 4, 6],
        "seq_len": [32, 64, 128, 256, 512], "batch_size": [1, 2, 4, 8, 16]}  # 1000 configurations
BASE = {"d_model": 64, "n_layers": 2, "seq_len": 64, "batch_size": 4, "steps": 5}


def law(c: dict) -> float:
    return (0.002 * c["d_model"] ** 1.6 * c["n_layers"] ** 0.9 * (c["seq_len"] / 64) ** 1.1
            * (c["batch_size"] / 4) ** 0.85)


def build(db: Path, runs: int, machines: int) -> None:
    store = Store(str(db))
    n_configs = math.prod(len(v) for v in AXES.values())
    repeats = max(1, math.ceil(runs / machines / n_configs))
    t0 = time.perf_counter()
    jobs = configs(BASE, AXES, repeats=repeats, grid=True)[: math.ceil(runs / machines)]
    enqueue(store, jobs, sweep="html-scale")
    print(f"enqueued {len(jobs):,} jobs ({n_configs:,} configurations x {repeats} repeats) in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    rng = random.Random(0)
    pid = os.getpid()
    for k in range(machines):
        m = store.register_machine(machine_facts(f"node{k}", f"Synthetic CPU {k}"))
        speed = 1.0 + 0.4 * k
        t0 = time.perf_counter()
        n = 0
        while (claim := store.claim(m, pid=pid, host=f"node{k}", max_cores=CPUS)) is not None:
            c = claim.config
            u = rng.random()
            if u < 0.02:
                store.finish(claim.run_id, pid=pid, status="failed",
                             reason="RuntimeError: out of memory" if c["d_model"] >= 256 else "killed: timeout")
            elif u < 0.03:
                store.finish(claim.run_id, pid=pid, status="skipped", reason="allocator: libtcmalloc not found")
            else:
                ms = law(c) * speed * math.exp(rng.gauss(0, 0.05))
                store.finish(claim.run_id, pid=pid, status="done", fields=done_fields(**metrics(ms, c), mfu=0.3))
            n += 1
            if n % 10_000 == 0:
                print(f"  machine {k}: {n:,} runs ({n / (time.perf_counter() - t0):,.0f}/s)", flush=True)
    print(f"database: {db} ({db.stat().st_size / 1e6:.0f} MB)", flush=True)


def load_times(page: Path, loads: int) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_script_timeout(300)
    driver.set_page_load_timeout(300)
    out: dict[str, list[float]] = {"wall_s": [], "ready_s": [], "dom_s": [], "filter_ms": []}
    try:
        for _ in range(loads):
            driver.get("about:blank")
            t0 = time.perf_counter()
            driver.get(page.resolve().as_uri())
            driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                        "window.cpubench.ready.then(() => done(true));")
            out["wall_s"].append(time.perf_counter() - t0)
            ready_ms, dom_ms = driver.execute_script(
                "const t = performance.getEntriesByType('navigation')[0];"
                "return [window.cpubench.loadMs, t.domContentLoadedEventEnd];")
            out["ready_s"].append(ready_ms / 1000)
            out["dom_s"].append(dom_ms / 1000)
            out["filter_ms"].append(driver.execute_script(
                "const c = window.cpubench; const t = performance.now(); c.state.status = 'failed'; c.applyFilter();"
                "c.state.status = ''; c.applyFilter(); return (performance.now() - t) / 2;"))
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        count = driver.find_element("id", "runs-count").text
    finally:
        driver.quit()
    return {"medians": {k: statistics.median(v) for k, v in out.items()}, "all": out, "errors": errors, "count": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--db", type=Path, help="keep the database here (reused when it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "results.db"
        if not db.exists():
            build(db, args.runs, args.machines)
        t0 = time.perf_counter()
        report = write_report(Store(str(db)), Path(tmp) / "result", plots=False)
        report_s = time.perf_counter() - t0
        page = report.html_path
        text = page.read_text()
        size = page.stat().st_size
        start = text.index('id="runs-data">') + len('id="runs-data">')
        runs_bytes = text.index("</script>", start) - start
        import plotly.offline

        plotly_bytes = len(plotly.offline.get_plotlyjs())
        print(f"write_report: {report_s:.1f} s (statistics, CSV, summary.md and the page; no PNGs)")
        print(f"page: {size / 1e6:.2f} MB = plotly.js {plotly_bytes / 1e6:.2f} MB + runs (gzip, base64) "
              f"{runs_bytes / 1e6:.2f} MB + the rest {(size - plotly_bytes - runs_bytes) / 1e6:.2f} MB; "
              f"{sum(report.counts.get(s, 0) for s in ('done', 'failed', 'skipped')):,} runs")
        times = load_times(page, args.loads)
        m = times["medians"]
        first = {k: v[0] for k, v in times["all"].items()}
        print(f"headless Chromium on {platform.node()} ({os.cpu_count()} CPUs): first load (a fresh browser) open to "
              f"ready {first['wall_s']:.2f} s (page clock {first['ready_s']:.2f} s, DOMContentLoaded "
              f"{first['dom_s']:.2f} s); median of {args.loads} loads {m['wall_s']:.2f} s (page clock "
              f"{m['ready_s']:.2f} s); filtering the runs table {m['filter_ms']:.0f} ms")
        print("  each load (s): " + ", ".join(f"{x:.2f}" for x in times["all"]["wall_s"]))
        print(f"  table: {times['count']}; console errors: {len(times['errors'])}")
        for e in times["errors"][:5]:
            print("   ", e)


if __name__ == "__main__":
    main()
