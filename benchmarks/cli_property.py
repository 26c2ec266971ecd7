"""The property test of the whole CLI, at scale: random command lines over every command, option and
value (tests/cli_lines.py draws them and checks each), run in process in a fresh folder each.

    python benchmarks/cli_property.py [--lines 2000] [--seed 0]

Prints the figures the issue asks for: command lines tried, by command and by exit code, tracebacks,
files changed on an exit 2, and every broken promise with its command line. Nothing trains (see
tests/cli_lines.py), so it takes about a second per twenty lines on one core.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cli-property-"))
    os.environ.update({"BENCH_STATE_DIR": str(work / "state"), "BENCH_PROBE_QUICK": "1",
                       "BENCH_OUTPUT_DIR": str(work / "output"), "BENCH_PEAK_PER_SET": "0"})
    os.environ.pop("BENCH_DB", None)

    import typer
    from hypothesis import HealthCheck, given, seed, settings

    from bench import app
    from tests.cli_lines import Tally, command_line, make_template, run_line

    template = work / "template.db"
    make_template(template)
    cli = typer.main.get_command(app)
    tally = Tally()
    counter = iter(range(10**9))

    @settings(max_examples=args.lines, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=("generate",))
    @seed(args.seed)
    @given(line=command_line(cli))
    def check(line):
        started = time.perf_counter()
        run_line(app, line, work / f"line{next(counter)}", template, tally)
        took = time.perf_counter() - started
        slowest.append((took, line))
        if took > 5:
            print(f"  slow line ({took:.1f} s): {line}", file=sys.stderr, flush=True)

    slowest: list = []

    start = time.perf_counter()
    check()
    took = time.perf_counter() - start
    print(f"command lines tried: {tally.lines} in {took:.0f} s ({tally.lines / took:.1f}/s)")
    print("by command: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.by_command.items())))
    print("by exit code: " + ", ".join(f"{k}: {v}" for k, v in sorted(tally.by_exit.items())))
    print(f"tracebacks (or exceptions): {tally.tracebacks}")
    print(f"files changed on exit 2: {tally.changed_on_exit_2}")
    slowest.sort(key=lambda t: t[0], reverse=True)
    print("slowest lines: " + "; ".join(f"{t:.1f} s {' '.join(line)[:80]}" for t, line in slowest[:5]))
    print(f"broken promises: {len(tally.failures)}")
    for failure in tally.failures[:40]:
        print("  " + failure)


if __name__ == "__main__":
    main()
