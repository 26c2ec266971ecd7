"""The report's "Time to a trained model": for the learning runs with a target (target_loss), each
variable's factor on time to target split into its factor on step time and on tokens to target
(orchestrator/stats/learning.py), the seed-to-seed spread, a callout wherever ranking by step time and by
time to target disagree, and each value's validation loss against tokens and seconds (plots/). The
report reads the curves once (read_curves) and prepares the section once (prepare); summary.md gets
markdown_section(), index.html html_section().
"""

from __future__ import annotations

import html
import math
import statistics
from collections import defaultdict
from pathlib import Path

from sqlalchemy import text

from orchestrator.report.tables import html_table, markdown_table
from orchestrator.stats import learning

# The final curve of every learning run with a target (its last attempt, done), in step order.
SELECT_CURVES = """
SELECT run_id, step, tokens, train_s + eval_s AS time_s, val_loss FROM v_curves
WHERE final AND target_loss IS NOT NULL ORDER BY run_id, step
"""

INTRO = ("A faster step can be a slower training: precision, batch size, width, optimizer and learning rate change "
         "how many tokens reach a given validation loss. Each learning run here trains on real text until its "
         "loss on held-out text it never saw is at or below its target (checked every eval_every tokens), or "
         "until max_tokens (then it is counted as not reached, never dropped). Time to target = steps x step time "
         "(+ evaluation, as MLPerf counts it), so each value's factor on it against the baseline is its factor on "
         "step time x its factor on tokens to target, each with a 95% interval over the value's seeds (every "
         "repeat trains with its own seed). A factor below 1 is faster or fewer tokens.")
CENSORED = ("≥: some of the value's runs did not reach the target, so it needs at least this many tokens; ≤: some "
            "of the baseline's did not; unresolved: both.")


def read_curves(conn, rows: list[dict]) -> dict[int, list[tuple]]:
    """run_id -> its final curve [(step, tokens, seconds, val_loss)], for the report's learning runs."""
    wanted = {r["run_id"] for r in learning.learning_rows(rows)}
    if not wanted:
        return {}
    curves: dict[int, list[tuple]] = defaultdict(list)
    for run_id, step, tokens, seconds, val_loss in conn.execute(text(SELECT_CURVES)):
        if run_id in wanted:
            curves[run_id].append((step, tokens, seconds, val_loss))
    return dict(curves)


def prepare(ctx, curves: dict[int, list[tuple]], plots_dir: Path | None, store=None) -> dict:
    """The section's data, once for both writers: comparisons, rank changes, the curve plots drawn
    into plots_dir (None: no pictures), and with several machines (and the store, for their cost
    models) each configuration's time to target on every machine."""
    rows = learning.learning_rows(ctx.done)
    comps = learning.comparisons(rows)
    drawn = _plot(comps, curves, plots_dir) if plots_dir is not None and comps else {}
    several = store is not None and rows and len(ctx.names) > 1
    return {"runs": rows, "comparisons": comps, "changes": learning.rank_changes(comps), "plots": drawn,
            "datasets": sorted({str(r.get("dataset_used")) for r in rows}),
            "machines": everywhere(rows, ctx.names, store) if several else [],
            "agreement": learning.machine_agreement(rows) if several else []}


