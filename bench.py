#!/usr/bin/env python3
"""cpubench: how does the time to train a language model on CPUs change with each variable?

The command line. Each command is options, a docstring (its --help) and one call into the library;
this is the only module that prints with rich, exits, or turns a BenchError into an exit code.
Nothing printed is rich markup: the consoles take text literally (a path or a sweep name with
brackets is printed as typed), and colour is given as styles (`styled`). Every error is one line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer._click import exceptions as click_errors  # typer 0.29 carries its own click
from typer.core import TyperGroup

from common.errors import BenchError
from orchestrator.queue.sweep import DEFAULT_MAX_JOBS, PRESETS_DIR

_IS_PROGRAM = False  # bench.py runs as the program (end_at_once); set in its __main__ block


def settings_given(settings: list[str]) -> dict:
    """`once` and `predict`'s K=V arguments as a partial config: each variable once, none that only
    sweeps set, every value checked (BadInput names the one that is wrong)."""
    from common import variables
    from common.errors import BadInput
    from orchestrator.queue.sweep import parse_assignment

    partial = {}
    for item in settings:
        key, value = parse_assignment(item, "setting")
        if key in variables.SET_BY_SWEEP:
            raise BadInput(f"setting {key!r}: set by sweeps, not by hand")
        if key in partial:
            raise BadInput(f"setting {item!r}: {key} is already given: give each variable once")
        partial[key] = variables.parse_value(key, value, "the command line")
    return partial


def styled(*parts) -> Text:
    """One line of plain strings and (text, style) pairs: the strings are never read as markup."""
    return Text.assemble(*parts)


class OneLineErrors(TyperGroup):
    """A usage error (an unknown option, `--repeats abc`) is one line on stderr and exit 2, like
    every other bad input, instead of click's usage block in a box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as error:
            error.show()
            sys.exit(error.exit_code)
        except click_errors.UsageError as error:
            where = f"{error.ctx.command_path}: " if error.ctx is not None else ""
            hint = f" (see {error.ctx.command_path} --help)" if error.ctx is not None else ""
            err.print(styled(("error: ", "bold red"), f"{where}{error.format_message()}{hint}"), highlight=False)
            sys.exit(error.exit_code)
        except click_errors.ClickException as error:
            err.print(styled(("error: ", "bold red"), error.format_message()), highlight=False)
            sys.exit(error.exit_code)
        except typer.Abort:
            err.print("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=OneLineErrors,
                  rich_markup_mode=None, help=__doc__.split("\n")[0])
out = Console(markup=False, highlight=False, soft_wrap=True)  # a result line is one line in a log
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)
_stores: list = []  # opened by this command: closed when it ends (no -wal/-shm left behind)

DbOption = Annotated[str, typer.Option("--db", envvar="BENCH_DB",
                                       help="results database: a file path or an SQLAlchemy URL")]
