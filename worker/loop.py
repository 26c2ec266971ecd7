"""The worker: probe and register the machine, restore what a killed worker left, then claim ->
check -> apply knobs -> spawn the child -> record, one job at a time, until nothing is queued.

One worker per CPU: each worker locks the CPUs of its pool, so a second worker on the same CPUs
waits or stops with a clear message, while workers on disjoint CPUs (`work --cpus`) may share a
machine. Knobs are restored after every job, on error and on SIGTERM; a kill -9 leaves a journal
that the next worker (or `bench.py restore`) restores.

A worker outlives a database outage (a PostgreSQL restart or failover, SQLite's lock held past the
busy timeout): every database call, the heartbeat thread's too, is retried with backoff for up to
`--db-retry` seconds (Patience); a finished run's result is kept on local disk (state dir, kept/)
until the database has it, and written by the next worker on this machine if this one gives up; a
claim whose answer was lost is found again (Store.own_running), a finish whose answer was lost is
not written twice (Store.finish). docs/databases.md tells the whole story.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import psutil

from common.errors import BadInput, BenchError, Busy, DatabaseUnavailable, Stopped
from common.patience import Patience
from orchestrator.queue.store import RUN_FACTS, Claim, Store, same_start, result_problems
from worker.machine import gemm_peak, probe, sensors
from worker.knobs import settings as knobs
from worker.trainers.torch import gemm_route
from worker.spawn import ForkServers, Outcome, child_env, run_exec
from worker.trainers.harness import METRICS, TRAINERS, WORKER_METRICS, compiled_while_timed

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CURVE_FILE = "curve.jsonl"  # in a run's output dir: a learning run's evaluations, appended by its child


def default_state_dir() -> Path:
    """Machine-wide worker state (locks, knob journals, probe cache, inductor cache)."""
    return Path(os.environ.get("BENCH_STATE_DIR", "/var/tmp/cpubench"))


@dataclass
class WorkerOptions:
    cpus: list[int] | None = None  # the pool; None = every CPU this process may use
    pool_name: str | None = None  # `work --pool NAME`: share that named pool's queue; None = this machine's own
    max_jobs: int | None = None
    wait: bool = False  # poll for new jobs instead of stopping when none is queued
    poll_s: float = 5.0
    timeout_s: float = 900.0  # per job
    heartbeat_s: float = 5.0
    max_attempts: int = 3  # strikes against a job before its run is failed (store.take_back_stale, _run_claim)
    # `work --target-ci`: add repeat passes until intervals are this narrow (0.05 = +-5%)
    target_ci: float | None = None
    max_repeats: int = 10
    budget_s: float | None = None  # `work --budget`: seconds of runs to spend on a sweep (orchestrator/queue/budget.py)
    budget_sweep_id: int | None = None  # the sweep the budget is for; None = the newest a user enqueued
    db_retry_s: float = 600.0  # how long a database outage is ridden out before the worker gives up
    state_dir: Path = field(default_factory=default_state_dir)
    sysfs_root: str = "/"
    data_dir: Path = field(default_factory=lambda: Path(os.environ.get("BENCH_DATA_DIR", PROJECT_ROOT / "data")))
    output_dir: Path = field(default_factory=lambda: Path(os.environ.get("BENCH_OUTPUT_DIR", PROJECT_ROOT / "output")))
    # "fork": children forked from a server that has imported torch once (no ~2 s import per job);
    # "exec": a fresh interpreter per job. Both give the child the job's exact start settings.
    spawn: str = field(default_factory=lambda: os.environ.get("BENCH_SPAWN", "fork"))
    # None: the trainer of the job's framework (harness.TRAINERS). Tests swap in a child that
    # crashes or hangs on purpose (tests/stub_child.py) for every framework.
    child_module: str | None = field(default_factory=lambda: os.environ.get("BENCH_CHILD_MODULE"))
    probe_quick: bool = field(default_factory=lambda: os.environ.get("BENCH_PROBE_QUICK") == "1")
    # ranks > 1: gloo's timeout of a collective, how long a hung rank holds its run before it fails
    collective_timeout_s: float = field(
        default_factory=lambda: float(os.environ.get("BENCH_COLLECTIVE_TIMEOUT_S", "60")))
    # MFU's peak measured on each job's own CPU set (worker/machine/gemm_peak.py: a torch child per new set);
    # BENCH_PEAK_PER_SET=0 scales the probe's 1-core / all-core peaks instead, and the basis says so.
    peak_per_set: bool = field(default_factory=lambda: os.environ.get("BENCH_PEAK_PER_SET", "1") != "0")

    @property
    def grace_s(self) -> float:
        return 2 * self.heartbeat_s  # stale after two missed heartbeats


@dataclass
class Event:
    kind: str  # start | claimed | finished | idle | stop | restored | requeued | note
    claim: Claim | None = None
    outcome: Outcome | None = None
    counts: dict | None = None
    text: str = ""


def allowed_cpus(requested: list[int] | None) -> list[int]:
    mine = sorted(os.sched_getaffinity(0))
    if requested is None:
        return mine
    outside = sorted(set(requested) - set(mine))
    if outside:
        raise BadInput(f"--cpus: CPU(s) {outside} are not available to this process (allowed: {mine})")
    return sorted(set(requested))


@contextmanager
def cpu_locks(state_dir: Path, cpus: list[int], *, wait: bool):
    """Hold one lock file per CPU for the worker's life; another worker on any of them is refused."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for cpu in cpus:
            handle = stack.enter_context(open(state_dir / f"cpu{cpu}.lock", "a+"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another worker"
                raise Busy(f"CPU {cpu} is in use by {holder}: one worker per CPU keeps timings honest; "
                           f"use --wait to queue behind it, or --cpus to give this worker other CPUs") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"worker pid {os.getpid()}")
            handle.flush()
        yield


def restore_left_behind(state_dir: Path, sysfs_root: str) -> list[str]:
    """Restore the knob journals of workers that are gone (killed with -9)."""
    restored = []
    journals = set(state_dir.glob("journal-*.json")) | {  # a worker that only shaped links has no sysfs journal
        j.with_name(j.name.replace("links-", "journal-", 1)) for j in state_dir.glob("links-*.json")}
    for journal in sorted(journals):
        pid = int(journal.stem.split("-", 1)[1])
        if pid != os.getpid() and psutil.pid_exists(pid):
            continue
        restored.extend(knobs.restore_journal(journal, sysfs_root=sysfs_root))
    return restored


def _raise_stopped(signum, _frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name}: settings restored, "
                  "the unfinished run is back in the queue")


