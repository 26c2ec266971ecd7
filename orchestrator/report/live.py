"""The live view of a sweep while workers run: progress per pool and machine (done, running and since
when, failed, skipped, queued, ETA), the last failures with their reasons, and `report --watch`,
which keeps result/index.html current. A pool's queued jobs wider than its workers (passed over by
them: eta.wider_waiting) are said apart and left out of its ETA.

progress() is a handful of aggregate queries over indexed columns (runs by pool and status), so it
costs the same at 100 runs and at a million; `bench.py status` prints it too (a PostgreSQL fleet).

watch() redoes the statistics only when runs finished since it last did (the per-pool, per-machine
counts and the latest finish are its fingerprint), and no more often than WATCH_DUTY allows (the
report took T seconds of CPU: the next one waits at least T / WATCH_DUTY), so a watcher on a worker's
machine takes a bounded share of one CPU. The statistics run in a child process at WATCH_NICE (the
workers' runs come first); the watcher itself only reads the progress and rewrites the page, also
while a report is being written, so the progress stays current where the workers leave no CPU idle.
Every write is atomic (a temporary file, then os.replace), so a browser or a copy never sees half a
page; the page reloads itself every --every seconds and keeps its scroll position.
"""

from __future__ import annotations

import html
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sqlalchemy import text

from common.errors import DatabaseUnavailable
from common.patience import DB_RETRY_S, Patience
from common.processes import set_parent_death_signal
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
WATCH_DUTY = 0.1  # the share of one CPU a watcher may spend on the statistics
# `report --watch` runs at the lowest CPU priority: on a machine whose CPUs the workers fill, its
# reports then wait for idle moments instead of taking time from the runs (measured at +17% step
# time at normal priority, benchmarks/watch_overhead.py).
WATCH_NICE = 19
# Stopping the watcher (Ctrl+C) waits this long for an idle report process to leave; one busy with a report
# nobody will read (at nice 19 beside busy workers it can take minutes) is killed at once, its children too.
REPORTER_LEAVES_S = 1.0
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
    eta_s: float | None = None  # the queued jobs' estimated time (orchestrator/queue/eta.py), split over its busy machines
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
    from orchestrator.report.words import short_reason

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
    return f"{p.queued - p.waiting:,} + {p.waiting:,} wider than its workers (> {p.widest} CPU{'s' if p.widest != 1 else ''})"


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


def progress_html(pr: Progress, *, every_s: float, analysed: tuple[float, int] | None, outage: str | None = None) -> str:
    """The page's live section: pools and machines, the running runs, the last failures; first, where the
    database does not answer (`outage`, in words), that this is the progress as it last answered."""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731
    rows = []
    for p in pr.pools:
        rows.append(f"<tr class='pool'><td><b>{e(p.label)}</b></td><td></td><td>{p.done:,}</td><td>{p.running:,}</td>"
                    f"<td>{p.failed:,}</td><td>{p.skipped:,}</td><td>{e(queued_words(p))}</td>"
                    f"<td>{e(eta_words(p, pr.now))}</td></tr>")
        for m in p.machines:
            since = f"{m.running:,} since {clock(m.running_since)} ({ago(pr.now - m.running_since)} ago)" \
                if m.running and m.running_since else f"{m.running:,}"
            rows.append(f"<tr><td></td><td>{e(m.hostname or '?')} (machine {m.machine_id})</td><td>{m.done:,}</td>"
                        f"<td>{e(since)}</td><td>{m.failed:,}</td><td>{m.skipped:,}</td><td></td>"
                        f"<td>last finished {e(clock(m.last_finished))}</td></tr>")
    table = ("<table class='live'><thead><tr><th>pool</th><th>machine</th><th>done</th><th>running</th><th>failed</th>"
             "<th>skipped</th><th>queued</th><th>ETA</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    running = "".join(f"<li>run {r['run_id']} on {e(r['host'] or '?')} ({e(r['pool'])}): {e(r['config'])}, claimed "
                      f"{clock(r['claimed'])} ({ago(pr.now - r['claimed'])} ago), heartbeat "
                      f"{ago(pr.now - r['heartbeat']) if r['heartbeat'] else '-'} ago</li>" for r in pr.running)
    failures = "".join(f"<li>{clock(r['finished'])} run {r['run_id']} on {e(r['host'] or '?')} ({e(r['pool'])}): "
                       f"<b>{e(r['status'])}</b>: {e(r['reason'])}</li>" for r in pr.failures)
    when = (f"The effects and everything below are from the {analysed[1]:,} runs finished by {clock(analysed[0])} UTC "
            "(redone when runs finish)." if analysed else "")
    stale = (f"<p class='outage' style='color:#a40000'><b>{e(outage)}. What follows is the progress as it last "
             f"answered.</b></p>" if outage else "")
    return (f"<section id='live'><h2>Live: the sweep as it runs</h2>{stale}<p class='meta'>Progress at {clock(pr.now)} UTC "
            f"(the database's clock), refreshed every {every_s:g} s by <code>bench.py report --watch</code>; this page "
            f"reloads itself. {when}</p>{table}"
            + (f"<h3>Running now</h3><ul>{running}</ul>" if running else "<p>No run is running.</p>")
            + (f"<h3>Last failures</h3><ul>{failures}</ul>" if failures else "")
            + "</section>")


