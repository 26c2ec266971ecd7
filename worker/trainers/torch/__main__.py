import time

_T0 = time.perf_counter()  # setup_s starts here: before the trainer's imports

from worker.trainers.session import main  # noqa: E402

main("torch", _T0)