def everywhere(rows: list[dict], names: dict, store) -> list[dict]:
    """Each learning configuration's time to target on every machine of the report: measured where the
    machine ran it (MLPerf's olympic mean), else predicted: tokens to target measured anywhere (the
    geometric mean over seeds) over tokens per step x that machine's cost-model step time, the
    evaluations' share of the time as measured; its 95% interval joins both on the log scale."""
    from common import variables as V
    from common.errors import BenchError
    from orchestrator.queue.predict import model_of

    per_machine = learning.values(rows)
    by_key: dict[tuple, list[learning.Value]] = defaultdict(list)
    for vs in per_machine.values():
        for key, v in vs.items():
            by_key[key].append(v)
    models: dict[int, object] = {}
    out = []
    for key, vs in by_key.items():
        pooled = learning.pooled_tokens(vs)
        measured_on = sorted({r["machine_id"] for r in pooled.runs})
        row = {"config": pooled.config, "measured_on": measured_on, "cells": {}}
        for machine_id in names:
            own = per_machine.get(machine_id, {}).get(key)
            if own is not None:
                row["cells"][machine_id] = ("measured", own.olympic_time(), None, None)
                continue
            try:
                if machine_id not in models:
                    models[machine_id] = model_of(store, machine_id, calibrated=True)
                config = _config_of(pooled.runs[0])
                p = models[machine_id].predict(config)
            except BenchError as why:
                row["cells"][machine_id] = ("refused", None, None, str(why))
                continue
            tokens = learning.geomean(pooled.tokens)
            if tokens.estimate is None or pooled.censored:
                row["cells"][machine_id] = ("refused", None, None, "tokens to target not measured whole "
                                            "(a seed did not reach it)")
                continue
            share = statistics.median(min(0.9, float(r["eval_s"] or 0) / float(r["time_to_target_s"]))
                                      for r in pooled.runs if r["reached"] and r.get("time_to_target_s"))
            train_s = tokens.estimate / V.tokens_per_step(config) * p.step_ms / 1e3
            total = train_s / (1.0 - share)
            halves = [math.log(p.step_ms_high / p.step_ms_low) / 2]
            if tokens.low is not None:
                halves.append((math.log(tokens.high) - math.log(tokens.low)) / 2)
            half = math.sqrt(sum(h * h for h in halves))
            row["cells"][machine_id] = ("predicted", total, (total * math.exp(-half), total * math.exp(half)), None)
        out.append(row)
    return out


def _config_of(row: dict) -> dict:
    """A run's full config from its row (a NULL column back to its word: default, none)."""
    from common import variables as V

    return V.complete({n: row.get(n) if row.get(n) is not None else (V.BY_NAME[n].words or ("default",))[0]
                       for n in V.NAMES})


def _factor(f: learning.Factor, digits: int = 2) -> str:
    if f.estimate is None:
        return "unresolved"
    est = f"{f.estimate:.{digits}f}x"
    if f.bound in (">=", "<="):
        side = f.low if f.bound == ">=" else f.high
        return f"{'≥' if f.bound == '>=' else '≤'} {est}" + (f" (95%: {side:.{digits}f})" if side else "")
    if f.bound == "unresolved":
        return f"unresolved ({est} over reached runs)"
    if f.low is None:
        return f"{est} (one run a side: no interval)"
    return f"{est} [{f.low:.{digits}f}, {f.high:.{digits}f}]"


def _runs(v: learning.Value) -> str:
    spread = v.tokens_spread()
    return f"{v.reached}/{v.seeds}" + (f", spread {spread:.0%}" if spread is not None else "")


def _olympic(v: learning.Value) -> str:
    t = v.olympic_time()
    return "-" if t is None else ("not reached" if math.isinf(t) else f"{t:.3g}")


HEADER = ["variable", "value vs baseline", "seeds reached, spread of their tokens", "step time", "tokens to target",
          "time to target", "olympic time to target, s (value; baseline)"]


def _cells(c: learning.Comparison, names: dict, several: bool) -> list[str]:
    machine = [names.get(c.machine_id, str(c.machine_id))] if several else []
    return machine + [c.variable, f"{c.label} vs {c.base_label}", f"{_runs(c.value)} (baseline {_runs(c.baseline)})",
                      _factor(c.step), _factor(c.tokens), _factor(c.time),
                      f"{_olympic(c.value)}; {_olympic(c.baseline)}"]


def _change_words(changes, comps, names: dict, several: bool) -> list[str]:
    out = []
    for machine_id, variable, by_step, by_time in changes:
        where = f" on {names.get(machine_id, machine_id)}" if several else ""
        clear = learning.clear_flips([c for c in comps if (c.machine_id, c.variable) == (machine_id, variable)])
        how = (f"clear for {', '.join(clear)} (step time and time to target both apart from the baseline's, "
               f"on opposite sides)" if clear else "within the noise: no value's two intervals both exclude the "
               "baseline on opposite sides")
        out.append(f"`{variable}`{where}: by step time {' < '.join(by_step)}, but by time to target "
                   f"{' < '.join(by_time)} ({how}).")
    return out


