"""The report people read after a sweep: index.html (the page, html.py), results.csv (every run),
summary.md (how step time changes with each variable, clearest first: markdown.py), plots/*.png,
and the fitted effects written to the `effects` table.

`write_report()` reads v_results once, leaves the statistics to effects.py and the pictures to
plots.py, and returns a Report that bench.py prints; it prints nothing itself. With pictures it uses
both CPUs of a small machine: children forked before the runs are read (orchestrator/report/forked.py) fit
the cost model's section on the share of the runs it uses while this process analyses, fit the step
model of every machine but the first while this process analyses that one, and draw the PNGs while it
writes the pages; results.csv is written by a child forked before the read (rows.start_results_csv),
waited for only before write_report returns. Where the runs are at most a page's (RUNS_ON_PAGE), a child
forked after the read sends the cost model's fitter its share and works out the page's parts that follow
from the runs alone (the runs table, packed) while this process analyses.

The package's parts depend one way (tests/test_layers.py reads their imports):
- data.py: the data a report shows, no text (the SQL, Context, Report, the effects table's rows);
- words.py: the words and number formatters, one copy for both writers;
- markdown.py (summary.md) and html.py (index.html, with static/page.css and static/page.js):
  the writers, each on data and words, neither importing the other;
- this module: write_report, which reads the store, analyses, and calls the writers.
"""

from __future__ import annotations

import gc
import json
import os
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import text
from threadpoolctl import threadpool_limits

from orchestrator.stats import effects as fx
from orchestrator.stats.effects import Analysis, VariableEffect
from orchestrator.stats.columns import gc_frozen_as_made, gc_paused
from orchestrator.report.forked import Family, Worker
from orchestrator.report.rows import read_results, start_results_csv
from orchestrator.stats import applied_cut
from orchestrator.queue import budget, effects_table
from orchestrator.stats import config_index
from orchestrator.report.sections import learning as learning_report, prediction as prediction_report
from orchestrator.queue.migrations import table_names
from orchestrator.stats.noise import quiet_probe_cv
from orchestrator.queue.store import ReadOnlyDatabase, Store
from orchestrator.report.view_sql import MACHINE_ONLY, REPORT_LEAVES, SELECT_RESULTS
from orchestrator.report import html as html_report
from orchestrator.report.page_data import RUNS_ON_PAGE
from orchestrator.report.data import (SELECT_MACHINES, SELECT_SWEEP_NOTES, SELECT_TARGETS,
                                      Context, Report, _probe_facts, effect_row)
from orchestrator.report.markdown import SECTIONS
from orchestrator.report.words import FACTS, _failures, _machine_name, mfu_peak, probe_load, short_reason
from common.variables import NAMES

# What callers use (bench.py, watch.py, tests, benchmarks): the package's face.
__all__ = ["Context", "FACTS", "Report", "SECTIONS", "SELECT_RESULTS", "effect_row", "short_reason", "write_report"]


# The cost model's child yields the CPU to the report's process and the step-model child: its answer is
# wanted only near the page's end, and three processes on two CPUs otherwise slow all three alike
# (docs/measurements.md has the figures).
FITTER_NICE = 10
# results.csv's child likewise: the file is wanted only when the report returns, and at a million runs its
# ~30 CPU-seconds, waited for after the read, held the report's process up ~15 s (docs/measurements.md).
CSV_NICE = 10
# The PNG drawers too, beside the cost model's child: their PNGs are wanted last, and at the same priority the
# three share the report's last seconds rather than the fitter running alone after the drawers.
DRAWER_NICE = 10


def write_report(store: Store, out_dir: Path, *, machine_id: int | None = None, plots: bool = True,
                 memo: dict | None = None) -> Report:
    """Write out_dir/index.html, results.csv, summary.md and plots/*.png for one machine (or all
    machines when machine_id is None), and replace those machines' rows of the effects table.
    plots=False leaves the pictures out (the statistics tests run the report many times). `memo`: a
    dict a long-lived caller keeps between reports (report --watch): the comparisons and predictions
    of a machine whose runs did not change since the last report are kept, not redone."""
    with ExitStack() as children:  # a child still running when this fails is stopped
        # One BLAS thread in each process: the report's numbers then do not depend on how many CPUs the
        # machine has (OpenBLAS sums in another order with more threads), and its children do not fight it.
        children.enter_context(threadpool_limits(1))
        children.enter_context(_collector_set_aside())
        # what the report's parts kept of its rows goes with the report (its runs' configuration numbers, the
        # sections' answers: config_index.kept_for_the_rows): else the rows outlive it
        children.callback(config_index.forget)
        workers = None
        if plots:  # the PNGs and the model fits go to children on the other CPU (forked.py)
            # forked now, before the runs are read: each holds only what it is sent. The drawers and the
            # cost model's fitter come from one child that imported matplotlib and scipy's fitting once.
            fitting = memo is None
            drawn = children.enter_context(Family(_import_fitting if fitting else _import_plots,
                                                  [DRAWER_NICE, DRAWER_NICE] + ([FITTER_NICE] if fitting else [])))
            workers = SimpleNamespace(drawers=drawn.workers[:2], fitter=drawn.workers[2] if fitting else None,
                                      beside=children.enter_context(Worker()))
        return _write(store, Path(out_dir), machine_id, plots, memo, workers, children)


