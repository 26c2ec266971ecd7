"""The report people read after a sweep: index.html (the page, orchestrator/html_report.py),
results.csv (every run), summary.md (how step time changes with each variable, clearest first),
plots/*.png, and the fitted effects written to the `effects` table.

`write_report()` reads v_results once, leaves the statistics to effects.py and the pictures to
plots.py, and returns a Report that bench.py prints; it prints nothing itself.

summary.md is a list of sections (SECTIONS): each is a function of the report's Context that returns
markdown lines (none when it has nothing to say). A new section is one function and one entry.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import text

from orchestrator import effects as fx
from orchestrator import html_report, parallel_report
from orchestrator.effects import Analysis, Effect, Grid, VariableEffect
from orchestrator.pool_report import pool_lines
from orchestrator.rows import read_rows
from orchestrator.seeds import seeds_section
from orchestrator import prediction_report
from orchestrator.store import ReadOnlyDatabase, Store
from common.metrics import peak_text
from common.variables import BY_NAME, NAMES

SELECT_RESULTS = "SELECT * FROM v_results {where} ORDER BY run_id"
SELECT_MACHINES = "SELECT * FROM machines"
SELECT_SWEEP_NOTES = "SELECT name, notes FROM sweeps ORDER BY sweep_id"
SELECT_TARGETS = "SELECT machine_id, target_ci, max_repeats FROM adaptive_decisions ORDER BY decision_id"
DELETE_EFFECTS = "DELETE FROM effects WHERE machine_id = :machine_id"
EFFECT_COLUMNS = ("machine_id", "variable", "kind", "value", "baseline", "estimate", "ci_low", "ci_high",
                  "ci_adj_low", "ci_adj_high", "se", "dof", "p_value", "p_adjusted", "significant", "family",
                  "method", "n_runs", "min_runs", "n_passes", "half_width", "target_met", "repeats_needed")
INSERT_EFFECT = (f"INSERT INTO effects ({', '.join(EFFECT_COLUMNS)}, created) "
                 f"VALUES ({', '.join(':' + c for c in EFFECT_COLUMNS)}, {{now}})")

# Machine facts shown side by side, with the words a reader needs.
FACTS = (
    ("cpu_model", "CPU"), ("hostname", "host"), ("sockets", "sockets"), ("physical_cores", "physical cores"),
    ("logical_cores", "logical CPUs"), ("numa_nodes", "NUMA nodes"), ("isa_flags", "vector ISA"),
    ("l2_kb", "L2 (KiB)"), ("l3_kb", "L3 (KiB)"), ("mem_total_gb", "memory (GB)"),
    ("mem_bw_gbs_all", "memory bandwidth, all CPUs (GB/s)"), ("gemm_gflops_fp32_all", "GEMM fp32, torch (GFLOP/s)"),
    ("gemm_gflops_bf16_all", "GEMM bf16, torch (GFLOP/s)"), ("probe_load", "the probe's peaks and noise"),
    ("mfu_peak", "MFU is against (GFLOP/s)"),
    ("freq_driver", "frequency driver"),
    ("kernel", "kernel"),
)
# The variables that say how big one training step is: shown in the baseline line of the summary.
SHAPE = ("n_layers", "d_model", "n_heads", "seq_len", "batch_size", "vocab_size", "precision", "steps", "cores")
SHARED_ROWS = 40  # cross-machine table length before it is cut


@dataclass
class Report:
    csv_path: Path
    summary_path: Path
    plot_paths: list[Path]
    top_effects: list[Effect]  # one headline effect per (machine, variable), clearest first
    counts: dict[str, int]  # status -> runs (queued included), as store.counts gives them
    failures: list[tuple[str, str, int]]  # (status, reason, runs) of failed and skipped runs, most first
    machines: int  # machines with runs in the report
    effects: list[Effect]  # every effect written to the effects table
    analysis: Analysis | None = None
    html_path: Path | None = None  # index.html, the page people open
    effects_not_written: str | None = None  # why the effects table was left as it was (a read-only database)


@dataclass
class Context:
    """What the sections of summary.md draw on."""

    rows: list[dict]
    done: list[dict]
    analysis: Analysis
    grids: dict[int, list[Grid]]
    names: dict[int, str]  # machine id -> its name in the text
    facts: dict[int, dict]
    counts: dict
    failures: list
    sweep_notes: list[tuple[str, str]]
    plot_paths: list[Path]
    out_dir: Path
    targets: dict[int, tuple[float, int]]  # machine -> (--target-ci, --max-repeats) of its adaptive passes

    @property
    def several(self) -> bool:
        return sum(1 for m in self.analysis.machines.values() if m.runs) > 1

    @property
    def varied(self) -> list[str]:
        return [n for n in NAMES if any(n in m.varied for m in self.analysis.machines.values())]

    @property
    def together(self) -> list[str]:
        return sorted({n for m in self.analysis.machines.values() for n in m.together}, key=NAMES.index)


def write_report(store: Store, out_dir: Path, *, machine_id: int | None = None, plots: bool = True) -> Report:
    """Write out_dir/index.html, results.csv, summary.md and plots/*.png for one machine (or all
    machines when machine_id is None), and replace those machines' rows of the effects table.
    plots=False leaves the pictures out (the statistics tests run the report many times)."""
    out_dir = Path(out_dir)
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    for old in plots_dir.glob("*.png"):  # a plot of a variable no longer varied must not linger
        old.unlink()
    where = "WHERE machine_id = :machine_id" if machine_id is not None else ""
    csv_path = out_dir / "results.csv"
    with store.transaction() as conn:  # the rows read in chunks, each written to results.csv as fetched
        _, rows = read_rows(conn, SELECT_RESULTS.format(where=where), {"machine_id": machine_id}, csv_path)
        machine_rows = [dict(r._mapping) for r in conn.execute(text(SELECT_MACHINES))]
        targets = {m: (float(t), int(mx)) for m, t, mx in conn.execute(text(SELECT_TARGETS))}

    machine_ids = sorted({r["machine_id"] for r in rows} | ({machine_id} if machine_id is not None else set()))
    facts = {m: next((r for r in rows if r["machine_id"] == m), {}) for m in machine_ids}
    names = {m: _machine_name(m, facts[m]) for m in machine_ids}
    probe_cv = {}
    for r in machine_rows:
        probe = _probe_facts(r.get("facts"))
        if r["machine_id"] in facts:
            facts[r["machine_id"]] = {**facts[r["machine_id"]], "probe_load": probe_load(probe),
                                      "mfu_peak": mfu_peak([x for x in rows if x["machine_id"] == r["machine_id"]])}
        # The probe's measured noise (machines.noise_cv), from a quiet machine only: one taken under
        # load would stand in for the runs' noise where nothing was repeated.
        if r.get("noise_cv") is not None and not probe.get("limits_disturbed"):
            probe_cv[r["machine_id"]] = float(r["noise_cv"])
    analysis = fx.analyse(rows, machine_ids, probe_cv=probe_cv,
                          target_ci={m: t for m, (t, _) in targets.items()} or None)
    grids = {m: fx.grids(a) for m, a in analysis.machines.items()}

    plot_paths = _plots(analysis, grids, names, plots_dir) if plots else []
    all_effects = analysis.effects
    try:
        _write_effects(store, machine_ids, all_effects)
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
                  plot_paths, out_dir, targets)
    ctx.sweep_texts, ctx.check_predictions = prediction_report.sweep_texts(store), plots  # "How long here"
    summary_path = out_dir / "summary.md"
    summary_path.write_text("\n".join(line for section in SECTIONS for line in section(ctx)))
    html_path = html_report.write_page(ctx, out_dir / "index.html")
    return Report(csv_path=csv_path, summary_path=summary_path, plot_paths=plot_paths, top_effects=top,
                  counts=counts, failures=failures, machines=len({r["machine_id"] for r in rows}),
                  effects=all_effects, analysis=analysis, html_path=html_path, effects_not_written=not_written)


# -- files --------------------------------------------------------------------------------------

def _plots(analysis: Analysis, grids, names, plots_dir: Path) -> list[Path]:
    from orchestrator import plots  # matplotlib only when there is something to draw

    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for m, ma in analysis.machines.items():
        for ve in ma.variables:
            by_variable[ve.variable].append(ve)
    # Plot legends have room for the host only; the summary gives the CPU.
    short = {m: n.split(",")[0] + (")" if "," in n else "") for m, n in names.items()}
    paths = [plots.plot_variable(series, short, plots_dir / f"{name}.png")
             for name, series in sorted(by_variable.items(), key=lambda kv: NAMES.index(kv[0]))]
    several = len(analysis.machines) > 1
    for m, gs in grids.items():
        for g in gs:
            suffix = f"_machine{m}" if several else ""
            paths.append(plots.plot_grid(g, names[m], plots_dir / f"grid_{g.rows}_x_{g.cols}{suffix}.png"))
    return paths


def effect_row(e: Effect) -> dict:
    """One row of the effects table."""
    lo, hi = e.ci95
    alo, ahi = e.ci_adj
    return {"machine_id": e.machine_id, "variable": e.variable, "kind": e.kind, "value": e.value,
            "baseline": e.baseline, "estimate": e.estimate, "ci_low": lo, "ci_high": hi, "ci_adj_low": alo,
            "ci_adj_high": ahi, "se": e.se, "dof": e.dof, "p_value": e.p_value, "p_adjusted": e.p_adjusted,
            "significant": e.significant, "family": e.family, "method": e.method, "n_runs": e.n_runs,
            "min_runs": e.min_runs, "n_passes": e.n_passes, "half_width": e.half_width,
            "target_met": e.target_met, "repeats_needed": e.repeats_needed}


def _write_effects(store: Store, machine_ids: list[int], effects: list[Effect]) -> None:
    rows = [effect_row(e) for e in effects]
    with store.transaction(write=True) as conn:
        for m in machine_ids:
            conn.execute(text(DELETE_EFFECTS), {"machine_id": m})
        if rows:
            conn.execute(store.sql(INSERT_EFFECT), rows)


def _failures(rows: list[dict]) -> list[tuple[str, str, int]]:
    counted = Counter((r["status"], short_reason(r.get("reason"))) for r in rows if r["status"] in ("failed", "skipped"))
    return [(s, why, n) for (s, why), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))]


def short_reason(reason: str | None) -> str:
    """One line that names the cause: a traceback's last line, otherwise the first line."""
    if not reason:
        return "(no reason recorded)"
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    line = lines[-1] if "Traceback" in reason else lines[0]
    return line if len(line) <= 160 else line[:157] + "..."


def _machine_name(machine_id: int, facts: dict) -> str:
    host = facts.get("hostname")
    cpu = facts.get("cpu_model")
    parts = [p for p in (host, cpu) if p]
    return f"machine {machine_id}" + (f" ({', '.join(parts)})" if parts else "")


# -- words and tables ---------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _ci(e: Effect, unit: str = "") -> str:
    lo, hi = e.ci_adj
    return "no interval: a value ran once" if lo is None else f"95% CI {lo:.2f}{unit} to {hi:.2f}{unit}"


def _ratio(e: Effect | None) -> str:
    if e is None:
        return "1 (baseline)"
    lo, hi = e.ci_adj
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else " (a value ran once: no CI)"
    return f"{e.estimate:.2f}x{ci}"


def _cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def effect_words(ve: VariableEffect) -> str:
    """The headline effect of a variable in one sentence, with its family-wise interval; plainly
    "no detectable effect" when the adjusted test does not reject no change."""
    h = ve.headline
    where = f" at {h.group}" if h.group else ""
    if ve.differs:
        where += f" (the effect differs between {len(ve.interaction.groups)} groups: see its section)"
    if h.kind == "elasticity":
        what = f"step time ~ {ve.variable}^{h.estimate:.2f}{where}"
        size = f"doubling it multiplies step time by {2 ** h.estimate:.2f}"
    else:
        what = f"{h.value} vs {h.baseline}: {h.estimate:.2f}x the step time{where}"
        size = ""
    if h.significant is None:
        return f"{what}: {h.verdict()}"
    if h.significant:
        return f"{what} ({_ci(h)})" + (f": {size}" if size else "")
    words = f"no detectable effect: {what} ({_ci(h)})"
    if h.repeats_needed:
        words += (f"; an effect this small needs about {h.repeats_needed} runs per value to be seen at this noise"
                  if h.repeats_needed <= fx.MAX_REPEATS_SAID else
                  f"; even {fx.MAX_REPEATS_SAID} runs per value would not resolve an effect this small at this noise")
    return words


def _target_words(e: Effect, target: tuple[float, int] | None) -> str:
    if target is None or e.target_met is None:
        return ""
    hw = e.half_width
    got = f"+-{_pct(hw)}" if hw is not None else "no interval"
    if e.target_met:
        return f"met ({got}) with {e.min_runs} runs"
    return f"not met ({got}) with {e.min_runs} runs" + (" (maximum)" if e.min_runs >= target[1] else "")


# -- sections of summary.md ---------------------------------------------------------------------

def title_section(ctx: Context) -> list[str]:
    sweeps = sorted({r["sweep"] for r in ctx.rows if r.get("sweep")})
    names = ctx.names
    where = f"{len(names)} machines" if ctx.several else (next(iter(names.values())) if names else "no machine yet")
    sweep_words = f"sweep{'s' if len(sweeps) != 1 else ''} {', '.join(sweeps)}" if sweeps else "no sweep yet"
    n_varied = len(ctx.varied)
    return ["# cpubench report", "", (
        f"This report covers {len(ctx.done)} finished training runs (of {len(ctx.rows)} claimed) from {sweep_words} "
        f"on {where}. Each run trains a small transformer language model on the CPU for a fixed number of "
        "optimizer steps and times every step; the number compared throughout is the **median step time** "
        "(milliseconds per optimizer step: lower is faster), with the throughput it implies (**tokens/s**: "
        f"higher is faster). The runs differ in {n_varied} variable{'s' if n_varied != 1 else ''}, "
        "usually one at a time around a *baseline* configuration (for each variable, the value most runs "
        "share). For each variable, its table holds the runs that differ from the baseline **in that variable "
        "alone** (what follows it, like the thread counts that follow `cores`, moves with it as it would by "
        "default): one row per value, its median step time and tokens/s, and its step time **relative to the "
        "baseline** (0.50x = twice as fast, 2.00x = twice as slow) with a 95% confidence interval from the "
        "repeated runs. For sizes (d_model, seq_len, cores...) a power law is fitted as well: step time ~ "
        "size^e, where e = 1 means doubling the size doubles the time, e = 0 means no effect and e = -1 "
        "means doubling it halves the time (perfect scaling with cores). Every interval in this report is "
        "**family-wise**: all of them hold together with 95% confidence, so the many comparisons made here "
        "do not produce effects by chance; an effect whose interval includes no change is reported as *no "
        "detectable effect*. Variables are ranked by how clearly they change step time (their effect "
        "relative to its uncertainty), not by the size of a noisy difference. Failed and skipped runs are "
        "counted below but never enter an average."), ""]


def baseline_section(ctx: Context) -> list[str]:
    runs = [r for m in ctx.analysis.machines.values() for r in m.runs]
    if not runs:
        return []
    varied = ctx.varied
    modal = fx.modal_config(runs, list(fx.FACTORS))
    shape = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in SHAPE if n not in varied)
    base = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in varied)
    lines = [f"**Baseline**: {base or '(nothing varied)'}.", ""]
    if shape:
        lines += [f"**Shared by every run**: {shape}.", ""]
    constant = [f"{n}={fx.label(n, modal[n])}" for n in fx.FACTORS if n not in varied]
    return lines + ["<details><summary>Every variable's value in the baseline</summary>", "",
                    ", ".join(constant), "", "</details>", ""]


def glance_section(ctx: Context) -> list[str]:
    lines = ["## At a glance: the variables, clearest effect first", ""]
    ranked = ctx.analysis.ranked()
    if not ranked:
        return lines + ["No variable took more than one value among the finished runs yet, so there is nothing to "
                        "compare." if ctx.done else "No run has finished yet: run `python bench.py work` first.", ""]
    several = ctx.several
    adaptive = any(m in ctx.targets for m in ctx.analysis.machines)
    header = ((["machine"] if several else []) + ["rank", "variable", "values tried", "effect (family-wise 95% CI)",
                                                   "adjusted p", "runs per value"]
              + (["target"] if adaptive else []))
    body = []
    for i, ve in enumerate(ranked, 1):
        h = ve.headline
        body.append(([ctx.names[ve.machine_id]] if several else [])
                    + [i, f"`{ve.variable}`", ", ".join(lv.label for lv in ve.levels), effect_words(ve),
                       _p(h.p_adjusted), _runs_per_value(ve)]
                    + ([_target_words(h, ctx.targets.get(ve.machine_id))] if adaptive else []))
    n = ctx.analysis.family
    lines += [f"*adjusted p*: Bonferroni over all {n} tests in this report; below 0.05 is a clear effect "
              "(family-wise error 5%), exactly when the interval shown excludes no change: each is a 95% interval "
              f"widened for the {n} tests, and they hold together.", ""]
    lines += _table(header, body)
    return lines


def _runs_per_value(ve: VariableEffect) -> str:
    ns = sorted({lv.n for lv in ve.levels})
    return str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def notes_section(ctx: Context) -> list[str]:
    lines = []
    together = ctx.together
    if together:
        lines += ["Varied, but no two finished runs differ in it alone, so its own effect cannot be separated "
                  "(it moved only together with another variable, e.g. threads that follow cores): "
                  + ", ".join(f"`{n}`" for n in together) + ".", ""]
    for m, ma in ctx.analysis.machines.items():
        who = f" on {ctx.names[m]}" if ctx.several else ""
        if ma.baseline_lost:
            lines += [f"**Baseline lost{who}**: {ma.baseline_lost}", ""]
        for n, why in ma.uncompared.items():
            lines += [f"**Not compared{who}**: `{n}`: {why}.", ""]
        if ma.lost:
            lines += [f"Values asked for with no usable run{who} (never averaged, never dropped silently):", ""]
            lines += _table(["variable", "value", "why"], [[f"`{x.variable}`", x.value, x.why] for x in ma.lost])
    for m, ma in ctx.analysis.machines.items():
        who = f" on {ctx.names[m]}" if ctx.several else ""
        for note in ma.identical:
            lines += [f"**Ran identically{who}**: {note}", ""]
        for note in ma.regrouped:
            lines += [f"**Counted under what ran{who}**: {note}.", ""]
    return lines


def noise_section(ctx: Context) -> list[str]:
    machines = [(m, ma) for m, ma in ctx.analysis.machines.items() if ma.runs]
    if not machines:
        return []
    lines = ["## How noisy the machine is", "",
             "The same configuration run again does not take exactly the same time. *Run-to-run noise* is the "
             "model's residual: the coefficient of variation of one run's step time around its configuration's, "
             "once the block it ran in is accounted for (runs made side by side). *Block-to-block noise* is how "
             "much stretches of time differ beyond that: comparisons are made inside blocks, so it does not widen "
             "them, but it is why runs minutes apart agree less than neighbours.", ""]
    body = []
    for m, ma in machines:
        nz = ma.noise
        if nz.cv is not None:
            figure = _pct(nz.cv) + f" ({nz.dof:.0f} degrees of freedom)"
            if nz.probe_cv is not None:
                figure += f"; the machine probe measured {_pct(nz.probe_cv)}"
        elif nz.probe_cv is not None:
            figure = f"{_pct(nz.probe_cv)} (the machine probe's: nothing here was repeated)"
        else:
            figure = "not known: no configuration ran twice and the probe measured none"
        strata = [s for s in nz.strata if s.dof > 0 and not s.noisy_config]
        by_stratum = "; ".join(
            f"{_cores_words(s.members)}: {_pct(s.cv)}" + (f", {s.slow_share:.0%} of runs in a slow mode "
                                                          f"{100 * math.expm1(s.slow_shift):.0f}% slower (effects use the fast mode)"
                                                          if s.bimodal else "")
            for s in strata) if len(strata) > 1 or any(s.bimodal for s in strata) else "-"
        rel = ma.drift.relative()
        drift = ", ".join(f"pass {p}: {100 * (x - 1):+.0f}%" for p, x in rel.items() if p != min(rel)) if len(rel) > 1 else "-"
        if rel and len(rel) > 1:
            drift += f" vs pass {min(rel)}"
        if ma.drift.not_estimated:
            drift += f"; pass {', '.join(map(str, ma.drift.not_estimated))} shares no configuration with the first"
        spreads = [r.row["step_ms_p90"] / r.row["step_ms_p10"] for r in ma.runs
                   if r.row.get("step_ms_p90") and r.row.get("step_ms_p10")]
        within = f"{np.median(spreads):.2f}" if spreads else "-"
        shown = [e for e in ma.effects if e.kind == "ratio" and e.se is not None]
        if shown:
            hw = float(np.median([e.half_width for e in shown]))
            mde = float(np.median([fx.smallest_resolvable(e) for e in shown]))
            widths = f"+-{_pct(hw)} (median over {len(shown)} ratios); smallest change resolvable {_pct(mde)}"
        else:
            widths = "-"
        body.append(([ctx.names[m]] if ctx.several else [])
                    + [figure, _pct(nz.block_cv), by_stratum, _pct(nz.cv_with_drift), drift, within, widths,
                       nz.where_repeats_help() or "-"])
    header = (["machine"] if ctx.several else []) + [
        "run-to-run noise (CV)", "block-to-block noise (CV)", "by number of CPUs", "a configuration's repeats, blocks left in (CV)",
        "pass drift (step time vs the first pass)", "within one run: p90 / p10 of step times (median over runs)",
        "shown intervals (family-wise) and the smallest change they resolve (80% power)", "where more repeats help"]
    return lines + _table(header, body)


def _cores_words(members) -> str:
    cores = sorted(m for m in members if m is not None)
    return ("runs on " + ", ".join(map(str, cores)) + " CPU" + ("s" if cores != [1] else "")) if cores else "runs"


def runs_section(ctx: Context) -> list[str]:
    counts, failures = ctx.counts, ctx.failures
    lines = ["## Runs", ""]
    lines += _table(["status", "runs"], [[s, counts.get(s, 0)] for s in ("done", "failed", "skipped", "running", "queued")]
                    + [["total", counts.get("total", 0)]])
    if failures:
        lines += ["Runs that did not finish, by reason (their metrics are empty and no average uses them):", ""]
        lines += _table(["status", "reason", "runs"], [[s, why, n] for s, why, n in failures])
    lines += disturbed_lines(ctx.done, ctx.analysis)
    if ctx.sweep_notes:
        lines += ["Left out when the sweeps were planned on this machine (no job was made for these):", ""]
        lines += _table(["sweep", "note"], [[name, note] for name, note in ctx.sweep_notes])
    return lines


def disturbed_lines(done: list[dict], analysis: Analysis) -> list[str]:
    """How many done runs were disturbed (effects.disturbed: other processes' CPU time or steal over
    a stated share of the window), which, and that the fits left them out (effects.analyse_machine)."""
    if not done:
        return []
    measured = sum(1 for r in done if r.get("other_cpu_s") is not None or r.get("steal_s") is not None)
    if not measured:
        return ["Disturbed runs: not known (no run measured other processes' CPU time or steal).", ""]
    machines = analysis.machines.values()
    flagged = sorted((r.row["run_id"], r.disturbed) for m in machines for r in m.disturbed)
    kept = sum(1 for m in machines if m.disturbed_kept)
    if not flagged:
        fate = "None was left out of the fits."
    elif not kept:
        fate = ("They are left out of every fit and interval (`work --target-ci` adds repeat passes where a "
                "comparison is left too wide).")
    elif kept == len(machines):
        fate = ("Every done run was disturbed, so they are kept in the fits (nothing else is left): read the "
                "effects with care, and rerun on a quiet machine.")
    else:
        fate = (f"Every done run of {kept} machine(s) was disturbed, so there they are kept in the fits (nothing "
                "else is left): read those effects with care, and rerun on a quiet machine. Elsewhere they are "
                "left out of every fit.")
    lines = [f"Disturbed runs: {len(flagged)} of {len(done)} done runs: other processes (`other_cpu_s`) or the "
             f"hypervisor (`steal_s`) took more than {fx.DISTURBED_SHARE:.0%} of the job's CPU time over the "
             f"timed window (a step slows by about the share taken, as much as the smaller effects measured "
             f"here). {fate}", ""]
    provisional = sum(1 for r in done if fx.provisional_peak(r))
    if provisional:
        lines += [f"MFU of {provisional} of {len(done)} done runs is against a provisional GEMM peak (measured under "
                  f"load, or not measured on the run's CPU set: `applied.peak_gflops.basis` says which).", ""]
    if flagged:
        shown = flagged[:SHARED_ROWS]
        lines += _table(["run", "why flagged"], [[run_id, why] for run_id, why in shown])
        if len(flagged) > len(shown):
            lines += [f"... and {len(flagged) - len(shown)} more (results.csv has other_cpu_s and steal_s).", ""]
    return lines


def variables_section(ctx: Context) -> list[str]:
    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for ve in ctx.analysis.ranked():
        by_variable[ve.variable].append(ve)
    if not by_variable:
        return []
    lines = ["## Each variable", ""]
    for name, ves in by_variable.items():  # clearest first
        lines += [f"### {name}", "", f"*{BY_NAME[name].doc}.*", ""]
        for ve in ves:
            if ctx.several:
                lines += [f"**{ctx.names[ve.machine_id]}**", ""]
            held = _held(ve.fixed, ctx.analysis.machines[ve.machine_id])
            follow = (f" {', '.join(f'`{f}`' for f in ve.followers)} moved with it, at the values derived from it."
                      if ve.followers else "")
            left = (f" {ve.left_out} runs at these settings are left out: a variable that follows `{name}` was set "
                    "by hand there, so they differ in more than it." if ve.left_out else "")
            fitted = f" Fitted over {ve.n_groups} groups of runs." if ve.n_groups > 1 else ""
            lines += [f"Runs that differ in `{name}` alone; held: {held}.{follow}{left} "
                      f"Effect: {effect_words(ve)}.{fitted}", ""]
            ratios = {r.value: r for r in ve.ratios}
            body = [[lv.label + (" (baseline)" if lv is ve.baseline else ""), f"{lv.n} ({len(lv.passes)})",
                     _ms(lv.median_step_ms), _rate(lv.median_tokens_per_s), _pct(lv.cv),
                     f"{lv.within_run_spread:.2f}" if lv.within_run_spread else "-",
                     _ratio(ratios.get(lv.label)), _p(ratios[lv.label].p_adjusted) if lv.label in ratios else "-"]
                    for lv in ve.levels]
            lines += _table([name, "runs (passes)", "median step (ms)", "tokens/s", "own noise (CV)",
                             "within-run p90/p10", "step time vs baseline [family-wise 95% CI]", "adjusted p"], body)
            if ve.elasticity is not None and ve.elasticity.se is not None:
                e = ve.elasticity
                lines += [f"Power law: exponent {e.estimate:.3f}, standard error {e.se:.3f}, {e.dof:.1f} degrees of "
                          f"freedom, adjusted p {_p(e.p_adjusted)}.", ""]
            target = ctx.targets.get(ve.machine_id)
            if target is not None:
                words = "; ".join(f"{e.value or 'power law'}: {_target_words(e, target)}" for e in ve.effects)
                lines += [f"Target +-{_pct(target[0])} (95% interval, `work --target-ci`): {words}.", ""]
        if name == "precision":
            lines += gemm_formats(ctx.done)
        plot = ctx.out_dir / "plots" / f"{name}.png"
        if plot in ctx.plot_paths:
            lines += [f"![{name}](plots/{name}.png)", ""]
    return lines


def gemm_formats(done: list[dict]) -> list[str]:
    """What each precision's GEMMs computed, as the runs recorded it (runs.gemm_format), per framework."""
    seen = sorted({(r["precision"], r["framework"], r.get("gemm_format") or "not recorded (an older release)")
                   for r in done}, key=lambda t: (fx.sort_key("precision", t[0]), t[1], t[2]))
    if not seen:
        return []
    return ["What each mode's GEMMs computed, as its runs recorded it (`gemm_format`; docs/precision.md has "
            "the table):", ""] + _table(["precision", "framework", "GEMMs"],
                                        [[fx.label("precision", p), f, g] for p, f, g in seen])


def _held(fixed: dict[str, str], ma) -> str:
    """The held values in words: those that differ from the baseline configuration, by name."""
    if not fixed:
        return "nothing else varied"
    modal = fx.modal_config(ma.runs, list(fixed))
    other = {k: v for k, v in fixed.items() if v != fx.label(k, modal[k])}
    if not other:
        return "everything else at the baseline"
    return "everything else at the baseline except " + ", ".join(f"{k}={v}" for k, v in other.items())


def grids_section(ctx: Context) -> list[str]:
    if not any(ctx.grids.values()):
        return []
    lines = ["## Two variables varied together", "",
             "Median step time (ms) on each combination; other varied variables held as noted.", ""]
    for m, gs in ctx.grids.items():
        for g in gs:
            held = ", ".join(f"{k}={v}" for k, v in g.fixed.items()) or "nothing else varied"
            lines += [f"### {g.rows} x {g.cols}" + (f" on {ctx.names[m]}" if ctx.several else ""), "", f"Held: {held}.", ""]
            body = [[r] + [_ms(v) for v in row] for r, row in zip(g.row_labels, g.step_ms)]
            lines += _table([f"{g.rows} \\ {g.cols}"] + g.col_labels, body) + ["(- : no finished run)", ""]
            suffix = f"_machine{m}" if ctx.several else ""
            lines += [f"![{g.rows} x {g.cols}](plots/grid_{g.rows}_x_{g.cols}{suffix}.png)", ""]
    return lines


def shared_section(ctx: Context) -> list[str]:
    """Side by side on the configurations several machines ran: median step time and the ratio."""
    if not ctx.several:
        return []
    names = ctx.names
    varied = [n for n in ctx.varied if n not in ctx.together]
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ma in ctx.analysis.machines.values():
        for r in ma.runs:
            cells[r.config_key()][ma.machine_id].append(r.step_ms)
    machines = sorted(m for m, ma in ctx.analysis.machines.items() if ma.runs)
    ref = machines[0]
    shared = {k: v for k, v in cells.items() if len(v) > 1}
    lines = ["## Machines compared", ""]
    if not shared:
        return lines + ["No configuration has finished on more than one machine yet.", ""]
    # Geometric mean of the per-configuration ratios: one number per machine.
    overall = []
    for m in machines[1:]:
        logs = [math.log(np.median(v[m]) / np.median(v[ref])) for v in shared.values() if m in v and ref in v]
        if logs:
            overall.append(f"{names[m]} takes {math.exp(np.mean(logs)):.2f}x the step time of {names[ref]} "
                           f"(geometric mean over {len(logs)} shared configurations)")
    lines += [("; ".join(overall) + ".") if overall else "", ""]
    shown = varied or ["d_model"]
    idx = [fx.FACTORS.index(n) for n in shown]
    header = [", ".join(shown)] + [f"{names[m]} (ms)" for m in machines] + [f"machine {m} / machine {ref}" for m in machines[1:]]
    body = []
    for key, per in sorted(shared.items(), key=lambda kv: [fx.sort_key(n, kv[0][i]) for n, i in zip(shown, idx)])[:SHARED_ROWS]:
        med = {m: float(np.median(v)) for m, v in per.items()}
        body.append([", ".join(fx.label(n, key[i]) for n, i in zip(shown, idx))]
                    + [_ms(med.get(m)) for m in machines]
                    + [f"{med[m] / med[ref]:.2f}x" if m in med and ref in med else "-" for m in machines[1:]])
    lines += _table(header, body)
    if len(shared) > SHARED_ROWS:
        lines += [f"({len(shared) - SHARED_ROWS} more shared configurations in results.csv.)", ""]
    return lines


def machines_section(ctx: Context) -> list[str]:
    if not ctx.facts:
        return []
    ids = list(ctx.facts)
    body = [[label] + [_fact(ctx.facts[m].get(col)) for m in ids] for col, label in FACTS]
    return ["## Machines", ""] + _table(["fact"] + [ctx.names[m] for m in ids], body)


def _probe_facts(facts_json: str | dict | None) -> dict:
    """machines.facts: JSON text in the database (a dict where a driver already parsed it)."""
    return facts_json if isinstance(facts_json, dict) else json.loads(facts_json or "{}")


def probe_load(facts: dict) -> str:
    """Whether the probe's measured figures (GEMM peaks, memory bandwidth, noise) were taken on a
    quiet machine, in words, from machines.facts (worker/probe.py: limits_disturbed). A provisional
    noise figure is not used for the report's noise (write_report)."""
    if "limits_disturbed" not in facts:
        return "load not checked (probed before the check existed)"
    why = facts["limits_disturbed"]
    return (f"provisional: {why}; measured again by the next probe; its noise figure is not used here" if why
            else "measured on a quiet machine")


def mfu_peak(rows: list[dict]) -> str | None:
    """The GEMM peak MFU is taken against on the machine's largest CPU set, in words: the fastest of
    the trainers' libraries there (worker/gemm_peak.py) and the others' figures, from the runs'
    applied.peak_gflops; the probe's torch figure where the runs' peaks were scaled from it (older
    runs, BENCH_PEAK_PER_SET=0); None where no run recorded a peak."""
    best, any_peak = None, False
    for r in rows:
        peak = fx.peak_of(r)
        any_peak = any_peak or bool(peak.get("fp32"))
        if peak.get("library") and r.get("cores") and (best is None or r["cores"] > best[0]):
            best = (r["cores"], peak)
    if best is None:
        return "torch's GEMM peak (the probe's, scaled to each run's CPUs): `applied.peak_gflops.basis`" if any_peak \
            else None
    cores, peak = best
    return f"{peak_text(peak)} on {cores} CPU(s): the fastest of the trainers' GEMM libraries"


def _fact(v) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 100 else f"{v:,.0f}"
    return re.sub(r"\s+", " ", str(v))


def method_section(ctx: Context) -> list[str]:
    n = ctx.analysis.family
    return ["## How the numbers were computed", "",
            "- Only runs with status `done` enter any number; failed and skipped runs are only counted, and every "
            "value that was asked for and has no usable run is named with why.",
            "- Runs are grouped on what really ran: the dataset a run trained on (`dataset_used`), and the thread "
            "counts, oneDNN switch and allocator the child read back where they differ from the job's (today's "
            "worker records such a run as failed; older databases may hold them). Asked-for values that ran "
            "identically are one value and are said to be so, never reported as an effect.",
            "- *What is compared*: for each variable, the runs that differ from each other in that variable alone. "
            "Every other varied variable is held at one value (the baseline's, where it can be), and the variables "
            "that follow it by default (`omp_threads`, `intra_threads`, `inter_threads` follow `cores`; `head_dim` "
            "follows `d_model` and `n_heads`; `kv_heads` follows `n_heads`; `compile` follows `framework`) are at "
            "the values derived from it, as recorded at enqueue (`jobs.derived`). *Baseline*: the variable's most "
            "common value among the done runs (in a one-factor-at-a-time sweep, the sweep's base; if the base "
            "failed, another value).",
            "- *One model per machine*: log step time = configuration effect + block effect + residual, fitted "
            "once by least squares. A *block* is a stretch of the run order: the configurations of one comparison "
            "(a variable's values and the baseline) run next to each other in each repeat pass (`jobs.block`; in "
            "older sweeps the whole pass). Slow drift and the correlated noise of a stretch of time are block "
            "effects, estimated inside the model with their degrees of freedom paid, so a comparison rests on "
            "runs made side by side. The residual variance is shared by all configurations (one per number of "
            "CPUs where that stratum has enough runs), so a value with 3 runs borrows the degrees of freedom of "
            "the whole sweep. Where the residuals clearly show a slow mode (a share of runs 10-20% slower with no "
            "sensor seeing why, as on shared VMs) it is fitted as a mixture and the effects are the fast mode's.",
            "- *Disturbed runs* (another process or the hypervisor took more than "
            f"{fx.DISTURBED_SHARE:.0%} of the job's CPU time during its timed window, as measured by `other_cpu_s` "
            "and `steal_s`) are left out of every fit; the Runs section counts and names them.",
            "- *Step time vs baseline*: exp of the difference of the two configurations' effects in the model, with "
            "its standard error from the model, Satterthwaite's degrees of freedom over the noise strata, a "
            "Student t test of no change.",
            "- *Power law* (numeric sizes with three or more values): the least-squares slope of the values' "
            "effects in the model on log value (within each group of runs that differ only in this variable). A "
            "size tried at two values has only its ratio (the same test twice would be counted twice).",
            "- *Interactions*: where a variable was varied in several groups (a grid), its effect in each group is "
            "tested for equality (Wald F test). Where the groups differ, the effect is reported per group and no "
            "pooled number is given.",
            f"- *One procedure for verdicts and intervals*: this report makes {n} tests. Each is judged at "
            f"{fx.ALPHA:g}/{n} (single-step Bonferroni: family-wise error 5%, the chance that even one comparison "
            "with no real effect is called an effect is at most 5%), and the interval shown is the matching "
            f"simultaneous 95% interval (each at {100 * (1 - fx.ALPHA / max(1, n)):.2f}%): an effect is *clear* "
            "exactly when its interval excludes no change. The effects table also keeps each comparison's own "
            "(unadjusted) 95% interval in `ci_low` / `ci_high`.",
            "- *No detectable effect*: the test does not reject no change; the interval shows how large an effect "
            "could still hide in the noise. *Runs per value needed* and *smallest effect resolvable* use the same "
            "standard error, quantile and degrees of freedom as the test (80% power).",
            "- *Ranking*: by the p-value of each variable's headline effect (its power law, or its clearest ratio): "
            "how clearly it changes step time relative to the uncertainty, not how large a noisy difference is.",
            "- Every run is in results.csv; the fitted effects are in the database table `effects` (estimate, "
            "standard error, degrees of freedom, p-value, adjusted p, significant, both intervals, method, runs, "
            "passes). docs/statistics.md says more.", ""]


def pools_section(ctx: Context) -> list[str]:
    """Named pools and their hosts (orchestrator/pool_report.py)."""
    return pool_lines(ctx.rows)


# The sections of summary.md, in order. Another part adds its own by adding a function here
# (for example the published figures beside this machine's, after the machines compared).
SECTIONS: list[Callable[[Context], list[str]]] = [
    title_section,
    baseline_section,
    glance_section,
    notes_section,
    noise_section,
    runs_section,
    variables_section,
    parallel_report.markdown_section,  # ranks/nodes: compute vs all-reduce (orchestrator/parallel_report.py)
    grids_section,
    shared_section,
    pools_section,
    seeds_section,
    prediction_report.markdown,
    machines_section,
    method_section,
]
