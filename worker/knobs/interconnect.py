"""The `interconnect` setting: the rate of the links between a job's nodes, shaped with the kernel's
token bucket filter (tc qdisc tbf) for the run and put back after, as the sysfs knobs are
(worker/knobs/system.py: available / read / apply / restore, journaled before the first write).

Which links: the worker shapes only what it is handed, never guesses an interface.
BENCH_INTERCONNECT_LINKS names them, space-separated, each `NETNS:DEVICE` (the device inside that
network namespace, reached by `nsenter --net=/run/netns/NETNS`) or `DEVICE` (one in the worker's own
namespace). Every packet between two nodes leaves one node's device once, so each node's device on
the nodes' network is listed (tests/netcluster.py: `Cluster.links()`, each node's eth0).

Only a link whose root qdisc is the kernel's own (handle 0:, e.g. noqueue on a veth, fq_codel or mq on
a NIC) is shaped: restoring means deleting the tbf, which gives the kernel's default back. A link
someone already shaped is left alone and the run skipped, naming it. Rates only: a delay needs
netem, which this kernel (and many VMs' kernels) does not have; the catalogue offers no delay.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.errors import BenchError

DEFAULT = "default"
LINKS_ENV = "BENCH_INTERCONNECT_LINKS"
# tbf's bucket: at least rate x the kernel timer's tick (tc-tbf(8)); 256 kB holds 2 ms at 1 Gbit/s, and
# a queue of 100 ms before drops keeps gloo's bursts from being dropped at low rates
BURST = "256kb"
LATENCY = "100ms"
UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
State = dict  # {link: its root qdisc line as `tc qdisc show` prints it}


def rate_bits(text: str) -> float:
    """'1gbit', '1Gbit', '10Mbit', '125Mbps' -> bits per second (tc's units: SI, bps = bytes/s)."""
    m = re.fullmatch(r"([\d.]+)([kmgt]?)(bit|bps)", text.strip().lower())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * UNITS[m.group(2)] * (8 if m.group(3) == "bps" else 1)


def links() -> list[str]:
    return os.environ.get(LINKS_ENV, "").split()


def _tc(link: str, command: str, *args: str) -> subprocess.CompletedProcess:
    """`tc qdisc COMMAND dev DEVICE ARGS` on the link, in its namespace."""
    netns, _, device = link.rpartition(":")
    prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    return subprocess.run([*prefix, "tc", "qdisc", command, "dev", device, *args], capture_output=True, text=True)


def _root_line(link: str) -> str:
    proc = _tc(link, "show")
    if proc.returncode != 0:
        raise BenchError(f"interconnect: cannot read {link}'s queueing discipline: {proc.stderr.strip()}")
    roots = [line.strip() for line in proc.stdout.splitlines() if " root " in f"{line} "]
    return roots[0] if roots else ""


def _root_or_none(link: str) -> str | None:
    try:
        return _root_line(link)
    except BenchError:
        return None  # the link is gone (its node's namespace removed), and its qdisc with it


def _kernels_own(line: str) -> bool:
    return line == "" or re.match(r"qdisc \S+ 0: root", line) is not None


def _rate_of(line: str) -> str | None:
    m = re.search(r"\btbf\b.*?\brate (\S+)", line)
    return m.group(1) if m else None


class Interconnect:
    """The Knob shape for tc: the state of a link is its root qdisc line."""

    name = "interconnect"

    def __init__(self, config: dict, record: dict | None = None):
        self.config = config
        self.links = links()
        self.record = {} if record is None else record

    def available(self, target) -> str | None:
        if target == DEFAULT:
            return None
        if self.config.get("nodes", 1) < 2:
            return f"interconnect={target}: a job on one node has no link between nodes to shape (nodes=1)"
        if not self.links:
            return (f"interconnect={target}: no link between nodes handed to this worker ({LINKS_ENV} names each "
                    "node's NETNS:DEVICE; docs/clusters.md)")
        if os.geteuid() != 0:
            return f"interconnect={target}: shaping a link with tc needs root"
        if shutil.which("tc") is None:
            return f"interconnect={target}: tc not found (apt-get install iproute2)"
        for link in self.links:
            proc = _tc(link, "show")
            if proc.returncode != 0:
                return f"interconnect={target}: cannot read {link}: {proc.stderr.strip() or proc.returncode}"
            line = next((x.strip() for x in proc.stdout.splitlines() if " root " in f"{x} "), "")
            if not _kernels_own(line):
                return f"interconnect={target}: {link} is already shaped by someone else ({line}); left alone"
        return None

    def read(self) -> State:
        return {link: _root_line(link) for link in self.links}

    def apply(self, target) -> State:
        saved = self.read()
        if target != DEFAULT:
            for link in self.links:
                proc = _tc(link, "replace", "root", "tbf", "rate", target, "burst", BURST, "latency", LATENCY)
                if proc.returncode != 0:
                    raise BenchError(f"interconnect: tc refused tbf rate {target} on {link}: {proc.stderr.strip()}")
        now = self.read()
        if target != DEFAULT:
            for link, line in now.items():
                rate = _rate_of(line)
                if rate is None or abs(rate_bits(rate) - rate_bits(target)) > rate_bits(target) / 100:
                    raise BenchError(f"interconnect: set tbf rate {target} on {link}, tc reads back '{line}'")
        rates = {_rate_of(line) for line in now.values()}
        self.record["interconnect"] = {"links": now,
                                       "rate": rates.pop() if len(rates) == 1 else sorted(map(str, rates)),
                                       "qdisc": "tbf" if target != DEFAULT else None}
        return saved

    def restore(self, saved: State) -> None:
        for link, line in saved.items():
            now = _root_or_none(link)
            if now is not None and _kernels_own(line) and not _kernels_own(now):
                _tc(link, "del", "root")


def unavailable(config: dict) -> str | None:
    return Interconnect(config).available(config.get("interconnect", DEFAULT))


def machine_availability() -> str | None:
    return Interconnect({"nodes": 2}).available("1gbit")


@contextmanager
def applied(config: dict, *, journal_path: Path, record: dict) -> Iterator[None]:
    """Shape the links for the job (journaled first), record what tc reads back, restore on exit."""
    restore_journal(journal_path)
    target = config.get("interconnect", DEFAULT)
    knob = Interconnect(config, record)
    why = knob.available(target)
    if why:
        raise BenchError("cannot apply this job's settings here: " + why)
    if target == DEFAULT:
        if knob.links:  # untouched, but what the links were is part of what the run ran over
            knob.apply(DEFAULT)
        yield
        return
    saved = knob.read()
    _write_journal(journal_path, saved)
    try:
        knob.apply(target)
        yield
    finally:
        knob.restore(saved)
        journal_path.unlink(missing_ok=True)


def _write_journal(journal_path: Path, saved: State) -> None:
    journal_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal_path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "time": time.time(), "links": saved}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(journal_path)


def restore_journal(journal_path: Path) -> list[str]:
    """Put back the links a killed worker left shaped; lines of what was restored."""
    try:
        saved = json.loads(Path(journal_path).read_text())["links"]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError):
        raise BenchError(f"{journal_path}: unreadable journal; check and delete it by hand") from None
    before = {link: _root_or_none(link) for link in saved}
    Interconnect({}, {}).restore(saved)
    Path(journal_path).unlink(missing_ok=True)
    after = {link: _root_or_none(link) for link in saved}
    return [f"{link}: {before[link]} -> {after[link] or 'no root qdisc'}"
            for link in saved if before[link] != after[link]]
