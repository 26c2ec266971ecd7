"""A training child that keeps its CPU busy for one second inside its timed window (the child
protocol, no torch): a run whose window other processes' CPU time can be measured against."""

import json
import os
import sys
import time

from worker.trainers import harness


def main():
    json.loads(sys.stdin.read())
    start, cpu0 = time.time(), time.process_time()
    while time.time() - start < 1.0:  # spin: the child's own CPU time must not count as other_cpu_s
        pass
    end, cpu1 = time.time(), time.process_time()
    metrics = dict.fromkeys(harness.TRAINER_METRICS) | {"step_ms_median": 1000.0, "train_s": end - start}
    print(json.dumps(harness.result(metrics, applied={"affinity": sorted(os.sched_getaffinity(0)),
                                                                     "window_cpu_s": cpu1 - cpu0},
                                    timed_window={"start_unix_s": start, "end_unix_s": end}, dataset_used="stub",
                                    output_path=None, torch_version=None, build_info=None)))


if __name__ == "__main__":
    main()