def _generated_note(section: dict) -> str | None:
    if "builtin" in section["datasets"]:
        return ("Some of these runs trained on the generated built-in text (the hub and PyPI were out of reach): "
                "its loss says nothing about learning real text.")
    return None


def markdown_section(ctx) -> list[str]:
    section = getattr(ctx, "learning", None)
    if not section or not section["runs"]:
        return []
    lines = ["## Time to a trained model", "", INTRO, ""]
    if note := _generated_note(section):
        lines += [f"**{note}**", ""]
    comps = section["comparisons"]
    if not comps:
        return lines + [f"{len(section['runs'])} learning runs, but no two configurations one variable apart: "
                        "nothing to compare yet.", ""]
    for words in _change_words(section["changes"], comps, ctx.names, ctx.several):
        lines += [f"> **Ranked differently by step time and by time to target**: {words}", ""]
    header = (["machine"] if ctx.several else []) + HEADER
    lines += markdown_table(header, [_cells(c, ctx.names, ctx.several) for c in comps], escape=False)
    lines += [CENSORED, ""]
    lines += _machines_lines(section, ctx.names)
    lines += [f"![validation loss, {v}](plots/{p.name})" for v, p in section["plots"].items()]
    return lines + [""]


MACHINES_INTRO = ("Learning is portable, step time is not: tokens to a target depend on the model, the data, the "
                  "precision, the hyperparameters and the seed, not on the CPU. Each configuration's time to "
                  "target on every machine: measured where the machine ran it (MLPerf's olympic mean); elsewhere "
                  "predicted, from the tokens to target measured on the machine named and that machine's "
                  "cost-model step time, with the evaluations' measured share added.")


def _machine_cells(row: dict, names: dict) -> list[str]:
    cells = []
    for machine_id in names:
        kind, value, interval, why = row["cells"][machine_id]
        if kind == "measured":
            cells.append("measured: " + ("not reached" if value is not None and math.isinf(value) else
                                         f"{value:.3g} s" if value is not None else "-"))
        elif kind == "predicted":
            source = ", ".join(f"machine {m}" for m in row["measured_on"])
            cells.append(f"predicted: {value:.3g} s [{interval[0]:.3g}, {interval[1]:.3g}] "
                         f"(tokens measured on {source})")
        else:
            cells.append(f"refused: {why}")
    return cells


def _config_words(config: dict, rows: list[dict]) -> str:
    varied = [k for k in learning.LEARNING_KEYS if len({str(r["config"].get(k)) for r in rows}) > 1]
    return ", ".join(f"{k}={learning._label(config[k])}" for k in varied) or "the configuration"


def _machines_lines(section: dict, names: dict) -> list[str]:
    rows = section["machines"]
    if not rows:
        return []
    lines = ["### Time to target on each machine", "", MACHINES_INTRO, ""]
    lines += markdown_table(["configuration"] + [names[m] for m in names], _machine_rows(rows, names), escape=False)
    for config, a, b, f in section["agreement"]:
        lines += [f"Tokens to target where two machines ran the same configuration "
                  f"({_config_words(config, rows)}): {names.get(b, b)} / {names.get(a, a)} = {_factor(f)}.", ""]
    return lines


def _machine_rows(rows: list[dict], names: dict) -> list[list[str]]:
    return [[_config_words(r["config"], rows)] + _machine_cells(r, names) for r in rows]


