"""summary.md: a list of sections (SECTIONS), each a function of the report's Context (data.py)
that returns markdown lines (none when it has nothing to say). A new section is one function and
one entry. The words and numbers come from words.py; the markdown tables from tables.py.
Imports no other writer (html.py).
"""

from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict
from collections.abc import Callable

import numpy as np

from orchestrator.queue import budget
from orchestrator.stats import effects as fx
from orchestrator.report.sections import learning as learning_report, parallel as parallel_report
from orchestrator.stats.effects import Analysis, VariableEffect
from orchestrator.report.sections import pools
from orchestrator.report.sections.seeds import seeds_section
from orchestrator.report.sections import prediction as prediction_report
from orchestrator.report.data import Context
from orchestrator.report.tables import markdown_table
from orchestrator.report.words import FACTS, _fact, _ms, _p, _pct, _rate, _ratio, _target_words, effect_words
from common.variables import BY_NAME
from orchestrator.stats.columns import column


# The variables that say how big one training step is: shown in the baseline line of the summary.
SHAPE = ("n_layers", "d_model", "n_heads", "seq_len", "batch_size", "vocab_size", "precision", "steps", "cores")
SHARED_ROWS = 40  # cross-machine table length before it is cut


# -- sections of summary.md ---------------------------------------------------------------------

def title_section(ctx: Context) -> list[str]:
    sweeps = ctx.sweeps
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
    modal = ctx.modal
    shape = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in SHAPE if n not in varied)
    base = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in varied)
    lines = [f"**Baseline**: {base or '(nothing varied)'}.", ""]
    if shape:
        lines += [f"**Shared by every run**: {shape}.", ""]
    constant = [f"{n}={fx.label(n, modal[n])}" for n in fx.FACTORS if n not in varied]
    return lines + ["<details><summary>Every variable's value in the baseline</summary>", "",
                    ", ".join(constant), "", "</details>", ""]


def glance_section(ctx: Context) -> list[str]:
    lines = ["## At a glance: effects on step time, clearest first", ""]
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
    lines += markdown_table(header, body)
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
            lines += markdown_table(["variable", "value", "why"],
                                    [[f"`{x.variable}`", x.value, x.why] for x in ma.lost])
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
            if nz.borrowed:
                figure += f"; {nz.borrowed}"
        elif nz.probe_cv is not None:
            figure = f"{_pct(nz.probe_cv)} (the machine probe's: nothing here was repeated)"
        else:
            figure = "not known: no configuration ran twice and the probe measured none"
        strata = [s for s in nz.strata if s.dof > 0 and not s.noisy_config]
        by_stratum = "; ".join(
            f"{_cores_words(s.members)}: {_pct(s.cv)}"
            + (f", {s.slow_share:.0%} of runs in a slow mode "
               f"{100 * math.expm1(s.slow_shift):.0f}% slower (effects use the fast mode)" if s.bimodal else "")
            for s in strata) if len(strata) > 1 or any(s.bimodal for s in strata) else "-"
        rel = ma.drift.relative()
        drift = (", ".join(f"pass {p}: {100 * (x - 1):+.0f}%" for p, x in rel.items() if p != min(rel))
                 if len(rel) > 1 else "-")
        if rel and len(rel) > 1:
            drift += f" vs pass {min(rel)}"
        if ma.drift.not_estimated:
            drift += f"; pass {', '.join(map(str, ma.drift.not_estimated))} shares no configuration with the first"
        rows = list(map(operator.attrgetter("row"), ma.runs))
        spreads = [p90 / p10 for p90, p10 in zip(column(rows, "step_ms_p90"),
                                                 column(rows, "step_ms_p10")) if p90 and p10]
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
        "run-to-run noise (CV)", "block-to-block noise (CV)", "by number of CPUs",
        "a configuration's repeats, blocks left in (CV)",
        "pass drift (step time vs the first pass)", "within one run: p90 / p10 of step times (median over runs)",
        "shown intervals (family-wise) and the smallest change they resolve (80% power)", "where more repeats help"]
    return lines + markdown_table(header, body)


def _cores_words(members) -> str:
    cores = sorted(m for m in members if m is not None)
    return ("runs on " + ", ".join(map(str, cores)) + " CPU" + ("s" if cores != [1] else "")) if cores else "runs"


