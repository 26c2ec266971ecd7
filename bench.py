#!/usr/bin/env python3
"""cpubench: how does the time to train a language model on CPUs change with each variable?

The command line. Each command is options, a docstring (its --help) and one call into the library;
this is the only module that prints with rich, exits, or turns a BenchError into an exit code.
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

from common.errors import BenchError
from orchestrator.sweep import DEFAULT_MAX_JOBS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help=__doc__.split("\n")[0])
out = Console()
err = Console(stderr=True, soft_wrap=True)

DbOption = Annotated[str, typer.Option("--db", envvar="BENCH_DB", help="results database: a file path or an SQLAlchemy URL")]
PoolOption = Annotated[Optional[str], typer.Option("--pool", help="a named pool shared by identical nodes "
                                                   "(each job once per pool); default: this machine's own")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout and nothing else there")]
MemLimitOption = Annotated[Optional[float], typer.Option(
    "--mem-limit-gb", envvar="BENCH_MEM_LIMIT_GB",
    help="GiB a job may use (refused above it, by estimate); default: this machine's memory")]


def fail(error: BenchError) -> None:
    from orchestrator.secrets import scrub

    err.print(f"[bold red]error:[/] {scrub(str(error))}", highlight=False)
    raise typer.Exit(error.exit_code)


def guarded(fn):
    """Run a command body: BenchError -> red message + its exit code; Ctrl-C -> exit 130."""
    try:
        return fn()
    except BenchError as error:
        fail(error)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: settings restored, the unfinished run is back in the queue")
        raise typer.Exit(130) from None


def open_store(db: str, *, read_only: bool = False):
    """The results database; read_only for the commands that only read (nothing is created there)."""
    from orchestrator.store import Store

    return Store(db, read_only=read_only)


def this_machine():
    """Expansion's view of the machine: CPUs this process may use, frequency limits if any."""
    from orchestrator.sweep import Machine

    return Machine(cpu_count=len(os.sched_getaffinity(0)), freq_limits=_freq_limits)


def probe_here(remeasure: bool = False) -> dict:
    """This machine's facts from the probe (cached per boot in the worker state dir)."""
    from worker.loop import default_state_dir
    from worker.probe import probe

    return probe(default_state_dir(), remeasure=remeasure, quick=os.environ.get("BENCH_PROBE_QUICK") == "1")


def _freq_limits():
    facts = probe_here()
    low, high = facts.get("freq_min_mhz"), facts.get("freq_max_mhz")
    return (int(low), int(high)) if low and high else None


def print_plan_result(plan, result, *, dry_run: bool, memory_gib: tuple[float, float] | None = None) -> None:
    verb = "would add" if dry_run else "added"
    err.print(f"sweep [bold]{plan.name}[/] ({plan.mode}, {plan.source}): {verb} [green]{result.new}[/] new jobs, "
              f"{result.present} already present, {sum(plan.rejected.values())} rejected", highlight=False)
    if memory_gib:
        err.print(f"  largest job's memory estimate {memory_gib[0]:.1f} GiB of {memory_gib[1]:.1f} GiB", highlight=False)
    for reason, n in plan.rejected.most_common():
        err.print(f"  rejected {n}: {reason}", highlight=False)
    for note in plan.notes:
        err.print(f"  [yellow]note[/]: {note}", highlight=False)


@app.command()
def enqueue(
    sweep_file: Annotated[Optional[Path], typer.Argument(help="a sweep TOML file")] = None,
    preset: Annotated[Optional[str], typer.Option(help="a preset from orchestrator/presets/")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="K=V: a base value (repeatable)")] = [],
    axis: Annotated[list[str], typer.Option(help="K=V1,V2: a varied variable (repeatable)")] = [],
    repeats: Annotated[Optional[int], typer.Option(help="repeats of every combination")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count, write nothing")] = False,
    max_jobs: Annotated[int, typer.Option("--max-jobs", envvar="BENCH_MAX_JOBS", min=1,
                                          help="refuse a sweep that plans more jobs than this")] = DEFAULT_MAX_JOBS,
    mem_limit_gb: MemLimitOption = None,
    db: DbOption = "results.db",
) -> None:
    """Expand a sweep into jobs. Idempotent: re-enqueueing adds only new combinations. A sweep is
    counted before it is expanded: one above --max-jobs is refused at once with its count; one with a
    job whose estimated memory exceeds the machine's (or --mem-limit-gb) is refused with the estimate."""
    from worker import memory
    from orchestrator.sweep import load

    def body():
        plan = load(sweep_file, preset=preset, sets=set_, axes=axis, repeats=repeats, machine=this_machine(),
                    max_jobs=max_jobs)
        limit = memory.machine_limit(mem_limit_gb)
        worst = memory.check_plan(plan, *limit)
        result = open_store(db).enqueue(name=plan.name, source=plan.source, sweep_text=plan.text,
                                        jobs=plan.iter_jobs(), notes=plan.notes, dry_run=dry_run)
        print_plan_result(plan, result, dry_run=dry_run, memory_gib=(worst / memory.GIB, limit[0] / memory.GIB))

    guarded(body)


