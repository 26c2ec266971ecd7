"""`report --watch`: keeps result/index.html current while workers run, the sweep's progress
(orchestrator/queue/progress.py) first on the page and the report below it.

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
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from common.errors import DatabaseUnavailable
from common.files import write_atomic
from common.patience import DB_RETRY_S, Patience
from common.processes import Child, fork_child, set_parent_death_signal
from orchestrator.queue.progress import Progress, ago, clock, eta_words, progress, queued_words
from orchestrator.queue.store import Store
from orchestrator.report.tables import html_table

WATCH_DUTY = 0.1  # the share of one CPU a watcher may spend on the statistics
# `report --watch` runs at the lowest CPU priority: on a machine whose CPUs the workers fill, its
# reports then wait for idle moments instead of taking time from the runs (at normal priority they
# slow the runs: docs/measurements.md, benchmarks/watch_overhead.py).
WATCH_NICE = 19
# Stopping the watcher (Ctrl+C) waits this long for an idle report process to leave; one busy with a report
# nobody will read (at nice 19 beside busy workers it can take minutes) is killed at once, its children too.
REPORTER_LEAVES_S = 1.0


# -- the page's live section ---------------------------------------------------------------------

# the live table's columns: a pool's row (class "pool"), then a row per machine of the pool
PROGRESS_HEADER = ["pool", "machine", "done", "running", "failed", "skipped", "queued", "ETA"]


def progress_html(pr: Progress, *, every_s: float, analysed: tuple[float, int] | None,
                  outage: str | None = None) -> str:
    """The page's live section: pools and machines, the running runs, the last failures; first, where the
    database does not answer (`outage`, in words), that this is the progress as it last answered."""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731 - one letter inside the f-strings below
    rows, classes = [], []
    for p in pr.pools:
        rows.append([f"<b>{e(p.label)}</b>", "", f"{p.done:,}", f"{p.running:,}", f"{p.failed:,}", f"{p.skipped:,}",
                     e(queued_words(p)), e(eta_words(p, pr.now))])
        classes.append("pool")
        for m in p.machines:
            since = f"{m.running:,} since {clock(m.running_since)} ({ago(pr.now - m.running_since)} ago)" \
                if m.running and m.running_since else f"{m.running:,}"
            rows.append(["", f"{e(m.hostname or '?')} (machine {m.machine_id})", f"{m.done:,}", e(since),
                         f"{m.failed:,}", f"{m.skipped:,}", "", f"last finished {e(clock(m.last_finished))}"])
            classes.append(None)
    table = html_table(PROGRESS_HEADER, rows, "live", row_classes=classes)
    running = "".join(f"<li>run {r['run_id']} on {e(r['host'] or '?')} ({e(r['pool'])}): {e(r['config'])}, claimed "
                      f"{clock(r['claimed'])} ({ago(pr.now - r['claimed'])} ago), heartbeat "
                      f"{ago(pr.now - r['heartbeat']) if r['heartbeat'] else '-'} ago</li>" for r in pr.running)
    failures = "".join(f"<li>{clock(r['finished'])} run {r['run_id']} on {e(r['host'] or '?')} ({e(r['pool'])}): "
                       f"<b>{e(r['status'])}</b>: {e(r['reason'])}</li>" for r in pr.failures)
    when = (f"The effects and everything below are from the {analysed[1]:,} runs finished by {clock(analysed[0])} UTC "
            "(redone when runs finish)." if analysed else "")
    stale = (f"<p class='outage' style='color:#a40000'><b>{e(outage)}. What follows is the progress as it last "
             f"answered.</b></p>" if outage else "")
    return (f"<section id='live'><h2>Live: the sweep as it runs</h2>{stale}<p class='meta'>"
            f"Progress at {clock(pr.now)} UTC "
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


# -- the watcher --------------------------------------------------------------------------------

@dataclass
class Tick:
    """What one round of the watcher did."""

    analysed: bool  # the statistics were redone
    report_s: float  # how long that took (0 when not)
    progress_s: float  # how long the progress queries took
    done: int  # finished runs (done + failed + skipped) in the database


def _reporter(store: Store, staging: Path, channel, watcher_pid: int) -> int:
    """The watcher's report process (forked): its reports (_report), the traceback of what stopped them
    on stderr, what it printed written before it exits."""
    try:
        _report(store, staging, channel, watcher_pid)
        return 0
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()


def _report(store: Store, staging: Path, channel, watcher_pid: int) -> None:
    """At WATCH_NICE, one report per request into `staging`, keeping its per-machine memo between them;
    answers (wall seconds, CPU seconds, None) or the error. It and the children a report forks are one
    process group, stopped together: by the watcher (watch), or, where the watcher dies (a kill -9, a
    closed terminal), by the SIGTERM its death sends."""
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
        except Exception as error:  # handed to the watcher, which raises it
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
    for stream in (sys.stdout, sys.stderr):  # what this process buffered is written once, not by the child too
        stream.flush()
    reporter = Child(fork_child(partial(_reporter, store, staging, theirs, os.getpid())))
    page, seen, analysed_at, next_ok, n = None, None, None, 0.0, 0
    shown: list[Progress] = []  # the last progress shown
    outage: list[str] = []  # while the database does not answer: since when, in words

    def show(pr: Progress) -> None:
        shown[:] = [pr]
        write_atomic(out_dir / "index.html", live_page(page or first_page(), progress_html(
            pr, every_s=every_s, analysed=analysed_at, outage=outage[0] if outage else None), every_s), mode=0o644)

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
                    if reporter.ended():
                        raise RuntimeError(f"the watcher's report process died (exit code {reporter.code})")
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
        if not reporter.ended():
            channel.send(False)  # an idle report process leaves at once
        if not reporter.ended(REPORTER_LEAVES_S):  # busy with a report whose page would be thrown away
            try:  # (staging): it and the children it forked, at once (at nice 19 beside busy workers it
                os.killpg(reporter.pid, signal.SIGKILL)  # would take long to unwind)
            except ProcessLookupError:  # not yet in a group of its own
                os.kill(reporter.pid, signal.SIGKILL)
            reporter.ended(None)
        if staging.exists():
            shutil.rmtree(staging)