class Worker:
    def __init__(self, store: Store | None, options: WorkerOptions, on_event: Callable[[Event], None] = lambda e: None):
        self.store = store
        self.opts = options
        self.emit = on_event
        self.pid = os.getpid()
        self.started = psutil.Process(self.pid).create_time()  # with the pid, names this process (pids are reused)
        self.host = socket.gethostname()
        self.pool = allowed_cpus(options.cpus)
        self.journal = options.state_dir / f"journal-{self.pid}.json"
        self.facts: dict = {}
        self.machine_id: int | None = None
        self.pool_id: int | None = None  # the queue claimed from (store pools; not the CPU pool above)
        self._counted_at = float("-inf")
        self.budget = None  # orchestrator.queue.budget.Budget under --budget, once started
        self.budget_spent_s = 0.0  # what the budget's runs took so far: the database's figure plus this worker's runs
        self._datasets: dict[str, str] = {}
        self._provisional_peaks: dict = {}  # loaded GEMM peak measurements, never cached (gemm_peak.peak_for)
        self.patience = Patience(options.db_retry_s, lambda text: on_event(Event("note", text=text)))
        # Finished results not yet in the database, one file per run, named by the database they belong to.
        self.kept_dir = options.state_dir / "kept"
        self._kept_prefix = hashlib.sha256(store.url.encode()).hexdigest()[:16] if store is not None else ""
        # Each database numbers its runs from 1: a run's model folder names its database too
        # (output/run-5-<8 hex of the URL>), so a second database's run 5 never overwrites this one's.
        self._output_tag = self._kept_prefix[:8]
        if options.spawn not in ("fork", "exec"):
            raise BadInput(f"BENCH_SPAWN={options.spawn!r}: expected fork or exec")
        self.forkserver = ForkServers() if options.spawn == "fork" else None
        # spawn=exec: what children proved once for later ones (harness `proven`), per start settings
        self._exec_proven: dict[tuple, dict] = {}

    def close(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()

    def _db(self, fn: Callable, *args, **kwargs):
        """A database call, patiently (through an outage of up to --db-retry seconds)."""
        return self.patience.call(fn, *args, **kwargs)

    def start(self) -> int:
        """Probe, register and restore; the machine id."""
        self.facts = probe.probe(self.opts.state_dir, quick=self.opts.probe_quick, sysfs_root=self.opts.sysfs_root)
        self.machine_id = self._db(self.store.register_machine, self.facts)
        self.pool_id = self._db(self.store.pool_id, self.machine_id, self.opts.pool_name)
        for line in restore_left_behind(self.opts.state_dir, self.opts.sysfs_root):
            self.emit(Event("restored", text=line))
        return self.machine_id

    def run(self) -> dict:
        """Claim and run jobs until none is queued (or max_jobs); the counts at the end."""
        previous = signal.signal(signal.SIGTERM, _raise_stopped)
        try:
            with cpu_locks(self.opts.state_dir, self.pool, wait=self.opts.wait):
                self.start()
                self.emit(Event("start", counts=self._db(self.store.counts, pool_id=self.pool_id)))
                if self.opts.budget_s is not None:
                    self._begin_budget()
                done = 0
                settled = False
                while self.opts.max_jobs is None or done < self.opts.max_jobs:
                    if self.budget is not None and self.budget_spent_s >= self.budget.budget_s:
                        self.emit(Event("note", text=self._spend(add=False).words()))
                        break
                    self._take_back_stale()
                    claim = self._claim()
                    if claim is None and self.opts.target_ci is not None and not settled:
                        if self._adapt():
                            continue
                        settled = True  # decided once for this empty queue (--wait polls on)
                    if claim is None and self.budget is not None and not settled:
                        decision = self._spend()
                        self.emit(Event("note", text=decision.words()))
                        if decision.added:
                            continue
                        settled = True
                    if claim is None:
                        if not self.opts.wait:
                            break
                        self.emit(Event("idle", counts=self._db(self.store.counts, pool_id=self.pool_id)))
                        time.sleep(self.opts.poll_s)
                        continue
                    settled = False
                    self.emit(Event("claimed", claim=claim))
                    claimed_at = time.monotonic()
                    outcome = self._run_claim(claim)
                    self.budget_spent_s += time.monotonic() - claimed_at
                    done += 1
                    self.emit(Event("finished", claim=claim, outcome=outcome, counts=self._counts_now_and_then()))
                counts = self._db(self.store.counts, pool_id=self.pool_id)
                if self.patience.outages:
                    self.emit(Event("note", text=f"rode out {self.patience.outages} database outage(s), "
                                                 f"{self.patience.lost_s:.1f} s in all"))
                self.emit(Event("stop", counts=counts))  # the progress bar ends on exact counts
                return counts
        finally:
            self.close()
            signal.signal(signal.SIGTERM, previous)

    def _adapt(self) -> bool:
        """The queue is empty: add a repeat pass where intervals are wider than --target-ci
        (orchestrator/queue/adaptive.py); True when jobs were added."""
        from orchestrator.queue.adaptive import next_pass

        decision = self._db(next_pass, self.store, self.machine_id, target_ci=self.opts.target_ci,
                            max_repeats=self.opts.max_repeats)
        self.emit(Event("note", text=decision.words(self.opts.target_ci)))
        return decision.added

    def _begin_budget(self) -> None:
        """--budget: the sweep's budget on this machine (made, or resumed with what its runs spent)."""
        from orchestrator.queue import budget

        self.budget = self._db(budget.begin, self.store, self.machine_id, self.opts.budget_s, self.opts.budget_sweep_id)
        self.budget_spent_s = self._db(budget.spent_s, self.store, self.budget)

    def _spend(self, add: bool = True):
        """The queue is empty, or the budget spent: decide where the rest goes (orchestrator/queue/budget.py)."""
        from orchestrator.queue import budget

        decision = self._db(budget.next_runs, self.store, self.budget, add=add)
        self.budget_spent_s = decision.spent_s
        return decision

    def _counts_now_and_then(self, every_s: float = 2.0) -> dict | None:
        """The pool's counts for the progress bar, at most every few seconds: counting a 100k-job
        pool costs ~10 ms, a sixth of a tiny job's whole cycle. None in between (the bar waits)."""
        now = time.monotonic()
        if now - self._counted_at < every_s:
            return None
        self._counted_at = now
        return self._db(self.store.counts, pool_id=self.pool_id)

    def _claim(self) -> Claim | None:
        """The next job; after a connection lost during the claim, the run it may have written for
        this worker is taken up again rather than left 'running' for nobody."""
        claim = partial(self.store.claim, self.machine_id, pid=self.pid, host=self.host, max_cores=len(self.pool),
                        pool_id=self.pool_id, started=self.started)
        try:
            return claim()
        except DatabaseUnavailable as error:
            self.patience.failed(error)

        def again() -> Claim | None:
            mine = self.store.own_running(self.pool_id, pid=self.pid, host=self.host, started=self.started)
            return mine if mine is not None else claim()

        return self._db(again)

    def _take_back_stale(self) -> None:
        self._db(self._write_kept)
        # Just after an outage, other hosts' workers get a grace period to beat again: their missed
        # beats were the database's fault (Store.take_back_stale also counts from a server restart).
        taken = self._db(self.store.take_back_stale, self.machine_id, host=self.host, grace_s=self.opts.grace_s,
                         max_attempts=self.opts.max_attempts, is_alive=_alive_other, pool_id=self.pool_id,
                         started_at=_start_time, other_hosts=self.patience.settled(self.opts.grace_s),
                         predicted_s=self._predicted_s)
        if taken:
            self.emit(Event("requeued", text=f"took back {len(taken)} run(s) of dead workers: {taken}"))

    def _predicted_s(self, job_id: int) -> float | None:
        """The ETA's seconds for a job of the pool: how long a dead worker's child may have run before
        its job is to blame (store.blame)."""
        from orchestrator.queue import eta  # numpy and the cost model: only when a dead worker's run is taken back

        return eta.predicted_job_s(self.store, self.machine_id, job_id, pool_id=self.pool_id)

    def _run_claim(self, claim: Claim) -> Outcome:
        seen = set()

        try:
            with heartbeating(self.store, claim.run_id, self.opts.heartbeat_s, self.patience) as beat:
                def child_started(child_pid: int) -> None:  # the child's pid, once (the heartbeat thread beats)
                    if child_pid not in seen:
                        seen.add(child_pid)
                        beat.child_pid = child_pid
                        try:
                            self.store.heartbeat(claim.run_id, child_pid)
                        except DatabaseUnavailable as error:  # the heartbeat thread writes it once the database is back
                            self.patience.failed(error)

                outcome = self.measure(claim.config, run_id=claim.run_id, on_heartbeat=child_started,
                                       derived=claim.derived)
        except (Stopped, KeyboardInterrupt):
            try:
                self.store.release(claim.run_id, pid=self.pid, reason="worker stopped before the run finished")
            except DatabaseUnavailable:
                pass  # the run names this pid, gone in a moment: the next worker takes it back
            raise
        fields = {**outcome.metrics, **outcome.facts, "applied": outcome.applied}
        problems = result_problems(outcome.status, fields)
        if problems:  # a trainer that breaks the contract: a failed run saying how, never a silent drop
            outcome.status, outcome.reason = "failed", f"the trainer's result breaks the contract: {problems}"
            fields = {k: v for k, v in fields.items() if k in RUN_FACTS or k in METRICS}
        if outcome.strike:  # its child killed by a signal we did not send: tried again up to max_attempts strikes
            strikes = claim.strikes + 1
            if strikes < self.opts.max_attempts:
                reason = f"requeued (strike {strikes} of {self.opts.max_attempts}): {outcome.reason}"
                if self._db(self.store.strike, claim.run_id, pid=self.pid, reason=reason, curve=outcome.curve):
                    outcome.status, outcome.reason = "queued", reason
                    return outcome
                raise BenchError(f"run {claim.run_id} was taken back from this worker before it finished "
                                 f"(heartbeat too old?)")
            outcome.reason = f"gave up after {strikes} strike{'s' * (strikes > 1)}; last: {outcome.reason}"
        self._finish(claim.run_id, outcome.status, outcome.reason, fields, outcome.curve, strike=outcome.strike)
        return outcome

    def _finish(self, run_id: int, status: str, reason: str | None, fields: dict, curve: list | None = None,
                strike: bool = False) -> None:
        """Write the run's result (and a learning run's curve; strike: its failure is the job's last
        strike); kept on local disk until the database has it."""
        kept = self.kept_dir / f"{self._kept_prefix}-run-{run_id}.json"
        try:
            self.kept_dir.mkdir(parents=True, exist_ok=True)
            partial_path = kept.with_suffix(".part")
            partial_path.write_text(json.dumps({
                "database": self.store.display_url, "run_id": run_id, "pid": self.pid, "started": self.started,
                "status": status, "reason": reason, "fields": fields, "curve": curve, "strike": strike}, default=str))
            partial_path.replace(kept)
        except OSError as error:  # a full local disk: the database may still take it
            self.emit(Event("note", text=f"run {run_id}'s result could not be kept on disk ({error})"))
            kept = None
        try:
            self._db(self.store.finish, run_id, pid=self.pid, status=status, reason=reason, fields=fields,
                     curve=curve, strike=strike)
        except DatabaseUnavailable as error:
            if kept is None:
                raise
            raise DatabaseUnavailable(f"{error}; run {run_id}'s result is kept in {kept}: the next `bench.py work` "
                                      f"on this machine writes it") from None
        except BenchError:
            if kept is not None:
                kept.unlink(missing_ok=True)  # taken back: another worker runs it; never written twice
            raise
        if kept is not None:
            kept.unlink(missing_ok=True)

    def _write_kept(self) -> None:
        """Write the results that workers of this machine finished and could not write (the database
        was away when they gave up): before anything takes their runs back."""
        for path in sorted(self.kept_dir.glob(f"{self._kept_prefix}-run-*.json")):
            try:
                kept = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written, or not ours to read
            if _alive_other(kept["pid"]) and same_start(_start_time(kept["pid"]), kept["started"]):
                continue  # its worker is alive and still trying
            if kept["pid"] == self.pid and kept["started"] == self.started:
                continue  # our own, being written
            try:
                self.store.finish(kept["run_id"], pid=kept["pid"], status=kept["status"], reason=kept["reason"],
                                  fields=kept["fields"], curve=kept.get("curve"), strike=kept.get("strike", False))
                self.emit(Event("note", text=f"wrote run {kept['run_id']}'s result, kept on disk by worker pid "
                                             f"{kept['pid']} through a database outage"))
            except DatabaseUnavailable:
                raise
            except BenchError as error:
                self.emit(Event("note", text=f"run {kept['run_id']}'s kept result not written: {error}"))
            path.unlink(missing_ok=True)

    def measure(self, config: dict, *, run_id: int | None, on_heartbeat: Callable[[int], None] = lambda pid: None,
                derived: dict | None = None) -> Outcome:
        """Check, apply, spawn, restore: one configuration measured in a fresh child. `derived`: the
        variables the job left on a word (jobs.derived); a torch route left on auto that cannot run
        here runs torch as shipped, and says so (gemm_route.auto_fallback)."""
        fallback = gemm_route.auto_fallback(config, derived, self.facts)
        if fallback:  # the child, the start spec and the read-back's judge all see the route that runs
            config = {**config, "blas": "mkl"}
        module = self.opts.child_module or TRAINERS[config["framework"]]
        why = _trainer_missing(module) or knobs.unavailable(config, self.facts, self.pool,
                                                            sysfs_root=self.opts.sysfs_root)
        if why:
            return Outcome("skipped", why)
        data_dir = self.opts.data_dir
        self._prepare_data(config["dataset"])
        output_dir = self.opts.output_dir / (f"run-{run_id}-{self._output_tag}" if run_id is not None
                                             else f"once-{time.strftime('%Y%m%d-%H%M%S')}-{self.pid}")
        job = {
            "config": config,
            "run_id": run_id,
            "output_dir": str(output_dir),
            "output_root": str(self.opts.output_dir),
            "data_dir": str(data_dir),
            "peak_gflops": None,  # of the CPU set knobs.applied picks, below
            "compile_cache_dir": str(self.opts.state_dir / "inductor-cache"),
            "collective_timeout_s": self.opts.collective_timeout_s,  # ranks > 1: a hung rank fails the run after it
            # a learning run appends each evaluation here as it goes: what a failed attempt got is kept
            "curve_path": str(output_dir / CURVE_FILE),
        }
        (output_dir / CURVE_FILE).unlink(missing_ok=True)  # the same worker's earlier attempt: this one starts clean
        with knobs.applied(config, self.facts, self.pool, journal_path=self.journal,
                           sysfs_root=self.opts.sysfs_root) as spec:
            job["peak_gflops"] = self._peak(config, spec.cpus)
            sampler = sensors.RunSampler(spec.cpus, sysfs_root=self.opts.sysfs_root)
            load_before = os.getloadavg()[0]
            sampler.start()

            def beat(child_pid: int) -> None:  # the sampler takes the child's own CPU time out of other_cpu_s
                sampler.watch(child_pid)
                on_heartbeat(child_pid)

            env = child_env(spec.env, PROJECT_ROOT, data_dir)
            proven = None
            if self.forkserver is None:  # a fork server keeps its own children's (a new server, nothing)
                proven = self._exec_proven.setdefault(
                    (module, tuple(sorted(env.items())), tuple(spec.argv_prefix), tuple(spec.cpus)), {})
                job["proven"] = dict(proven)
            try:
                spawn = self.forkserver.run if self.forkserver is not None else run_exec
                outcome = spawn(job, module=module, argv_prefix=spec.argv_prefix, env=env, cpus=spec.cpus,
                                cwd=PROJECT_ROOT, timeout_s=self.opts.timeout_s, heartbeat_s=self.opts.heartbeat_s,
                                on_heartbeat=beat)
            finally:
                sampled = sampler.stop()
            if proven is not None:
                proven.update(outcome.proven)
        outcome.curve = read_curve(output_dir / CURVE_FILE)
        window = outcome.timed_window  # {start_unix_s, end_unix_s}: the sensors average over exactly it
        if window:
            sampled = sampler.summary((window["start_unix_s"], window["end_unix_s"]))
        notes = sampled.pop("notes", {})
        sources = sampled.pop("sources", {})
        wrong = knobs.not_in_force(config, spec, outcome.applied) if outcome.status == "done" else []
        if wrong:
            outcome.status = "failed"
            outcome.reason = "the child did not run under the job's settings: " + "; ".join(wrong)
        compiled = compiled_while_timed(outcome.timed_window) if outcome.status == "done" else None
        if compiled:  # its step times are the compiler's: failed with why, never a silent done
            outcome.status, outcome.reason = "failed", compiled
        if outcome.status == "done":
            outcome.metrics.update({k: sampled.get(k) for k in WORKER_METRICS if k != "wall_s"})
        outcome.facts["load_before"] = load_before
        outcome.applied = {**spec.applied, **outcome.applied, "sensor_notes": notes, "sensor_sources": sources,
                           "peak_gflops": job["peak_gflops"]}
        if fallback:
            outcome.applied["blas_fallback"] = fallback
        if outcome.timed_window is not None:
            outcome.applied["timed_window"] = outcome.timed_window
        return outcome

    def _peak(self, config: dict, cpus: list[int]) -> dict | None:
        """The GEMM peak of the job's CPU set (gemm_peak: measured on that set, under the clock knobs
        now in force), or the probe's peaks scaled to it where that is off or fails; `basis` says which."""
        if self.opts.peak_per_set and self.opts.sysfs_root not in ("", "/"):
            why = f"per-set GEMM peak not measured: the machine is described by {self.opts.sysfs_root}, not this one"
        elif self.opts.peak_per_set:
            try:
                started = time.perf_counter()
                peak = gemm_peak.peak_for(cpus, config, self.facts, self.opts.state_dir, quick=self.opts.probe_quick,
                                          provisional=self._provisional_peaks)
                # what this run's claim-to-finish spent on it: a set measured once is cached for later runs
                return {**peak, "measure_s": round(time.perf_counter() - started, 3)}
            except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as error:
                why = f"the GEMM peak of the set could not be measured ({error})"
        else:
            why = "per-set GEMM peak measurement off (BENCH_PEAK_PER_SET=0)"
        out = _peaks(self.facts, cpus)
        if out:
            out["basis"] += f"; {why}"
            out["provisional"] = why
        return out

    def _prepare_data(self, dataset: str) -> None:
        if dataset not in self._datasets:
            from worker import data  # imports `datasets` (slow): only when a job needs it

            _, used = data.prepare(self.opts.data_dir, dataset)
            self._datasets[dataset] = used
            if used != dataset:
                self.emit(Event("note", text=f"dataset {dataset} could not be loaded; training on {used} instead "
                                             f"(recorded per run as dataset_used={used})"))


def read_curve(path: Path) -> list[dict]:
    """The evaluations a learning run's child appended (harness.Learning.curve_path), whole lines only:
    a child killed while writing leaves its last line cut."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def _trainer_missing(module: str) -> str | None:
    """Why the trainer cannot be started (a package without __main__: not written yet), or None."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:  # a package: python -m runs __main__
            spec = importlib.util.find_spec(f"{module}.__main__")
    except ModuleNotFoundError:
        spec = None
    return None if spec is not None else f"unavailable: no trainer {module} in this checkout"


@dataclass
class Beat:
    child_pid: int | None = None  # written with the next beat once the child has started


@contextmanager
def heartbeating(store: Store, run_id: int, every_s: float, patience: Patience | None = None):
    """Beat for the run from claim to finish, whatever the worker is doing meanwhile (data, knobs, a
    fork server's start, the child): a thread of its own, on its own pooled connection. A beat lost
    to a database outage is tried again at the next one, until the outage has lasted the worker's
    --db-retry (patience: shared with the worker, which is told when the outage began and ended);
    a run taken back stops nothing here, finish() says so."""
    stop = threading.Event()
    state = Beat()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                store.heartbeat(run_id, state.child_pid)
            except DatabaseUnavailable as error:
                if patience is not None:
                    patience.failed(error)
                    if patience.gave_up():
                        return  # the worker's own next call gives up too, and says so
                continue
            except Exception:  # the next beat tries again; the worker's own calls report errors
                continue
            if patience is not None:
                patience.ok()

    thread = threading.Thread(target=beat, name=f"heartbeat-run-{run_id}", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join()


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive_other(pid: int) -> bool:
    """A run's worker pid still alive on this host (our own pid means a previous life of this pid)."""
    if pid == os.getpid():
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _peaks(facts: dict, cpus: list[int]) -> dict | None:
    """The GEMM peak of the CPU set a run really uses: its physical cores (SMT siblings share one core's
    FMA units) x the measured 1-core peak, at most the measured all-core peak (one thread per CPU of the
    whole machine); without a 1-core figure, the all-core peak x the share of physical cores used.
    The ISA is the machine's full one: a capped run's MFU shows what the cap costs."""
    core_cpus = facts.get("core_cpus") or [[c] for c in (facts.get("cpus") or cpus)]
    used = set(cpus)
    physical_used = sum(1 for core in core_cpus if used & set(core)) or len(used)
    physical_all = len(core_cpus) or physical_used
    out = {}
    for precision in ("fp32", "bf16"):
        one, every = facts.get(f"gemm_gflops_{precision}_1c"), facts.get(f"gemm_gflops_{precision}_all")
        if one:
            out[precision] = min(one * physical_used, every) if every else one * physical_used
        elif every:
            out[precision] = every * physical_used / physical_all
    if out:
        how = "the 1-core GEMM peak, at most the all-core one" if facts.get("gemm_gflops_fp32_1c") else \
            f"the all-core GEMM peak / {physical_all} physical cores"
        out["basis"] = f"{physical_used} physical core(s) of CPUs {sorted(used)} x {how} (the probe's, torch's GEMM)"
    return out or None



def once_cpu_count(options: WorkerOptions) -> int:
    """How many CPUs `bench.py once` may use: what its config's cores=all resolves against."""
    return len(allowed_cpus(options.cpus))


def measure_once(config: dict, options: WorkerOptions, derived: dict | None = None) -> dict:
    """`bench.py once K=V ...`: one resolved configuration (the CLI resolves it through the catalogue,
    against once_cpu_count()) measured in a child, outside the queue. The result has every metric by
    its column name (None where not measured), status, reason, and applied (the settings read back)."""
    worker = Worker(None, replace(options, spawn="exec"))  # one job: a fork server would only add a start
    with cpu_locks(options.state_dir, worker.pool, wait=options.wait):
        worker.facts = probe.probe(options.state_dir, quick=options.probe_quick, sysfs_root=options.sysfs_root)
        restore_left_behind(options.state_dir, options.sysfs_root)
        try:
            outcome = worker.measure(config, run_id=None, derived=derived)
        finally:
            worker.close()
    result = {"status": outcome.status, "reason": outcome.reason}
    result.update({m: outcome.metrics.get(m) for m in METRICS})
    result.update({k: v for k, v in outcome.facts.items() if k != "child_pid"})
    result["applied"] = outcome.applied
    result["config"] = config
    if outcome.curve:
        result["curve"] = outcome.curve
    return result
