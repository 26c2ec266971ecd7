"""How long `bench.py report` and the progress bar's ETA take on a 200-run database (prints, never asserts).

    python benchmarks/report_speed.py [--runs-per-config 9]
"""

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.queue.eta import estimate_remaining_s  # noqa: E402
from orchestrator.report import write_report  # noqa: E402
from orchestrator.queue.store import Store  # noqa: E402
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all  # noqa: E402

AXES = {"d_model": [64, 128, 256, 512], "n_layers": [1, 2, 4, 8], "seq_len": [64, 128, 256], "batch_size": [4, 8, 16],
        "cores": [1, 2, 4, 8], "precision": ["fp32", "bf16", "q8"], "attn_backend": ["manual", "sdpa", "sdpa_math"],
        "activation": ["gelu", "swiglu"]}
BASE = {"d_model": 128, "n_layers": 2, "seq_len": 128, "batch_size": 8, "cores": 4}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-per-config", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "results.db"))
        m = store.register_machine(machine_facts("bench", "Intel Xeon (synthetic)"))
        jobs = configs(BASE, AXES, repeats=args.runs_per_config)
        enqueue(store, jobs)
        rng = random.Random(0)

        def outcome(c):
            if c["precision"] == "q8" and c["repeat"] % 3 == 0:
                return "failed", "RuntimeError: q8 kernel missing", {}
            t = 20 * (c["d_model"] / 128) ** 1.8 * (c["n_layers"] / 2) ** 0.9 * (c["seq_len"] / 128) ** 1.1
            t *= ((c["batch_size"] / 8) ** 0.9 * (c["cores"] / 4) ** -0.7
                  * {"fp32": 1, "bf16": 2, "q8": 3}[c["precision"]])
            return "done", None, metrics(t * math.exp(rng.gauss(0, 0.04)), c)
        run_all(store, m, outcome, limit=len(jobs) - 10)  # leave a few queued for the ETA
        counts = store.counts(m)
        t0 = time.perf_counter()
        report = write_report(store, Path(tmp) / "result")
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(store, Path(tmp) / "result")
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            eta = estimate_remaining_s(store, m)
        eta_ms = (time.perf_counter() - t0) / 20 * 1000
    print(f"runs: {counts}")
    print(f"write_report: {cold:.2f} s first call in the process (matplotlib import included), {warm:.2f} s again; "
          f"{len(report.plot_paths)} plots")
    print(f"estimate_remaining_s: {eta_ms:.1f} ms per call -> {eta:.0f} s left")


if __name__ == "__main__":
    main()
