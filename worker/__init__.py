"""The worker: everything that runs on the measured machine. The claim loop (loop.py) takes jobs
from the orchestrator's store, applies the system knobs, spawns a training child (trainers/) pinned
to the job's CPUs, reads the sensors over its timed window and records the result; the machine probe,
the data and the memory estimate live here too. It imports orchestrator/ (the store) and common/."""
