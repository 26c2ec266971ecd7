"""The live view of a running sweep (orchestrator/queue/progress.py; the watcher,
orchestrator/report/watch.py): progress per pool and machine from the real store (SQLite and
PostgreSQL), `report --watch` rewriting the page atomically and redoing the statistics only when runs
finished, `status` showing the same, and the page drawing every plot before it is printed."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.queue.progress import eta_words, progress, queued_words
from orchestrator.report.watch import watch
from orchestrator.queue.store import Store
from tests.conftest import ROOT, Deadline, bench, done_fields, wait_until
from tests.reportdb import CPUS, configs, enqueue, machine_facts, metrics

BASE = {"d_model": 32, "n_layers": 1, "seq_len": 32, "steps": 2}
AXES = {"d_model": [32, 64], "batch_size": [1, 2, 4]}
JOBS = len(configs(BASE, AXES, repeats=3))


def _finish(store: Store, machine_id: int, pool_id: int, status: str, *, host: str) -> int:
    claim = store.claim(machine_id, pid=os.getpid(), host=host, max_cores=CPUS, pool_id=pool_id)
    assert claim is not None
    if status == "running":
        return claim.run_id
    c = claim.config
    fields = (done_fields(**metrics(10.0 * c["d_model"] / 32 * math.sqrt(c["batch_size"]), c)) if status == "done"
              else {})
    reason = {"failed": "Traceback (most recent call last):\n  ...\nRuntimeError: boom in the child",
              "skipped": "governor: no cpufreq in this VM"}.get(status)
    store.finish(claim.run_id, pid=os.getpid(), status=status, reason=reason, fields=fields)
    return claim.run_id


def _fleet(store: Store) -> dict:
    """A named pool of two machines (one run still running) and one machine's own pool."""
    enqueue(store, configs(BASE, AXES, repeats=3))
    a = store.register_machine(machine_facts("alpha"))
    b = store.register_machine(machine_facts("beta"))
    fleet = store.pool_id(a, "fleet")
    for status in ("done", "done", "failed"):
        _finish(store, a, fleet, status, host="alpha")
    for status in ("done", "skipped"):
        _finish(store, b, fleet, status, host="beta")
    running = _finish(store, a, fleet, "running", host="alpha")
    own = store.pool_id(a)
    _finish(store, a, own, "done", host="alpha")
    return {"a": a, "b": b, "fleet": fleet, "own": own, "running": running}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_store(request, tmp_path):
    if request.param == "sqlite":
        return Store(str(tmp_path / "results.db"))
    return Store(request.getfixturevalue("pg_db"))


def test_progress_counts_each_pool_and_machine_with_running_runs_and_the_last_failures(any_store):
    ids = _fleet(any_store)
    pr = progress(any_store)

    fleet, own = (next(p for p in pr.pools if p.pool_id == ids[k]) for k in ("fleet", "own"))
    assert (fleet.label, fleet.total, fleet.done, fleet.running, fleet.failed, fleet.skipped, fleet.queued) == \
        ("fleet", JOBS, 3, 1, 1, 1, JOBS - 6)
    alpha, beta = fleet.machines
    assert (alpha.hostname, alpha.done, alpha.running, alpha.failed, alpha.skipped) == ("alpha", 2, 1, 1, 0)
    assert (beta.hostname, beta.done, beta.running, beta.failed, beta.skipped) == ("beta", 1, 0, 0, 1)
    assert alpha.running_since is not None and abs(pr.now - alpha.running_since) < 60 and beta.running_since is None
    assert fleet.eta_s is not None and fleet.eta_s > 0  # learned from its done runs (orchestrator/queue/eta.py)
    assert (own.done, own.queued, own.running) == (1, JOBS - 1, 0)
    assert own.label.startswith(f"machine {ids['a']} (alpha")
    # a time to finish by where a worker runs; where none does, the work left and that no worker runs
    assert eta_words(fleet, pr.now).endswith(" UTC)") and eta_words(own, pr.now).endswith(" of work; no worker running")
    (run,) = pr.running
    assert (run["run_id"], run["host"], run["pool"]) == (ids["running"], "alpha", "fleet")
    assert "d_model=" in run["config"]
    assert [(f["status"], f["reason"]) for f in pr.failures] == [
        ("skipped", "governor: no cpufreq in this VM"), ("failed", "RuntimeError: boom in the child")]
    assert json.loads(json.dumps(pr.as_dict()))["pools"][0]["machines"]


