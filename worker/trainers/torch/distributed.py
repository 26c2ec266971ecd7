"""Data parallelism of the torch trainer: `ranks` processes per machine on `nodes` machines, started by
torch.distributed's own launcher, training with DistributedDataParallel over gloo.

Two sides, one module:

    launcher  the torch child the worker started (session.py's Session.launch sends a job of ranks x nodes > 1).
              It runs torchrun's elastic agent in-process (torch.distributed.launcher.api.elastic_launch:
              c10d rendezvous, max_restarts=0) over `python -m worker.trainers.torch.distributed DIR`,
              and, with nodes > 1, starts one more launcher per node (`srun` inside a SLURM allocation,
              NODE_LAUNCHER). The worker still sees one child and reads one result line: the one rank 0
              wrote to DIR, merged over every rank.
    rank      sets PR_SET_PDEATHSIG (its launcher killed -> it dies: a kill -9 of the worker leaves no
              rank; the launcher starts ranks in sessions of their own, so a process-group kill alone
              would miss them), pins itself to its slice of the launcher's CPUs (equal, disjoint, in
              CPU order; OMP_PLACES follows it with pin_threads) before torch loads, joins the gloo group
              (torch's standard env: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and trains
              through the shared training loop (worker/trainers/session.py) with the torch trainer's Session
              on its Rank (train.Session.on_rank): its slice of each global batch, the DDP wrap, the
              all-reduce timing.

What a run records (`applied.data_parallel`, `applied.ranks`, the metric columns):
    step_ms_*      the slowest rank's (highest median): a step ends when its all-reduce does
    allreduce_ms   median over the timed steps of that rank's all-reduce time per step, measured by a DDP
                   comm hook around torch's own allreduce_hook: the union of each gradient bucket's
                   launch -> completion intervals (a bucket launched while backward still computes
                   overlaps it: the first bucket usually does)
    allreduce_share  allreduce_ms / step_ms_median
    tokens_per_s, samples_per_s, gflops, mfu   every rank together (the global batch over the step)
    loss_first, loss_last   the mean over ranks (= the loss of the global batch: equal-size slices)
    cpu_user_s, cpu_sys_s, ctx_switches, peak_rss_mb   summed over ranks
    applied.ranks  per rank: host, pid, its slice, affinity and threads read back in the rank, its medians

Faults: a rank that dies makes the agent stop the others (SIGTERM, SIGKILL after SHUTDOWN_TIMEOUT_S);
a rank that hangs makes the others' next collective fail after the collective timeout (the request's
`collective_timeout_s`, default COLLECTIVE_TIMEOUT_S); either way the launcher raises RankFailed naming
the rank that failed first and how far each rank got, and exits non-zero: the worker records a
failed run and goes on. With nodes > 1 a lost node (its launcher killed, its link cut, its slurmd dead
and the node declared down by slurmctld) is named: by the srun that ended early (NodeWatch) or by this
node's ranks all failing on a peer (remote_nodes); see docs/clusters.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

from common import scratch
from common.variables import PER_RANK_READBACK

COLLECTIVE_TIMEOUT_S = 60.0  # gloo's timeout of every collective: how long a hung rank holds the run
SHUTDOWN_TIMEOUT_S = 5  # SIGTERM -> SIGKILL of the other ranks once one failed
RENDEZVOUS_TIMEOUT_S = 120  # every node's launcher must join within this
BACKEND = "gloo"
LAUNCHER = "torch.distributed.launcher.api.elastic_launch (torchrun's elastic agent), c10d rendezvous, max_restarts=0"
ALLREDUCE_TIMING = ("DDP comm hook around torch's allreduce_hook: per step, the union of each bucket's "
                    "launch -> completion intervals (may overlap backward compute)")
RESULT = "result.json"
# per rank: "<pid> <steps begun> <compute|allreduce>", rewritten in place (pwrite) as it goes: after a
# collective timeout, the rank still computing while the others wait in the all-reduce is the one that hung
PROGRESS = "progress-rank{rank}"
ENV_RUN_DIR = "CPUBENCH_DP_DIR"
ENV_LAUNCHER_PID = "CPUBENCH_DP_LAUNCHER_PID"


class RankFailed(RuntimeError):
    """A rank died, hung past the collective timeout or raised: the run fails with this reason."""


def world_size(config: dict) -> int:
    return int(config.get("ranks", 1)) * int(config.get("nodes", 1))


def slices(cpus: list[int], ranks: int) -> list[list[int]]:
    """Equal disjoint slices of a CPU set, in CPU order, one per local rank."""
    cpus = sorted(cpus)
    if ranks < 1 or len(cpus) % ranks:
        raise ValueError(f"{len(cpus)} CPUs cannot be split into {ranks} equal slices")
    k = len(cpus) // ranks
    return [cpus[i * k:(i + 1) * k] for i in range(ranks)]


def availability() -> dict[str, str | None]:
    """For `bench.py machine`: ranks, nodes and each torch.distributed CPU backend -> None or why not."""
    import shutil

    import torch.distributed as dist

    gloo = None if dist.is_available() and dist.is_gloo_available() else "this torch is built without gloo"
    mpi = None if dist.is_available() and dist.is_mpi_available() else (
        "PyPI's torch 2.13 wheel is built without MPI (torch.distributed.is_mpi_available() is False)")
    nodes = None if shutil.which("srun") else "no srun here: nodes > 1 runs inside a SLURM allocation"
    return {"ranks": gloo, "nodes": gloo or nodes, "distributed=gloo": gloo, "distributed=mpi": mpi}


# -- the launcher side ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launch(request: dict, t0: float) -> dict:
    """In the torch child: start the job's ranks with torch's elastic agent, wait, return rank 0's merged
    result. Raises RankFailed (the run fails with its message) when any rank failed."""
    from worker.trainers import harness

    config = request["config"]
    if config["compile"] == "inductor":  # before any rank starts: a skip must be fast
        return harness.skipped(f"{harness.UNAVAILABLE}: ranks/nodes > 1 with compile=inductor (not implemented: "
                               "every rank would compile and share one warm cache)")
    ranks, nodes = int(config.get("ranks", 1)), int(config.get("nodes", 1))
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) % ranks:
        raise RankFailed(f"the job's {len(cpus)} CPUs cannot be split into {ranks} equal slices")
    # the ranks' request, progress and result; with nodes > 1 every node's launcher reads it: under
    # output_root, on the filesystem the cluster shares (the project's), not this node's /tmp
    shared = request.get("output_root") if nodes > 1 else None
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
    run_dir = Path(request.get("dp_dir") or scratch.make("cpubench-ranks-", dir=shared))
    run_dir.mkdir(parents=True, exist_ok=True)
    endpoint = request.get("rendezvous") or f"{socket.gethostname() if nodes > 1 else '127.0.0.1'}:{_free_port()}"
    timeout_s = float(request.get("collective_timeout_s") or COLLECTIVE_TIMEOUT_S)
    run_id = f"cpubench-{socket.gethostname()}-{os.getpid()}"
    (run_dir / "request.json").write_text(json.dumps({**request, "collective_timeout_s": timeout_s,
                                                      "launcher_t0": t0, "rendezvous": endpoint, "run_id_dp": run_id}))
    others = start_other_nodes(request, run_dir, nodes) if nodes > 1 else []
    watch = NodeWatch(others, run_dir) if others else None
    try:
        run_agent(run_dir, ranks=ranks, nodes=nodes, endpoint=endpoint, run_id=run_id)
        return json.loads((run_dir / RESULT).read_text())
    except RankFailed as failed:
        lost = watch.lost if watch else None
        raise RankFailed(f"{lost}; this node's ranks were stopped" if lost else str(failed)) from None
    finally:
        if watch:
            watch.stop()
        stop_other_nodes(others)
        if not request.get("dp_dir"):  # a folder of our own: nothing in it outlives the run
            shutil.rmtree(run_dir, ignore_errors=True)


def run_agent(run_dir: Path, *, ranks: int, nodes: int, endpoint: str, run_id: str) -> None:
    """One node's launcher: torchrun's elastic agent over this module's rank entry point."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _bounded_stop()
    os.environ[ENV_LAUNCHER_PID] = str(os.getpid())  # this process's own environment: its ranks inherit it
    launch_config = LaunchConfig(min_nodes=nodes, max_nodes=nodes, nproc_per_node=ranks, run_id=run_id,
                                 rdzv_backend="c10d", rdzv_endpoint=endpoint, max_restarts=0,
                                 monitor_interval=0.1, start_method="spawn",
                                 rdzv_configs={"timeout": RENDEZVOUS_TIMEOUT_S}, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    try:
        elastic_launch(launch_config, sys.executable)("-m", "worker.trainers.torch.distributed", str(run_dir))
    except ChildFailedError as failed:
        raise RankFailed(failure_reason(failed, run_dir)) from None


def _bounded_stop() -> None:
    """Once a rank failed, torch 2.13's agent closes the others with a 30 s SIGTERM -> SIGKILL grace
    (SubprocessContext._poll calls close() with its default, ignoring LaunchConfig.shutdown_timeout): a
    stopped (SIGSTOP, D-state) rank ignores the SIGTERM and held the run 30 s more. Cap it."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    if getattr(PContext.close, "cpubench_capped", False):
        return
    close = PContext.close

    def capped(self, death_sig=None, timeout: int = 30) -> None:
        close(self, death_sig, min(timeout, SHUTDOWN_TIMEOUT_S))

    capped.cpubench_capped = True
    PContext.close = capped


def failure_reason(failed, run_dir: Path) -> str:
    """Which rank failed first and why, e.g. 'rank 1 (pid 123 on host) was killed by SIGKILL', or 'rank 1
    hung: ...' where the others' collective timed out while it never reached the all-reduce; then where each
    rank of this node was. The agent records failures to the second, so the cause is told from the
    consequences by kind: a peer's lost connection or timeout, and the SIGTERM the agent sends the rest."""
    where = {}
    for path in sorted(run_dir.glob("progress-rank*")):
        fields = path.read_text().split()
        if len(fields) == 3:
            where[int(path.name.removeprefix("progress-rank"))] = (int(fields[1]), fields[2])
    said = ", ".join(f"rank {r} step {n} {'in the all-reduce' if phase == 'allreduce' else 'computing'}"
                     for r, (n, phase) in sorted(where.items()))
    at = f" [{said}]" if said else ""
    described = {rank: _describe(f) for rank, f in failed.failures.items()}
    remote = remote_nodes(run_dir)
    peer_words = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout")
    if remote and all(any(w in described[r].lower() for w in peer_words) for r in failed.failures):
        # every rank here failed waiting on a peer: the other node(s) were lost (a cut link, a dead node)
        rank = min(failed.failures)
        return (f"lost contact with {remote}: rank {rank} on {socket.gethostname()} {described[rank]}{at}")
    timed_out = [r for r, text in described.items() if "timed out" in text.lower()]
    quiet = sorted(r for r in failed.failures if r not in timed_out)  # did not time out: it was not waiting
    if timed_out and quiet:
        return (f"rank {', '.join(map(str, quiet))} hung: rank {', '.join(map(str, sorted(timed_out)))} waited for it "
                f"in a collective until the collective timeout ({described[timed_out[0]]}); the launcher then "
                f"stopped it{at}")

    def consequence(item) -> tuple:
        rank, f = item
        text = described[rank].lower()
        peer = any(word in text for word in ("connection closed", "connection reset", "broken pipe", "timed out"))
        return (f.exitcode == -signal.SIGTERM, peer, f.timestamp, rank)

    rank, first = min(failed.failures.items(), key=consequence)
    return f"rank {rank} (pid {first.pid} on {socket.gethostname()}) {described[rank]}{at}"


def _describe(failure) -> str:
    if failure.exitcode < 0:
        name = signal.Signals(-failure.exitcode).name
        return f"was killed by {name}" + (" (kill -9, or the kernel's out-of-memory killer)" if name == "SIGKILL"
                                          else "")
    message = failure.message
    if isinstance(message, dict):  # the error file @record wrote: {"message": "...", "extraInfo": ...}
        message = message.get("message", json.dumps(message))
    first = [line for line in str(message).strip().splitlines() if line.strip()][:1] or [""]
    return f"exited with code {failure.exitcode}: {first[0][:300]}"


# Starting the launchers of nodes 2..N. Inside a SLURM allocation: srun, one task per node, the first node
# excluded (--relative=1: it runs this launcher). BENCH_NODES_LOOPBACK=1 (tests, a single host): local
# processes, each its own launcher over loopback, the simulated "nodes" sharing this host's CPUs.
def start_other_nodes(request: dict, run_dir: Path, nodes: int) -> list:
    import subprocess

    argv = [sys.executable, "-m", "worker.trainers.torch.distributed", "--node", str(run_dir)]
    if os.environ.get("SLURM_JOB_ID") and not request.get("nodes_loopback"):
        argv = ["srun", f"--nodes={nodes - 1}", f"--ntasks={nodes - 1}", "--ntasks-per-node=1", "--relative=1",
                "--export=ALL", *argv]
        with open(run_dir / SRUN_ERR, "ab") as err:
            return [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err)]
    if not request.get("nodes_loopback"):
        raise RankFailed(f"nodes={nodes} needs a SLURM allocation of {nodes} nodes (bench.py submit --slurm "
                         f"--nodes {nodes}): no SLURM_JOB_ID here")
    return [subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=False) for _ in range(nodes - 1)]