PoolOption = Annotated[Optional[str], typer.Option("--pool", help="a named pool shared by identical nodes "
                                                   "(each job once per pool); default: this machine's own")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout and nothing else there")]
BudgetOption = Annotated[Optional[str], typer.Option(
    "--budget", help="DURATION (5m, 90s, 2h, or none): one pass of every comparison, then runs where the intervals "
                     "are widest until this much run time is spent; run: default the preset's sweep.budget")]
MemLimitOption = Annotated[Optional[float], typer.Option(
    "--mem-limit-gb", envvar="BENCH_MEM_LIMIT_GB",
    help="GiB a job may use (refused above it, by estimate); default: this machine's memory")]


def fail(error: BenchError) -> None:
    from common.secrets import scrub

    message = " ".join(scrub(str(error)).split("\n"))  # one line, whatever the message held
    err.print(styled(("error: ", "bold red"), message), highlight=False)
    raise typer.Exit(error.exit_code)


def guarded(fn):
    """Run a command body: BenchError -> one red line + its exit code; a failure of the system (a
    disk, a permission) -> one line, exit 1; Ctrl-C -> exit 130. The stores it opened are closed."""
    try:
        return fn()
    except BenchError as error:
        fail(error)
    except OSError as error:
        where = f" {error.filename}" if error.filename else ""
        fail(BenchError(f"{error.strerror or error}{':' if where else ''}{where}"))
    except KeyboardInterrupt:
        err.print(styled(("interrupted", "yellow"), ": settings restored, the unfinished run is back in the queue"))
        raise typer.Exit(130) from None
    finally:
        while _stores:
            _stores.pop().close()


def open_store(db: str, *, read_only: bool = False, create: bool = True):
    """The results database; read_only for the commands that only read (nothing is created there);
    create=False for those that work on what it holds (an empty database is refused, not made one)."""
    from orchestrator.queue.store import Store

    store = Store(db, read_only=read_only, create=create)
    _stores.append(store)
    return store


def note(text: str, console=None) -> None:
    """A warning: stderr, whatever the command prints on stdout."""
    (console or err).print(styled(("note", "yellow"), ": ", text), highlight=False)


def this_machine():
    """Expansion's view of the machine: CPUs this process may use, frequency limits if any."""
    from orchestrator.queue.sweep import Machine

    return Machine(cpu_count=len(os.sched_getaffinity(0)), freq_limits=_freq_limits)


def probe_here(remeasure: bool = False) -> dict:
    """This machine's facts from the probe (cached per boot in the worker state dir)."""
    from worker.loop import default_state_dir
    from worker.machine.probe import probe

    return probe(default_state_dir(), remeasure=remeasure, quick=os.environ.get("BENCH_PROBE_QUICK") == "1")


def static_here() -> dict:
    """This machine's static facts (cached per boot in the worker state dir), for the commands that only
    look the machine up or read its frequency range: not the probe's measurements or its checks of the
    knobs, which import torch."""
    from worker.loop import default_state_dir
    from worker.machine.probe import cached_static_facts

    return cached_static_facts(default_state_dir())


def _freq_limits():
    facts = static_here()
    low, high = facts.get("freq_min_mhz"), facts.get("freq_max_mhz")
    return (int(low), int(high)) if low and high else None


def print_plan_result(plan, result, *, dry_run: bool, memory_gib: tuple[float, float] | None = None) -> None:
    """The result of an enqueue, on stdout (`> log` keeps it); its notes are warnings, on stderr."""
    verb = "would add" if dry_run else "added"
    out.print(styled("sweep ", (plan.name, "bold"), f" ({plan.mode}, {plan.source}): {verb} ",
                     (str(result.new), "green"),
                     f" new jobs, {result.present} already present, {sum(plan.rejected.values())} rejected"))
    if memory_gib:
        out.print(f"  largest job's memory estimate {memory_gib[0]:.1f} GiB of {memory_gib[1]:.1f} GiB")
    for reason, n in plan.rejected.most_common():
        out.print(f"  rejected {n}: {reason}")
    for text in plan.notes:
        note(text)


@app.command()
def enqueue(
    sweep_file: Annotated[Optional[Path], typer.Argument(help="a sweep TOML file")] = None,
    preset: Annotated[Optional[str], typer.Option(help="a preset from orchestrator/queue/presets/: " + ", ".join(
        sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))))] = None,
    set_: Annotated[list[str], typer.Option("--set", metavar="K=V", help="a base value (repeatable, once per "
                                                                          "variable)")] = [],
    axis: Annotated[list[str], typer.Option(metavar="K=V1,V2", help="a varied variable (repeatable, once per "
                                                                     "variable); K=auto for a machine-derived "
                                                                     "range")] = [],
    repeats: Annotated[Optional[int], typer.Option(help="repeats of every combination")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count, write nothing")] = False,
    max_jobs: Annotated[int, typer.Option("--max-jobs", envvar="BENCH_MAX_JOBS", min=1,
                                          help="refuse a sweep that plans more jobs than this")] = DEFAULT_MAX_JOBS,
    mem_limit_gb: MemLimitOption = None,
    name: Annotated[Optional[str], typer.Option(help="the sweep's name in status and the report; default: the "
                                                     "file's [sweep] name or stem, or the axes given here")] = None,
    db: DbOption = "results.db",
) -> None:
    """Expand a sweep into jobs. Idempotent: re-enqueueing adds only new combinations. A sweep is
    counted before it is expanded: one above --max-jobs is refused at once with its count; one with a
    job whose estimated memory exceeds the machine's (or --mem-limit-gb) is refused with the estimate."""
    from worker import memory
    from orchestrator.queue.sweep import load

    from orchestrator.queue import cli_support

    def body():
        plan = load(sweep_file, preset=preset, sets=set_, axes=axis, repeats=repeats, machine=this_machine(),
                    max_jobs=max_jobs, name=name)
        limit = memory.machine_limit(mem_limit_gb)
        worst = memory.check_plan(plan, *limit)
        cli_support.first_job(plan)
        if dry_run and cli_support.missing(db):
            result = cli_support.dry_run_without_database(plan)
        else:
            result = open_store(db, read_only=dry_run).enqueue(
                name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.iter_jobs(), notes=plan.notes,
                dry_run=dry_run)
        print_plan_result(plan, result, dry_run=dry_run, memory_gib=(worst / memory.GIB, limit[0] / memory.GIB))

    guarded(body)