@pytest.mark.slow
def test_status_shows_every_pool_and_machine_and_says_so_in_json(tmp_path):
    db = str(tmp_path / "results.db")
    _fleet(Store(db))
    doc = json.loads(bench("status", "--json", "--all-machines", "--db", db, check=True).stdout)
    pools = {p["label"]: p for p in doc["fleet"]["pools"]}
    assert pools["fleet"]["done"] == 3 and [m["hostname"] for m in pools["fleet"]["machines"]] == ["alpha", "beta"]
    assert doc["fleet"]["failures"][0]["reason"] == "governor: no cpufreq in this VM"
    shown = bench("status", "--all-machines", "--db", db, check=True).stdout
    assert "by pool and machine" in shown and "since" in shown and "RuntimeError: boom in the child" in shown


@pytest.mark.slow
def test_watch_rewrites_the_page_atomically_and_redoes_the_statistics_only_when_runs_finished(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    ids = _fleet(store)
    out = tmp_path / "result"
    ticks = []

    def tick(t):
        ticks.append(t)
        if len(ticks) == 1:  # a run finishes between the first round and the second
            _finish(store, ids["b"], ids["fleet"], "done", host="beta")

    watch(store, out, every_s=0.01, rounds=3, on_tick=tick, duty=1e6)
    assert [t.analysed for t in ticks] == [True, True, False]
    assert [t.done for t in ticks] == [6, 7, 7]
    page = (out / "index.html").read_text()
    assert "<section id='live'>" in page and "location.reload" in page and "cpubench report" in page
    assert "RuntimeError: boom in the child" in page and "since" in page
    assert page.index("<section id='live'>") < page.index('id="effects"')
    with (out / "results.csv").open(newline="") as f:
        assert len(list(csv.reader(f))) == 1 + 7 + 1  # the header, the finished runs, the running one
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "results.csv", "summary.md"]  # no temp file left


def test_the_progress_is_on_the_page_before_and_while_the_first_report_is_written_at_low_priority(tmp_path,
                                                                                                   monkeypatch):
    # beside workers on every CPU the report (at nice 19) can take minutes: the progress shows at once
    import orchestrator.report as report_package
    store = Store(str(tmp_path / "results.db"))
    _fleet(store)
    out = tmp_path / "result"
    looked, real = tmp_path / "looked.json", report_package.write_report

    def slow(*args, **kwargs):  # the real report (in the watcher's child), slowed, looking at the page meanwhile
        page = out / "index.html"
        before = (page.read_text(), page.stat().st_mtime_ns, os.getpriority(os.PRIO_PROCESS, 0))
        time.sleep(1.0)
        looked.write_text(json.dumps([*before, page.stat().st_mtime_ns]))
        return real(*args, **kwargs)

    monkeypatch.setattr(report_package, "write_report", slow)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    watch(store, out, every_s=0.1, rounds=1, duty=1e6)
    first, started, priority, later = json.loads(looked.read_text())
    assert "<section id='live'>" in first and "being written" in first and 'id="effects"' not in first
    assert "location.reload" in first
    assert later > started, "the progress was not rewritten while the report ran"
    assert priority == min(19, nice + 19) and os.getpriority(os.PRIO_PROCESS, 0) == nice  # only the report yields
    page = (out / "index.html").read_text()
    assert 'id="effects"' in page and "being written" not in page


def test_report_watch_keeps_the_page_current_until_interrupted(tmp_path):
    db = str(tmp_path / "results.db")
    _fleet(Store(db))
    out = tmp_path / "result"
    # Ctrl+C as a user's terminal sends it: a test run started in the background (`cmd &` in a script)
    # ignores SIGINT, and the watcher would inherit that and never see it.
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench.py"), "report", "--watch", "--every", "1", "--out",
                             str(out), "--db", db], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = Deadline(120)
        while not (out / "index.html").exists() and not deadline.passed() and proc.poll() is None:
            time.sleep(0.2)
        assert (out / "index.html").exists(), proc.stderr.read() if proc.poll() is not None else "no page in 120 s"
        first = (out / "index.html").stat().st_mtime_ns
        while (out / "index.html").stat().st_mtime_ns == first and not deadline.passed():
            time.sleep(0.2)
        assert (out / "index.html").stat().st_mtime_ns != first, "the page was not rewritten"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "runs finished: report redone" in err and "stopped watching" in err


