"""A SLURM cluster of several nodes on one machine, for tests and benchmarks/slurm_cluster.py.

Each node is a network namespace of its own (an address on one bridge, a hostname in a UTS namespace,
an /etc/hosts naming every node, bind-mounted in a mount namespace of its own) with a slurmd pinned to
its own CPUs; slurmctld, munged and a PostgreSQL server run in the machine's namespace on the bridge's
address, so every node reaches them as a cluster's nodes reach their head node. Everything carries one
tag (namespaces, interfaces, a temp dir), and `leftovers(tag)` lists whatever of it outlived the
cluster: the tests assert it is empty.

    bridge <tag>br 10.213.S.1/24 (slurmctld, munged's socket is a file, PostgreSQL)
      |-- veth <tag>n0 == eth0 in netns <tag>n0, hostname <tag>n0, 10.213.S.10, slurmd on CPU 0
      |-- veth <tag>n1 == eth0 in netns <tag>n1, hostname <tag>n1, 10.213.S.11, slurmd on CPU 1

Every packet between two nodes leaves one node's eth0 once: `shape` puts a tbf on each node's eth0
(the kernel's queueing disciplines: this VM's kernel has tbf and htb, not netem, so a delay cannot be
added: `qdisc_support` says so). `cut`/`mend` take a node's link down and up (ip link set ... down).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.pgserver import Server, postgres_server
from tests.slurm import _free_port, _wait

PREFIX = "cbn"  # every namespace, interface and temp dir of these clusters starts with it
SLURMD_TIMEOUT_S = 5  # slurmctld marks a silent node DOWN after this (the node-loss tests wait for it)


def why_not() -> str | None:
    """Why a namespace cluster cannot be built here, or None."""
    missing = [b for b in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "ip", "tc",
                           "unshare") if shutil.which(b) is None]
    if missing:
        return (f"a namespace SLURM cluster needs {', '.join(missing)} (apt-get install slurm-wlm munge iproute2 "
                "util-linux)")
    if os.geteuid() != 0:
        return "building network namespaces and starting slurmd needs root"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces are not allowed here: {probe.stderr.strip()}"
    return None


def qdisc_support(kind: str) -> str | None:
    """None if the kernel has this queueing discipline, else why not (tried in a throwaway namespace)."""
    args = {"tbf": ["tbf", "rate", "1gbit", "burst", "128kb", "latency", "50ms"], "htb": ["htb", "default", "1"],
            "netem": ["netem", "delay", "1ms"]}[kind]
    proc = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", *args], capture_output=True,
                          text=True)
    return None if proc.returncode == 0 else f"this kernel has no {kind} queueing discipline ({proc.stderr.strip()})"


@dataclass
class Node:
    name: str  # hostname = SLURM NodeName = netns name = root-side veth name
    address: str
    cpus: list[int]
    slurmd: subprocess.Popen | None = None


@dataclass
class Cluster:
    tag: str
    root: Path
    subnet: str  # 10.213.S
    nodes: list[Node]
    env: dict[str, str]  # what SLURM's clients need (SLURM_CONF)
    pg: Server | None = None
    conf: Path = Path()
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def head(self) -> str:
        return f"{self.subnet}.1"

    def db_url(self, name: str = "postgres") -> str:
        """The PostgreSQL URL as the nodes reach it (the bridge's address)."""
        assert self.pg is not None
        return self.pg.url.replace("127.0.0.1", self.head).rsplit("/", 1)[0] + f"/{name}"

    def on_node(self, node: Node, argv: list[str]) -> list[str]:
        """argv run as a process of `node`: its netns, hostname and /etc/hosts."""
        hosts = self.root / "hosts"
        # nsenter, not `ip netns exec`: that mounts a fresh /sys, without the cgroup tree slurmd needs
        return ["nsenter", f"--net=/run/netns/{node.name}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", f'mount --bind {hosts} /etc/hosts && hostname {node.name} && exec "$@"', "sh", *argv]

    def start_slurmd(self, node: Node) -> None:
        log = open(self.root / f"slurmd-{node.name}.err", "a")
        node.slurmd = subprocess.Popen(["taskset", "-c", ",".join(map(str, node.cpus)),
                                        *self.on_node(node, ["slurmd", "-D", "-f", str(self.conf)])],
                                       env={**os.environ, **self.env}, stdout=subprocess.DEVNULL, stderr=log)

    def kill_slurmd(self, node: Node) -> None:
        """SIGKILL to the node's slurmd (the daemon only: its job steps' slurmstepd go on)."""
        for pid in netns_pids(node.name):
            if _comm(pid) == "slurmd":
                os.kill(pid, signal.SIGKILL)
        if node.slurmd is not None:
            node.slurmd.wait()

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env={**os.environ, **self.env}, capture_output=True,
                             text=True)
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 60) -> None:
        def idle() -> bool:
            states = self.node_states()
            return len(states) == len(self.nodes) and all(s.rstrip("*") == "idle" for s in states.values())

        _wait(idle, timeout, "every node idle", [self.root / "slurmctld.log", *self.root.glob("slurmd-*")])

    def cut(self, node: Node) -> None:
        subprocess.run(["ip", "link", "set", node.name, "down"], check=True)

    def mend(self, node: Node) -> None:
        subprocess.run(["ip", "link", "set", node.name, "up"], check=True)

    def shape(self, rate: str | None) -> None:
        """A tbf of `rate` (e.g. '1gbit') on every node's eth0, or none (None)."""
        for node in self.nodes:
            shape_link(node.name, "eth0", rate)

    def links(self) -> str:
        """BENCH_INTERCONNECT_LINKS for the worker: the links it may shape (netns:device)."""
        return " ".join(f"{node.name}:eth0" for node in self.nodes)

    def rank_processes(self) -> dict[str, list[int]]:
        """Per node, the torch.distributed processes (launchers and ranks) still in its namespace."""
        found = {}
        for node in self.nodes:
            pids = [p for p in netns_pids(node.name) if "worker.trainers.torch" in _cmdline(p)]
            if pids:
                found[node.name] = pids
        return found