def work_with_progress(db: str, options) -> dict:
    """Run a worker with a rich progress bar (on stderr) and an ETA learned from finished runs."""
    from orchestrator.queue.eta import estimate_remaining_s
    from worker.loop import Worker

    store = open_store(db, create=False)  # an empty database has nothing to run: refused, not made one
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"))
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task("jobs", total=None, tally="", eta="?")
        eta_at = [0.0]  # when the ETA was last fitted: every few seconds is enough for a person

        def show(event):
            if event.counts and worker.budget is not None:  # the bar counts seconds of the budget, not jobs
                c = event.counts
                spent, total = worker.budget_spent_s, worker.budget.budget_s
                progress.update(task, total=round(total), completed=round(min(spent, total)),
                                tally=f"s of budget; done {c['done']} failed {c['failed']} skipped {c['skipped']}",
                                eta=_duration(max(0.0, total - spent)))
            elif event.counts:
                c = event.counts
                finished = c["done"] + c["failed"] + c["skipped"]
                progress.update(task, total=c["total"], completed=finished,
                                tally=f"done {c['done']} failed {c['failed']} skipped {c['skipped']}")
                if worker.pool_id and time.monotonic() - eta_at[0] > 5:
                    eta_at[0] = time.monotonic()
                    progress.update(task, eta=_duration(estimate_remaining_s(store, worker.machine_id,
                                                                             pool_id=worker.pool_id)))
            if event.kind == "claimed":
                progress.update(task, description=f"run {event.claim.run_id}")
            elif event.kind == "finished" and event.outcome.status != "done":
                colour = "red" if event.outcome.status == "failed" else "yellow"
                first = (event.outcome.reason or "").splitlines()[0] if event.outcome.reason else ""
                progress.console.print(styled((event.outcome.status, colour), f" run {event.claim.run_id}: {first}"),
                                       highlight=False)
            elif event.kind in ("restored", "requeued", "note"):
                progress.console.print(styled((event.kind, "yellow"), f": {event.text}"), highlight=False)

        worker = Worker(store, options, on_event=show)
        return worker.run()