NODE_FILE = "node-rank{rank}.json"  # each rank's node: host, address, group rank (for a reason naming it)
SRUN_ERR = "srun-nodes.err"


class NodeWatch:
    """While this node's agent runs: the other nodes' launcher (srun) ending first means a node was lost
    (its launcher killed, its slurmd declared dead by slurmctld and the step ended): this node's ranks are
    killed at once, so the run fails now instead of after the collective timeout, and `lost` says why."""

    def __init__(self, others: list, run_dir: Path):
        import threading

        self.others, self.run_dir, self.lost = others, run_dir, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            # srun says "error: Node failure on <node>" and exits 0 when slurmctld declared the node dead
            ended = [p for p in self.others if p.poll() is not None and (
                p.returncode != 0 or "Node failure" in _last_line(self.run_dir / SRUN_ERR))]
            if ended:
                said = _last_line(self.run_dir / SRUN_ERR)
                code = ended[0].returncode
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                self.lost = f"lost {remote_nodes(self.run_dir) or 'another node'}: its launcher step (srun) {how}" + \
                    (f" ({said})" if said else "")
                for pid in _local_rank_pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def _local_rank_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)
            if "worker.trainers.torch.distributed" in " ".join(p.cmdline()) and "--node" not in p.cmdline()]


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def stop_other_nodes(others: list) -> None:
    """After this node's agent ended: the other launchers end with their ranks (a lost peer fails their
    collectives too); one that does not within SHUTDOWN_TIMEOUT_S (its link cut: srun hears nothing) is sent
    SIGTERM (srun passes it on to its task), then SIGKILL."""
    deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
    for proc in others:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            proc.terminate()
            try:
                proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except Exception:
                proc.kill()
                proc.wait()