def work_with_progress(db: str, options) -> dict:
    """Run a worker with a rich progress bar (on stderr) and an ETA learned from finished runs."""
    from orchestrator.eta import estimate_remaining_s
    from worker.loop import Worker

    store = open_store(db)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"))
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task("jobs", total=None, tally="", eta="?")
        eta_at = [0.0]  # when the ETA was last fitted: every few seconds is enough for a person

        def show(event):
            if event.counts:
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
                progress.console.print(f"[{colour}]{event.outcome.status}[/] run {event.claim.run_id}: {first}",
                                       highlight=False)
            elif event.kind in ("restored", "requeued", "note"):
                progress.console.print(f"[yellow]{event.kind}[/]: {event.text}", highlight=False)

        worker = Worker(store, options, on_event=show)
        return worker.run()


def _duration(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


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


def _worker_options(cpus, max_jobs, wait, timeout, pool_name=None, target_ci=None, max_repeats=10, db_retry=None):
    from common.errors import BadInput
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
    if db_retry is None:
        db_retry = os.environ.get("BENCH_DB_RETRY_S", "600")
    try:
        db_retry_s = float(db_retry)
    except ValueError:
        db_retry_s = -1.0
    if not db_retry_s >= 0:
        raise BadInput(f"--db-retry / BENCH_DB_RETRY_S {db_retry!r}: expected seconds >= 0")
    return WorkerOptions(cpus=pool, max_jobs=max_jobs, wait=wait, timeout_s=timeout, pool_name=pool_name,
                         heartbeat_s=float(os.environ.get("BENCH_HEARTBEAT_S", "5")),
                         max_attempts=int(os.environ.get("BENCH_MAX_ATTEMPTS", "3")),
                         target_ci=None if target_ci is None else target_ci / 100, max_repeats=max_repeats,
                         db_retry_s=db_retry_s)


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
    db_retry: Annotated[Optional[float], typer.Option(
        "--db-retry", help="seconds to ride out a lost database (a server restart, a held lock) before giving up "
                           "[default: BENCH_DB_RETRY_S or 600]")] = None,
    db: DbOption = "results.db",
) -> None:
    """Claim and run queued jobs, one at a time, until none is left: this machine's own (every job,
    to compare machines), or with --pool those of a pool of identical nodes (each job once)."""
    def body():
        counts = work_with_progress(db, _worker_options(cpus, max_jobs, wait, timeout, pool, target_ci, max_repeats,
                                                        db_retry))
        err.print(f"queued {counts['queued']}, done {counts['done']}, failed {counts['failed']}, "
                  f"skipped {counts['skipped']}")
        if counts["queued"] and max_jobs is None:
            err.print("[yellow]note[/]: the jobs still queued need more CPUs than this worker may use (--cpus)")

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
        from orchestrator.store import NO_POOL

        store = open_store(db, read_only=True)
        machine_id = pool_id = None
        if pool is not None:
            pool_id = store.pool_id(None, pool, create=False)
        elif not all_machines:  # looked up, not registered: status writes nothing
            machine_id = store.find_machine(probe_here()["fingerprint"])
            pool_id = store.pool_id(machine_id) if machine_id is not None else NO_POOL
        counts = store.counts(pool_id=pool_id)
        per_pool = {}
        if pool_id is None:
            active = store.active_pools()
            per_pool = {p.label: store.counts(pool_id=p.pool_id) for p in store.pools() if p.pool_id in active}
        if as_json:
            doc = {**counts, **({"pool": pool} if pool else {}),
                   **({"pools": per_pool} if pool_id is None else {})}
            print(json.dumps(doc))
            return
        scope = f"pool {pool}" if pool else "all machines and pools" if all_machines else "this machine"
        table = Table(title=f"cpubench status ({scope})")
        for column in ("sweep", "total", "queued", "running", "done", "failed", "skipped"):
            table.add_column(column, justify="left" if column == "sweep" else "right")
        for name, c in sorted(store.counts_by_sweep(pool_id=pool_id).items()):
            table.add_row(name, *(str(c[k]) for k in ("total", "queued", "running", "done", "failed", "skipped")))
        table.add_row("[bold]all jobs", *(f"[bold]{counts[k]}" for k in ("total", "queued", "running", "done", "failed", "skipped")))
        out.print(table)
        if per_pool:
            pools = Table(title="by machine and pool")
            for column in ("queue", "total", "queued", "running", "done", "failed", "skipped"):
                pools.add_column(column, justify="left" if column == "queue" else "right")
            for label, c in per_pool.items():
                pools.add_row(label, *(str(c[k]) for k in ("total", "queued", "running", "done", "failed", "skipped")))
            out.print(pools)
        if pool_id is not None:
            from orchestrator.eta import estimate_remaining_s

            eta = estimate_remaining_s(store, machine_id, pool_id=pool_id)
            if counts["queued"] and eta is not None:
                out.print(f"ETA for the queued jobs: {_duration(eta)} (learned from finished runs)")

    guarded(body)