def shape_link(netns: str, device: str, rate: str | None) -> None:
    subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", device, "root"], capture_output=True)
    if rate:
        # burst: at least rate x 1 ms of the kernel's timer (tc's rule of thumb), at least 64 kB
        subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", rate,
                        "burst", "256kb", "latency", "100ms"], check=True, capture_output=True)


def netns_pids(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def leftovers(tag: str) -> list[str]:
    """Whatever of cluster `tag` still exists: namespaces, interfaces, processes of its temp dir, the dir."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found += [f"netns {n}" for n in netns if n.startswith(tag)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    found += [f"interface {line.split(':')[1].strip()}" for line in links if line.split(":")[1].strip().startswith(tag)]
    roots = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{tag}-*")]
    found += [f"directory {r}" for r in roots]
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        cmd = _cmdline(pid)
        if any(r in cmd for r in roots) or f"/run/netns/{tag}" in cmd:
            found.append(f"process {pid} {cmd[:120]}")
    return found


def _subnet() -> str:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        subnet = f"10.213.{random.randrange(256)}"
        if f" {subnet}." not in used:
            return subnet
    raise RuntimeError("no free 10.213.x.0/24 subnet")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextmanager
def namespace_cluster(n_nodes: int = 2, *, postgres: bool = True) -> Iterator[Cluster]:
    """Build the cluster, yield it, tear every part of it down (also when building failed half-way)."""
    reason = why_not()
    if reason:
        raise RuntimeError(reason)
    tag = f"{PREFIX}{random.randrange(16**4):04x}"
    root = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    os.chmod(root, 0o755)
    subnet = _subnet()
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // n_nodes)  # each node its own CPUs where there are enough; shared otherwise
    nodes = [Node(f"{tag}n{i}", f"{subnet}.{10 + i}", cpus[(i * per) % len(cpus):(i * per) % len(cpus) + per])
             for i in range(n_nodes)]
    cluster = Cluster(tag, root, subnet, nodes, env={})
    server = None
    try:
        bridge = f"{tag}br"
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{subnet}.1/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for node in nodes:
            _run("ip", "netns", "add", node.name)
            _run("ip", "link", "add", node.name, "type", "veth", "peer", "name", f"{node.name}p")
            _run("ip", "link", "set", f"{node.name}p", "netns", node.name)
            _run("ip", "netns", "exec", node.name, "ip", "link", "set", f"{node.name}p", "name", "eth0")
            _run("ip", "netns", "exec", node.name, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            _run("ip", "netns", "exec", node.name, "ip", "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", node.name, "ip", "link", "set", "lo", "up")
            # the machine's own addresses (an srun on the host says where to call back) through the head
            _run("ip", "netns", "exec", node.name, "ip", "route", "add", "default", "via", f"{subnet}.1")
            _run("ip", "link", "set", node.name, "master", bridge)
            _run("ip", "link", "set", node.name, "up")
        host = socket.gethostname()
        (root / "hosts").write_text("127.0.0.1 localhost\n" + f"{subnet}.1 {host}\n"
                                    + "".join(f"{n.address} {n.name}\n" for n in nodes))
        os.chmod(root / "hosts", 0o644)
        if postgres:
            server_cm = postgres_server(listen=("127.0.0.1", f"{subnet}.1"), trust=(f"{subnet}.0/24",))
            server = server_cm
            cluster.pg = server_cm.__enter__()

        key, sock = root / "munge.key", root / "munge.socket"
        _run("mungekey", "--create", f"--keyfile={key}")
        os.chmod(key, 0o600)
        cluster._procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
             f"--seed-file={root / 'munge.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(sock.exists, 15, "munged", [root / "munged.log"])
        (root / "state").mkdir()
        for node in nodes:
            (root / f"spool-{node.name}").mkdir()
        node_lines = "".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={len(n.cpus)} "
                             "RealMemory=1000 State=UNKNOWN\n" for n in nodes)
        cluster.conf = conf = root / "slurm.conf"
        conf.write_text(f"""ClusterName={tag}
SlurmctldHost={host}({subnet}.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
# task/none: a step's tasks keep the CPUs of their node's slurmd (taskset at its start): the nodes'
# own CPUs on this one machine
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
MessageTimeout=5
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root}/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
InactiveLimit=0
KillWait=5
MinJobAge=300
{node_lines}PartitionName=bench Nodes={','.join(n.name for n in nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        cluster.env = {"SLURM_CONF": str(conf), "BENCH_SLURM_ROOT": str(root)}
        cluster._procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)],
                                               env={**os.environ, **cluster.env}, stdout=subprocess.DEVNULL,
                                               stderr=open(root / "slurmctld.err", "w")))
        for node in nodes:
            cluster.start_slurmd(node)
        cluster.wait_idle(60)
        yield cluster
    finally:
        teardown(cluster, server)