def remote_nodes(run_dir: Path) -> str:
    """The nodes other than this one that ranks joined from, e.g. 'node 1 (host n1, 10.0.0.11: rank 1)'."""
    here, nodes = socket.gethostname(), {}
    for path in sorted(run_dir.glob("node-rank*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if info["host"] != here:
            nodes.setdefault((info["node"], info["host"], info["address"]), []).append(info["rank"])
    return ", ".join(f"node {node} (host {host}, {address}: rank{'s' if len(r) > 1 else ''} "
                     f"{', '.join(map(str, sorted(r)))})" for (node, host, address), r in sorted(nodes.items()))


def _leave_when_ranks_ended() -> None:
    """A launcher cut off from the first node (its link down) outlived its ranks: once they failed, torch's
    agent closes the rendezvous through the first node's store and waits on TCP for minutes. Once this
    node's ranks have all ended, the agent gets SHUTDOWN_TIMEOUT_S to return; then the launcher leaves."""
    import threading

    import psutil

    def watch() -> None:
        me, seen, ended_at = psutil.Process(), False, None
        while True:
            time.sleep(0.5)
            ranks = [p for p in me.children() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            seen = seen or bool(ranks)
            if seen and not ranks:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > SHUTDOWN_TIMEOUT_S:
                    print(f"cpubench: this node's ranks ended {SHUTDOWN_TIMEOUT_S} s ago and the agent has not "
                          f"returned (the first node unreachable?): leaving", file=sys.stderr, flush=True)
                    _leave(1)

    threading.Thread(target=watch, daemon=True).start()


def node_main(run_dir: Path) -> None:
    """A launcher of a node other than the first: the same agent, joining the first node's rendezvous."""
    from common.processes import set_parent_death_signal

    set_parent_death_signal(os.getppid())
    request = json.loads((run_dir / "request.json").read_text())
    config = request["config"]
    cpus = sorted(os.sched_getaffinity(0))  # the whole node (srun's task): the job's cores of it, as on the first
    os.sched_setaffinity(0, cpus[:int(config["cores"])])
    _leave_when_ranks_ended()
    run_agent(run_dir, ranks=int(config["ranks"]), nodes=int(config["nodes"]), endpoint=request["rendezvous"],
              run_id=request["run_id_dp"])


# -- the rank side ---------------------------------------------------------------------------------------


class Rank:
    """What data parallelism adds to the torch trainer's training inside one rank (train.Session's `dp`)."""

    def __init__(self, rank: int, world: int, local_rank: int, run_dir: Path, cpus: list[int], group=None):
        self.rank, self.world, self.local_rank, self.cpus = rank, world, local_rank, cpus
        self.group = group  # the training's process group (None: the world's)
        self.progress = os.open(run_dir / PROGRESS.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.steps_begun = 0
        self._mark("compute")
        self.intervals: list[tuple[int, int]] = []  # this step's bucket all-reduces (ns)
        self.allreduce_ns: list[int] = []  # per step
        self.first_step_start: float | None = None
        self.losses: list = []  # every step's loss on this rank's slice (warm-up included)
        self.node = int(os.environ.get("GROUP_RANK", 0))
        self.address = local_address(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 9)))

    def batches(self, tokens, config: dict):
        """This rank's exact slice of each global batch: the samples [rank*B, (rank+1)*B) of the batch of
        world*B that a one-rank run with batch_size world*B draws from the same seed."""
        import torch

        from worker import data

        B = config["batch_size"]
        drawn = data.Batches(tokens, config["seq_len"], B * self.world, config["seed"])
        lo, hi = self.rank * B, (self.rank + 1) * B

        def next_batch():
            self.steps_begun += 1  # before the step's clock starts (the harness draws first)
            self._mark("compute")
            x, y = drawn.next()
            return torch.from_numpy(x[lo:hi].copy()), torch.from_numpy(y[lo:hi].copy())

        return next_batch

    def wrap(self, model):
        """DistributedDataParallel over the process group, its all-reduce timed by a comm hook."""
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, process_group=self.group)

        def timed_allreduce(state, bucket):
            started = time.perf_counter_ns()
            self._mark("allreduce")  # a few microseconds a bucket: says where a rank waits if a peer hangs

            def done(fut):
                self.intervals.append((started, time.perf_counter_ns()))
                return fut.value()

            return allreduce_hook(state, bucket).then(done)

        ddp.register_comm_hook(self.group or dist.group.WORLD, timed_allreduce)
        return ddp

    def _mark(self, phase: str) -> None:
        os.pwrite(self.progress, f"{os.getpid()} {self.steps_begun} {phase:<9}\n".encode(), 0)

    def step(self, step):
        def timed(micro):
            if self.first_step_start is None:
                self.first_step_start = time.perf_counter()
            self.intervals.clear()
            loss = step(micro)
            self.losses.append(loss)
            self.allreduce_ns.append(_union_ns(self.intervals))
            return loss

        return timed

    def record(self, result: dict, config: dict) -> dict:
        """What the launcher merges: this rank's result, read-back and all-reduce times.

        allreduce_ms is the median over the timed loop's steps alone. Every call of the step self.step
        wrapped is a warm-up or a timed step (the read-back step after the loop runs unwrapped); a done
        run that made any other call fails here rather than shift the median onto another step."""
        warmup, timed_steps = int(config["warmup_steps"]), int(config["steps"])
        if result.get("status") == "done" and len(self.allreduce_ns) != warmup + timed_steps:
            raise RuntimeError(f"rank {self.rank} timed {len(self.allreduce_ns)} steps' all-reduce, not the "
                               f"{warmup} warm-up + {timed_steps} timed steps of its loop")
        timed = self.allreduce_ns[warmup:] if result.get("status") == "done" else []
        applied = result.get("applied") or {}
        return {"rank": self.rank, "local_rank": self.local_rank, "host": socket.gethostname(), "pid": os.getpid(),
                "node": self.node, "address": self.address, "machine": {**machine_facts(), "address": self.address},
                "numa_nodes": numa_nodes(self.cpus),
                "slice": self.cpus, "result": result, "first_step_start": self.first_step_start,
                "allreduce_ms": statistics.median(timed) / 1e6 if timed else None,
                "losses": [float(loss) for loss in self.losses],
                "readback": {k: applied.get(k) for k in PER_RANK_READBACK}}


def local_address(peer: str, port: int) -> str:
    """This host's address on the route to the rendezvous host (a connected UDP socket sends nothing): the
    interface gloo's traffic to the other nodes leaves by."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def numa_nodes(cpus: list[int]) -> list[int]:
    """The NUMA nodes of a rank's slice (sysfs cpuN/nodeM links). Its memory follows first touch from
    its pinned threads, so it lands on them: no membind of its own."""
    found = set()
    for cpu in cpus:
        try:
            found |= {int(n[4:]) for n in os.listdir(f"/sys/devices/system/cpu/cpu{cpu}")
                      if n[:4] == "node" and n[4:].isdigit()}
        except OSError:
            pass
    return sorted(found)


def machine_facts() -> dict:
    """The node's machine as a rank sees it: host, CPU model, logical CPUs, kernel."""
    import platform

    model = None
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu_model": model, "logical_cpus": os.cpu_count(),
            "kernel": platform.release()}


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def rank_main(run_dir: Path) -> None:
    """A rank: die with its launcher, pin to its slice, join the group, train, gather to rank 0."""
    from common.processes import set_parent_death_signal

    set_parent_death_signal(int(os.environ.get(ENV_LAUNCHER_PID, os.getppid())))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    mine = slices(sorted(os.sched_getaffinity(0)), local_world)[local_rank]
    os.sched_setaffinity(0, mine)
    if os.environ.get("OMP_PLACES"):  # pin_threads: the rank's threads bound to its own slice
        os.environ["OMP_PLACES"] = ",".join(f"{{{cpu}}}" for cpu in mine)
    request = json.loads((run_dir / "request.json").read_text())

    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    from worker.trainers import session as shared
    from worker.trainers.torch import train as one_process

    @record
    def train() -> None:
        # Joining waits as long as the rendezvous does (another node's launcher, started by srun, imports torch
        # seconds after this one); the training's collectives get the collective timeout, in a group of their own
        timeout_s = float(request["collective_timeout_s"])
        dist.init_process_group(BACKEND, timeout=timedelta(seconds=max(timeout_s, RENDEZVOUS_TIMEOUT_S)))
        group = dist.new_group(timeout=timedelta(seconds=timeout_s)) if timeout_s < RENDEZVOUS_TIMEOUT_S else None
        dp = Rank(rank, world, local_rank, run_dir, mine, group)
        (run_dir / NODE_FILE.format(rank=rank)).write_text(json.dumps(
            {"rank": rank, "node": dp.node, "host": socket.gethostname(), "address": dp.address}))
        mine_request = {**request, "output_dir": request.get("output_dir") if rank == 0 else None}
        result = shared.train(mine_request, one_process.Session.on_rank(dp), one_process._T0)
        records = [None] * world if rank == 0 else None
        dist.gather_object(dp.record(result, request["config"]), records, dst=0, group=group)
        if rank == 0:
            merged = merge(records, request)
            (run_dir / (RESULT + ".tmp")).write_text(json.dumps(merged))
            os.replace(run_dir / (RESULT + ".tmp"), run_dir / RESULT)
        dist.barrier(group=group)  # every rank leaves together, after rank 0 wrote the result

    # Leave without C++ teardown, whether train() returned or raised: a rank that destroyed its gloo group
    # and exited normally was killed by SIGABRT ("terminate called without an active exception", a joinable
    # thread destroyed at exit) in about 1 run in 3 here, failing a run whose result was already written;
    # and a rank whose collective timed out was once killed the same way after its error, so that the run's
    # reason named it as killed by SIGABRT instead of the rank that hung. @record has written the error
    # file the launcher reads; nothing is left to flush but Python's own streams.
    try:
        train()
    except BaseException:
        traceback.print_exc()
        _leave(1)
    _leave(0)