def _duration(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _cpu_list(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    cpus = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise BenchError(f"--cpus {text!r}: expected a list like 0-3,8") from None
    return sorted(cpus)


def _worker_options(cpus, max_jobs, wait, timeout, pool_name=None, target_ci=None, max_repeats=10, db_retry=None,
                    budget_s=None, budget_sweep_id=None):
    from common.errors import BadInput
    from common.patience import retry_seconds
    from worker.loop import WorkerOptions

    try:
        pool = _cpu_list(cpus)
    except BenchError as error:
        raise BadInput(str(error)) from None
    if pool_name is not None and not pool_name.strip():
        raise BadInput("--pool: give the pool a name")
    if target_ci is not None and not 0 < target_ci < 100:
        raise BadInput(f"--target-ci {target_ci:g}: expected a percentage between 0 and 100 (5 = +-5%)")
    if max_repeats < 2:
        raise BadInput(f"--max-repeats {max_repeats}: an interval needs at least 2 runs per value")
    if budget_s is not None and target_ci is not None:
        raise BadInput("--budget and --target-ci: give one (a budget spends its time where intervals are widest)")
    db_retry_s = retry_seconds(db_retry)
    return WorkerOptions(cpus=pool, max_jobs=max_jobs, wait=wait, timeout_s=timeout, pool_name=pool_name,
                         heartbeat_s=float(os.environ.get("BENCH_HEARTBEAT_S", "5")),
                         max_attempts=int(os.environ.get("BENCH_MAX_ATTEMPTS", "3")),
                         target_ci=None if target_ci is None else target_ci / 100, max_repeats=max_repeats,
                         db_retry_s=db_retry_s, budget_s=budget_s, budget_sweep_id=budget_sweep_id)


@app.command()
def work(
    max_jobs: Annotated[Optional[int], typer.Option(help="stop after this many jobs")] = None,
    cpus: Annotated[Optional[str], typer.Option(help="the CPUs this worker may use, e.g. 0-3,8")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for busy CPUs and poll for new jobs")] = False,
    timeout: Annotated[float, typer.Option(help="seconds one job may take")] = 900.0,
    pool: PoolOption = None,
    target_ci: Annotated[Optional[float], typer.Option(
        "--target-ci", help="PCT: when the queue is empty, add repeat passes for comparisons whose 95% interval "
                            "is wider than +-PCT%")] = None,
    max_repeats: Annotated[int, typer.Option(help="with --target-ci: at most this many runs per value")] = 10,
    budget: BudgetOption = None,
    db_retry: Annotated[Optional[float], typer.Option(
        "--db-retry", help="seconds to ride out a lost database (a server restart, a held lock) before giving up "
                           "[default: BENCH_DB_RETRY_S or 600]")] = None,
    db: DbOption = "results.db",
) -> None:
    """Claim and run queued jobs, one at a time, until none is left: this machine's own (every job,
    to compare machines), or with --pool those of a pool of identical nodes (each job once)."""
    def body():
        from orchestrator.queue.cli_support import require_database

        from common.durations import parse_duration

        options = _worker_options(cpus, max_jobs, wait, timeout, pool, target_ci, max_repeats, db_retry,
                                  budget_s=parse_duration(budget) if budget is not None else None)
        require_database(db, "work")
        counts = work_with_progress(db, options)
        out.print(f"queued {counts['queued']}, done {counts['done']}, failed {counts['failed']}, "
                  f"skipped {counts['skipped']}")
        if counts["queued"] and max_jobs is None:
            note("the jobs still queued need more CPUs than this worker may use (--cpus)")

    guarded(body)


def _machine_id(store) -> int:
    return store.register_machine(probe_here())


@app.command()
def status(
    as_json: JsonOption = False,
    all_machines: Annotated[bool, typer.Option("--all-machines", help="count every machine's and pool's runs")] = False,
    pool: PoolOption = None,
    db: DbOption = "results.db",
) -> None:
    """Queued / running / done / failed / skipped per sweep, for this machine (or a --pool, or all)."""
    def body():
        from common.errors import BadInput
        from orchestrator.queue.store import NO_POOL

        if pool is not None and all_machines:
            raise BadInput("--pool and --all-machines: give one (a pool's counts, or every machine's and pool's)")
        store = open_store(db, read_only=True)
        machine_id = pool_id = None
        if pool is not None:
            pool_id = store.pool_id(None, pool, create=False)
        elif not all_machines:  # looked up, not registered: status writes nothing
            machine_id = store.find_machine(static_here()["fingerprint"])
            pool_id = store.pool_id(machine_id) if machine_id is not None else NO_POOL
        counts = store.counts(pool_id=pool_id)
        per_pool = {}
        if pool_id is None:
            active = store.active_pools()
            per_pool = {p.label: store.counts(pool_id=p.pool_id) for p in store.pools() if p.pool_id in active}
        by_sweep = store.counts_by_sweep(pool_id=pool_id)
        if as_json:
            doc = {**counts, **({"pool": pool} if pool else {}),
                   **({"pools": per_pool} if pool_id is None else {}), "sweeps": by_sweep,
                   **({"fleet": fleet_progress(store).as_dict()} if pool_id is None else {})}
            print(json.dumps(doc))
            return
        scope = f"pool {pool}" if pool else "all machines and pools" if all_machines else "this machine"
        table = Table(title=f"cpubench status ({scope})")
        for column in ("sweep", "total", "queued", "running", "done", "failed", "skipped"):
            table.add_column(column, justify="left" if column == "sweep" else "right")
        for name, c in sorted(by_sweep.items()):
            table.add_row(name, *(str(c[k]) for k in ("total", "queued", "running", "done", "failed", "skipped")))
        table.add_row("all jobs",
                      *(str(counts[k]) for k in ("total", "queued", "running", "done", "failed", "skipped")),
                      style="bold")
        out.print(table)
        if per_pool:
            pools = Table(title="by machine and pool")
            for column in ("queue", "total", "queued", "running", "done", "failed", "skipped"):
                pools.add_column(column, justify="left" if column == "queue" else "right")
            for label, c in per_pool.items():
                pools.add_row(label, *(str(c[k]) for k in ("total", "queued", "running", "done", "failed", "skipped")))
            out.print(pools)
            print_fleet(fleet_progress(store))
        if pool_id is not None:
            from orchestrator.queue.eta import estimate_remaining_s

            from orchestrator.queue.progress import eta_words

            mine = next((p for p in fleet_progress(store).pools if p.pool_id == pool_id), None)
            if mine is not None and mine.budget_s is not None:  # the budget, not the queue, says when it ends
                out.print(f"Time budget (--budget): {eta_words(mine, time.time())}")
            else:
                eta = estimate_remaining_s(store, machine_id, pool_id=pool_id)
                if counts["queued"] and eta is not None:
                    out.print(f"ETA for the queued jobs: {_duration(eta)} (learned from finished runs)")

    guarded(body)


def fleet_progress(store):
    from orchestrator.queue.progress import progress

    return progress(store)


def print_fleet(pr) -> None:
    """Per pool and machine: done, running since when, failed, skipped, queued, ETA (orchestrator/queue/progress.py)."""
    from orchestrator.queue.progress import clock, eta_words, queued_words

    table = Table(title="by pool and machine, now")
    for column in ("pool", "machine", "done", "running", "failed", "skipped", "queued", "ETA"):
        table.add_column(column, justify="left" if column in ("pool", "machine", "running", "ETA") else "right")
    for p in pr.pools:
        table.add_row(Text(p.label, style="bold"), "", str(p.done), str(p.running), str(p.failed), str(p.skipped),
                      queued_words(p), eta_words(p, pr.now))
        for m in p.machines:
            since = (f"{m.running} since {clock(m.running_since)} UTC" if m.running and m.running_since
                     else str(m.running))
            table.add_row("", f"{m.hostname or '?'} ({m.machine_id})", str(m.done), since, str(m.failed),
                          str(m.skipped), "", "")
    out.print(table)
    for f in pr.failures[:5]:
        out.print(f"{clock(f['finished'])} {f['status']} run {f['run_id']} on {f['host'] or '?'}: {f['reason']}",
                  highlight=False, soft_wrap=True)


def report_and_print(db: str, out_dir: Path):
    """Write the report of `db` into out_dir and print its top effects. Returns the Report: a caller that ends with
    end_at_once keeps it till then, so that its runs are never freed one by one."""
    from orchestrator.queue.cli_support import check_out_dir
    from orchestrator.report import write_report

    check_out_dir(out_dir)
    store = open_store(db, read_only=True)
    rep = write_report(store, out_dir)
    if not rep.counts.get("done"):
        note(f"no finished run in {store.where} yet: the report has no effects to show (`bench.py work` runs the "
             f"queue)")
        out.print(f"wrote an empty report: {rep.html_path}")
        return rep
    table = Table(title="largest effects on median step time, relative to their uncertainty (clearest first)")
    several = rep.machines > 1
    for column in (("machine",) if several else ()) + ("variable", "effect", "estimate", "95% CI (family-wise)",
                                                       "runs", "verdict"):
        table.add_column(column)
    for e in rep.top_effects[:10]:
        table.add_row(*((str(e.machine_id),) if several else ()), *e.row(), e.verdict())
    out.print(table)
    out.print(f"wrote {rep.csv_path}, {rep.summary_path} and {len(rep.plot_paths)} plots in {out_dir / 'plots'}")
    if rep.effects_not_written:
        note(f"the effects table was not updated: {rep.effects_not_written}")
    out.print(f"the report: open {rep.html_path} in a browser (works offline)", soft_wrap=True)
    return rep


@app.command()
def report(
    out_dir: Annotated[Path, typer.Option(
        "--out", help="where to write the page, CSV, markdown and plots")] = Path("result"),
    watch: Annotated[bool, typer.Option(
        "--watch", help="keep index.html current while workers run (Ctrl+C stops)")] = False,
    every: Annotated[float, typer.Option("--every", help="with --watch: seconds between updates", min=1.0)] = 10.0,
    db_retry: Annotated[Optional[float], typer.Option(
        "--db-retry", help="with --watch: seconds to ride out a lost database (a server restart, a held lock) "
                           "before giving up [default: BENCH_DB_RETRY_S or 600]")] = None,
    db: DbOption = "results.db",
) -> None:
    """Write result/: index.html (the page to open), results.csv, summary.md, plots/*.png, fitted effects (also to
    the effects table). --watch keeps index.html current while workers run: progress per machine and pool, the
    effects as they stand, the last failures (orchestrator/report/watch.py); each update redoes the comparisons and
    predictions of only the machines whose runs changed."""
    if watch:
        guarded(lambda: watch_and_print(db, out_dir, every, db_retry))
        return

    def body():
        from common.patience import retry_seconds

        if db_retry is not None:
            retry_seconds(db_retry)  # a bad value refused (exit 2) as with --watch, though only --watch uses it
        return report_and_print(db, out_dir)
    _report = guarded(body)  # held to the end: end_at_once then skips freeing its runs (~0.7 s at a million)
    end_at_once()


def end_at_once() -> None:
    """End the program now, its output flushed and its stores closed, without the interpreter's
    teardown: that frees a report's objects one by one (0.4 s of the command at 100k runs; several
    seconds at a million), after every file is written. Only where bench.py is the program: a call in
    the same process (a test's CliRunner) returns."""
    if not _IS_PROGRAM:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def watch_and_print(db: str, out_dir: Path, every: float, db_retry: float | None = None) -> None:
    from common.patience import retry_seconds
    from orchestrator.report.watch import watch as keep_current

    retry_s = retry_seconds(db_retry)  # a database outage ridden out, as a worker does
    store = open_store(db, read_only=True)  # the statistics run in a child at nice 19 (watch.WATCH_NICE)
    err.print(f"keeping {out_dir / 'index.html'} current every {every:g} s (Ctrl+C stops)", highlight=False)

    def said(tick):
        if tick.analysed:
            err.print(f"{time.strftime('%H:%M:%S')} {tick.done:,} runs finished: "
                      f"report redone in {tick.report_s:.1f} s", highlight=False)
    try:
        keep_current(store, out_dir, every_s=every, on_tick=said, retry_s=retry_s,
                     on_note=lambda text: err.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False))
    except KeyboardInterrupt:
        err.print("stopped watching", highlight=False)


def _env_max_jobs() -> int:
    from common.errors import BadInput

    value = os.environ.get("BENCH_MAX_JOBS", str(DEFAULT_MAX_JOBS))
    if not value.isdigit() or int(value) < 1:
        raise BadInput(f"BENCH_MAX_JOBS={value!r}: expected a whole number of jobs >= 1")
    return int(value)


@app.command()
def run(
    preset: Annotated[str, typer.Option(help="the sweep preset to run: " + ", ".join(
        sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))))] = "quick",
    out_dir: Annotated[Path, typer.Option("--out", help="where the report goes")] = Path("result"),
    timeout: Annotated[float, typer.Option(help="seconds one job may take")] = 900.0,
    mem_limit_gb: MemLimitOption = None,
    budget: BudgetOption = None,
    db: DbOption = "results.db",
) -> None:
    """The main job: enqueue a preset, work until it is done (or its time budget is spent), write the report."""
    from worker import memory
    from orchestrator.queue.sweep import load

    def body():
        from orchestrator.queue.cli_support import check_out_dir, first_job

        from common.durations import parse_duration

        check_out_dir(out_dir)
        asked = parse_duration(budget) if budget is not None else None
        plan = load(None, preset=preset, machine=this_machine(), max_jobs=_env_max_jobs())
        budget_s = asked if budget is not None else plan.budget_s
        if budget_s is not None:  # one pass of everything; the budget decides the repeats
            plan = load(None, preset=preset, repeats=1, machine=this_machine(), max_jobs=_env_max_jobs())
        limit = memory.machine_limit(mem_limit_gb)
        worst = memory.check_plan(plan, *limit)
        first_job(plan)
        result = open_store(db).enqueue(name=plan.name, source=plan.source, sweep_text=plan.text,
                                        jobs=plan.iter_jobs(), notes=plan.notes)
        options = _worker_options(None, None, False, timeout, budget_s=budget_s, budget_sweep_id=result.sweep_id)
        print_plan_result(plan, result, dry_run=False, memory_gib=(worst / memory.GIB, limit[0] / memory.GIB))
        work_with_progress(db, options)
        report_and_print(db, out_dir)

    guarded(body)