def _write(store: Store, out_dir: Path, machine_id: int | None, plots: bool, memo: dict | None,
           workers: SimpleNamespace | None, children: ExitStack) -> Report:
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    for old in plots_dir.glob("*.png"):  # a plot of a variable no longer varied must not linger
        old.unlink()
    csv_path = out_dir / "results.csv"
    # The rows read in chunks, their runs, jobs and machines by separate statements (rows.read_results) that
    # must see one state of a database that workers write meanwhile (snapshot); results.csv written meanwhile
    # by a child forked before the read, yielding the CPU (CSV_NICE), and waited for only at the end.
    with store.transaction(snapshot=True) as conn:
        csv_child = start_results_csv(conn, machine_id, csv_path, nice=CSV_NICE)
        children.callback(csv_child.stop)
        # the rows: never traversed again by the collections of the analysis that follows
        with gc_frozen_as_made():
            # (the machine's facts: below; of each run's applied, what the report reads: applied_cut)
            _, rows = read_results(conn, machine_id, leave_out=REPORT_LEAVES, cut_applied=applied_cut.cut,
                                   read_prefix=applied_cut.READ_PREFIX)
            machine_rows = [dict(r._mapping) for r in conn.execute(text(SELECT_MACHINES))]
            curves = learning_report.read_curves(conn, rows)  # learning runs' final curves ({} without any)
            targets = {m: (float(t), int(mx)) for m, t, mx in conn.execute(text(SELECT_TARGETS))}
            tables = table_names(conn, store.engine.dialect.name)
            budgets = budget.decisions(conn) if "budget_decisions" in tables else {}

    by_machine = defaultdict(list)  # the rows of each machine, in their order (one pass over the rows)
    for r in rows:
        by_machine[r["machine_id"]].append(r)
    machine_ids = sorted(set(by_machine) | ({machine_id} if machine_id is not None else set()))
    machine_of = {r["machine_id"]: r for r in machine_rows}
    facts = {m: _facts(by_machine[m][0], machine_of.get(m, {})) if by_machine.get(m) else {} for m in machine_ids}
    names = {m: _machine_name(m, facts[m]) for m in machine_ids}
    probe_cv = {}
    for r in machine_rows:
        probe = _probe_facts(r.get("facts"))
        if r["machine_id"] in facts:
            facts[r["machine_id"]] = {**facts[r["machine_id"]], "probe_load": probe_load(probe),
                                      "mfu_peak": mfu_peak(by_machine[r["machine_id"]])}
        # The probe's measured noise (machines.noise_cv), from a quiet machine only: one taken under
        # load would stand in for the runs' noise where nothing was repeated.
        if (cv := quiet_probe_cv(r.get("noise_cv"), probe)) is not None:
            probe_cv[r["machine_id"]] = cv
    # The cost model's section needs the runs only: a fresh report with pictures (its leave-one-out is
    # most of that section's time) sends the share of them its fits use to a child, which fits while
    # this process analyses. --watch (a memo) keeps its per-machine entries in this process.
    sweep_texts = prediction_report.sweep_texts(store)
    fitter = workers.fitter if workers is not None else None

    def send_fitter():  # once the step-model child has its work: the cost model's share
        fitter.submit(_predictions_drawn, prediction_report.shares(SimpleNamespace(
            rows=rows, names=names, facts=facts, sweep_texts=sweep_texts, check_predictions=plots, memo=None)),
            SimpleNamespace(names=names, out_dir=out_dir))

    # The page's parts that follow from the runs alone, worked out by a child on the other CPU while this
    # process analyses: forked now, it reads the rows as they are here (copying the pages it touches: a
    # page's worth of runs at most, RUNS_ON_PAGE; beyond, the statistics pick the runs the page shows).
    # It sends the cost model's fitter its share first. The runs' configuration numbers are made here
    # before it forks: the child's parts and this process's analysis both read them.
    meanwhile = send_fitter if fitter is not None else None
    ahead = None
    if workers is not None and len(rows) <= RUNS_ON_PAGE:
        with gc_frozen_as_made():  # (a tuple per run and per configuration: frozen as the rows are)
            config_index.config_index(rows)
        ahead = children.enter_context(Worker(task=partial(_ahead, rows, names, meanwhile)))
        if fitter is not None:
            fitter.sent_elsewhere()
        meanwhile = None

    # The analysis made without collections and frozen as the rows are: a Run per run, the cells and the
    # comparisons (each full collection walked all of them made so far again: ~0.3 CPU-s at 100k runs,
    # ~1.4 at 1M). A cycle it left (none in the reports measured) is freed once _collector_set_aside
    # unfreezes.
    with gc_frozen_as_made():
        analysis = fx.analyse(rows, machine_ids, probe_cv=probe_cv,
                              target_ci={m: t for m, (t, _) in targets.items()} or None,
                              memo=memo.setdefault("effects", {}) if memo is not None else None,
                              beside=workers.beside if workers is not None else None,
                              meanwhile=meanwhile)
        grids = {m: fx.grids(a) for m, a in analysis.machines.items()}
        # The PNGs are drawn by two children while this process writes the effects and the pages (one
        # drawer would finish well after the pages), each taking the next PNG when done (_draw); sent
        # before the collection that ends the analysis.
        jobs = _plot_jobs(analysis, grids, names, out_dir / "plots") if plots else []
        drawing = [w.submit(_draw, jobs) for w in workers.drawers[:len(jobs)]] if jobs else []
    plot_paths = [path for _, _, path in jobs]
    all_effects = analysis.effects
    try:
        effects_table.replace(store, machine_ids, [effect_row(e) for e in all_effects])
        not_written = None
    except ReadOnlyDatabase as err:  # an archived or shared copy: the files are the report
        not_written = str(err)
    top = [ve.headline for ve in analysis.ranked()]

    counts = store.counts(machine_id)
    failures = _failures(rows)
    with store.transaction() as conn:
        sweep_notes = [(name, note) for name, notes in conn.execute(text(SELECT_SWEEP_NOTES))
                       for note in json.loads(notes or "[]")]
    ctx = Context(rows, fx.done_runs(rows), analysis, grids, names, facts, counts, failures, sweep_notes,
                  plot_paths, out_dir, targets, budgets, sweep_texts=sweep_texts, check_predictions=plots,
                  memo=memo.setdefault("predictions", {}) if memo is not None else None)
    # "Time to a trained model"
    ctx.learning = learning_report.prepare(ctx, curves, plots_dir if plots else None, store)
    plot_paths += list(ctx.learning["plots"].values())
    if fitter is not None:  # the child's result waited for where a writer first needs it
        prediction_report.adopt(ctx, fitter.result)
    # The page first: its cost model's section comes near its end, after most of its work, so that a
    # fitter still running overlaps the page rather than holding up both files.
    html_path = html_report.write_page(ctx, out_dir / "index.html", ahead.result() if ahead is not None else None)
    summary_path = out_dir / "summary.md"
    summary_path.write_text("\n".join(line for section in SECTIONS for line in section(ctx)))
    for drawer in drawing:
        drawer.result()  # its PNGs are on disk (or the child's failure is raised here)
    csv_child.wait(store.transaction)  # results.csv on disk (written here where the child failed)
    return Report(csv_path=csv_path, summary_path=summary_path, plot_paths=plot_paths, top_effects=top,
                  counts=counts, failures=failures, machines=len({r["machine_id"] for r in rows}),
                  effects=all_effects, analysis=analysis, html_path=html_path, effects_not_written=not_written)