def report_and_print(db: str, out_dir: Path) -> None:
    from orchestrator.report import write_report

    store = open_store(db, read_only=True)
    rep = write_report(store, out_dir)
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
        err.print(f"[yellow]note[/]: the effects table was not updated: {rep.effects_not_written}", highlight=False)
    out.print(f"the report: open {rep.html_path} in a browser (works offline)", soft_wrap=True)


@app.command()
def report(
    out_dir: Annotated[Path, typer.Option("--out", help="where to write the page, CSV, markdown and plots")] = Path("result"),
    db: DbOption = "results.db",
) -> None:
    """Write result/: index.html (the page to open), results.csv, summary.md, plots/*.png, fitted effects (also to
    the effects table)."""
    guarded(lambda: report_and_print(db, out_dir))


def _env_max_jobs() -> int:
    from common.errors import BadInput

    value = os.environ.get("BENCH_MAX_JOBS", str(DEFAULT_MAX_JOBS))
    if not value.isdigit() or int(value) < 1:
        raise BadInput(f"BENCH_MAX_JOBS={value!r}: expected a whole number of jobs >= 1")
    return int(value)


@app.command()
def run(
    preset: Annotated[str, typer.Option(help="the sweep preset to run")] = "quick",
    out_dir: Annotated[Path, typer.Option("--out", help="where the report goes")] = Path("result"),
    timeout: Annotated[float, typer.Option(help="seconds one job may take")] = 900.0,
    mem_limit_gb: MemLimitOption = None,
    db: DbOption = "results.db",
) -> None:
    """The main job: enqueue a preset, work until it is done, write the report."""
    from worker import memory
    from orchestrator.sweep import load

    def body():
        plan = load(None, preset=preset, machine=this_machine(), max_jobs=_env_max_jobs())
        limit = memory.machine_limit(mem_limit_gb)
        worst = memory.check_plan(plan, *limit)
        result = open_store(db).enqueue(name=plan.name, source=plan.source, sweep_text=plan.text,
                                        jobs=plan.iter_jobs(), notes=plan.notes)
        print_plan_result(plan, result, dry_run=False, memory_gib=(worst / memory.GIB, limit[0] / memory.GIB))
        work_with_progress(db, _worker_options(None, None, False, timeout))
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
    from orchestrator.sweep import parse_assignment
    from worker.loop import measure_once, once_cpu_count

    def body():
        partial = {}
        for item in settings:
            key, value = parse_assignment(item, "setting")
            if key in variables.SET_BY_SWEEP:
                raise BadInput(f"setting {key!r}: set by sweeps, not by hand")
            partial[key] = variables.parse_value(key, value, "the command line")
        options = _worker_options(None, None, False, timeout)
        config, why = variables.resolve(partial, once_cpu_count(options))
        if why:
            raise BadInput(f"this configuration cannot run: {'; '.join(why)}")
        memory.check([config], *memory.machine_limit(mem_limit_gb), "once")
        result = measure_once(config, options)
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
            knobs.add_row(name, "[green]available[/]" if why is None else f"[yellow]unavailable[/]: {why}")
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
        store = open_store(db)
        both = not failed and not skipped
        machine_id = _machine_id(store)
        pool_id = store.pool_id(machine_id, pool, create=False) if pool is not None else None
        n = store.retry(machine_id, failed=failed or both, skipped=skipped or both, pool_id=pool_id)
        err.print(f"requeued {n} run(s)" + (f" of pool {pool}" if pool else ""))

    guarded(body)


