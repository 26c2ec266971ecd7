"""A stand-in training child whose step time follows a known law with noise, for `work --target-ci`
(tests/test_adaptive.py): step_ms_median = 10 ms * (d_model / 64) ** 1.0 * exp(N(0, 0.03)), nothing
else matters (so every other comparison is a true "no change"). The noise is drawn from a generator
seeded by the run id: the same database gives the same numbers. Same protocol as tests/stub_child.py,
no torch, no sleeping."""

import json
import math
import random
import sys

from worker.trainers import harness

ELASTICITY = 1.0
SIGMA = 0.03


def main():
    job = json.loads(sys.stdin.read())
    config = job["config"]
    rng = random.Random(f"law:{job['run_id']}")
    ms = 10.0 * (config["d_model"] / 64) ** ELASTICITY * math.exp(rng.gauss(0.0, SIGMA))
    metrics = dict.fromkeys(harness.TRAINER_METRICS) | {
        "step_ms_median": ms, "tokens_per_s": config["batch_size"] * config["seq_len"] * 1000.0 / ms}
    print(json.dumps(harness.result(metrics, applied={}, timed_window=None, dataset_used=config["dataset"],
                                    output_path=None, torch_version=None, build_info=None)))


if __name__ == "__main__":
    main()
