"""How fast this machine runs the report's kind of Python, so that report timings taken on different VMs
can be set side by side: the CPU time of a fixed piece of work like the report's (rows built as dicts,
values shared through a dict, text parsed and written as CSV, a sort), the median of several repeats, in
one process alone and in two at once (the report keeps both CPUs of a small machine busy).

The development VMs of one type differ from one another and from day to day, and one VM's speed changes
within minutes (the work took ~310 ms for a minute, then ~172 ms, on the same VM): the same commit's
1M-run report has taken 62 s on one and 76 s on another. A report timing means most beside this figure,
taken just before and after it (report_scale.py prints it before and after its cases).

    venv/bin/python benchmarks/machine_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

ROWS = 20_000


def work() -> int:
    """The fixed work: ROWS rows of 12 columns made, shared, parsed from JSON, sorted and written as CSV."""
    shared: dict = {}
    rows = []
    for i in range(ROWS):
        values = (i, i % 7, f"host{i % 3}", i * 0.001, "done", None, i % 5 == 0, f"cfg{i % 101}", 1e-3 * (i % 13),
                  i // 2, "fp32", 64 + i % 4)
        rows.append({f"c{k}": shared.setdefault(v, v) for k, v in enumerate(values) if v is not None})
    texts = [json.dumps(r) for r in rows[: ROWS // 4]]
    parsed = [json.loads(t) for t in texts]
    rows.sort(key=lambda r: (r["c7"], -r["c3"]))
    buf = io.StringIO()
    csv.writer(buf).writerows(tuple(r.values()) for r in rows)
    return len(buf.getvalue()) + len(parsed)


def speed_ms(repeats: int = 7) -> dict:
    """The work's CPU time on this process's CPU: median and range of `repeats` (ms), after one warm-up."""
    work()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        work()
        times.append((time.process_time() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "repeats": repeats}


def machine_speed(repeats: int = 5) -> dict:
    """speed_ms in this process alone ("one") and in two processes at once ("two": each one's)."""
    one = speed_ms(repeats)
    with ProcessPoolExecutor(2) as pool:
        two = list(pool.map(speed_ms, [repeats, repeats]))
    return {"one": one, "two": two}


def describe(speed: dict) -> str:
    one, two = speed["one"], speed["two"]
    both = " and ".join(format(t["median_ms"], ".0f") for t in two)
    return (f"machine speed: {one['median_ms']:.0f} ms alone (range {one['min_ms']:.0f}-{one['max_ms']:.0f}), "
            f"{both} ms two at once ({one['repeats']} repeats each; lower is faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(describe(machine_speed(args.repeats)))


if __name__ == "__main__":
    main()
