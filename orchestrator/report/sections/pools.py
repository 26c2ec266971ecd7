"""The report's section on pools: queues side by side, and the hosts inside each named pool.

A named pool (`work --pool NAME`) runs each job once on whichever node claims it, so its runs are
one set of measurements taken on several hosts that should be identical; a machine's own pool runs
every job. This section shows, per queue, who ran what and how fast on the configurations the
queues share, and, inside a named pool, whether its hosts agree (a host that is slower on the same
configurations is not identical, and its runs mix into the pool's numbers).
"""

from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict

import numpy as np

from common.variables import NAMES
from orchestrator.stats import effects as fx
from orchestrator.report.tables import markdown_table
from orchestrator.stats.columns import column

METRIC = "step_ms_median"
KEY = tuple(n for n in NAMES if n != "repeat")  # a configuration; repeats of it are its samples


def queues(rows: list[dict]) -> list[dict]:
    """Each queue the runs came from, by (pool id, name): its name ("machine N" for a machine's own),
    its hosts and machines, and its runs done, failed, skipped and running. Both writers list these."""
    # the distinct (pool, machine, hosts, status) of the runs, counted at C speed, then added up per queue
    seen = Counter(zip(column(rows, "pool_id"), column(rows, "pool"),
                       map(operator.itemgetter("machine_id"), rows), column(rows, "worker_host"),
                       column(rows, "hostname"), map(operator.itemgetter("status"), rows)))
    per: dict[tuple, dict] = {}
    for (pool_id, pool, machine, worker_host, hostname, status), n in seen.items():
        key = (pool_id, pool or f"machine {machine}")
        p = per.setdefault(key, {"pool_id": pool_id, "pool": key[1], "hosts": set(), "machines": set(), "done": 0,
                                 "failed": 0, "skipped": 0, "running": 0})
        p["hosts"].add(worker_host or hostname or "?")
        p["machines"].add(machine)
        if status in p:
            p[status] += n
    return [{**p, "hosts": sorted(p["hosts"]), "machines": sorted(p["machines"])} for _, p in sorted(per.items())]


def pool_lines(rows: list[dict], queued: list[dict]) -> list[str]:
    """Markdown lines (none when no named pool has runs): the queues (`queued`: queues(rows)) compared
    on shared configurations, then each named pool's hosts compared with each other."""
    if not any(not q["pool"].startswith("machine ") for q in queued):
        return []
    done = [r for r in rows if r["status"] == "done" and r.get(METRIC)]
    queues = [(q["pool_id"], q["pool"]) for q in queued]
    lines = ["## Pools and machines compared", "",
             "Each machine has its own queue (it runs every job); a named pool shares one queue among "
             "identical nodes (each job once). Step times are medians over repeats, compared on the "
             "configurations both sides finished; the ratio is their geometric mean.", ""]
    ref = queues[0]
    body = []
    for q in queued:
        pool_id = q["pool_id"]
        ratio, shared = _ratio(done, lambda r: r["pool_id"] == pool_id, lambda r: r["pool_id"] == ref[0])
        body.append([q["pool"], ", ".join(q["hosts"]), q["done"], q["failed"], q["skipped"],
                     "reference" if pool_id == ref[0] else (f"{ratio:.2f}x ({shared} shared)" if ratio else "-")])
    header = ["queue", "hosts", "done", "failed", "skipped", f"step time vs {ref[1]}"]
    lines += markdown_table(header, body, escape=False)  # its cells unescaped, as they have always been
    for pool_id, label in queues:
        hosts = sorted({r.get("worker_host") for r in done if r["pool_id"] == pool_id and r.get("worker_host")})
        if label.startswith("machine ") or len(hosts) < 2:
            continue
        lines += [f"Hosts of pool **{label}** against {hosts[0]} (identical nodes should be near 1.00x): "
                  + "; ".join(_host_words(done, pool_id, host, hosts[0]) for host in hosts[1:]) + ".", ""]
    return lines


def _ratio(done: list[dict], mine, theirs) -> tuple[float | None, int]:
    """Geometric mean over shared configurations of (median step time here / median there)."""
    cells: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for r in done:
        key = tuple(r[n] for n in KEY)
        if mine(r):
            cells[key][0].append(float(r[METRIC]))
        if theirs(r):
            cells[key][1].append(float(r[METRIC]))
    logs = [math.log(np.median(a) / np.median(b)) for a, b in cells.values() if a and b]
    return (math.exp(float(np.mean(logs))) if logs else None), len(logs)


def _host_words(done: list[dict], pool_id: int, host: str, ref: str) -> str:
    ratio, shared = _ratio(done, lambda r: r["pool_id"] == pool_id and r.get("worker_host") == host,
                           lambda r: r["pool_id"] == pool_id and r.get("worker_host") == ref)
    if ratio is None:
        return f"{host}: no configuration in common yet"
    return f"{host} {ratio:.2f}x ({shared} configurations in common)"


def machines_compared(analysis) -> tuple[list[int], dict[tuple, dict[int, list[float]]]]:
    """summary.md's machines side by side: the machines with fitted runs, and per configuration as it
    ran (config_key) that more than one of them finished, each machine's step times. Its runs are the
    fitted ones (disturbed runs left out) grouped as they ran; the page's scatter (page_data's
    shared_configs) takes every finished run by its asked-for configuration, so the two can differ
    where runs were disturbed or ran otherwise than asked."""
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ma in analysis.machines.values():
        # the runs of a cell share one key object (as_ran): group on it (cheap), then on the key's values
        # (a key per run hashes every value of it); the step times of a key come in another order, which
        # no median minds
        # (numpy: the runs sorted on their key object's id, stably, the keys taken in the order they first ran)
        if not ma.runs:
            continue
        keys = list(map(operator.methodcaller("config_key"), ma.runs))
        rows = map(operator.attrgetter("row"), ma.runs)
        steps = np.array(list(map(float, map(operator.itemgetter(fx.METRIC), rows))))
        objects = np.array(list(map(id, keys)), dtype=np.uint64)
        order = np.argsort(objects, kind="stable")
        objects, steps = objects[order], steps[order].tolist()
        starts = np.flatnonzero(np.r_[True, objects[1:] != objects[:-1]])
        ends = np.r_[starts[1:], len(objects)].tolist()
        for j in np.argsort(order[starts], kind="stable").tolist():  # by each key object's first run
            start = int(starts[j])
            cells[keys[int(order[start])]][ma.machine_id].extend(steps[start:ends[j]])
    machines = sorted(m for m, ma in analysis.machines.items() if ma.runs)
    shared = {k: v for k, v in cells.items() if len(v) > 1}
    return machines, shared