def teardown(cluster: Cluster, server) -> None:
    """Stop everything the cluster started, in reverse, and remove its namespaces, links and dir."""
    env = {**os.environ, **cluster.env}
    if cluster.env:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True)
    for node in cluster.nodes:
        if node.slurmd is not None and node.slurmd.poll() is None:
            node.slurmd.terminate()
            try:
                node.slurmd.wait(timeout=15)
            except subprocess.TimeoutExpired:
                node.slurmd.kill()
                node.slurmd.wait()
    for node in cluster.nodes:  # what a killed slurmd or a cut link left running in the node
        for pid in netns_pids(node.name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in reversed(cluster._procs):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if server is not None:
        server.__exit__(None, None, None)
    for node in cluster.nodes:
        subprocess.run(["ip", "link", "del", node.name], capture_output=True)
        deadline = time.monotonic() + 10
        while netns_pids(node.name) and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(["ip", "netns", "del", node.name], capture_output=True)
    subprocess.run(["ip", "link", "del", f"{cluster.tag}br"], capture_output=True)
    shutil.rmtree(cluster.root, ignore_errors=True)


if __name__ == "__main__":
    with namespace_cluster() as c:
        print(subprocess.run(["sinfo", "-N"], env={**os.environ, **c.env}, capture_output=True, text=True).stdout)
        out = subprocess.run(["srun", "-N2", "sh", "-c", "echo $(hostname) $(hostname -I) $(taskset -pc $$)"],
                             env={**os.environ, **c.env}, capture_output=True, text=True)
        print(out.stdout, out.stderr)
        tag = c.tag
    print("leftovers:", leftovers(tag))