@app.command()
def once(
    settings: Annotated[list[str], typer.Argument(help="K=V settings; the catalogue's defaults fill the rest")] = [],
    as_json: JsonOption = False,
    timeout: Annotated[float, typer.Option(help="seconds the run may take")] = 900.0,
    mem_limit_gb: MemLimitOption = None,
) -> None:
    """Measure one configuration in a child process, outside the queue, and print its metrics."""
    from common import variables
    from worker import memory
    from common.errors import BadInput
    from worker.loop import measure_once, once_cpu_count

    def body():
        partial = settings_given(settings)
        options = _worker_options(None, None, False, timeout)
        config, why = variables.resolve(partial, once_cpu_count(options))
        if why:
            raise BadInput(f"this configuration cannot run: {'; '.join(why)}")
        memory.check([config], *memory.machine_limit(mem_limit_gb), "once")
        result = measure_once(config, options, variables.derived_words(partial))
        if as_json:
            print(json.dumps(result, default=str))
            return
        table = Table(title=f"once: {result['status']}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in result.items():
            if key not in ("applied", "config", "build_info") and value is not None:
                table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        out.print(table)
        out.print("applied:", json.dumps(result["applied"], default=str))
        if result["status"] == "failed":
            raise typer.Exit(1)

    guarded(body)


@app.command()
def predict(
    settings: Annotated[list[str], typer.Argument(help="K=V settings; the catalogue's defaults fill the rest")] = [],
    machine_name: Annotated[Optional[str], typer.Option(
        "--machine", help="the machine's id, hostname or fingerprint "
                          "(default: this host when it has runs, else the only machine)")] = None,
    tokens: Annotated[Optional[float], typer.Option(help="also the time to train this many tokens")] = None,
    epochs: Annotated[Optional[float], typer.Option(
        help="also the time to train this many epochs of --dataset")] = None,
    dataset: Annotated[Optional[str], typer.Option(
        help="wikitext-2 or wikitext-103 (their published word counts, converted to the run's tokenizer)")] = None,
    to_loss: Annotated[Optional[float], typer.Option(
        "--to-loss", help="also the time to this validation loss "
                          "(tokens to it from the learning runs' curves, docs/learning.md)")] = None,
    as_json: JsonOption = False,
    db: DbOption = "results.db",
) -> None:
    """The predicted median step time of a configuration on a machine of the database, with a 95%
    prediction interval, what it rests on and what it extrapolates (orchestrator/stats/cost_model.py,
    docs/prediction.md); with --to-loss, the time to reach that validation loss. Only reads the database."""
    import socket

    from orchestrator.queue.predict import predict as predict_config

    def body():
        partial = settings_given(settings)
        doc = predict_config(open_store(db, read_only=True), partial, machine=machine_name,
                             here=socket.gethostname(), tokens=tokens, epochs=epochs, dataset=dataset,
                             to_loss=to_loss)
        if as_json:
            print(json.dumps(doc))
            return
        m = doc["machine"]

        def step(ms: float) -> str:
            return f"{ms / 1e3:.3g} s" if ms >= 1e3 else f"{ms:.3g} ms"
        out.print(styled((step(doc["step_ms"]), "bold"), f" per step (95% interval {step(doc['step_ms_low'])} to "
                         f"{step(doc['step_ms_high'])}) on machine {m['machine_id']} "
                         f"({m['hostname']}, {m['cpu_model']})"))
        out.print(f"  {doc['flops_per_step'] / 1e9:.4g} GFLOP and {doc['tokens_per_step']:,} tokens per step, "
                  f"{doc['params'] / 1e6:.4g}M parameters")
        if "train_s" in doc:
            out.print(f"  training {doc['tokens']:,.0f} tokens ({doc['steps']:,.0f} steps): "
                      f"{_duration(doc['train_s'])} "
                      f"({_duration(doc['train_s_low'])} to {_duration(doc['train_s_high'])})")
            if "tokens_basis" in doc:
                out.print(f"  tokens: {doc['tokens_basis']}")
        if "time_to_target_s" in doc:
            out.print(styled(("  to validation loss ", ""), (f"{doc['to_loss']:g}", "bold"),
                             f": {_duration(doc['time_to_target_s'])} ({_duration(doc['time_to_target_s_low'])} to "
                             f"{_duration(doc['time_to_target_s_high'])}), {doc['tokens_to_target']:,.0f} tokens "
                             f"({doc['tokens_to_target_low']:,.0f} to {doc['tokens_to_target_high']:,.0f})"))
            out.print(f"  learning: {doc['learning_basis']}")
            for name, e in doc["learning_extrapolated"].items():
                out.print(styled("  ", ("extrapolated", "yellow"), f": {name}={e['value']:g}, learning measured "
                                 f"{e['measured_min']:g} to {e['measured_max']:g}"))
        out.print(f"  basis: {doc['basis']}")
        for name, e in doc["extrapolated"].items():
            out.print(styled("  ", ("extrapolated", "yellow"),
                             f": {name}={e['value']:g}, measured {e['measured_min']:g} "
                             f"to {e['measured_max']:g} ({e['beyond']:.3g}x the nearest end)"))

    guarded(body)


@app.command()
def machine(
    as_json: JsonOption = False,
    remeasure: Annotated[bool, typer.Option("--remeasure", help="measure bandwidth and GEMM peaks again")] = False,
) -> None:
    """The machine's facts, its measured limits, and which knobs can be applied here (and why not)."""
    def body():
        facts = probe_here(remeasure=remeasure)
        if as_json:
            print(json.dumps(facts, default=str, sort_keys=True))
            return
        table = Table(title="this machine", show_header=False)
        table.add_column("fact")
        table.add_column("value")
        for key, value in facts.items():
            if key not in ("knobs",) and not isinstance(value, (dict, list)):
                table.add_row(key, str(value))
        out.print(table)
        knobs = Table(title="knobs")
        knobs.add_column("knob")
        knobs.add_column("here")
        for name, why in (facts.get("knobs") or {}).items():
            knobs.add_row(name, styled(("available", "green")) if why is None else styled(("unavailable", "yellow"),
                                                                                           f": {why}"))
        out.print(knobs)

    guarded(body)


@app.command()
def retry(
    failed: Annotated[bool, typer.Option("--failed", help="requeue failed runs")] = False,
    skipped: Annotated[bool, typer.Option("--skipped", help="requeue skipped runs")] = False,
    pool: PoolOption = None,
    db: DbOption = "results.db",
) -> None:
    """Put this machine's (or a --pool's) failed and/or skipped runs back in the queue (both when
    neither is given)."""
    def body():
        from orchestrator.queue.cli_support import require_database

        require_database(db, "retry")
        store = open_store(db, create=False)
        both = not failed and not skipped
        if pool is not None:  # looked up before anything is written: a wrong name changes nothing
            machine_id, pool_id = None, store.pool_id(None, pool, create=False)
        else:  # a machine that never worked here has nothing to retry: it is not registered for it
            machine_id, pool_id = store.find_machine(static_here()["fingerprint"]), None
        n = 0 if pool_id is None and machine_id is None else \
            store.retry(machine_id, failed=failed or both, skipped=skipped or both, pool_id=pool_id)
        out.print(f"requeued {n} run(s)" + (f" of pool {pool}" if pool else ""))

    guarded(body)


@app.command()
def merge(
    others: Annotated[list[str], typer.Argument(help="other results databases: files (any cpubench version) or URLs")],
    db: DbOption = "results.db",
) -> None:
    """Import the machines, sweeps, jobs and finished runs of other results databases (machines that
    ran offline). Idempotent; a run already here for the same job and machine or pool is kept."""
    from orchestrator.queue.merge import check_source, merge as merge_one, read_source
    from orchestrator.queue.store import database_url

    def body():
        from common.errors import BadInput

        for other in others:
            check_source(other)
            if database_url(other) == database_url(db):
                raise BadInput(f"merge {other}: that is the database being merged into (--db)")
        rows = {other: read_source(other) for other in dict.fromkeys(others)}  # all read before --db is opened
        store = open_store(db)
        for other in others:
            r = merge_one(store, other, rows[other])  # a source named twice: the second adds nothing
            out.print(styled("merged ", (r.source, "bold"), f": machines {r.machines[0]} new, {r.machines[1]} known; "
                             f"sweeps {r.sweeps[0]} new, {r.sweeps[1]} known; jobs {r.jobs[0]} new, {r.jobs[1]} known; "
                             f"runs ", (f"{r.runs[0]} imported", "green"), f", {r.runs[1]} already here, {r.replaced} "
                             f"replaced a queued run, {r.unfinished} unfinished left out, "
                             f"{len(r.conflicts)} conflicting"))
            for conflict in r.conflicts:
                err.print(styled("  ", ("conflict", "yellow"), f": {conflict}"), highlight=False)

    guarded(body)


@app.command()
def submit(
    slurm: Annotated[bool, typer.Option("--slurm", help="submit to SLURM (the only scheduler so far)")] = False,
    nodes: Annotated[int, typer.Option(help="array tasks, one node each")] = 1,
    partition: Annotated[Optional[str], typer.Option(help="SLURM partition")] = None,
    time_limit: Annotated[Optional[str], typer.Option("--time", help="SLURM time limit per task, e.g. 2:00:00")] = None,
    cpus_per_task: Annotated[Optional[int], typer.Option(
        "--cpus-per-task", min=1, help="CPUs per task; default: the whole node (--exclusive)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds one job may take")] = 900.0,
    logs: Annotated[Path, typer.Option("--logs", help="where the batch script and the tasks' output go "
                                       "(on the shared filesystem)")] = Path("slurm"),
    pool: PoolOption = None,
    together: Annotated[bool, typer.Option(
        help="one allocation of N nodes, one worker on its first node: jobs with "
             "nodes > 1 train over all of them (one launcher per node via srun)")] = False,
    db: DbOption = "results.db",
) -> None:
    """Start `work` on N nodes as a SLURM job array, all against one database (PostgreSQL for more
    than one node); with --together, one worker in an allocation of N nodes that multi-node jobs span.
    Prints the job id and how to watch it."""
    from orchestrator.queue.slurm import submit as submit_job
    from orchestrator.queue.store import safe_url

    def body():
        if not slurm:
            from common.errors import BadInput

            raise BadInput("submit needs a scheduler: --slurm")
        job = submit_job(db, nodes=nodes, pool=pool, partition=partition, time_limit=time_limit,
                         cpus_per_task=cpus_per_task, timeout=timeout, log_dir=logs, together=together)
        watch = "python bench.py status" + (f" --pool {pool}" if pool else " --all-machines")
        err.print(styled("submitted SLURM job array ", (str(job.job_id), "bold"),
                         f" ({job.tasks} task(s)); script {job.script}"), highlight=False)
        err.print(f"watch: squeue -j {job.job_id}; {watch} --db '{safe_url(db)}'; "
                  f"logs: {job.logs}/cpubench-{job.job_id}_*.out", highlight=False)
        print(job.job_id)

    guarded(body)


@app.command()
def restore() -> None:
    """Restore system settings (frequency, governor, turbo) left behind by a killed worker."""
    from worker.loop import default_state_dir, restore_left_behind

    def body():
        lines = restore_left_behind(default_state_dir(), "/")
        for line in lines:
            out.print(f"restored {line}")
        if not lines:
            out.print("nothing to restore")

    guarded(body)


@app.command()
def docs(
    check: Annotated[bool, typer.Option("--check", help="change nothing; exit 1 if a page is out of date")] = False,
) -> None:
    """Regenerate the reference pages made from the code: docs/variables.md from the catalogue,
    docs/v_results.md from schema.sql's comments, docs/commands.md from this command line."""
    from orchestrator.docs.pages import stale_pages, write_pages

    cli = typer.main.get_command(app)

    def body():
        if check:
            stale = stale_pages(cli=cli)
            for path in stale:
                err.print(f"out of date: {path} (run `python bench.py docs`)", highlight=False)
            if stale:
                raise typer.Exit(1)
            return
        for path in write_pages(cli=cli):
            out.print(f"wrote {path}", highlight=False)

    guarded(body)


if __name__ == "__main__":
    _IS_PROGRAM = True
    sys.exit(app())