def _ahead(rows: list[dict], names: dict[int, str], send_fitter) -> dict | None:
    """The page's child (forked after the read): the cost model's fitter sent its share (send_fitter,
    where there is one), then the page's parts that follow from the runs alone. With the collector off:
    what it makes holds no cycle, and each full collection walked all of it made so far again."""
    with gc_paused():
        if send_fitter is not None:
            send_fitter()
        return html_report.ahead_of_analysis(rows, names)


def _facts(row: dict, machine: dict) -> dict:
    """A machine's facts: its first run's row, with the machine's columns the rows leave out
    (view_sql.MACHINE_ONLY) from its machines row, as v_results gives them."""
    return {**row, **{c: machine.get(c) for c in MACHINE_ONLY}}


# -- the garbage collector ----------------------------------------------------------------------
# Python's cyclic collector traverses every container object it tracks: each full collection while a
# million rows are built walks all the rows built so far, and every one after walks them again (15 s of
# a 1M report's 125 s). The rows hold no cycles; the objects frozen are still freed by their counts.

@contextmanager
def _collector_set_aside():
    """For one report: what exists now is frozen (the report's collections skip it, and a forked child
    does not copy its pages by collecting it), and unfrozen afterwards, so that a long-lived caller's
    garbage (report --watch) is collected again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# -- files --------------------------------------------------------------------------------------

def _plot_jobs(analysis: Analysis, grids, names, plots_dir: Path) -> list[tuple[str, tuple, Path]]:
    """The PNGs to draw: (kind, its arguments, its path), one per varied variable, then one per grid."""
    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for m, ma in analysis.machines.items():
        for ve in ma.variables:
            by_variable[ve.variable].append(ve)
    # Plot legends have room for the host only; the summary gives the CPU.
    short = {m: n.split(",")[0] + (")" if "," in n else "") for m, n in names.items()}
    jobs = [("variable", ([_drawn(ve) for ve in series], short), plots_dir / f"{name}.png")
            for name, series in sorted(by_variable.items(), key=lambda kv: NAMES.index(kv[0]))]
    several = len(analysis.machines) > 1
    for m, gs in grids.items():
        for g in gs:
            suffix = f"_machine{m}" if several else ""
            jobs.append(("grid", (g, names[m]), plots_dir / f"grid_{g.rows}_x_{g.cols}{suffix}.png"))
    return jobs


@dataclass
class _DrawnLevel:
    """A Level as plots.plot_variable reads it: its figures, not its runs (whose rows a drawer would
    otherwise be sent, every run of the comparison)."""

    value: object
    label: str
    step_ms: list[float]
    tokens_per_s: list[float]
    median_step_ms: float
    median_tokens_per_s: float | None


def _drawn(ve: VariableEffect) -> VariableEffect:
    """`ve` as a drawer is sent it: its levels (the baseline one of them, as in `ve`) as _DrawnLevels, its
    effects without their job ids (plot_variable reads neither the runs nor the jobs)."""
    def level(lv) -> _DrawnLevel:
        return _DrawnLevel(lv.value, lv.label, lv.step_ms, lv.tokens_per_s, lv.median_step_ms, lv.median_tokens_per_s)

    def effect(e):  # without the jobs it rests on (an elasticity's: every job of the comparison)
        return replace(e, job_ids=()) if e is not None else None

    levels = {id(lv): level(lv) for lv in ve.levels}
    baseline = levels.get(id(ve.baseline)) or level(ve.baseline)
    return replace(ve, levels=[levels[id(lv)] for lv in ve.levels], baseline=baseline, elasticity=effect(ve.elasticity),
                   ratios=list(map(effect, ve.ratios)), by_group=list(map(effect, ve.by_group)))


def _import_plots() -> None:
    from orchestrator.report import plots

    plots.warm()  # matplotlib, imported before the child's task comes (plots.py imports it lazily)


def _import_fitting() -> None:
    _import_plots()
    from scipy import optimize  # noqa: F401 - the cost model's fits (cost_model imports it where it fits)


def _draw(jobs: list[tuple[str, tuple, Path]]) -> None:
    """Draw the PNGs of `jobs` that no other drawer took: each drawer is sent them all and takes one by
    creating its file (the plots' folder holds no PNG when they start), so that whichever is done first
    draws the next (two CPUs are not always alike fast: a fixed half each made one drawer finish ~1 s
    after the other)."""
    from orchestrator.report import plots  # matplotlib only when there is something to draw

    draw = {"variable": plots.plot_variable, "grid": plots.plot_grid}
    for kind, args, path in jobs:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # another drawer's
            continue
        draw[kind](*args, path)


def _predictions_drawn(shares: dict, where: SimpleNamespace) -> dict:
    """The cost model's section (prediction_report.fitted) with its predicted-vs-measured plots drawn
    where the writers draw them (`where`: the report's machine names and folder). The fits with the
    collector off, as the page's child (_ahead): they make many objects and no cycle."""
    with gc_paused():
        d = prediction_report.fitted(shares)
    for machine_id, m in d["machines"].items():
        if "refused" not in m and m["loo"]["predicted"]:
            prediction_report.plot(where, machine_id, m["loo"])
    return d
