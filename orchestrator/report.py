"""The report people read after a sweep: results.csv (every run), summary.md (how step time changes
with each variable, ranked), plots/*.png, and the fitted effects written to the `effects` table.

`write_report()` reads v_results once, leaves the statistics to effects.py and the pictures to
plots.py, and returns a Report that bench.py prints; it prints nothing itself.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import text

from orchestrator import effects as fx
from orchestrator.effects import Effect, Grid, VariableEffect
from orchestrator.pool_report import pool_lines
from orchestrator.store import Store
from orchestrator.variables import BY_NAME, NAMES

SELECT_RESULTS = "SELECT * FROM v_results {where} ORDER BY run_id"
SELECT_SWEEP_NOTES = "SELECT name, notes FROM sweeps ORDER BY sweep_id"
DELETE_EFFECTS = "DELETE FROM effects WHERE machine_id = :machine_id"
INSERT_EFFECT = """
INSERT INTO effects (machine_id, variable, kind, value, baseline, estimate, ci_low, ci_high, n_runs, created)
VALUES (:machine_id, :variable, :kind, :value, :baseline, :estimate, :ci_low, :ci_high, :n_runs, {now})
"""

# Machine facts shown side by side, with the words a reader needs.
FACTS = (
    ("cpu_model", "CPU"), ("hostname", "host"), ("sockets", "sockets"), ("physical_cores", "physical cores"),
    ("logical_cores", "logical CPUs"), ("numa_nodes", "NUMA nodes"), ("isa_flags", "vector ISA"),
    ("l2_kb", "L2 (KiB)"), ("l3_kb", "L3 (KiB)"), ("mem_total_gb", "memory (GB)"),
    ("mem_bw_gbs_all", "memory bandwidth, all CPUs (GB/s)"), ("gemm_gflops_fp32_all", "GEMM fp32 peak (GFLOP/s)"),
    ("gemm_gflops_bf16_all", "GEMM bf16 peak (GFLOP/s)"), ("freq_driver", "frequency driver"),
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
    top_effects: list[Effect]  # one headline effect per (machine, variable), largest span first
    counts: dict[str, int]  # status -> runs (queued included), as store.counts gives them
    failures: list[tuple[str, str, int]]  # (status, reason, runs) of failed and skipped runs, most first
    machines: int  # machines with runs in the report
    effects: list[Effect]  # every effect written to the effects table


def write_report(store: Store, out_dir: Path, *, machine_id: int | None = None) -> Report:
    """Write out_dir/results.csv, out_dir/summary.md and out_dir/plots/*.png for one machine (or all
    machines when machine_id is None), and replace those machines' rows of the effects table."""
    out_dir = Path(out_dir)
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    for old in plots_dir.glob("*.png"):  # a plot of a variable no longer varied must not linger
        old.unlink()
    where = "WHERE machine_id = :machine_id" if machine_id is not None else ""
    with store.transaction() as conn:
        result = conn.execute(text(SELECT_RESULTS.format(where=where)), {"machine_id": machine_id})
        columns = list(result.keys())
        rows = [dict(zip(columns, r)) for r in result.all()]
    csv_path = _write_csv(out_dir / "results.csv", columns, rows)

    machine_ids = sorted({r["machine_id"] for r in rows} | ({machine_id} if machine_id is not None else set()))
    facts = {m: next((r for r in rows if r["machine_id"] == m), {}) for m in machine_ids}
    names = {m: _machine_name(m, facts[m]) for m in machine_ids}
    done = fx.done_runs(rows)
    varied = fx.varied_variables(done)

    analyses: dict[int, list[VariableEffect]] = {}
    together: dict[int, list[str]] = {}
    grids: dict[int, list[Grid]] = {}
    for m in machine_ids:
        analyses[m], together[m] = fx.analyse_machine(rows, m, varied)
        grids[m] = fx.grids(rows, m, [ve.variable for ve in analyses[m]], together[m])

    plot_paths = _plots(analyses, grids, names, plots_dir)
    all_effects = [e for m in machine_ids for ve in analyses[m] for e in ([ve.elasticity] if ve.elasticity else []) + ve.ratios]
    _write_effects(store, machine_ids, all_effects)
    top = sorted((ve.headline for m in machine_ids for ve in analyses[m]), key=lambda e: -e.span)

    counts = store.counts(machine_id)
    failures = _failures(rows)
    with store.transaction() as conn:
        sweep_notes = [(name, note) for name, notes in conn.execute(text(SELECT_SWEEP_NOTES))
                       for note in json.loads(notes or "[]")]
    summary_path = out_dir / "summary.md"
    summary_path.write_text(_summary(rows, done, varied, analyses, together, grids, names, facts, counts,
                                     failures, sweep_notes, plot_paths, out_dir))
    return Report(csv_path=csv_path, summary_path=summary_path, plot_paths=plot_paths, top_effects=top,
                  counts=counts, failures=failures, machines=len({r["machine_id"] for r in rows}),
                  effects=all_effects)


# -- files --------------------------------------------------------------------------------------

def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([r[c] for c in columns] for r in rows)
    return path


def _plots(analyses, grids, names, plots_dir: Path) -> list[Path]:
    from orchestrator import plots  # matplotlib only when there is something to draw

    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for m, ves in analyses.items():
        for ve in ves:
            by_variable[ve.variable].append(ve)
    # Plot legends have room for the host only; the summary gives the CPU.
    short = {m: n.split(",")[0] + (")" if "," in n else "") for m, n in names.items()}
    paths = [plots.plot_variable(series, short, plots_dir / f"{name}.png")
             for name, series in sorted(by_variable.items(), key=lambda kv: NAMES.index(kv[0]))]
    several = len(analyses) > 1
    for m, gs in grids.items():
        for g in gs:
            suffix = f"_machine{m}" if several else ""
            paths.append(plots.plot_grid(g, names[m], plots_dir / f"grid_{g.rows}_x_{g.cols}{suffix}.png"))
    return paths


def _write_effects(store: Store, machine_ids: list[int], effects: list[Effect]) -> None:
    rows = [{"machine_id": e.machine_id, "variable": e.variable, "kind": e.kind, "value": e.value,
             "baseline": e.baseline, "estimate": e.estimate, "ci_low": e.ci_low, "ci_high": e.ci_high,
             "n_runs": e.n_runs} for e in effects]
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


# -- summary.md ---------------------------------------------------------------------------------

def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _ratio(e: Effect | None) -> str:
    if e is None:
        return "1 (baseline)"
    ci = f" [{e.ci_low:.2f}, {e.ci_high:.2f}]" if e.ci_low is not None else " (one run each: no CI)"
    return f"{e.estimate:.2f}x{ci}"


def _cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def _effect_words(ve: VariableEffect) -> str:
    e = ve.elasticity
    if e is not None:
        ci = f" (95% CI {e.ci_low:.2f} to {e.ci_high:.2f})" if e.ci_low is not None else ""
        doubling = 2 ** e.estimate
        return f"step time ~ {ve.variable}^{e.estimate:.2f}{ci}: doubling it multiplies step time by {doubling:.2f}"
    h = ve.headline
    return f"{h.value} vs {h.baseline}: {_ratio(h)} the step time"


def _summary(rows, done, varied, analyses, together, grids, names, facts, counts, failures, sweep_notes, plot_paths,
             out_dir) -> str:
    several = sum(1 for m in analyses if analyses[m] or any(r["machine_id"] == m for r in done)) > 1
    sweeps = sorted({r["sweep"] for r in rows if r.get("sweep")})
    lines = ["# cpubench report", ""]
    lines += [_intro(len(done), len(rows), sweeps, names, varied, several), ""]
    lines += _baseline_lines(done, varied)

    lines += ["## At a glance: the variables ranked by effect", ""]
    ranked = sorted(((m, ve) for m in analyses for ve in analyses[m]), key=lambda mv: -mv[1].span)
    if ranked:
        header = (["machine"] if several else []) + ["rank", "variable", "values tried", "slowest / fastest", "effect"]
        body = [([names[m]] if several else []) + [i, f"`{ve.variable}`", ", ".join(lv.label for lv in ve.levels),
                                                   f"{ve.span:.2f}x", _effect_words(ve)]
                for i, (m, ve) in enumerate(ranked, 1)]
        lines += ["*slowest / fastest*: how many times longer the slowest value's median step took than the "
                  "fastest value's, the ranking key.", ""] + _table(header, body)
    else:
        lines += ["No variable took more than one value among the finished runs yet, so there is nothing to "
                  "compare." if done else "No run has finished yet: run `python bench.py work` first.", ""]
    moved = sorted({n for m in together for n in together[m]}, key=NAMES.index)
    if moved:
        lines += ["Varied, but no two finished runs differ in it alone, so its own effect cannot be separated "
                  "(usually it is derived from another variable and moved with it, e.g. threads with cores): "
                  + ", ".join(f"`{n}`" for n in moved) + ".", ""]

    lines += _runs_lines(counts, failures, sweep_notes)
    lines += _variable_lines(analyses, names, plot_paths, out_dir, several)
    lines += _grid_lines(grids, names, out_dir, several)
    if several:
        lines += _shared_lines(done, [n for n in varied if n not in moved], names)
    lines += pool_lines(rows)  # queue's section (orchestrator/pool_report.py): named pools and their hosts
    lines += _machine_lines(facts, names)
    lines += _method_lines()
    return "\n".join(lines)


def _intro(n_done: int, n_rows: int, sweeps: list[str], names: dict, varied: list[str], several: bool) -> str:
    where = f"{len(names)} machines" if several else (next(iter(names.values())) if names else "no machine yet")
    sweep_words = f"sweep{'s' if len(sweeps) != 1 else ''} {', '.join(sweeps)}" if sweeps else "no sweep yet"
    return (
        f"This report covers {n_done} finished training runs (of {n_rows} claimed) from {sweep_words} on "
        f"{where}. Each run trains a small transformer language model on the CPU for a fixed number of "
        "optimizer steps and times every step; the number compared throughout is the **median step time** "
        "(milliseconds per optimizer step: lower is faster), with the throughput it implies (**tokens/s**: "
        f"higher is faster). The runs differ in {len(varied)} variable{'s' if len(varied) != 1 else ''}, "
        "usually one at a time around a *baseline* configuration (for each variable, the value most runs "
        "share). For each variable, its table holds the runs that differ from the baseline only in that "
        "variable: one row per value, its median step time and tokens/s, and its step time **relative to "
        "the baseline** (0.50x = twice as fast, 2.00x = twice as slow) with a 95% confidence interval from "
        "the repeated runs. For sizes (d_model, seq_len, cores...) a power law is fitted as well: "
        "step time ~ size^e, where e = 1 means doubling the size doubles the time, e = 0 means no effect "
        "and e = -1 means doubling it halves the time (perfect scaling with cores). Variables are ranked "
        "by how much the step time moved over the values tried. Failed and skipped runs are counted below "
        "but never enter an average."
    )


def _baseline_lines(done: list[dict], varied: list[str]) -> list[str]:
    if not done:
        return []
    modal = fx.modal_config(done, list(NAMES))
    shape = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in SHAPE if n not in varied)
    base = ", ".join(f"{n}={fx.label(n, modal[n])}" for n in varied)
    lines = [f"**Baseline**: {base or '(nothing varied)'}.", ""]
    if shape:
        lines += [f"**Shared by every run**: {shape}.", ""]
    constant = [f"{n}={fx.label(n, modal[n])}" for n in NAMES if n not in varied and n != "repeat"]
    lines += ["<details><summary>Every variable's value in the baseline</summary>", "",
              ", ".join(constant), "", "</details>", ""]
    return lines


def _runs_lines(counts: dict, failures: list, sweep_notes: list[tuple[str, str]]) -> list[str]:
    lines = ["## Runs", ""]
    lines += _table(["status", "runs"], [[s, counts.get(s, 0)] for s in ("done", "failed", "skipped", "running", "queued")]
                    + [["total", counts.get("total", 0)]])
    if failures:
        lines += ["Runs that did not finish, by reason (their metrics are empty and no average uses them):", ""]
        lines += _table(["status", "reason", "runs"], [[s, why, n] for s, why, n in failures])
    if sweep_notes:
        lines += ["Left out when the sweeps were planned on this machine (no job was made for these):", ""]
        lines += _table(["sweep", "note"], [[name, note] for name, note in sweep_notes])
    return lines


def _variable_lines(analyses, names, plot_paths, out_dir: Path, several: bool) -> list[str]:
    by_variable: dict[str, list[VariableEffect]] = defaultdict(list)
    for m in analyses:
        for ve in analyses[m]:
            by_variable[ve.variable].append(ve)
    if not by_variable:
        return []
    lines = ["## Each variable", ""]
    order = sorted(by_variable, key=lambda n: -max(ve.span for ve in by_variable[n]))
    for name in order:
        lines += [f"### {name}", "", f"*{BY_NAME[name].doc}.*", ""]
        for ve in by_variable[name]:
            if several:
                lines += [f"**{names[ve.machine_id]}**", ""]
            held = ", ".join(f"{k}={v}" for k, v in ve.fixed.items()) or "nothing else varied"
            follow = f" {', '.join(ve.followers)} moved with it (derived from it)." if ve.followers else ""
            lines += [f"Runs that differ only in `{name}`; held: {held}.{follow} "
                      f"Effect: {_effect_words(ve)}."
                      + (f" Fitted over {ve.n_groups} groups of runs." if ve.n_groups > 1 else ""), ""]
            ratios = {r.value: r for r in ve.ratios}
            body = [[lv.label + (" (baseline)" if lv is ve.baseline else ""), len(lv.step_ms), _ms(lv.median_step_ms),
                     _rate(lv.median_tokens_per_s), _ratio(ratios.get(lv.label))] for lv in ve.levels]
            lines += _table([name, "runs", "median step (ms)", "tokens/s", "step time vs baseline [95% CI]"], body)
        plot = out_dir / "plots" / f"{name}.png"
        if plot in plot_paths:
            lines += [f"![{name}](plots/{name}.png)", ""]
    return lines


def _grid_lines(grids, names, out_dir: Path, several: bool) -> list[str]:
    if not any(grids.values()):
        return []
    lines = ["## Two variables varied together", "",
             "Median step time (ms) on each combination; other varied variables held as noted.", ""]
    for m, gs in grids.items():
        for g in gs:
            held = ", ".join(f"{k}={v}" for k, v in g.fixed.items()) or "nothing else varied"
            lines += [f"### {g.rows} x {g.cols}" + (f" on {names[m]}" if several else ""), "", f"Held: {held}.", ""]
            body = [[r] + [_ms(v) for v in row] for r, row in zip(g.row_labels, g.step_ms)]
            lines += _table([f"{g.rows} \\ {g.cols}"] + g.col_labels, body) + ["(- : no finished run)", ""]
            suffix = f"_machine{m}" if several else ""
            lines += [f"![{g.rows} x {g.cols}](plots/grid_{g.rows}_x_{g.cols}{suffix}.png)", ""]
    return lines


def _shared_lines(done: list[dict], varied: list[str], names: dict) -> list[str]:
    """Side by side on the configurations several machines ran: median step time and the ratio."""
    key_names = [n for n in NAMES if n != "repeat"]
    cells: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in done:
        cells[tuple(fx.value_of(n, r[n]) for n in key_names)][r["machine_id"]].append(float(r[fx.METRIC]))
    machines = sorted({r["machine_id"] for r in done})
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
    shown = [n for n in varied if n != "repeat"] or ["d_model"]
    idx = [key_names.index(n) for n in shown]
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


def _machine_lines(facts: dict, names: dict) -> list[str]:
    if not facts:
        return []
    ids = list(facts)
    lines = ["## Machines", ""]
    body = [[label] + [_fact(facts[m].get(col)) for m in ids] for col, label in FACTS]
    return lines + _table(["fact"] + [names[m] for m in ids], body)


def _fact(v) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 100 else f"{v:,.0f}"
    return re.sub(r"\s+", " ", str(v))


def _method_lines() -> list[str]:
    return ["## How the numbers were computed", "",
            "- Only runs with status `done` enter any number; failed and skipped runs are only counted.",
            "- *Baseline*: for each variable, its most common value among the done runs (in a "
            "one-factor-at-a-time sweep, the sweep's base).",
            "- *Step time vs baseline*: the geometric mean of the value's step times over the baseline's, "
            "within the runs that differ only in this variable. 95% CI: a t-interval on the log scale with "
            "the run-to-run noise pooled over all values of the variable (timing noise is multiplicative); "
            "no CI when every value ran once.",
            "- *Power law* (numeric sizes): least-squares slope of log step time on log value, within each "
            "group of runs that differ only in this variable (each group has its own intercept); 95% "
            "t-interval on the slope.",
            "- Variables that resolve derives from another (head_dim from d_model, threads from cores) move "
            "with it and are reported under it.",
            "- Every run is in results.csv; the fitted effects are in the database table `effects`.", ""]
