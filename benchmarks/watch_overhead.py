"""What `bench.py report --watch` costs the workers: a real two-worker sweep on PostgreSQL (two
`bench.py work --pool fleet` processes, one per CPU) with the watcher switched on and off in
alternating stretches of --toggle seconds; afterwards each run is classed by whether its whole
claim-to-finish window fell in a stretch with the watcher on or off (runs across a switch, or
while the screenshot was taken, are left out), and the step times are compared per configuration:
the geometric mean over configurations of median(on) / median(off), with the same statistic
between two halves of the off runs as the noise to compare it with. Prints, never asserts.

    venv/bin/python benchmarks/watch_overhead.py --prefill 20000 --screenshot /tmp/live.png

--prefill N: N synthetic runs of two other machines first (tests/scaledb.py), so that each report
the watcher makes costs what it would on a fleet's database. --screenshot: a PNG of the live page
(headless Chromium) once a few runs have finished.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from orchestrator.queue.store import Store  # noqa: E402
from tests.pgserver import throwaway_postgres  # noqa: E402
from tests.scaledb import build  # noqa: E402

SELECT_RUNS = """
SELECT r.run_id, r.claimed, r.finished, r.step_ms_median, j.d_model, j.batch_size, r.worker_pid
FROM runs r JOIN jobs j ON j.job_id = r.job_id JOIN pools p ON p.pool_id = r.pool_id
WHERE p.name = 'fleet' AND r.status = 'done'
"""


def bench(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench.py"), *args]


def screenshot(page: Path, png: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_script_timeout(120)
    try:
        driver.get(page.resolve().as_uri() + "#print")
        driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                    "(window.cpubench ? window.cpubench.ready : Promise.resolve())"
                                    ".then(() => done(true));")
        driver.save_screenshot(str(png))
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=float, default=2.0, help="the watcher's --every")
    parser.add_argument("--toggle", type=float, default=30.0, help="seconds the watcher is on, then off, ...")
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, throwaway_postgres() as url:
        tmp = Path(tmp)
        if args.prefill:
            build(url, args.prefill, quiet=True)
        sweep = ["enqueue", "--db", url, "--set", "n_layers=1", "--set", "seq_len=128", "--set", "vocab_size=512",
                 "--set", f"steps={args.steps}", "--set", "warmup_steps=2", "--set", "dataset=builtin",
                 "--set", "cores=1", "--axis", "d_model=128,256", "--axis", "batch_size=4,8",
                 "--repeats", str(args.repeats)]
        said = subprocess.run(bench(*sweep), capture_output=True, text=True)
        print("enqueue:", said.returncode, (said.stdout + said.stderr).strip()[-400:], flush=True)
        with Store(url, read_only=True).transaction() as conn:
            print("jobs in the database:", conn.execute(text("SELECT COUNT(*) FROM jobs")).scalar_one(), flush=True)
        workers = [subprocess.Popen(bench("work", "--pool", "fleet", "--cpus", str(cpu), "--db", url),
                                    stdout=subprocess.DEVNULL, stderr=open(tmp / f"worker{cpu}.log", "w"))
                   for cpu in (0, 1)]
        # a failure below must not leave two workers holding the CPUs' locks for the next run
        atexit.register(lambda: [w.kill() for w in workers if w.poll() is None])
        out = tmp / "result"
        on: list[list[float]] = []
        shots: list[tuple[float, float]] = []
        watcher = None
        store = Store(url, read_only=True)
        t_switch = time.time()
        while any(w.poll() is None for w in workers):
            now = time.time()
            if now >= t_switch:
                if watcher is None:
                    watcher = subprocess.Popen(bench("report", "--watch", "--every", str(args.every), "--out", str(out),
                                                     "--db", url), stdout=subprocess.DEVNULL,
                                               stderr=open(tmp / "watch.log", "a"))
                    on.append([now, math.inf])
                else:
                    watcher.send_signal(signal.SIGINT)
                    watcher.wait(timeout=120)
                    watcher = None
                    on[-1][1] = time.time()
                t_switch = time.time() + args.toggle
            # the live page with its effects (before the watcher's first report it holds the progress only)
            # (or, where the workers leave the watcher's report no CPU, the progress it shows by half the sweep)
            if args.screenshot and not shots and watcher is not None and (out / "index.html").exists():
                effects = 'id="effects"' in (out / "index.html").read_text(encoding="utf-8")
                with store.transaction() as conn:
                    done = conn.execute(text("SELECT COUNT(*) FROM runs r JOIN pools p ON p.pool_id = r.pool_id "
                                             "WHERE p.name = 'fleet' AND r.status = 'done'")).scalar_one()
                if done >= 6 and (effects or done >= 2 * args.repeats):
                    t0 = time.time()
                    screenshot(out / "index.html", args.screenshot)
                    shots.append((t0, time.time()))
                    print(f"screenshot: {args.screenshot} ({done} runs done; the page "
                          f"{'with' if effects else 'without'} the effects yet)", flush=True)
            time.sleep(0.5)
        if watcher is not None:
            watcher.send_signal(signal.SIGINT)
            watcher.wait(timeout=120)
            on[-1][1] = time.time()
        with store.transaction() as conn:
            runs = conn.execute(text(SELECT_RUNS)).all()
        print("watcher log (last lines):", *(tmp / "watch.log").read_text().strip().splitlines()[-4:], sep="\n  ")

    def state(a: float, b: float) -> str | None:
        if any(s < b and a < e for s, e in shots):
            return None
        if any(s <= a and b <= e for s, e in on):
            return "on"
        if not any(s < b and a < e for s, e in on):
            return "off"
        return None  # across a switch
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _, claimed, finished, step_ms, d_model, batch, _pid in sorted(runs):
        st = state(claimed, finished)
        if st is not None and step_ms:
            cells[(d_model, batch)][st].append(step_ms)

    def gm_ratio(pairs):
        logs = [math.log(statistics.median(x) / statistics.median(y)) for x, y in pairs if x and y]
        return (math.exp(statistics.mean(logs)), len(logs)) if logs else (None, 0)
    ratio, n = gm_ratio([(c["on"], c["off"]) for c in cells.values()])
    noise, n_noise = gm_ratio([(c["off"][::2], c["off"][1::2]) for c in cells.values() if len(c["off"]) >= 2])
    counts = {k: sum(len(c[k]) for c in cells.values()) for k in ("on", "off")}
    print(f"runs done: {len(runs)}; classed: watcher on {counts['on']}, off {counts['off']} (the rest across a switch "
          f"or the screenshot); {len(on)} stretches on")
    for key, c in sorted(cells.items()):
        print(f"  d_model={key[0]} batch_size={key[1]}: on {len(c['on'])} runs, median "
              f"{statistics.median(c['on']) if c['on'] else float('nan'):.2f} ms; off {len(c['off'])} runs, median "
              f"{statistics.median(c['off']) if c['off'] else float('nan'):.2f} ms")
    print(f"step time with the watcher / without: {ratio if ratio else float('nan'):.3f} (geometric mean over {n} "
          f"configurations); off vs off (alternate runs, the noise): {noise if noise else float('nan'):.3f} "
          f"over {n_noise}")
    print(json.dumps({"ratio_on_off": ratio, "noise_off_off": noise, "counts": counts, "configs": n}))


if __name__ == "__main__":
    main()
