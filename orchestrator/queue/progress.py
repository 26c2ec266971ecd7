"""Where a sweep stands while workers run: progress per pool and machine (done, running and since
when, failed, skipped, queued, ETA), the running runs and the last failures, and those in words
(ETA, queued jobs, clock times). A pool's queued jobs wider than its workers (passed over by them:
eta.wider_waiting) are said apart and left out of its ETA.

progress() is a handful of aggregate queries over indexed columns (runs by pool and status), so it
costs the same at 100 runs and at a million; `bench.py status` prints it, and `report --watch`
(orchestrator/report/watch.py) puts it first on the page.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from sqlalchemy import text

from orchestrator.queue.store import Store

# Runs per pool, machine and status, with the oldest claim of the running ones and the last finish.
SELECT_PROGRESS = """
SELECT r.pool_id, p.name AS pool_name, r.machine_id, m.hostname, r.status, COUNT(*) AS n,
       MIN(CASE WHEN r.status = 'running' THEN r.claimed END) AS running_since, MAX(r.finished) AS last_finished
FROM runs r JOIN pools p ON p.pool_id = r.pool_id JOIN machines m ON m.machine_id = r.machine_id
WHERE r.status <> 'queued'
GROUP BY r.pool_id, p.name, r.machine_id, m.hostname, r.status
"""
# Running and failed runs found through the (pool_id, status) index, pool by pool: a scan of the runs
# table reads every row, and a real run's row holds its ~3 KB applied (1M realistic runs: ~0.7 s each).
SELECT_RUNNING = """
SELECT r.run_id, r.pool_id, r.machine_id, r.worker_host, r.claimed, r.heartbeat, j.config
FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.pool_id IN (SELECT pool_id FROM pools) AND r.status = 'running' ORDER BY r.claimed LIMIT :limit
"""
SELECT_FAILURES = """
SELECT r.run_id, r.pool_id, r.machine_id, r.worker_host, r.status, r.finished, r.reason
FROM runs r WHERE r.pool_id IN (SELECT pool_id FROM pools) AND r.status IN ('failed', 'skipped')
ORDER BY r.finished DESC, r.run_id DESC LIMIT :limit
"""
SELECT_NOW = {"sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
              "postgresql": "SELECT CAST(extract(epoch from clock_timestamp()) AS DOUBLE PRECISION)"}
RUNNING_SHOWN = 20
FAILURES_SHOWN = 10
STATES = ("done", "running", "failed", "skipped")


@dataclass
class MachineProgress:
    machine_id: int
    hostname: str | None
    done: int = 0
    running: int = 0
    failed: int = 0
    skipped: int = 0
    running_since: float | None = None  # the oldest claim of its running runs (unix s)
    last_finished: float | None = None


@dataclass
class PoolProgress:
    pool_id: int
    label: str
    total: int  # jobs the pool runs (each once)
    queued: int = 0  # its jobs not run yet, `waiting` among them
    waiting: int = 0  # queued jobs wider than its workers, which wait for a wider one (eta.wider_waiting)
    widest: int | None = None  # the most cores of a job it ran (where that tells whether jobs wait)
    done: int = 0
    running: int = 0
    failed: int = 0
    skipped: int = 0
    eta_s: float | None = None  # the queued jobs' estimated time (queue/eta.py), split over its busy machines
    machines: list[MachineProgress] = field(default_factory=list)
    # A machine's own pool under `--budget` (orchestrator/queue/budget.py): its length, what its runs spent, and
    # how it ended ('spent', 'resolved'; None while it runs). The budget, not the queue, says when it ends.
    budget_s: float | None = None
    budget_spent_s: float | None = None
    budget_ended: str | None = None


@dataclass
class Progress:
    now: float  # the database's clock (unix s)
    jobs: int
    pools: list[PoolProgress]
    running: list[dict]  # the running runs, oldest claim first (at most RUNNING_SHOWN)
    failures: list[dict]  # the latest failed and skipped runs, newest first (at most FAILURES_SHOWN)

    @property
    def fingerprint(self) -> tuple:
        """What changes when a run finishes anywhere (the statistics follow the finished runs)."""
        return tuple((p.pool_id, m.machine_id, m.done, m.failed, m.skipped, m.last_finished)
                     for p in self.pools for m in p.machines)

    def as_dict(self) -> dict:
        return {"now": self.now, "jobs": self.jobs, "pools": [asdict(p) for p in self.pools],
                "running": self.running, "failures": self.failures}


_eta_cache: dict[tuple, tuple] = {}  # (database, pool) -> (its counts when estimated, seconds left)


def progress(store: Store, *, eta: bool = True) -> Progress:
    """Where every pool and machine stands now, from aggregates (no run is read one by one but the
    RUNNING_SHOWN running and FAILURES_SHOWN latest failures)."""
    from orchestrator.queue.eta import estimate_remaining_s, wider_waiting

    with store.transaction(snapshot=True) as conn:  # its statements' counts agree while workers write
        now = float(conn.exec_driver_sql(SELECT_NOW[store.dialect]).scalar_one())
        jobs = int(conn.exec_driver_sql("SELECT COUNT(*) FROM jobs").scalar_one())
        rows = conn.execute(text(SELECT_PROGRESS)).all()
        running = conn.execute(text(SELECT_RUNNING), {"limit": RUNNING_SHOWN}).all()
        failures = conn.execute(text(SELECT_FAILURES), {"limit": FAILURES_SHOWN}).all()
        wider = {pool_id: wider_waiting(conn, pool_id) for pool_id in {r[0] for r in rows}}
    pools: dict[int, PoolProgress] = {}
    for pool_id, pool_name, machine_id, hostname, status, n, since, last in rows:
        label = pool_name if pool_name is not None else f"machine {machine_id} ({hostname or '?'})"
        p = pools.setdefault(pool_id, PoolProgress(pool_id, label, jobs))
        m = next((x for x in p.machines if x.machine_id == machine_id), None)
        if m is None:
            m = MachineProgress(machine_id, hostname)
            p.machines.append(m)
        if status in STATES:
            setattr(m, status, getattr(m, status) + int(n))
            setattr(p, status, getattr(p, status) + int(n))
        if since is not None:
            m.running_since = float(since) if m.running_since is None else min(m.running_since, float(since))
        if last is not None:
            m.last_finished = float(last) if m.last_finished is None else max(m.last_finished, float(last))
    for p in pools.values():
        p.queued = max(0, p.total - sum(getattr(p, s) for s in STATES))
        p.waiting, p.widest = wider[p.pool_id]
        p.waiting = min(p.waiting, p.queued)
        p.machines.sort(key=lambda m: m.machine_id)
        if eta and p.queued > p.waiting and p.done:
            # The queued jobs' estimate reads the pool's queue: redone only when a run of it finished.
            key, state = (store.url, p.pool_id), (p.done, p.failed, p.skipped, p.queued, p.waiting)
            if _eta_cache.get(key, (None,))[0] != state:
                _eta_cache[key] = (state, estimate_remaining_s(store, p.machines[0].machine_id, pool_id=p.pool_id,
                                                               wider=wider[p.pool_id]))
            left = _eta_cache[key][1]
            busy = sum(1 for m in p.machines if m.running) or 1
            p.eta_s = None if left is None else left / busy
    _budgets(store, pools)
    labels = {p.pool_id: p.label for p in pools.values()}
    return Progress(
        now, jobs, sorted(pools.values(), key=lambda p: p.pool_id),
        [{"run_id": r[0], "pool": labels.get(r[1], str(r[1])), "machine_id": r[2], "host": r[3], "claimed": r[4],
          "heartbeat": r[5], "config": _config_words(r[6])} for r in running],
        [{"run_id": r[0], "pool": labels.get(r[1], str(r[1])), "machine_id": r[2], "host": r[3], "status": r[4],
          "finished": r[5], "reason": short_reason(r[6])} for r in failures])


# The newest budget of each machine (its own pool), with its last decision.
SELECT_BUDGETS = """
SELECT b.budget_id, b.machine_id, b.sweep_id, b.budget_s, p.pool_id,
       (SELECT d.decision FROM budget_decisions d WHERE d.budget_id = b.budget_id ORDER BY d.decision_id DESC LIMIT 1)
