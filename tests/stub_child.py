"""A stand-in training child for the queue's tests: it follows the child protocol (job JSON on
stdin, one JSON line on stdout), sleeps steps * 50 ms, and misbehaves on purpose, chosen by the
job's `seed`:
0 = a quick honest result, 1 = segfault, 2 = os._exit(3), 3 = hang, 4 = raise, 5 = print garbage,
6 = a done result with a metric the contract does not know (and without mfu), 7 = a done result whose
timed steps counted compilations (a trainer that recompiles every step), 8 = killed by SIGKILL as the
OOM killer does (each try leaves a file in output_root/tries/ first).
It skips torch entirely (its result is built by the harness's result(), every metric named) so the
queue's tests stay fast; the real child has its own tests."""

import ctypes
import json
import os
import signal
import sys
import time

from worker.trainers import harness


def main():
    job = json.loads(sys.stdin.read())
    config = job["config"]
    mode = config["seed"]
    time.sleep(config["steps"] * 0.05)
    if mode == 1:
        ctypes.string_at(0)
    elif mode == 2:
        os._exit(3)
    elif mode == 3:
        time.sleep(3600)
    elif mode == 4:
        raise RuntimeError("stub child raised on purpose")
    elif mode == 5:
        print("not json")
        sys.exit(0)
    elif mode == 8:
        tries = os.path.join(job["output_root"], "tries")
        os.makedirs(tries, exist_ok=True)
        open(os.path.join(tries, f"run-{job['run_id']}-{os.getpid()}"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    # One file per completed child run: the tests count executions per job.
    markers = os.path.join(job["output_root"], "markers")
    os.makedirs(markers, exist_ok=True)
    with open(os.path.join(markers, f"run-{job['run_id']}-{os.getpid()}"), "w") as f:
        f.write(json.dumps(config))
    metrics = dict.fromkeys(harness.TRAINER_METRICS) | {"step_ms_median": 1.0 + config["d_model"] / 100}
    now = time.time()
    result = harness.result(metrics, applied={"affinity": sorted(os.sched_getaffinity(0)),
                                              "allocator_lib": harness.loaded_allocator()},
                            timed_window={"start_unix_s": now, "end_unix_s": now,
                                          "compilations": config["steps"] if mode == 7 else 0,
                                          "slowest_step_x_median": 9.0 if mode == 7 else 1.0}, dataset_used="stub",
                            output_path=None, torch_version=None, build_info=None)
    if mode == 6:  # a trainer that broke the contract after harness.result (or never used it)
        del result["metrics"]["mfu"]
        result["metrics"]["steps_seen"] = config["steps"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