RELOAD_JS = """<script>(function(){const k='cpubench-scroll';const y=sessionStorage.getItem(k);
if(y!==null)window.addEventListener('load',()=>window.scrollTo(0,+y));
setTimeout(()=>{sessionStorage.setItem(k,String(window.scrollY));location.reload();},%d);})();</script>"""


def live_page(page: str, section: str, every_s: float) -> str:
    """The report's page with the live section first in <main> and the reload script."""
    page = page.replace("<main>", "<main>" + section, 1)
    return page.replace("</body>", RELOAD_JS % int(every_s * 1000) + "</body>", 1)


def first_page() -> str:
    """The page before the first report is written: the live section goes first in its <main>. At
    nice 19 on a machine whose workers fill every CPU, the first report of a large database can take
    minutes; the sweep's progress (a few aggregate queries) shows at once."""
    from orchestrator.report.html import CSS
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>cpubench report (live)</title>"
            f"<style>{CSS}</style></head><body><main><p class='meta'>The first report of this database is being "
            "written (at low priority: the workers come first); the effects appear here when it is done.</p>"
            "</main></body></html>")


def write_atomic(path: Path, content: str) -> None:
    """Write so that a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(content, encoding="utf-8")
    os.replace(tmp, path)


# -- the watcher --------------------------------------------------------------------------------

@dataclass
class Tick:
    """What one round of the watcher did."""

    analysed: bool  # the statistics were redone
    report_s: float  # how long that took (0 when not)
    progress_s: float  # how long the progress queries took
    done: int  # finished runs (done + failed + skipped) in the database


def _reporter(store: Store, staging: Path, channel, watcher_pid: int) -> None:
    """The watcher's report process (forked): at WATCH_NICE, one report per request into `staging`,
    keeping its per-machine memo between them; answers (wall seconds, CPU seconds, None) or the error.
    It and the children a report forks are one process group, stopped together: by the watcher (watch),
    or, where the watcher dies (a kill -9, a closed terminal), by the SIGTERM its death sends."""
    from orchestrator.report import write_report
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the watcher's: it stops us
    os.setpgrp()
    signal.signal(signal.SIGTERM, _stop_group)
    set_parent_death_signal(watcher_pid, signal.SIGTERM)
    os.nice(WATCH_NICE)  # the workers' runs come first
    store.engine.dispose(close=False)  # connections of its own: none of the watcher's cross the fork
    memo: dict = {}  # per machine: its comparisons and predictions, redone only when its runs changed
    while channel.recv():
        t, cpu = time.perf_counter(), time.process_time()
        try:
            if staging.exists():
                shutil.rmtree(staging)
            write_report(store, staging, plots=False, memo=memo)
            channel.send((time.perf_counter() - t, time.process_time() - cpu, None))
        except Exception as error:  # noqa: BLE001 - handed to the watcher, which raises it
            channel.send((0.0, 0.0, error))


def _stop_group(signum, frame) -> None:
    os.killpg(0, signal.SIGKILL)  # this process and every child it forked


def watch(store: Store, out_dir: Path, *, every_s: float = 10.0, rounds: int | None = None,
          on_tick: Callable[[Tick], None] | None = None, until_idle: bool = False, duty: float = WATCH_DUTY,
          retry_s: float = DB_RETRY_S, on_note: Callable[[str], None] | None = None) -> None:
    """Keep out_dir/index.html (and results.csv, summary.md) current while workers run, until
    interrupted, `rounds` rounds, or (until_idle) a round finds nothing running and nothing queued but
    jobs wider than their pool's workers. The statistics run in a child process at WATCH_NICE; this
    process only reads the progress (a few aggregate queries) and rewrites the page, also while a
    report is being written, so the progress stays current even where the workers leave the report
    no CPU. A database outage (a PostgreSQL restart) is ridden out for up to retry_s seconds, as a
    worker does (common/patience.py): the page keeps the last progress and says since when the
    database has not answered; `on_note` is told when an outage begins and ends."""
    import multiprocessing

    out_dir = Path(out_dir)
    staging = out_dir / ".watch"
    out_dir.mkdir(parents=True, exist_ok=True)
    channel, theirs = multiprocessing.Pipe()
    reporter = multiprocessing.get_context("fork").Process(target=_reporter, args=(store, staging, theirs, os.getpid()),
                                                           daemon=True)
    reporter.start()
    page, seen, analysed_at, next_ok, n = None, None, None, 0.0, 0
    shown: list[Progress] = []  # the last progress shown
    outage: list[str] = []  # while the database does not answer: since when, in words

    def show(pr: Progress) -> None:
        shown[:] = [pr]
        write_atomic(out_dir / "index.html", live_page(page or first_page(), progress_html(
            pr, every_s=every_s, analysed=analysed_at, outage=outage[0] if outage else None), every_s))

    def noted(text: str) -> None:  # an outage begins (the page says so) or ends
        outage[:] = [f"The database has not answered since {clock(time.time())} UTC ({text})"] \
            if patience.failing_since is not None else []
        if outage and shown:
            show(shown[0])
        if on_note is not None:
            on_note(text)
    patience = Patience(retry_s, noted)

    def current() -> Progress:
        return patience.call(progress, store)
    try:
        while rounds is None or n < rounds:
            n += 1
            t0 = time.perf_counter()
            pr = current()
            progress_s = time.perf_counter() - t0
            report_s = 0.0
            finished = sum(m.done + m.failed + m.skipped for p in pr.pools for m in p.machines)
            if pr.fingerprint != seen and time.monotonic() >= next_ok:
                show(pr)  # the progress now (and before the first report, a page at all)
                channel.send(True)
                while not channel.poll(every_s):  # the report runs: keep the progress current meanwhile
                    if not reporter.is_alive():
                        raise RuntimeError(f"the watcher's report process died (exit code {reporter.exitcode})")
                    show(current())
                report_s, report_cpu_s, error = channel.recv()
                if isinstance(error, DatabaseUnavailable):  # tried again once the database answers
                    patience.failed(error)
                    if patience.gave_up():
                        raise error
                    report_s = 0.0
                elif error is not None:
                    raise error
                else:
                    for name in ("results.csv", "summary.md"):
                        os.replace(staging / name, out_dir / name)
                    page = (staging / "index.html").read_text(encoding="utf-8")
                    seen, analysed_at = pr.fingerprint, (pr.now, finished)
                    next_ok = time.monotonic() + report_cpu_s / duty  # its share of one CPU, however long it waited
            if page is not None:
                show(pr)
            if on_tick is not None:
                on_tick(Tick(report_s > 0, report_s, progress_s, finished))
            idle = not any(p.queued > p.waiting or p.running for p in pr.pools)
            if until_idle and idle and pr.fingerprint == seen:
                break
            if rounds is None or n < rounds:
                time.sleep(max(0.0, every_s - (time.perf_counter() - t0)))
    finally:
        if reporter.is_alive():
            channel.send(False)  # an idle report process leaves at once
            reporter.join(timeout=REPORTER_LEAVES_S)
        if reporter.is_alive():  # busy with a report whose page would be thrown away (staging): it and the
            try:  # children it forked, at once (at nice 19 beside busy workers it would take long to unwind)
                os.killpg(reporter.pid, signal.SIGKILL)
            except ProcessLookupError:  # not yet in a group of its own
                reporter.kill()
            reporter.join()
        if staging.exists():
            shutil.rmtree(staging)