@pytest.mark.browser
def test_the_page_draws_every_plot_before_it_is_printed(tmp_path):
    from tests.test_html_report import CHROMEDRIVER, CHROMIUM, build

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("no headless browser (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from orchestrator.report import write_report

    store = Store(str(tmp_path / "results.db"))
    build(store)
    page = write_report(store, tmp_path / "result", plots=False).html_path
    assert "--print-to-pdf" in page.read_text()  # the page says how to get a PDF
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(120)
    try:
        def opened(uri: str) -> tuple[int, int]:
            driver.get(uri)
            driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                        "window.cpubench.ready.then(() => done(true));")
            return driver.execute_script(
                "const ps = [...document.querySelectorAll('.plot')];"
                "return [ps.length, ps.filter(p => p.querySelector('.main-svg')).length];")

        total, drawn = opened(page.resolve().as_uri())
        assert 0 < drawn < total  # on screen, plots below the fold wait until they scroll into view
        driver.execute_script("window.dispatchEvent(new Event('beforeprint'))")
        assert driver.execute_script("return document.querySelectorAll('.plot .main-svg').length") >= total
        assert opened(page.resolve().as_uri() + "#print") == [total, total]  # a headless PDF or screenshot
    finally:
        driver.quit()


def test_stopping_the_watcher_stops_a_report_in_flight_and_the_children_it_forked(tmp_path, monkeypatch):
    """Ctrl+C while the watcher's report process writes a report (at nice 19 beside busy workers, that can
    take minutes): the report is abandoned, its page would be thrown away. Its process is killed with the
    children the report forked (results.csv's), as a group; before, it was waited for 30 s and then killed
    alone, and a child of it lived on."""
    import threading

    import psutil

    import orchestrator.report as report_package
    store = Store(str(tmp_path / "results.db"))
    _fleet(store)
    started = tmp_path / "started"

    def endless(*args, **kwargs):  # a report that forks a child, as write_report does, and never ends
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            started.write_text(str(child.pid))
            time.sleep(600)
        finally:
            child.kill()
            child.wait()

    def interrupt():  # Ctrl+C, once the report is under way
        while not started.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(report_package, "write_report", endless)
    # Ctrl+C as a terminal sends it: a test run started in the background (`cmd &` in a script) ignores
    # SIGINT, and this process would never see it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = {c.pid for c in psutil.Process().children(recursive=True)}
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            watch(store, tmp_path / "result", every_s=0.1, duty=1e6)
    finally:
        signal.signal(signal.SIGINT, previous)
    forked = int(started.read_text())
    assert not psutil.pid_exists(forked) or psutil.Process(forked).status() == psutil.STATUS_ZOMBIE
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= before
    assert not (tmp_path / "result" / ".watch").exists()


