"""result/index.html: the page people read after a sweep, one self-contained file that works offline
from file:// (plotly's JavaScript is inlined once; no network, no CDN).

What the page holds, in order: the effects as a forest plot (every effect with its family-wise
interval and verdict, clearest first, each a link to its variable), one section per varied variable
(its runs as dots over the fitted power law or ratios, the values that failed or were skipped and
why, interaction plots of the grids it is part of), the machine (facts, measured peaks, noise and
what it means for the intervals), the runs (a table sorted, filtered and paginated in JavaScript),
the seed documents' reference runs beside this machine's, and the machines and pools side by side.

Two layers, so that the statistics can change under the page:
- `analysis_dicts()` is the one place that reads effects.py's objects (Analysis, MachineAnalysis,
  VariableEffect, Effect, Level, Grid, Noise, Drift) and turns them into plain dicts; a change of
  the statistics' classes is adapted there and nowhere else.
- everything else works on those dicts and on the rows of v_results (stable: the schema's columns).

In the report package it is the page's writer: it draws on data.py's Context and words.py's words
and numbers, its CSS and JavaScript are files of their own (static/page.css, static/page.js), and
it imports no other writer (markdown.py).

Scale: a database of 100k runs must give a page under ~10 MB that opens in seconds. The runs
travel once, column by column, gzip-compressed and base64-encoded (the browser inflates them with
DecompressionStream); repeated text (configurations, reasons) is interned; the dots of a value are
at most DOTS_PER_LEVEL runs, evenly sampled; the table shows one page of rows at a time, and plots
are drawn when they scroll into view.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import itertools
import json
import math
import operator
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from orchestrator.stats import effects as fx
from orchestrator.queue import budget
from orchestrator.report.sections import learning as learning_report, parallel as parallel_report, prediction as prediction_report, seeds
from orchestrator.stats.config_index import CONFIG_NAMES, config_index
from orchestrator.stats.columns import column
from orchestrator.report.tables import html_table
from orchestrator.report.view_sql import tuple_getter
from orchestrator.report.words import FACTS, _fact, _fmt, _p, _pct, short_reason
from common.variables import BY_NAME, NAMES

RUNS_ON_PAGE = 200_000  # runs the page's table carries: beyond it, a sample (every run in results.csv)
DOTS_PER_LEVEL = 300  # runs drawn per value of a variable (evenly sampled beyond it; the table has them all)
RUNS_PER_PAGE = 50
SHARED_POINTS = 2000  # shared configurations drawn in the machines-compared scatter
NOT_CONFIG = ("repeat",)  # the pass index: not part of what differs between configurations
SECTIONS = (("effects", "Effects"), ("variables", "Variables"), ("machine", "Machine and noise"),
            ("runs", "Runs"), ("seeds", "Reference runs"), ("predict", "How long here"), ("machines", "Machines and pools"))
# The page's CSS and JavaScript are files of their own (static/), read once; a newline after
# <style> and <script>, as the page has always had.
STATIC = Path(__file__).resolve().parent / "static"
CSS = "\n" + (STATIC / "page.css").read_text(encoding="utf-8")
JS = "\n" + (STATIC / "page.js").read_text(encoding="utf-8")


# -- the adapter: effects.py's objects -> plain dicts --------------------------------------------

def analysis_dicts(analysis, grids: dict[int, list], names: dict[int, str]) -> dict:
    """The statistics as the page draws them: {"effects": [...] in rank order, "variables": [...],
    "grids": [...], "noise": {machine: {...}}, "family": int}. The only function that touches the
    classes of orchestrator/stats/effects.py."""
    family = analysis.family
    effects, variables = [], []
    for rank, ve in enumerate(analysis.ranked(), 1):
        anchor = var_anchor(ve.variable, ve.machine_id, several=len(analysis.machines) > 1)
        headline = ve.headline
        ordered = [headline] + sorted((e for e in ve.effects if e is not headline),
                                      key=lambda e: (e.p_value if e.p_value is not None else 2.0))
        for e in ordered:
            effects.append(_effect_dict(e, rank, anchor, names, headline=e is headline))
        base = ve.baseline
        levels = []
        for lv in ve.levels:
            ratio = next((r for r in ve.ratios if r.value == lv.label), None)
            levels.append({"label": lv.label, "value": _num_or_none(lv.value), "n": lv.n,
                           "passes": len(lv.passes), "median_ms": lv.median_step_ms,
                           "geo_ms": float(np.exp(np.mean(np.log(lv.step_ms)))),
                           "tokens_per_s": lv.median_tokens_per_s, "cv": lv.cv, "baseline": lv is base,
                           "ratio": _effect_dict(ratio, rank, anchor, names) if ratio else None,
                           "run_ids": _sample([r.row["run_id"] for r in lv.runs], DOTS_PER_LEVEL)})
        law = None
        if ve.elasticity is not None:
            law = _effect_dict(ve.elasticity, rank, anchor, names)
        variables.append({
            "variable": ve.variable, "machine_id": ve.machine_id, "anchor": anchor, "rank": rank,
            "size_like": bool(ve.size_like and law is not None), "levels": levels, "law": law,
            "baseline": base.label, "fixed": dict(ve.fixed), "followers": list(ve.followers),
            "left_out": ve.left_out, "n_groups": ve.n_groups, "headline": _effect_dict(headline, rank, anchor, names),
        })
    out_grids = [{"machine_id": g.machine_id, "rows": g.rows, "cols": g.cols, "row_labels": list(g.row_labels),
                  "col_labels": list(g.col_labels), "step_ms": [list(r) for r in g.step_ms], "fixed": dict(g.fixed)}
                 for m, gs in grids.items() for g in gs]
    noise = {}
    for m, ma in analysis.machines.items():
        nz = ma.noise
        per_value = Counter(lv.n for ve in ma.variables for lv in ve.levels).most_common(1)
        noise[m] = {"cv": nz.cv, "cv_with_drift": nz.cv_with_drift, "probe_cv": nz.probe_cv, "configs": nz.configs,
                    "borrowed": nz.borrowed,
                    "sigma": nz.sigma, "noisiest": [list(x) for x in nz.noisiest],
                    "drift": {int(p): x for p, x in ma.drift.relative().items()},
                    "drift_not_estimated": list(ma.drift.not_estimated),
                    "runs_per_value": per_value[0][0] if per_value else None,
                    "disturbed": len(ma.disturbed), "fitted_runs": len(ma.runs), "together": list(ma.together),
                    "identical": list(ma.identical), "regrouped": list(ma.regrouped),
                    "varied": list(ma.varied), "dof": nz.dof, "block_cv": nz.block_cv,
                    "strata": [{"cpus": [c for c in st.members if c is not None], "cv": st.cv, "slow_share": st.slow_share,
                                "slow_shift": math.expm1(st.slow_shift)} for st in nz.strata
                               if st.dof > 0 and not st.noisy_config],
                    "half_widths": sorted(e.half_width for e in ma.effects if e.kind == "ratio" and e.se is not None),
                    "resolvable": sorted(fx.smallest_resolvable(e) for e in ma.effects if e.kind == "ratio" and e.se is not None),
                    "advice": nz.where_repeats_help(), "uncompared": dict(ma.uncompared),
                    "baseline_lost": ma.baseline_lost}
    return {"effects": effects, "variables": variables, "grids": out_grids, "noise": noise, "family": family,
            "alpha": fx.ALPHA}


def _effect_dict(e, rank: int, anchor: str, names: dict[int, str], headline: bool = False) -> dict:
    lo, hi = e.ci_adj
    if e.kind == "elasticity":  # on the page's one axis: the step-time factor of a doubling
        label = f"{e.variable}: power law (per doubling)"
        factor, flo, fhi = 2 ** e.estimate, (2 ** lo if lo is not None else None), (2 ** hi if hi is not None else None)
    else:
        label = f"{e.variable}: {e.value} vs {e.baseline}"
        factor, flo, fhi = e.estimate, lo, hi
    verdict, significant = e.verdict(), e.significant
    if e.se is not None and not e.usable:  # beyond 0.2x-5x: a point without its interval, never an effect
        flo = fhi = None
        verdict, significant = f"unresolved: {e.n_runs} runs, interval {lo:.2g} to {hi:.2g}", None
    return {"machine_id": e.machine_id, "machine": names.get(e.machine_id, str(e.machine_id)), "variable": e.variable,
            "kind": e.kind, "value": e.value, "baseline": e.baseline, "estimate": e.estimate, "lo": lo, "hi": hi,
            "factor": factor, "factor_lo": flo, "factor_hi": fhi, "label": label, "verdict": verdict,
            "significant": significant, "p_adjusted": e.p_adjusted, "n_runs": e.n_runs, "min_runs": e.min_runs,
            "repeats_needed": e.repeats_needed, "describe": e.describe(), "rank": rank, "anchor": anchor,
            "headline": headline}


# -- page data from rows -----------------------------------------------------------------------

def var_anchor(variable: str, machine_id: int | None = None, several: bool = False) -> str:
    return f"var-{variable}" + (f"-m{machine_id}" if several and machine_id is not None else "")


def _num_or_none(v):
    if isinstance(v, bool):
        return None
    return float(v) if isinstance(v, (int, float)) else None


def _sample(xs: list, k: int) -> list:
    if len(xs) <= k:
        return list(xs)
    step = len(xs) / k
    return [xs[int(i * step)] for i in range(k)]


def _round(x, digits: int = 4):
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    if x == 0:
        return 0
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def _round_all(values, digits: int = 4) -> list:
    """[_round(x, digits) for x in values], the digits of every value found at once (numpy): the same
    Python round() of the same float per value, so the same numbers. A power of ten's logarithm is
    asked of math.log10, as _round asks it, wherever numpy's could fall on the other side of an integer."""
    xs = list(values)
    try:
        a = np.array(xs, dtype=float)  # None: NaN, which _round also gives None for
    except (TypeError, ValueError):
        return [_round(x, digits) for x in xs]
    if a.ndim != 1:
        return [_round(x, digits) for x in xs]
    finite = np.isfinite(a)
    nonzero = finite & (a != 0)
    mag = np.abs(a[nonzero])
    logs = np.log10(mag)
    exponent = np.floor(logs)
    for i in np.flatnonzero(np.abs(logs - np.round(logs)) < 1e-9).tolist():
        exponent[i] = math.floor(math.log10(float(mag[i])))
    rounded = list(map(round, a[nonzero].tolist(), np.maximum(0, digits - 1 - exponent).astype(np.int64).tolist()))
    if len(rounded) == len(xs):
        return rounded
    kind = finite.astype(np.int8) + nonzero  # 0: None, 1: zero, 2: rounded
    it = iter(rounded)
    return [next(it) if k == 2 else (0 if k else None) for k in kind.tolist()]


