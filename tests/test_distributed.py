"""Data parallelism (worker/trainers/torch/distributed.py) with real processes: torch's elastic agent
starting real ranks, real gloo all-reduces, real kill -9, SIGSTOP and an address-space limit."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from common.variables import parse_value, resolve
from tests.conftest import CpuStall
from worker import data
from worker.trainers.torch import distributed

pytestmark = [pytest.mark.trainer, pytest.mark.probe]

REPO = Path(__file__).resolve().parents[1]
TINY = dict(d_model=32, n_layers=1, n_heads=2, seq_len=32, vocab_size=256, warmup_steps=1, dataset="builtin",
            cores=2)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def request(data_dir, tmp_path, name, **overrides):
    partial = {k: parse_value(k, v) for k, v in (TINY | overrides).items()}
    config, why = resolve(partial, 2)
    assert not why, why
    return {"config": config, "run_id": None, "data_dir": str(data_dir), "output_root": str(tmp_path / "output"),
            "output_dir": str(tmp_path / "output" / name), "peak_gflops": None,
            "compile_cache_dir": str(tmp_path / "inductor"), "dp_dir": str(tmp_path / f"dp-{name}"),
            "collective_timeout_s": 3}


def start_child(req: dict) -> subprocess.Popen:
    """The torch child as the worker starts it: its own process group, the job's threads in its env."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0",
           "OMP_NUM_THREADS": str(req["config"]["omp_threads"]), "MKL_NUM_THREADS": str(req["config"]["omp_threads"])}
    path = Path(req["dp_dir"] + ".request.json")
    path.write_text(json.dumps(req))
    with path.open() as stdin:
        return subprocess.Popen([sys.executable, "-m", "worker.trainers.torch"], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env, text=True,
                                start_new_session=True)


def train(req: dict) -> dict:
    proc = start_child(req)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "done", result
    return result


def test_a_rank_takes_its_exact_slice_of_the_one_rank_batch(tmp_path):
    tokens = np.arange(5000) % 251
    config = {"batch_size": 3, "seq_len": 16, "seed": 5}
    whole = data.Batches(tokens, 16, 6, 5)
    parts = [distributed.Rank(r, 2, r, tmp_path, [r]).batches(tokens, config) for r in range(2)]
    for _ in range(4):  # the same samples in the same order, step after step
        x, y = whole.next()
        got = [p() for p in parts]
        assert np.array_equal(torch.cat([g[0] for g in got]).numpy(), x)
        assert np.array_equal(torch.cat([g[1] for g in got]).numpy(), y)


def test_cpus_split_into_equal_disjoint_slices_in_cpu_order():
    assert distributed.slices([3, 1, 2, 0], 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError):
        distributed.slices([0, 1, 2], 2)


def test_two_ranks_of_batch_b_train_exactly_like_one_rank_of_batch_2b(data_dir, tmp_path):
    steps = 6
    two = train(request(data_dir, tmp_path, "two", ranks=2, batch_size=2, steps=steps))
    one = train(request(data_dir, tmp_path, "one", ranks=1, batch_size=4, steps=steps))
    m2, m1 = two["metrics"], one["metrics"]
    assert (m2["world_size"], m2["global_batch"], m1["world_size"], m1["global_batch"]) == (2, 4, 1, 4)
    loss_diff = max(abs(m2[k] - m1[k]) for k in ("loss_first", "loss_last"))
    p2 = torch.load(Path(two["output_path"]) / "model.pt", weights_only=True)
    p1 = torch.load(Path(one["output_path"]) / "model.pt", weights_only=True)
    assert p2.keys() == p1.keys()
    param_diff = max(float((p2[k] - p1[k]).abs().max()) for k in p1)
    print(f"\nequivalence after {steps + 1} steps: max |loss diff| {loss_diff:.3g}, max |param diff| {param_diff:.3g}")
    assert loss_diff < 1e-5 and param_diff < 1e-5
    assert m1["loss_last"] < m1["loss_first"]  # it trained
    ranks = two["applied"]["ranks"]
    assert [r["affinity"] for r in ranks] == [[0], [1]] and {r["torch_threads"] for r in ranks} == {1}
    assert two["applied"]["data_parallel"]["backend"] == "gloo"
    assert m2["allreduce_ms"] > 0 and 0 < m2["allreduce_share"] < 1 and m1["allreduce_ms"] is None
    per_step = np.mean([r["losses"] for r in ranks], axis=0)  # the ranks' mean = the global batch's loss
    assert abs(per_step[0] - m1["loss_first"]) < 1e-5


def rank_pids(dp_dir: Path) -> dict[int, int]:
    found = {}
    for path in dp_dir.glob("progress-rank*"):
        fields = path.read_text().split()
        if len(fields) == 3:
            found[int(path.name.removeprefix("progress-rank"))] = int(fields[0])
    return found


def steps_begun(dp_dir: Path, rank: int) -> int:
    fields = (dp_dir / f"progress-rank{rank}").read_text().split() if (dp_dir / f"progress-rank{rank}").exists() else []
    return int(fields[1]) if len(fields) == 3 else 0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fault(rank_pid: int, kind: str) -> None:
    if kind == "kill -9":
        os.kill(rank_pid, signal.SIGKILL)
    elif kind == "hang":
        os.kill(rank_pid, signal.SIGSTOP)
    else:  # out of memory: no more address space than the rank maps now
        size = psutil.Process(rank_pid).memory_info().vms
        resource.prlimit(rank_pid, resource.RLIMIT_AS, (size, size))