FROM budgets b JOIN pools p ON p.machine_id = b.machine_id
WHERE b.budget_id = (SELECT MAX(budget_id) FROM budgets WHERE machine_id = b.machine_id)
"""


def _budgets(store: Store, pools: dict[int, "PoolProgress"]) -> None:
    """Each machine pool's budget, where it has one (orchestrator/queue/budget.py): the bar counts against it."""
    from orchestrator.queue import budget
    from orchestrator.queue.migrations import table_names

    with store.transaction() as conn:
        if "budgets" not in table_names(conn, store.dialect):
            return
        rows = conn.execute(text(SELECT_BUDGETS)).all()
    for budget_id, machine_id, sweep_id, budget_s, pool_id, last in rows:
        p = pools.get(pool_id)
        if p is None:
            continue
        b = budget.Budget(budget_id, machine_id, sweep_id, float(budget_s))
        p.budget_s, p.budget_spent_s = b.budget_s, budget.spent_s(store, b)
        p.budget_ended = last if last in ("spent", "resolved") else None


def _config_words(config_json: str | None) -> str:
    """A running job in a few words: the sizes that say how long it takes."""
    import json

    try:
        c = json.loads(config_json or "{}")
    except ValueError:
        return ""
    keys = ("framework", "n_layers", "d_model", "seq_len", "batch_size", "cores", "precision", "repeat")
    return ", ".join(f"{k}={c[k]}" for k in keys if k in c)