def budget_section(ctx: Context) -> list[str]:
    """`run --budget`: how the time went and what is left unresolved (budget.spending, the page's too)."""
    lines = []
    for _, who, sp in ctx.budget_spending:
        lines += [f"## How the time budget was spent{who}", "", sp["words"], ""]
        if sp["given"]:
            lines += ["Comparisons given extra runs (a pass each time; why at the first):", ""]
            lines += markdown_table(budget.GIVEN_HEADER, sp["given"])
        if sp["still"]:
            lines += [sp["still"], ""]
    return lines


def runs_section(ctx: Context) -> list[str]:
    counts, failures = ctx.counts, ctx.failures
    lines = ["## Runs", ""]
    statuses = [[s, counts.get(s, 0)] for s in ("done", "failed", "skipped", "running", "queued")]
    lines += markdown_table(["status", "runs"], statuses + [["total", counts.get("total", 0)]])
    if failures:
        lines += ["Runs that did not finish, by reason (their metrics are empty and no average uses them):", ""]
        lines += markdown_table(["status", "reason", "runs"], [[s, why, n] for s, why, n in failures])
    lines += disturbed_lines(ctx.done, ctx.analysis)
    if ctx.sweep_notes:
        lines += ["Left out when the sweeps were planned on this machine (no job was made for these):", ""]
        lines += markdown_table(["sweep", "note"], [[name, note] for name, note in ctx.sweep_notes])
    return lines


def disturbed_lines(done: list[dict], analysis: Analysis) -> list[str]:
    """How many done runs were disturbed (effects.disturbed: other processes' CPU time or steal over
    a stated share of the window), which, and that the fits left them out (effects.analyse_machine)."""
    if not done:
        return []
    measured = any(r.get("other_cpu_s") is not None or r.get("steal_s") is not None for r in done)
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
    # only the runs whose applied could hold a provisional peak are parsed (none is, where every applied is NULL)
    applied = column(done, "applied")
    provisional = 0 if applied.count(None) == len(applied) else _provisional_count(done, applied)
    if provisional:
        lines += [f"MFU of {provisional} of {len(done)} done runs is against a provisional GEMM peak (measured under "
                  f"load, or not measured on the run's CPU set: `applied.peak_gflops.basis` says which).", ""]
    if flagged:
        shown = flagged[:SHARED_ROWS]
        lines += markdown_table(["run", "why flagged"], [[run_id, why] for run_id, why in shown])
        if len(flagged) > len(shown):
            lines += [f"... and {len(flagged) - len(shown)} more (results.csv has other_cpu_s and steal_s).", ""]
    return lines


def _provisional_count(done: list[dict], applied: list) -> int:
    """How many of the runs (`applied`: their applied, column(done, "applied")) have a provisional peak:
    each distinct applied text asked once (a fleet's runs repeat their texts)."""
    try:
        times = Counter(applied)
    except TypeError:  # a row that holds its applied already parsed (a dict)
        return sum(1 for r, a in zip(done, applied) if _may_be_provisional(a) and fx.provisional_peak(r))
    return sum(n for a, n in times.items() if _may_be_provisional(a) and fx.provisional_peak({"applied": a}))


def _may_be_provisional(applied) -> bool:
    """False where a run's applied cannot hold a provisional peak: none, or JSON text without the word
    anywhere in it, not even \\u-escaped (a million runs' applied are then not parsed for it)."""
    return applied is not None and (not isinstance(applied, str) or "provisional" in applied or "\\u" in applied)