@pytest.mark.postgres
def test_the_watcher_rides_out_a_postgres_restart_and_the_page_says_the_database_is_not_answering(tmp_path):
    """The server stopped under `report --watch` (a maintenance restart): the watcher neither dies nor
    prints a traceback; the page keeps the last progress and says since when the database has not
    answered; once it is back the progress goes on, the notice gone. Before, the watcher stopped at the
    first query that failed."""
    from tests.pgserver import pg_bin, postgres_server

    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with postgres_server() as server:
        _fleet(Store(server.url))
        out = tmp_path / "result"
        page = out / "index.html"
        proc = subprocess.Popen([sys.executable, str(ROOT / "bench.py"), "report", "--watch", "--every", "1",
                                 "--db-retry", "120", "--out", str(out), "--db", server.url],
                                cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "BENCH_DB_RETRY_S": "5"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

        def wait_for(check, what: str, within: float = 120) -> None:
            deadline = Deadline(within)
            while not deadline.passed() and proc.poll() is None:
                if page.exists() and check(page.read_text()):
                    return
                time.sleep(0.2)
            raise AssertionError(f"{what}: " + (proc.stderr.read() if proc.poll() is not None else "not in time"))
        try:
            wait_for(lambda text: 'id="effects"' in text, "the first report")
            server.stop()
            try:
                wait_for(lambda text: "The database has not answered since" in text, "the outage on the page")
                assert 'id="effects"' in page.read_text()  # the page as it was, the notice above it
            finally:
                server.start()
            wait_for(lambda text: "has not answered" not in text, "the page after the outage")
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "retrying for up to 120 s" in err and "database back after" in err and "Traceback" not in err


def test_a_watcher_killed_with_kill_9_leaves_no_report_process_and_no_child_of_one(tmp_path):
    """The watcher killed outright (kill -9, a closed terminal) while its report process writes a report:
    its death signals the report process (PR_SET_PDEATHSIG), which stops itself and the children the
    report forked, as a group. Before, the report process lived on until its report was done."""
    import psutil

    store = Store(str(tmp_path / "results.db"))
    _fleet(store)
    started = tmp_path / "started"
    script = f"""
import subprocess, sys, time
sys.path.insert(0, {str(ROOT)!r})
import orchestrator.report as report_package
from orchestrator.report.watch import watch
from orchestrator.queue.store import Store

def endless(*args, **kwargs):  # a report that forks a child, as write_report does, and never ends
    import os
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open({str(started)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
    time.sleep(600)

report_package.write_report = endless
watch(Store({str(tmp_path / "results.db")!r}), {str(tmp_path / "result")!r}, every_s=0.1, duty=1e6)
"""
    watcher = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    pids: list[int] = []
    try:
        deadline = Deadline(60)
        while not started.exists() and not deadline.passed() and watcher.poll() is None:
            time.sleep(0.05)
        time.sleep(0.2)  # the pids written in full
        pids += [int(p) for p in started.read_text().split()]
        watcher.kill()
        watcher.wait()

        def alive() -> list[int]:
            return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        wait_until(lambda: not alive(), timeout=30, poll_s=0.1)
        assert alive() == [], "the report process or its child outlived the watcher"
    finally:
        for p in pids:
            if psutil.pid_exists(p):
                psutil.Process(p).kill()


@pytest.mark.slow
def test_a_pools_jobs_wider_than_its_workers_wait_apart_and_out_of_its_eta(any_store, tmp_path):
    """A worker of one CPU passes over its pool's two-core jobs (store.POP_QUEUE: the first job in run
    order that fits). Once it has, the progress says those wait for a wider worker instead of counting
    them queued for the pool's workers, the ETA leaves them out, and when nothing else is left the pool
    says its workers can run no queued job. A worker with two CPUs takes them: queued for it again."""
    from orchestrator.queue import eta

    jobs = sorted(configs(BASE, {"cores": [1, 2], "d_model": [32, 64]}, repeats=2, grid=True),
                  key=lambda c: (c["repeat"], c["d_model"], c["cores"]))  # one core, two cores, one core, ...
    enqueue(any_store, jobs)
    a = any_store.register_machine(machine_facts("alpha"))
    pool = any_store.pool_id(a, "narrow")

    def run(max_cores: int) -> dict | None:
        claim = any_store.claim(a, pid=os.getpid(), host="alpha", max_cores=max_cores, pool_id=pool)
        if claim is not None:
            c = claim.config
            any_store.finish(claim.run_id, pid=os.getpid(), status="done",
                             fields=done_fields(**metrics(10.0 * c["d_model"] / 32 * c["cores"], c)))
            return c

    def narrow():
        return next(p for p in progress(any_store).pools if p.pool_id == pool)

    assert run(1)["cores"] == 1
    p = narrow()  # no two-core job passed over yet: no sign the workers are narrower
    assert (p.queued, p.waiting, p.widest) == (7, 0, 1) and p.eta_s is not None
    assert run(1)["d_model"] == 64  # the two-core job between passed over
    p = narrow()
    assert (p.done, p.queued, p.waiting, p.widest) == (2, 6, 4, 1)
    with any_store.transaction() as conn:  # the ETA: the two one-core jobs left, not the four two-core ones
        rows = {fits: conn.execute(text(eta.SELECT_QUEUED), {"pool_id": pool, "fits": fits}).all() for fits in (1, 2)}
    learned = eta._fits[(any_store.url, pool)][1]
    assert len(rows[1]) == 2 and len(rows[2]) == 6
    assert p.eta_s == pytest.approx(eta.remaining_s(learned, rows[1]))
    assert p.eta_s < eta.remaining_s(learned, rows[2])
    assert eta.estimate_remaining_s(any_store, a, pool_id=pool) == pytest.approx(p.eta_s)
    assert queued_words(p) == "2 + 4 wider than its workers (> 1 CPU)"
    while run(1) is not None:
        pass
    p = narrow()
    assert (p.queued, p.waiting, p.eta_s) == (4, 4, None) and eta_words(p, 0.0) == "none fits its workers"
    if any_store.dialect == "sqlite":  # status says so too
        db = str(tmp_path / "results.db")
        doc = json.loads(bench("status", "--json", "--all-machines", "--db", db, check=True).stdout)
        assert [(p["queued"], p["waiting"]) for p in doc["fleet"]["pools"] if p["label"] == "narrow"] == [(4, 4)]
        assert "wider" in bench("status", "--all-machines", "--db", db, check=True).stdout
    assert run(2)["cores"] == 2  # a wider worker: the rest are queued for it
    p = narrow()
    assert (p.queued, p.waiting) == (3, 0) and p.eta_s is not None and queued_words(p) == "3"
