"""A fork server for training children: a process that has already imported torch and the child's
modules, and forks one fresh child per job. It removes the ~2 s interpreter and torch import from
every job, which dominates tiny jobs.

Only jobs whose process-start settings are identical share a server: the whole child environment
(threads, LD_PRELOAD, ISA caps, OpenMP binding are read when libraries load), the numactl prefix
and the CPU set. Any difference starts a new server, so a forked child runs under exactly the
settings a freshly executed one would. The server never trains itself: each child starts from the
same just-imported state, sets its affinity and privileges, and runs the child module as __main__.
What the server holds for them besides imports: the job's token ids (loaded before forking, shared
copy-on-write) and what the trainer's `prepare_server()` reads once (the torch trainer: the library
ISA read-back, worker/knobs/isa_check.py). What a child proved once for the later ones (the torch trainer's
GEMM route: worker/trainers/torch/gemm_route.py) is kept by the worker's side (worker/spawn.py
ForkServer.proven) and travels in each job's request; it dies with the server.

Protocol on the server's stdin/stdout, one JSON object a line:
  -> {"stdin": path, "stdout": path, "stderr": path, "cpus": [...], "user": [uid, gid] | null}
  <- {"pid": N}                      once the child is forked
  <- {"pid": N, "returncode": rc}    when it ended (rc < 0: killed by that signal)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
import traceback
from functools import partial

from common.processes import fork_child, set_parent_death_signal
from worker.spawn import become_job_process

def _child(module: str, request: dict, server_pid: int) -> int:
    """In the forked child: become a fresh process for one job, then run the module as __main__; its
    exit code (a SystemExit's, 1 where it raised, its traceback on the job's stderr)."""
    code = 1
    try:
        become_job_process(request["cpus"], request.get("user"), server_pid)
        for fd, (path, flags) in enumerate(((request["stdin"], os.O_RDONLY),
                                            (request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                            (request["stderr"], os.O_WRONLY | os.O_TRUNC))):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = [module]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):  # what the module printed reaches the job's files
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _hold_data(job_path: str) -> None:
    """Before forking: the job's token ids loaded here (worker/data.py hold()), so that every child of
    the same corpus and vocabulary finds them in memory. Only a trainer that preloads worker.data
    gets this; anything wrong leaves the child to load them itself."""
    data = sys.modules.get("worker.data")
    if data is None:
        return
    try:
        with open(job_path) as f:
            job = json.load(f)
        data.hold(job["data_dir"], job["config"]["dataset"], int(job["config"]["vocab_size"]))
    except Exception:  # the child reports any real problem with the data
        pass


def serve(module: str) -> None:
    """Import the child's modules once, then fork a child per request until stdin closes."""
    worker_pid = int(os.environ.pop("BENCH_FORKSERVER_PARENT"))
    set_parent_death_signal(worker_pid)
    # The module and the heavy modules it names in PRELOAD (it may import them lazily) stay cached
    # for every child.
    package = importlib.import_module(module)
    for name in getattr(package, "PRELOAD", ()):
        importlib.import_module(name)
    # What every child would redo and may be done once here (the torch trainer: the library ISA
    # read-back); it must start no thread in this process, or the children would fork it.
    if hasattr(package, "prepare_server"):
        package.prepare_server()
    control_in, control_out = sys.stdin, sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=control_out, flush=True)
    for line in control_in:
        request = json.loads(line)
        _hold_data(request["stdin"])
        control_out.flush()
        pid = fork_child(partial(_child, module, request, os.getpid()))
        print(json.dumps({"pid": pid}), file=control_out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}), file=control_out,
              flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