def variables_section(ctx: Context) -> list[str]:
    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for ve in ctx.analysis.ranked():
        by_variable[ve.variable].append(ve)
    if not by_variable:
        return []
    # each machine's baseline values of every variable some comparison holds: one look at its runs
    held_names: dict[int, dict] = defaultdict(dict)
    for ves in by_variable.values():
        for ve in ves:
            held_names[ve.machine_id].update(dict.fromkeys(ve.fixed))
    machines = ctx.analysis.machines
    modal = {m: ctx.modal if len(machines) == 1 and set(names) <= set(ctx.modal)
             else fx.modal_config(machines[m].runs, list(names)) for m, names in held_names.items() if names}
    lines = ["## Each variable", ""]
    for name, ves in by_variable.items():  # clearest first
        lines += [f"### {name}", "", f"*{BY_NAME[name].doc}.*", ""]
        for ve in ves:
            if ctx.several:
                lines += [f"**{ctx.names[ve.machine_id]}**", ""]
            held = _held(ve.fixed, ctx.analysis.machines[ve.machine_id], modal.get(ve.machine_id))
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
            lines += markdown_table([name, "runs (passes)", "median step (ms)", "tokens/s", "own noise (CV)",
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
            "the table):", ""] + markdown_table(["precision", "framework", "GEMMs"],
                                        [[fx.label("precision", p), f, g] for p, f, g in seen])


def _held(fixed: dict[str, str], ma, modal: dict | None = None) -> str:
    """The held values in words: those that differ from the baseline configuration, by name.
    `modal`: fx.modal_config(ma.runs, names) already taken for these names and maybe more (each
    variable's modal value is its own)."""
    if not fixed:
        return "nothing else varied"
    modal = modal if modal is not None else fx.modal_config(ma.runs, list(fixed))
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
            lines += [f"### {g.rows} x {g.cols}" + (f" on {ctx.names[m]}" if ctx.several else ""), "",
                      f"Held: {held}.", ""]
            body = [[r] + [_ms(v) for v in row] for r, row in zip(g.row_labels, g.step_ms)]
            lines += markdown_table([f"{g.rows} \\ {g.cols}"] + g.col_labels, body) + ["(- : no finished run)", ""]
            suffix = f"_machine{m}" if ctx.several else ""
            lines += [f"![{g.rows} x {g.cols}](plots/grid_{g.rows}_x_{g.cols}{suffix}.png)", ""]
    return lines


def _median(xs: list[float]):
    """np.median(xs) (a configuration's step times on one machine): a single run's own time without the call."""
    return xs[0] if len(xs) == 1 else np.median(xs)


def shared_section(ctx: Context) -> list[str]:
    """Side by side on the configurations several machines ran: median step time and the ratio."""
    if not ctx.several:
        return []
    names = ctx.names
    varied = [n for n in ctx.varied if n not in ctx.together]
    machines, shared = pools.machines_compared(ctx.analysis)
    ref = machines[0]
    lines = ["## Machines compared", ""]
    if not shared:
        return lines + ["No configuration has finished on more than one machine yet.", ""]
    # Geometric mean of the per-configuration ratios: one number per machine.
    overall = []
    for m in machines[1:]:
        logs = [math.log(_median(v[m]) / _median(v[ref])) for v in shared.values() if m in v and ref in v]
        if logs:
            overall.append(f"{names[m]} takes {math.exp(np.mean(logs)):.2f}x the step time of {names[ref]} "
                           f"(geometric mean over {len(logs)} shared configurations)")
    lines += [("; ".join(overall) + ".") if overall else "", ""]
    shown = varied or ["d_model"]
    idx = [fx.FACTORS.index(n) for n in shown]
    header = ([", ".join(shown)] + [f"{names[m]} (ms)" for m in machines]
              + [f"machine {m} / machine {ref}" for m in machines[1:]])
    body = []
    for key, per in sorted(shared.items(),
                           key=lambda kv: [fx.sort_key(n, kv[0][i]) for n, i in zip(shown, idx)])[:SHARED_ROWS]:
        med = {m: float(np.median(v)) for m, v in per.items()}
        body.append([", ".join(fx.label(n, key[i]) for n, i in zip(shown, idx))]
                    + [_ms(med.get(m)) for m in machines]
                    + [f"{med[m] / med[ref]:.2f}x" if m in med and ref in med else "-" for m in machines[1:]])
    lines += markdown_table(header, body)
    if len(shared) > SHARED_ROWS:
        lines += [f"({len(shared) - SHARED_ROWS} more shared configurations in results.csv.)", ""]
    return lines


def machines_section(ctx: Context) -> list[str]:
    if not ctx.facts:
        return []
    ids = list(ctx.facts)
    body = [[label] + [_fact(ctx.facts[m].get(col)) for m in ids] for col, label in FACTS]
    return ["## Machines", ""] + markdown_table(["fact"] + [ctx.names[m] for m in ids], body)


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
    """Named pools and their hosts (orchestrator/report/sections/pools.py)."""
    return pools.pool_lines(ctx.rows, ctx.queues)


# The sections of summary.md, in order. Another part adds its own by adding a function here
# (for example the published figures beside this machine's, after the machines compared).
SECTIONS: list[Callable[[Context], list[str]]] = [
    title_section,
    baseline_section,
    glance_section,
    learning_report.markdown_section,  # time to a trained model (orchestrator/report/sections/learning.py)
    notes_section,
    noise_section,
    budget_section,
    runs_section,
    variables_section,
    parallel_report.markdown_section,  # ranks/nodes: compute vs all-reduce (orchestrator/report/sections/parallel.py)
    grids_section,
    shared_section,
    pools_section,
    seeds_section,
    prediction_report.markdown,
    machines_section,
    method_section,
]