def baselines(rows: list[dict]) -> dict[int, dict[str, object]]:
    """Per machine, the value of each variable most of its configurations share (each configuration
    counted once), over every claimed run: failed and skipped ones say what differs too."""
    out = {}
    ids, raws = config_index(rows)
    # a configuration is a config_hash (a run without one: the run itself); its first run's values count
    machines = list(map(operator.itemgetter("machine_id"), rows))
    hashes = column(rows, "config_hash")
    if all(hashes):  # every run has one (the usual case): read at C speed
        jobs = list(zip(machines, hashes))
    else:
        jobs = [(m, h or r["run_id"]) for m, h, r in zip(machines, hashes, rows)]
    first = dict(zip(reversed(jobs), reversed(ids)))  # the earliest run of each wins
    by_machine: dict[int, Counter] = {}
    for job in dict.fromkeys(jobs):  # in the order they first ran
        c = by_machine.get(job[0])
        if c is None:
            c = by_machine[job[0]] = Counter()
        c[first[job]] += 1
    names = list(CONFIG_NAMES)
    for m, per_id in by_machine.items():
        # Configurations that differ only in their repeat count as many times as they are, once each.
        raw = {raws[i]: k for i, k in per_id.items()}
        modal = {}
        for i, n in enumerate(names):
            counts = Counter()
            for values, k in raw.items():
                counts[_val(n, values[i])] += k
            if len(counts) > 1:
                modal[n] = max(counts.items(), key=lambda kv: (kv[1], str(kv[0]) == str(BY_NAME[n].default)))[0]
        out[m] = modal
    return out