def _leave(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- merging the ranks' results ----------------------------------------------------------------------------


def merge(records: list[dict], request: dict) -> dict:
    """Rank 0's answer to the worker: one harness result over every rank (see the module docstring)."""
    from worker.trainers import harness

    config = request["config"]
    records = sorted(records, key=lambda r: r["rank"])
    first = records[0]["result"]
    if any(r["result"]["status"] != "done" for r in records):
        return next(r["result"] for r in records if r["result"]["status"] != "done")
    world = len(records)
    slowest = max(records, key=lambda r: r["result"]["metrics"]["step_ms_median"])
    metrics = dict(slowest["result"]["metrics"])
    every = [r["result"]["metrics"] for r in records]
    for name in ("loss_first", "loss_last"):
        metrics[name] = statistics.fmean(m[name] for m in every)
    for name in ("cpu_user_s", "cpu_sys_s", "ctx_switches", "peak_rss_mb"):
        metrics[name] = sum(m[name] for m in every)
    samples = config["batch_size"] * config["grad_accum"] * world
    median_s = metrics["step_ms_median"] / 1e3
    metrics.update(world_size=world, global_batch=samples, tokens_per_s=samples * config["seq_len"] / median_s,
                   samples_per_s=samples / median_s, allreduce_ms=slowest["allreduce_ms"])
    metrics["allreduce_share"] = (metrics["allreduce_ms"] / metrics["step_ms_median"]
                                  if metrics["allreduce_ms"] is not None else None)
    metrics |= harness.throughput(metrics, {**config, "batch_size": config["batch_size"] * world},
                                  request.get("peak_gflops"))
    here = [r for r in records if r["node"] == records[0]["node"] and r["first_step_start"] is not None]
    metrics["setup_s"] = max(r["first_step_start"] for r in here) - float(request["launcher_t0"])
    applied = dict(first["applied"])
    applied["affinity"] = sorted({cpu for r in here for cpu in (r["readback"]["affinity"] or [])})
    applied["ranks"] = [{"rank": r["rank"], "node": r["node"], "local_rank": r["local_rank"], "host": r["host"],
                         "address": r["address"],
                         "pid": r["pid"], "numa_nodes": r["numa_nodes"],
                         "slice": r["slice"], **r["readback"],
                         "step_ms_median": r["result"]["metrics"]["step_ms_median"],
                         "allreduce_ms": r["allreduce_ms"], "losses": r["losses"]}
                        for r in records]
    applied["data_parallel"] = {
        "launcher": LAUNCHER, "backend": BACKEND, "world_size": world, "nodes": int(config.get("nodes", 1)),
        "ranks_per_node": int(config.get("ranks", 1)), "rendezvous": request["rendezvous"],
        "machines": {str(r["node"]): r["machine"] for r in records}, "global_batch": samples,
        "collective_timeout_s": request["collective_timeout_s"], "allreduce_timing": ALLREDUCE_TIMING,
        "step_time": f"rank {slowest['rank']}'s (the slowest median)"}
    windows = [r["result"]["timed_window"] for r in records]
    window = {"start_unix_s": min(w["start_unix_s"] for w in windows),
              "end_unix_s": max(w["end_unix_s"] for w in windows),
              "compilations": windows[0].get("compilations"),
              "slowest_step_x_median": max((w.get("slowest_step_x_median") or 0) for w in windows) or None}
    return {**first, "metrics": {m: metrics[m] for m in harness.TRAINER_METRICS}, "applied": applied,
            "timed_window": window}


if __name__ == "__main__":
    if sys.argv[1] == "--node":
        node_main(Path(sys.argv[2]))
    else:
        rank_main(Path(sys.argv[1]))