def html_section(ctx) -> str:
    section = getattr(ctx, "learning", None)
    if not section or not section["runs"]:
        return ""
    e = html.escape
    parts = [f'<section id="learning"><h2>Time to a trained model</h2><p>{e(INTRO)}</p>']
    if note := _generated_note(section):
        parts.append(f'<p class="callout"><strong>{e(note)}</strong></p>')
    comps = section["comparisons"]
    if not comps:
        parts.append(f"<p>{len(section['runs'])} learning runs, but no two configurations one variable apart: "
                     "nothing to compare yet.</p></section>")
        return "".join(parts)
    for words in _change_words(section["changes"], comps, ctx.names, ctx.several):
        parts.append(f'<p class="callout"><strong>Ranked differently by step time and by time to target</strong>: '
                     f'{e(words).replace("`", "")}</p>')
    header = (["machine"] if ctx.several else []) + HEADER
    parts.append(html_table(header, [_cells(c, ctx.names, ctx.several) for c in comps], None, escape=True,
                            thead=False))
    parts.append(f"<p>{e(CENSORED)}</p>")
    if section["machines"]:
        rows, names = section["machines"], ctx.names
        parts.append(f"<h3>Time to target on each machine</h3><p>{e(MACHINES_INTRO)}</p>")
        parts.append(html_table(["configuration"] + [names[m] for m in names], _machine_rows(rows, names), None,
                                escape=True, thead=False))
        parts += [f"<p>Tokens to target where two machines ran the same configuration "
                  f"({e(_config_words(config, rows))}): {e(str(names.get(b, b)))} / {e(str(names.get(a, a)))} = "
                  f"{e(_factor(f))}.</p>" for config, a, b, f in section["agreement"]]
    parts += [f'<figure><img src="plots/{e(p.name)}" alt="validation loss against tokens and seconds, {e(v)}">'
              f"<figcaption>Validation loss against tokens and against seconds (training + evaluation), "
              f"<code>{e(v)}</code>: the median over each value's seeds</figcaption></figure>"
              for v, p in section["plots"].items()]
    return "".join(parts) + "</section>"


def _plot(comps: list[learning.Comparison], curves: dict[int, list[tuple]], plots_dir: Path) -> dict[str, Path]:
    """One PNG per (machine, variable): each value's median validation loss over its seeds at every
    evaluation, against tokens and against seconds, the target dashed."""
    from orchestrator.report import plots

    by_variable: dict[tuple, list] = defaultdict(list)
    for c in comps:
        key = (c.machine_id, c.variable)
        if not by_variable[key]:
            by_variable[key].append((c.base_label + " (baseline)", c.baseline))
        by_variable[key].append((c.label, c.value))
    several = len({m for m, _ in by_variable}) > 1
    out = {}
    for (machine_id, variable), series in by_variable.items():
        fig = plots.figure(9.0, 3.4)
        ax_tokens, ax_time = fig.subplots(1, 2, sharey=True)
        for label, value in series:
            points = _median_curve(value, curves)
            if points:
                tokens, seconds, loss = zip(*points)
                ax_tokens.plot(tokens, loss, marker=".", label=label)
                ax_time.plot(seconds, loss, marker=".", label=label)
        target = series[0][1].config.get("target_loss")
        for ax, xlabel in ((ax_tokens, "tokens trained"), (ax_time, "seconds (training + evaluation)")):
            if target is not None:
                ax.axhline(float(target), linestyle="--", color="grey", linewidth=1)
            ax.set_xlabel(xlabel)
        from matplotlib.ticker import FuncFormatter

        ax_tokens.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e3:g}k"))
        ax_tokens.set_ylabel("validation loss")
        ax_tokens.legend(title=variable, fontsize=7)
        plots.lay_out(fig)
        name = f"learning_{variable}" + (f"_machine{machine_id}" if several else "") + ".png"
        path = plots_dir / name
        plots._save(fig, path)
        out[variable + (f" (machine {machine_id})" if several else "")] = path
    return out


def _median_curve(value: learning.Value, curves: dict[int, list[tuple]]) -> list[tuple]:
    """(tokens, seconds, validation loss) at each evaluation step, medians over the value's runs that got there."""
    at: dict[int, list[tuple]] = defaultdict(list)
    for r in value.runs:
        for step, tokens, seconds, loss in curves.get(r["run_id"], []):
            at[step].append((tokens, seconds, loss))
    return [(statistics.median(p[0] for p in pts), statistics.median(p[1] for p in pts),
             statistics.median(p[2] for p in pts)) for _, pts in sorted(at.items())]