@functools.lru_cache(maxsize=65536)
def _val(name: str, raw) -> str:
    """A column value as the page writes it (cached: a 100k-run page asks millions of times)."""
    return fx.label(name, fx.value_of(name, raw))


def config_difference(row: dict, modal: dict[str, object]) -> dict[str, str]:
    """The variables where this run differs from its machine's baseline configuration, as labels."""
    out = {}
    for n, base in modal.items():
        v = _val(n, row.get(n))
        if v != base:
            out[n] = v
    return out


def runs_table(rows: list[dict], modal: dict[int, dict], names: dict[int, str], disturbed: set,
               index: tuple[list[int], list[tuple]] | None = None) -> dict:
    """The runs, column by column, with repeated text interned: what the runs table and the hover
    texts of the dots read. `index`: config_index(rows), where known (each run's key is then made
    once per machine and configuration)."""
    interned: dict[str, dict[str, int]] = {"machine": {}, "status": {}, "config": {}, "reason": {}}

    def idx(kind: str, text: str) -> int:
        table = interned[kind]
        if text not in table:
            table[text] = len(table)
        return table[text]

    cols: dict[str, list] = {}
    config_vars: dict[int, list[str]] = {}
    seen: dict[tuple, int] = {}  # (machine, the run's values of its baseline's variables) -> config text index
    machines = list(map(operator.itemgetter("machine_id"), rows))
    # each run's key (its machine, its values of the baseline's variables) read at C speed; a key's
    # text made once, in the order the keys first appear (as run by run)
    base_names = {m: tuple(modal.get(m, {})) for m in dict.fromkeys(machines)}
    if index is not None and set().union(*base_names.values()) <= set(CONFIG_NAMES):
        keys, first_row = _keys_by_number(rows, machines, index, base_names)
    else:
        keys = list(zip(machines, map(tuple, map(map, map(operator.attrgetter("get"), rows),
                                                 map(base_names.__getitem__, machines)))))
        first_row = dict(zip(reversed(keys), reversed(rows)))
    for key in dict.fromkeys(keys):
        diff = config_difference(first_row[key], modal.get(key[0], {}))
        text = ", ".join(f"{k}={v}" for k, v in diff.items()) or "baseline"
        ci = seen[key] = idx("config", text)
        config_vars.setdefault(ci, list(diff))
    config = list(map(seen.__getitem__, keys))
    # column by column (each kind's text interned in the order the runs show it, as run by run)
    cols["run_id"] = list(map(operator.itemgetter("run_id"), rows))
    machine = {m: idx("machine", names.get(m, f"machine {m}")) for m in dict.fromkeys(machines)}
    cols["machine"] = list(map(machine.__getitem__, machines))
    statuses = list(map(operator.itemgetter("status"), rows))
    status = {s: idx("status", s) for s in dict.fromkeys(statuses)}
    cols["status"] = list(map(status.__getitem__, statuses))
    cols["pass"] = _ints(column(rows, "repeat"))
    cols["step_ms"] = _round_all(column(rows, "step_ms_median"))
    cols["tokens_per_s"] = _round_all(column(rows, "tokens_per_s"))
    cols["mfu"] = _round_all(column(rows, "mfu"), 3)
    cols["config"] = config
    # the reasons of the runs that failed or were skipped; "" for the rest (interned as first shown)
    reasons = [""] * len(rows)
    stopped = [status[s] for s in ("failed", "skipped") if s in status]
    if stopped:
        for i in np.flatnonzero(np.isin(np.array(cols["status"], dtype=np.int64), stopped)).tolist():
            reasons[i] = short_reason(rows[i].get("reason"))
    for text in dict.fromkeys(reasons):
        idx("reason", text)
    cols["reason"] = list(map(interned["reason"].__getitem__, reasons))
    cols["disturbed"] = list(map(int, map(disturbed.__contains__, cols["run_id"])))
    dicts = {k: list(v) for k, v in interned.items()}
    return {"n": len(rows), "cols": cols, "dicts": dicts,
            "config_vars": [config_vars[i] for i in range(len(dicts["config"]))]}