@pytest.mark.parametrize("kind, reason", [
    ("kill -9", "rank 1 (pid {pid} on "),
    ("hang", "rank 1 hung: rank 0 waited for it in a collective until the collective timeout"),
    ("out of memory", "rank 1 (pid {pid} on "),
])
def test_a_rank_that_dies_hangs_or_runs_out_of_memory_fails_the_run_naming_it_and_leaves_no_rank(
        data_dir, tmp_path, kind, reason):
    req = request(data_dir, tmp_path, "fault", ranks=2, batch_size=2, steps=100000)
    dp_dir = Path(req["dp_dir"])
    proc = start_child(req)
    try:
        deadline = time.monotonic() + 120
        while steps_begun(dp_dir, 1) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = rank_pids(dp_dir)
        assert set(pids) == {0, 1}, proc.stderr.read() if proc.poll() is not None else pids
        fault(pids[1], kind)
        hit, stall = time.monotonic(), CpuStall()
        out, err = proc.communicate(timeout=60)
        failed_after_s, stalled_s = time.monotonic() - hit, stall.seconds()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"\n{kind} of rank 1: the run failed {failed_after_s:.1f} s later: {err.strip().splitlines()[-1]}")
    assert proc.returncode != 0 and out.strip() == ""
    assert reason.format(pid=pids[1]) in err.strip().splitlines()[-1]
    bound = 3 + distributed.SHUTDOWN_TIMEOUT_S + 10 if kind == "hang" else 15  # collective timeout 3 s
    assert failed_after_s - stalled_s < bound, err[-4000:]  # load-aware: a busy machine's waits do not count
    assert not any(alive(pid) for pid in pids.values()), "a rank outlived its failed run"


# -- the worker around it: `bench.py work`, the real torch child, real ranks ------------------------------

def rank_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "worker.trainers.torch.distributed" in " ".join(p.info["cmdline"] or [])]


def start_worker(db: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "bench.py"), "work", "--db", db], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


TINY_SET = [f"{k}={v}" for k, v in (TINY | {"batch_size": 2, "ranks": 2}).items()]


def enqueue(db: str, *axes: str) -> None:
    args = [a for kv in TINY_SET for a in ("--set", kv)] + [a for axis in axes for a in ("--axis", axis)]
    done = subprocess.run([sys.executable, str(REPO / "bench.py"), "enqueue", "--db", db, *args], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_worker_fails_a_run_whose_rank_was_killed_and_goes_on_with_the_next_job(db):
    enqueue(db, "steps=100000,3")
    worker = start_worker(db, {"BENCH_COLLECTIVE_TIMEOUT_S": "5"})
    try:
        assert wait_for(lambda: len(rank_processes()) == 2 and any(
            "100000" in (r[0] or "") for r in sqlite_rows(db, "SELECT j.config FROM runs r JOIN jobs j USING (job_id) "
                                                          "WHERE r.status = 'running'")), 180)
        time.sleep(2)  # training, past the rendezvous
        victim = max(rank_processes(), key=lambda p: p.pid)
        victim.kill()
        killed = time.monotonic()
        assert wait_for(lambda: sqlite_rows(db, "SELECT COUNT(*) FROM runs WHERE status = 'failed'")[0][0] == 1, 60)
        print(f"\nkill -9 of a rank under the worker: its run failed {time.monotonic() - killed:.1f} s later")
        assert worker.wait(timeout=180) == 0, worker.stderr.read()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    runs = dict(sqlite_rows(db, "SELECT j.steps, r.status FROM runs r JOIN jobs j USING (job_id)"))
    assert runs == {100000: "failed", 3: "done"}
    reason = sqlite_rows(db, "SELECT reason FROM runs WHERE status = 'failed'")[0][0]
    assert f"(pid {victim.pid} on " in reason and "killed by SIGKILL" in reason
    assert not rank_processes()


def test_a_killed_worker_leaves_no_rank_and_its_job_resumes(db):
    enqueue(db, "steps=400")
    worker = start_worker(db, {})
    assert wait_for(lambda: len(rank_processes()) == 2, 180)
    ranks = rank_processes()
    worker.kill()
    worker.wait()
    assert wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks), 10), \
        "a rank outlived its killed worker"
    again = start_worker(db, {})
    assert again.wait(timeout=240) == 0, again.stderr.read()[-3000:]
    assert sqlite_rows(db, "SELECT status, attempts FROM runs") == [("done", 2)]
    applied = json.loads(sqlite_rows(db, "SELECT applied FROM runs")[0][0])
    assert [r["affinity"] for r in applied["ranks"]] == [[0], [1]]


def sqlite_rows(db: str, sql: str) -> list:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_two_nodes_simulated_as_two_launchers_over_loopback_train_one_run(data_dir, tmp_path):
    """What is simulated: two "nodes" on this host, each its own torch elastic agent (the second started
    as a local process where SLURM's srun would start it on the second node), joined by c10d rendezvous
    over loopback at the first launcher's store; both share this host's CPUs and hostname."""
    req = request(data_dir, tmp_path, "nodes", ranks=1, nodes=2, cores=1, batch_size=2, steps=4)
    req["nodes_loopback"] = True
    result = train(req)
    dp = result["applied"]["data_parallel"]
    print("\ntwo-node (loopback) run:", json.dumps({k: dp[k] for k in ("world_size", "nodes", "ranks_per_node",
                                                                      "rendezvous", "machines")}),
          {k: result["metrics"][k] for k in ("step_ms_median", "allreduce_ms", "tokens_per_s", "global_batch")})
    assert (dp["world_size"], dp["nodes"], result["metrics"]["global_batch"]) == (2, 2, 4)
    assert sorted(dp["machines"]) == ["0", "1"]
    assert sorted(r["node"] for r in result["applied"]["ranks"]) == [0, 1]
