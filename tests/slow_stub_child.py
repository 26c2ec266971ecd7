"""tests/stub_child.py, slow to start on CPU 1: importing it there takes 5 s (a fork server
importing torch on a busy machine, say), so a worker given `--cpus 1` spends that long between its
claim and its child's first output. Elsewhere it is the plain stub. (The child's environment is a
whitelist, so the choice rides on the CPU set the worker gives it, not on a variable.)"""

import os
import time

from tests.stub_child import main

IMPORT_S = 5.0

if os.sched_getaffinity(0) == {1}:
    time.sleep(IMPORT_S)

if __name__ == "__main__":
    main()