def _keys_by_number(rows: list[dict], machines: list, index: tuple[list[int], list[tuple]],
                    base_names: dict) -> tuple[list, dict]:
    """runs_table's keys (each run's machine and its values of its baseline's variables) and each
    key's first run, made once per machine and configuration number (config_index: runs of one
    number have equal values of every one of those variables, so equal keys)."""
    ids, raws = index
    at = {n: i for i, n in enumerate(CONFIG_NAMES)}
    pick = {m: tuple_getter([at[n] for n in ns]) for m, ns in base_names.items()}
    pairs = list(zip(machines, ids))
    key_of = {p: (p[0], tuple(pick[p[0]](raws[p[1]]))) for p in dict.fromkeys(pairs)}
    first_at = dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1)))  # each pair's earliest run
    first_row: dict = {}
    for p, key in key_of.items():  # pairs in the order they first ran: a key's first pair has its first run
        if key not in first_row:
            first_row[key] = rows[first_at[p]]
    return list(map(key_of.__getitem__, pairs)), first_row


def _ints(values) -> list[int]:
    """[int(x or 0) for x in values]: the values themselves where every one is an int."""
    xs = list(values)
    if set(map(type, xs)) <= {int}:
        return xs
    return [int(x or 0) for x in xs]


def page_runs(rows: list[dict], st: dict, cap: int | None = None) -> list[dict]:
    """The runs the page's table carries: every one up to RUNS_ON_PAGE; beyond, every run not done,
    every run drawn as a dot, and an even sample of the rest (a page of a million runs stays bounded)."""
    cap = RUNS_ON_PAGE if cap is None else cap
    if len(rows) <= cap:
        return rows
    drawn = {i for v in st["variables"] for lv in v.get("levels", []) for i in lv.get("run_ids", [])}
    step = -(-len(rows) // cap)
    # every step-th run, every run not done, every drawn run: the three masks at C speed
    keep = np.zeros(len(rows), dtype=bool)
    keep[::step] = True
    keep |= np.array(list(map(operator.ne, map(operator.itemgetter("status"), rows), itertools.repeat("done"))),
                     dtype=bool)
    keep |= np.array(list(map(drawn.__contains__, map(operator.itemgetter("run_id"), rows))), dtype=bool)
    return list(itertools.compress(rows, keep.tolist()))


def lost_values(rows: list[dict], modal: dict[int, dict]) -> dict[tuple[int, str], list[dict]]:
    """(machine, variable) -> the values that failed or were skipped, with why and how many runs:
    a run that did not finish is charged to every variable where it differs from the baseline."""
    counted: dict[tuple[int, str], Counter] = defaultdict(Counter)
    stopped = map(("failed", "skipped").__contains__, map(operator.itemgetter("status"), rows))
    for r in itertools.compress(rows, stopped):  # only the runs that did not finish (picked at C speed)
        diff = config_difference(r, modal.get(r["machine_id"], {})) or {"(baseline)": "baseline"}
        for n, v in diff.items():
            counted[(r["machine_id"], n)][(v, r["status"], short_reason(r.get("reason")))] += 1
    return {k: [{"value": v, "status": s, "why": why, "runs": n} for (v, s, why), n in c.most_common()]
            for k, c in counted.items()}


def shared_configs(rows: list[dict], done: list[dict] | None = None) -> dict:
    """Machines side by side: per pair (reference, other) the median step time of every configuration
    both finished, and the geometric mean of their ratios. `done`: fx.done_runs(rows), where known."""
    done = fx.done_runs(rows) if done is None else done
    machine_of = list(map(operator.itemgetter("machine_id"), done))
    machines = sorted(set(machine_of))
    if len(machines) < 2:
        return {"machines": machines, "pairs": []}
    # each finished run's configuration number (done is in the rows' order: one walk along both)
    ids, config, pending = config_index(rows)[0], [], iter(done)
    nxt = next(pending, None)
    for i, r in zip(ids, rows):
        if r is nxt:
            config.append(i)
            nxt = next(pending, None)
    if len(config) != len(done):  # not a subsequence of the rows: look each one up
        number = dict(zip(map(id, rows), ids))
        config = [number[id(r)] for r in done]
    # the runs sorted into (configuration, machine) cells; the configurations in the order they first finished
    n_machines, column = len(machines), {m: j for j, m in enumerate(machines)}
    config_array = np.array(config, dtype=np.int64)
    cell = config_array * n_machines + np.array(list(map(column.__getitem__, machine_of)), dtype=np.int64)
    steps = np.array(list(map(float, map(operator.itemgetter("step_ms_median"), done))), dtype=float)
    order = np.argsort(cell, kind="stable")
    cell, steps = cell[order], steps[order]
    starts = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
    bounds = dict(zip(cell[starts].tolist(), zip(starts.tolist(), np.r_[starts[1:], len(cell)].tolist())))
    seen, first = np.unique(config_array, return_index=True)
    in_order = seen[np.argsort(first)].tolist()  # each configuration once, in the order it first finished
    ref = machines[0]
    pairs = []
    for j, m in enumerate(machines[1:], 1):
        xs, ys = [], []
        for c in in_order:
            here, there = bounds.get(c * n_machines), bounds.get(c * n_machines + j)
            if here is not None and there is not None:
                xs.append(float(np.median(steps[here[0]:here[1]])))
                ys.append(float(np.median(steps[there[0]:there[1]])))
        ratio = float(np.exp(np.mean(np.log(np.array(ys) / np.array(xs))))) if xs else None
        keep = _sample(list(range(len(xs))), SHARED_POINTS)
        pairs.append({"ref": ref, "other": m, "shared": len(xs), "ratio": ratio,
                      "x": [_round(xs[i]) for i in keep], "y": [_round(ys[i]) for i in keep]})
    return {"machines": machines, "pairs": pairs}


def pools_table(rows: list[dict]) -> list[dict]:
    # the distinct (pool, machine, hosts, status) of the runs, counted at C speed, then added up per queue
    seen = Counter(zip(column(rows, "pool_id"), column(rows, "pool"),
                       map(operator.itemgetter("machine_id"), rows), column(rows, "worker_host"),
                       column(rows, "hostname"), map(operator.itemgetter("status"), rows)))
    per: dict[tuple, dict] = {}
    for (pool_id, pool, machine, worker_host, hostname, status), n in seen.items():
        key = (pool_id, pool or f"machine {machine}")
        p = per.setdefault(key, {"pool": key[1], "hosts": set(), "machines": set(), "done": 0, "failed": 0,
                                 "skipped": 0, "running": 0})
        p["hosts"].add(worker_host or hostname or "?")
        p["machines"].add(machine)
        if status in p:
            p[status] += n
    return [{**p, "hosts": sorted(p["hosts"]), "machines": sorted(p["machines"])} for _, p in sorted(per.items(),
                                                                                                   key=lambda kv: str(kv[0]))]


# -- HTML ----------------------------------------------------------------------------------------

def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _budget_section(ctx) -> str:
    """`run --budget`: how the time went (budget.spending, as summary.md says it)."""
    out = []
    for m, who, sp in ctx.budget_spending:
        out.append(f'<section id="budget-{m}"><h2>How the time budget was spent{_e(who)}</h2><p>{_e(sp["words"])}</p>'
                   + (html_table(budget.GIVEN_HEADER, [[_e(c) for c in row] for row in sp["given"]]) if sp["given"] else "")
                   + (f'<p>{_e(sp["still"])}</p>' if sp["still"] else "") + "</section>")
    return "".join(out)


def _verdict_class(e: dict) -> str:
    return "clear" if e["significant"] else "none" if e["significant"] is False else "untested"


def _effect_text(e: dict) -> str:
    lo, hi = e["lo"], e["hi"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else " (no interval: a value ran once)"
    if e["kind"] == "elasticity":
        return (f"step time ~ {_e(e['variable'])}<sup>{e['estimate']:.2f}</sup>{ci}: doubling it multiplies "
                f"step time by {e['factor']:.2f}")
    return f"{_e(e['value'])} vs {_e(e['baseline'])}: {e['estimate']:.2f}x the step time{ci}"


def _head(title: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{CSS}</style></head><body>"""


def _nav() -> str:
    links = "".join(f'<a href="#{sid}">{_e(name)}</a>' for sid, name in SECTIONS)
    return f'<nav><strong>cpubench</strong>{links}</nav>'


def _effects_section(st: dict, ctx, several: bool) -> str:
    n = st["family"]
    effects = st["effects"]
    if not effects:
        why = ("No variable took more than one value among the finished runs yet, so there is nothing to compare."
               if ctx.done else "No run has finished yet: run <code>python bench.py work</code> first.")
        return f'<section id="effects"><h2>Effects on step time</h2><p>{why}</p></section>'
    heads = [e for e in effects if e["headline"]]
    rows = []
    for e in heads:
        rows.append(([_e(e["machine"])] if several else [])
                    + [str(e["rank"]), f'<a href="#{e["anchor"]}"><code>{_e(e["variable"])}</code></a>',
                       _effect_text(e), f'<span class="v {_verdict_class(e)}">{_e(e["verdict"])}</span>',
                       _p(e["p_adjusted"]), str(e["n_runs"])])
    header = (["machine"] if several else []) + ["rank", "variable", "headline effect [family-wise 95% CI]",
                                                 "verdict", "adjusted p", "runs"]
    return f"""<section id="effects"><h2>Effects on step time, clearest first</h2>
<p>Every comparison of this report as a step-time factor with its family-wise 95% interval
(the {n} intervals hold together; a <span class="v clear">clear effect</span> is one whose interval excludes no change: Bonferroni, p &times; {n} below {st['alpha']:g}).
A ratio is a value's step time over its baseline's (0.5 = twice as fast); a power law is drawn as the
factor of a doubling (step time ~ size<sup>e</sup>: 2<sup>e</sup>). Click a row to open its variable.</p>
<div class="plot" id="plot-forest" data-plot="forest"></div>
{html_table(header, rows, "effects")}</section>"""


def _variable_section(v: dict | None, name: str, machine_id: int, ctx, st: dict, lost: list[dict],
                      grids: list[tuple[int, dict]], several: bool) -> str:
    doc = BY_NAME[name].doc
    anchor = var_anchor(name, machine_id, several)
    title = f"{name}" + (f" on {ctx.names.get(machine_id, machine_id)}" if several else "")
    parts = [f'<section class="variable" id="{anchor}" data-variable="{_e(name)}"><h3>{_e(title)}</h3>'
             f'<p class="doc">{_e(doc)}.</p>']
    if v is None:
        noise = st["noise"].get(machine_id, {})
        if name in noise.get("uncompared", {}):
            parts.append(f"<p>Not compared: {_e(noise['uncompared'][name])}.</p>")
        elif name in noise.get("together", []):
            parts.append("<p>Varied, but no two finished runs differ in it alone: it moved with another variable "
                         "(threads with cores, head_dim with d_model), so its own effect cannot be separated.</p>")
        else:
            parts.append("<p>No comparison: fewer than two of its values finished (see below).</p>")
    else:
        h = v["headline"]
        held = ", ".join(f"{k}={x}" for k, x in v["fixed"].items()) or "nothing else varied"
        follow = (f" {', '.join(v['followers'])} moved with it, at the values derived from it." if v["followers"] else "")
        left = (f" {v['left_out']} runs left out: a follower was set by hand there." if v["left_out"] else "")
        parts.append(f'<p><span class="v {_verdict_class(h)}">{_e(h["verdict"])}</span> {_effect_text(h)}. '
                     f'Runs that differ in <code>{_e(name)}</code> alone; held: {_e(held)}.{_e(follow)}{_e(left)}</p>')
        parts.append(f'<div class="plot" data-plot="variable" data-index="{st["variables"].index(v)}"></div>')
        body = []
        for lv in v["levels"]:
            r = lv["ratio"]
            body.append([_e(lv["label"]) + (" (baseline)" if lv["baseline"] else ""), f'{lv["n"]} ({lv["passes"]})',
                         _fmt(lv["median_ms"]), _fmt(lv["tokens_per_s"]), _pct(lv["cv"]),
                         (_effect_text(r) if r else "1 (baseline)"),
                         (f'<span class="v {_verdict_class(r)}">{_e(r["verdict"])}</span>' if r else "")])
        parts.append(html_table([name, "runs (passes)", "median step (ms)", "tokens/s", "own noise (CV)",
                             "step time vs baseline [family-wise 95% CI]", "verdict"], body))
    if lost:
        rows = [[_e(x["value"]), _e(x["status"]), _e(x["why"]), str(x["runs"])] for x in lost]
        parts.append("<p>Values that did not finish (no average uses them):</p>"
                     + html_table(["value", "status", "why", "runs"], rows, "lost"))
    for gi, g in grids:
        held = ", ".join(f"{k}={x}" for k, x in g["fixed"].items()) or "nothing else varied"
        parts.append(f'<h4>Interaction: {_e(g["rows"])} x {_e(g["cols"])}</h4><p>Median step time on each '
                     f'combination; one line per {_e(g["rows"])} value. Parallel lines on these log axes mean the '
                     f'effects multiply; lines that cross or fan out mean the effect of one depends on the other. '
                     f'Held: {_e(held)}.</p><div class="plot" data-plot="grid" data-index="{gi}"></div>')
    parts.append("</section>")
    return "".join(parts)


def _machine_section(ctx, st: dict, several: bool) -> str:
    ids = list(ctx.facts)
    if not ids:
        return '<section id="machine"><h2>Machine and noise</h2><p>No machine has claimed a run yet.</p></section>'
    body = [[_e(label)] + [_e(_fact(ctx.facts[m].get(col)).strip()) for m in ids] for col, label in FACTS]
    facts = html_table(["fact"] + [ctx.names[m] for m in ids], body, "facts")
    noise_rows = []
    for m in ids:
        nz = st["noise"].get(m)
        if not nz:
            continue
        if nz["cv"] is not None:
            figure = _pct(nz["cv"])
            source = (f"the model's residual: runs around their configuration, blocks removed ({nz['dof']:.0f} "
                      "degrees of freedom)" + (f"; the machine probe measured {_pct(nz['probe_cv'])}"
                                                if nz["probe_cv"] is not None else "")
                      + (f"; {nz['borrowed']}" if nz.get("borrowed") else ""))
        elif nz["probe_cv"] is not None:
            figure, source = _pct(nz["probe_cv"]), "the machine probe (identical short runs): nothing here was repeated"
        else:
            figure, source = "-", "not known: no configuration ran twice and the probe measured none"
        strata = nz.get("strata", [])
        if len(strata) > 1 or any(x["slow_share"] for x in strata):
            source += "; " + "; ".join(
                f"runs on {', '.join(map(str, x['cpus']))} CPU(s): {_pct(x['cv'])}"
                + (f", {x['slow_share']:.0%} of runs in a slow mode {_pct(x['slow_shift'])} slower (effects use the fast mode)"
                   if x["slow_share"] else "") for x in strata)
        drift = ", ".join(f"pass {p}: {100 * (x - 1):+.0f}%" for p, x in sorted(nz["drift"].items())[1:]) or "-"
        if nz.get("block_cv") is not None:
            drift += f"; blocks (stretches of time) vary by {_pct(nz['block_cv'])} beyond the runs in them"
        meaning = "-"
        if nz.get("half_widths"):
            hw, mde = nz["half_widths"], nz["resolvable"]
            meaning = (f"the shown ratio intervals are ±{_pct(hw[len(hw) // 2])} (median of {len(hw)}); changes smaller "
                       f"than about {_pct(mde[len(mde) // 2])} are not resolved (80% power)"
                       + (f"; {nz['advice']}" if nz.get("advice") else ""))
        noisiest = "; ".join(f"{_e(c)} ({_pct(cv)})" for c, cv in nz["noisiest"]) or "-"
        noise_rows.append(([_e(ctx.names[m])] if several else [])
                          + [figure, _e(source), _pct(nz["cv_with_drift"]), _e(drift), _e(meaning), noisiest,
                             f'{nz["disturbed"]} of {nz["fitted_runs"] + nz["disturbed"]}'])
    noise = html_table((["machine"] if several else []) + [
        "run-to-run noise (CV)", "source", "a configuration's repeats, blocks left in", "pass drift vs the first pass",
        "what it means for the intervals", "noisiest configurations", "disturbed runs"], noise_rows, "noise")
    notes = "".join(f"<p>{_e(n)}</p>" for m in ids for n in st["noise"].get(m, {}).get("identical", [])
                    + st["noise"].get(m, {}).get("regrouped", []) + [st["noise"].get(m, {}).get("baseline_lost") or ""]
                    if n)
    return f"""<section id="machine"><h2>Machine and noise</h2>
<p>What the runs ran on: the probe's facts and measured peaks (GEMM GFLOP/s, memory bandwidth). MFU divides
by a GEMM peak measured on the run's own CPU set: the fastest of the trainers' GEMM libraries there.</p>{facts}
<h3>How noisy it is, and what that means for the intervals</h3>
<p>The same configuration run again does not take exactly the same time. Every comparison comes from one
model of the machine's runs: log step time = configuration + block + residual. A block is a stretch of
the run order where a comparison's runs ran side by side, so a slow stretch of time or a drifting
pass moves all of them and cancels in the comparison; the residual noise is shared by every
configuration (docs/statistics.md). Disturbed runs (another process or the hypervisor took more than
{fx.DISTURBED_SHARE:.0%} of the job's CPU time) are left out of the fits.</p>{noise}{notes}</section>"""


def _runs_section(ctx, runs: dict, varied: list[str]) -> str:
    counts = ctx.counts
    status_rows = [[s, _fmt(counts.get(s, 0))] for s in ("done", "failed", "skipped", "running", "queued")]
    failures = [[_e(s), _e(why), _fmt(n)] for s, why, n in ctx.failures[:30]]
    opts = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in runs["dicts"]["status"])
    vopts = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in varied)
    more = f"<p>... and {len(ctx.failures) - 30} more reasons (results.csv has every run).</p>" if len(ctx.failures) > 30 else ""
    if runs["n"] < len(ctx.rows):
        more += (f"<p><strong>The table below holds {runs['n']:,} of the {len(ctx.rows):,} runs</strong> (every run "
                 f"not done, every run drawn as a dot, and an even sample of the rest): results.csv has them all.</p>")
    return f"""<section id="runs"><h2>Runs</h2>
<div class="cols">{html_table(["status", "runs"], status_rows, "counts")}
{html_table(["status", "reason", "runs"], failures, "reasons") if failures else "<p>Every claimed run finished.</p>"}</div>{more}
<p>Every claimed run (results.csv and <code>v_results</code> have all their columns). <em>config</em> is
where a run differs from its machine's baseline. Click a column to sort.</p>
<div class="filters">
<label>status <select id="f-status"><option value="">all</option>{opts}</select></label>
<label>differs in <select id="f-variable"><option value="">any variable</option>{vopts}</select></label>
<label>config contains <input id="f-text" type="search" placeholder="d_model=256"></label>
<span id="runs-count">loading the runs...</span></div>
<table id="runs-table" class="runs"><thead><tr>
<th data-key="run_id">run</th><th data-key="machine">machine</th><th data-key="status">status</th>
<th data-key="pass">pass</th><th data-key="config">config</th><th data-key="step_ms">step (ms)</th>
<th data-key="tokens_per_s">tokens/s</th><th data-key="mfu">MFU</th><th data-key="reason">why not done</th>
</tr></thead><tbody></tbody></table>
<div class="pager"><button id="p-prev">previous</button><span id="p-page"></span><button id="p-next">next</button></div>
</section>"""


def _seeds_section(ctx) -> str:
    found = seeds.measured_all(ctx.rows)  # each distinct shape matched once (and summary.md's answer kept)
    body = []
    for ref in seeds.PUBLISHED:
        mine = found[ref.id] or {None: None}
        for m, got in sorted(mine.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            body.append([_e(ref.id), _e(ref.model), _e(ctx.names.get(m, "-")) if got else "not run here",
                         str(got.runs) if got else "0", _fmt(got.s_per_step) if got else "-",
                         _fmt(got.tokens_per_s) if got else "-", _fmt(got.mfu) if got else "-", _e(ref.figure),
                         _e(ref.hardware), _e(ref.kind)])
    ran = any(found.values())
    lead = ("This machine's figures (medians over its finished runs of each reference configuration) beside the "
            "figures the source documents publish." if ran else
            "No run here has a reference configuration yet: <code>python bench.py run --preset seeds</code> runs "
            "them. The published figures:")
    caveats = "".join(f"<li>{_e(ref.id)}: {_e('; '.join(x for x in (ref.nearest, ref.caveat) if x))}</li>"
                      for ref in seeds.PUBLISHED if ref.nearest or ref.caveat)
    return f"""<section id="seeds"><h2>The source documents' reference runs</h2><p>{lead} <strong>The hardware
differs</strong>: the columns sit side by side, they do not say one CPU is faster. MFU carries across machines
better than tokens/s.</p>
{html_table(["id", "model", "machine", "runs", "s/step", "tokens/s", "MFU", "published", "published hardware", "kind"], body, "seeds")}
<details><summary>Caveats and nearest configurations</summary><ul>{caveats}</ul></details></section>"""


def _machines_section(ctx, shared: dict, pools: list[dict]) -> str:
    several = len(shared["machines"]) > 1
    parts = ['<section id="machines"><h2>Machines and pools side by side</h2>']
    if not several:
        parts.append("<p>This database holds finished runs of one machine. Runs of others join it with "
                     "<code>python bench.py merge OTHER.db</code>, or by pointing several workers at one "
                     "database (<code>--db postgresql+psycopg://...</code>); they are then compared here on the "
                     "configurations they share.</p>")
    else:
        words = []
        for p in shared["pairs"]:
            ref, other = ctx.names.get(p["ref"]), ctx.names.get(p["other"])
            words.append(f"{_e(other)} takes <strong>{p['ratio']:.2f}x</strong> the step time of {_e(ref)} "
                         f"(geometric mean over {p['shared']} shared configurations)" if p["ratio"] else
                         f"{_e(other)} and {_e(ref)} share no finished configuration yet")
        parts.append("<p>" + "; ".join(words) + ". Each dot is one configuration both finished (median step "
                     "time); on the diagonal they are equally fast.</p>")
        parts.append('<div class="plot" data-plot="shared"></div>')
    body = [[_e(p["pool"]), _e(", ".join(p["hosts"])), _fmt(p["done"]), _fmt(p["failed"]), _fmt(p["skipped"])]
            for p in pools]
    parts.append("<p>Queues: each machine's own (it runs every job) and named pools (<code>work --pool</code>: "
                 "identical nodes share one queue, each job once).</p>")
    parts.append(html_table(["queue", "hosts", "done", "failed", "skipped"], body, "pools"))
    parts.append("</section>")
    return "".join(parts)


def _json_script(element_id: str, data) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=_jsonable).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _clean(x):
    """NaN and infinities to None, recursively (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_page(ctx, path: Path) -> Path:
    """Write the page for a report's Context (orchestrator/report/data.py) to `path`."""
    import plotly.offline

    path = Path(path)
    several = ctx.several
    st = _clean(analysis_dicts(ctx.analysis, ctx.grids, ctx.names))
    modal = baselines(ctx.rows)
    disturbed = {r.row["run_id"] for ma in ctx.analysis.machines.values() for r in ma.disturbed}
    shown = page_runs(ctx.rows, st)
    runs = runs_table(shown, modal, ctx.names, disturbed, config_index(ctx.rows) if shown is ctx.rows else None)
    lost = lost_values(ctx.rows, modal)
    # Every variable varied on a machine (done or not) gets a section, clearest first, then the rest.
    by_key = {(v["machine_id"], v["variable"]): v for v in st["variables"]}
    asked = sorted({(m, n) for m, vs in modal.items() for n in vs}, key=lambda k: (k[0], NAMES.index(k[1])))
    # A variable's sections sit together (one per machine), in the order of its clearest effect.
    first = {}
    for v in st["variables"]:
        first.setdefault(v["variable"], len(first))
    order = sorted(by_key, key=lambda k: (first[k[1]], k[0])) + [k for k in asked if k not in by_key]
    grid_by_var: dict[tuple, list] = defaultdict(list)
    for gi, g in enumerate(st["grids"]):
        grid_by_var[(g["machine_id"], g["rows"])].append((gi, g))
    varied = sorted({n for _, n in order}, key=NAMES.index)
    var_html = "".join(_variable_section(by_key.get(k), k[1], k[0], ctx, st, lost.get(k, []),
                                         grid_by_var.get(k, []), several) for k in order)
    first_section: dict[str, int] = {}
    for m, n in order:
        first_section.setdefault(n, m)
    index = "".join(f'<a href="#{var_anchor(n, m, several)}"><code>{_e(n)}</code></a> ' for n, m in first_section.items())
    sweeps = ctx.sweeps
    done = len(ctx.done)
    where = (f"{len(ctx.names)} machines" if several else next(iter(ctx.names.values()), "no machine yet"))
    intro = (f"{done:,} finished training runs (of {len(ctx.rows):,} claimed) from "
             f"{_e(', '.join(sweeps) or 'no sweep yet')} on {_e(where)}. Each run trains a small transformer "
             "on the CPU for a fixed number of steps and times every step; the number compared is the <strong>median "
             "step time</strong> (lower is faster), with the tokens/s it implies. Variables differ one at a time "
             "around a baseline where the sweep is one-factor-at-a-time."
             + (" Learning runs train to a validation-loss target instead: their time to a trained model comes "
                "first." if ctx.learning and ctx.learning["runs"] else ""))
    page_data = {"effects": st["effects"], "variables": st["variables"], "grids": st["grids"],
                 "shared": shared_configs(ctx.rows, ctx.done), "names": {str(k): v for k, v in ctx.names.items()},
                 "per_page": RUNS_PER_PAGE, "several": several}
    # the runs need no _clean(): their floats come from _round(), which gives None for NaN and infinities
    packed = base64.b64encode(gzip.compress(json.dumps(runs, separators=(",", ":")).encode(), 6)).decode()
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = "".join([
        _head("cpubench report"), _nav(), '<main>',
        f'<header><h1>cpubench report</h1><p>{intro}</p><p class="meta">Written {generated} by '
        '<code>bench.py report</code>; summary.md and results.csv sit beside this file. A PDF: print this page '
        '(Ctrl+P, "Save as PDF": every plot is drawn before printing), or without a window: '
        '<code>chromium --headless --no-pdf-header-footer --virtual-time-budget=30000 '
        '--print-to-pdf=report.pdf "file://$PWD/result/index.html#print"</code>.</p></header>',
        learning_report.html_section(ctx),  # time to a trained model, first where learning runs exist
        _effects_section(st, ctx, several),
        f'<section id="variables"><h2>Each variable</h2><p>One section per varied variable, clearest effect first. '
        f'Dots are runs (hover for the run); the line is the fitted power law, diamonds with bars the fitted '
        f'ratios with their family-wise 95% intervals. Up to {DOTS_PER_LEVEL} runs per value are drawn.</p>'
        f'<p class="index">{index}</p>{var_html}</section>',
        _machine_section(ctx, st, several),
        parallel_report.html_section(ctx),  # ranks/nodes: compute vs all-reduce
        _budget_section(ctx),
        _runs_section(ctx, runs, varied),
        _seeds_section(ctx),
        prediction_report.html(ctx),
        _machines_section(ctx, page_data["shared"], pools_table(ctx.rows)),
        '</main>',
        _json_script("page-data", page_data),
        f'<script type="application/octet-stream" id="runs-data">{packed}</script>',
        f"<script>{plotly.offline.get_plotlyjs()}</script>",
        f"<script>{JS}</script></body></html>",
    ])
    path.write_text(body, encoding="utf-8")
    return path