@app.command()
def merge(
    others: Annotated[list[str], typer.Argument(help="other results databases: files (any cpubench version) or URLs")],
    db: DbOption = "results.db",
) -> None:
    """Import the machines, sweeps, jobs and finished runs of other results databases (machines that
    ran offline). Idempotent; a run already here for the same job and machine or pool is kept."""
    from orchestrator.merge import merge as merge_one

    def body():
        store = open_store(db)
        for other in others:
            r = merge_one(store, other)
            err.print(f"merged [bold]{r.source}[/]: machines {r.machines[0]} new, {r.machines[1]} known; sweeps "
                      f"{r.sweeps[0]} new, {r.sweeps[1]} known; jobs {r.jobs[0]} new, {r.jobs[1]} known; runs "
                      f"[green]{r.runs[0]} imported[/], {r.runs[1]} already here, {r.replaced} replaced a queued run, "
                      f"{r.unfinished} unfinished left out, {len(r.conflicts)} conflicting", highlight=False)
            for conflict in r.conflicts:
                err.print(f"  [yellow]conflict[/]: {conflict}", highlight=False)

    guarded(body)


@app.command()
def submit(
    slurm: Annotated[bool, typer.Option("--slurm", help="submit to SLURM (the only scheduler so far)")] = False,
    nodes: Annotated[int, typer.Option(help="array tasks, one node each")] = 1,
    partition: Annotated[Optional[str], typer.Option(help="SLURM partition")] = None,
    time_limit: Annotated[Optional[str], typer.Option("--time", help="SLURM time limit per task, e.g. 2:00:00")] = None,
    cpus_per_task: Annotated[Optional[int], typer.Option("--cpus-per-task", min=1,
                                                         help="CPUs per task; default: the whole node (--exclusive)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds one job may take")] = 900.0,
    logs: Annotated[Path, typer.Option("--logs", help="where the batch script and the tasks' output go "
                                       "(on the shared filesystem)")] = Path("slurm"),
    pool: PoolOption = None,
    together: Annotated[bool, typer.Option(help="one allocation of N nodes, one worker on its first node: jobs with "
                                                "nodes > 1 train over all of them (one launcher per node via srun)")] = False,
    db: DbOption = "results.db",
) -> None:
    """Start `work` on N nodes as a SLURM job array, all against one database (PostgreSQL for more
    than one node); with --together, one worker in an allocation of N nodes that multi-node jobs span.
    Prints the job id and how to watch it."""
    from orchestrator.slurm import submit as submit_job
    from orchestrator.store import safe_url

    def body():
        if not slurm:
            from common.errors import BadInput

            raise BadInput("submit needs a scheduler: --slurm")
        job = submit_job(db, nodes=nodes, pool=pool, partition=partition, time_limit=time_limit,
                         cpus_per_task=cpus_per_task, timeout=timeout, log_dir=logs, together=together)
        watch = "python bench.py status" + (f" --pool {pool}" if pool else " --all-machines")
        err.print(f"submitted SLURM job array [bold]{job.job_id}[/] ({job.tasks} task(s)); script {job.script}",
                  highlight=False)
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
            err.print(f"restored {line}", highlight=False)
        if not lines:
            err.print("nothing to restore")

    guarded(body)


@app.command()
def docs(
    check: Annotated[bool, typer.Option("--check", help="change nothing; exit 1 if a page is out of date")] = False,
) -> None:
    """Regenerate the reference pages made from the code (docs/variables.md from the catalogue)."""
    from orchestrator.docs import stale_pages, write_pages

    def body():
        if check:
            stale = stale_pages()
            for path in stale:
                err.print(f"out of date: {path} (run `python bench.py docs`)", highlight=False)
            if stale:
                raise typer.Exit(1)
            return
        for path in write_pages():
            out.print(f"wrote {path}", highlight=False)

    guarded(body)


if __name__ == "__main__":
    sys.exit(app())