# -- words --------------------------------------------------------------------------------------

def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def clock(unix_s: float | None) -> str:
    return "-" if unix_s is None else time.strftime("%H:%M:%S", time.gmtime(unix_s))


def queued_words(p: PoolProgress) -> str:
    """A pool's queued jobs, those that wait for a wider worker than its own said apart."""
    if not p.waiting:
        return f"{p.queued:,}"
    plural = "s" if p.widest != 1 else ""
    return f"{p.queued - p.waiting:,} + {p.waiting:,} wider than its workers (> {p.widest} CPU{plural})"


def eta_words(p: PoolProgress, now: float) -> str:
    """When a pool's queued jobs should be done (those its workers can run), or why there is no time: a
    pool with no run running has no worker to finish them by any time, only their work left. Under a
    budget: what is left of it (the allocation adds runs until it is spent, unless all is resolved first)."""
    if p.budget_s is not None:
        spent = f"budget {ago(p.budget_spent_s)} of {ago(p.budget_s)} spent"
        if p.budget_ended:
            return spent + ("; every comparison resolved" if p.budget_ended == "resolved" else "")
        left = max(0.0, p.budget_s - p.budget_spent_s)
        return f"{spent}; at most {ago(left)} left" + (f" (by {clock(now + left)} UTC)" if p.running else "")
    if p.eta_s is not None and not p.running:
        return f"{ago(p.eta_s)} of work; no worker running"
    if p.eta_s is not None:
        return f"{ago(p.eta_s)} (at {clock(now + p.eta_s)} UTC)"
    if not p.running and p.queued == p.waiting:
        return "finished" if not p.waiting else "none fits its workers"
    return "-"


def short_reason(reason: str | None) -> str:
    """One line that names the cause: a traceback's last line, otherwise the first line."""
    if not reason:
        return "(no reason recorded)"
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    line = lines[-1] if "Traceback" in reason else lines[0]
    return line if len(line) <= 160 else line[:157] + "..."
