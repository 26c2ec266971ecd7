"""index.html's data, no HTML (html.py writes it): the statistics as plain dicts, the runs column by
column, each machine's baseline configuration, the values that failed and why, the machines side by
side; page(ctx) works all of it out for one report.

Two layers, so that the statistics can change under the page:
- `analysis_dicts()` is the one place that reads effects.py's objects (Analysis, MachineAnalysis,
  VariableEffect, Effect, Level, Grid, Noise, Drift) and turns them into plain dicts; a change of
  the statistics' classes is adapted there and nowhere else.
- everything else works on those dicts and on the rows of v_results (stable: the schema's columns).

Scale: a database of 100k runs must give a page under ~10 MB that opens in seconds. The runs
travel once, column by column (runs_table), with repeated text (configurations, reasons) interned;
the dots of a value are at most DOTS_PER_LEVEL runs, evenly sampled; beyond RUNS_ON_PAGE runs the
table carries a sample of them (page_runs).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat
from types import NoneType

import numpy as np

from common.variables import BY_NAME, NAMES
from orchestrator.queue.progress import short_reason
from orchestrator.report.view_sql import tuple_getter
from orchestrator.stats import effects as fx
from orchestrator.stats.columns import column
from orchestrator.stats.config_index import CONFIG_NAMES, config_index, positions

RUNS_ON_PAGE = 200_000  # runs the page's table carries: beyond it, a sample (every run in results.csv)
DOTS_PER_LEVEL = 300  # runs drawn per value of a variable (evenly sampled beyond it; the table has them all)
RUNS_PER_PAGE = 50
SHARED_POINTS = 2000  # shared configurations drawn in the machines-compared scatter
NOT_CONFIG = ("repeat",)  # the pass index: not part of what differs between configurations


@dataclass
class Page:
    """What the page's writer draws on, for one report (page())."""

    stats: dict  # analysis_dicts, cleaned for JSON
    runs: dict  # runs_table of the runs the page carries
    lost: dict[tuple[int, str], list[dict]]  # lost_values
    variables: dict[tuple[int, str], dict]  # (machine, variable) -> its dict of stats["variables"]
    order: list[tuple[int, str]]  # the variables' sections, (machine, variable) each
    grids: dict[tuple[int, str], list[tuple[int, dict]]]  # (machine, row variable) -> (index, grid) of its grids
    varied: list[str]  # every variable with a section, in the catalogue's order
    first_section: dict[str, int]  # variable -> the machine of its first section
    pools: list[dict]  # the queues (sections/pools.queues), in the page's order
    data: dict  # the page's JSON (page-data): effects, variables, grids, machines side by side, names


def page(ctx, ahead: dict | None = None) -> Page:
    """All the page draws, from a report's Context (data.py). `ahead`: rows_part() of its rows, worked
    out before the analysis (by a child, ahead_of_analysis), used where its disturbed runs are the analysis's."""
    st = _clean(analysis_dicts(ctx.analysis, ctx.grids, ctx.names))
    disturbed = {r.row["run_id"] for ma in ctx.analysis.machines.values() for r in ma.disturbed}
    part = (ahead if ahead is not None and ahead["disturbed"] == disturbed else
            rows_part(ctx.rows, ctx.names, disturbed, st, ctx.done))
    modal, runs, lost = part["modal"], part["runs"], part["lost"]
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
    first_section: dict[str, int] = {}
    for m, n in order:
        first_section.setdefault(n, m)
    data = {"effects": st["effects"], "variables": st["variables"], "grids": st["grids"],
            "shared": part["shared"], "names": {str(k): v for k, v in ctx.names.items()},
            "per_page": RUNS_PER_PAGE, "several": ctx.several}
    # the queues by id, then name (as summary.md lists them)
    pools = sorted(ctx.queues, key=lambda q: (q["pool_id"], q["pool"]))
    return Page(st, runs, lost, by_key, order, grid_by_var, varied, first_section, pools, data)


def rows_part(rows: list[dict], names: dict[int, str], disturbed: set, st: dict | None = None,
              done: list[dict] | None = None) -> dict:
    """What the page takes from the runs alone, given the disturbed runs' ids: each machine's baseline
    ("modal"), the runs table ("runs"), the values lost ("lost") and the machines side by side ("shared").
    `st` (the statistics' dicts) is read only beyond RUNS_ON_PAGE runs (page_runs); `done`: fx.done_runs(rows)."""
    modal = baselines(rows)
    shown = page_runs(rows, st)
    return {"disturbed": disturbed, "modal": modal,
            "runs": runs_table(shown, modal, names, disturbed, config_index(rows) if shown is rows else None),
            "lost": lost_values(rows, modal), "shared": shared_configs(rows, done)}


def ahead_of_analysis(rows: list[dict], names: dict[int, str]) -> dict | None:
    """rows_part() before the analysis, with the disturbed runs as as_ran marks them (page() checks that
    they are the analysis's), where the runs are at most RUNS_ON_PAGE (more: the statistics pick the
    runs shown); None otherwise."""
    return rows_part(rows, names, fx.disturbed_run_ids(rows)) if len(rows) <= RUNS_ON_PAGE else None


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
                    "strata": [{"cpus": [c for c in st.members if c is not None], "cv": st.cv,
                                "slow_share": st.slow_share,
                                "slow_shift": math.expm1(st.slow_shift)} for st in nz.strata
                               if st.dof > 0 and not st.noisy_config],
                    "half_widths": sorted(e.half_width for e in ma.effects if e.kind == "ratio" and e.se is not None),
                    "resolvable": sorted(fx.smallest_resolvable(e) for e in ma.effects
                                          if e.kind == "ratio" and e.se is not None),
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
    by_machine = _configs_by_machine(rows, ids)
    for m, per_id in by_machine.items():
        # Configurations that differ only in their repeat count as many times as they are, once each.
        weights = list(per_id.values())
        columns = zip(*map(raws.__getitem__, per_id))  # each variable's value in every configuration
        modal = {}
        for n, col in zip(CONFIG_NAMES, columns):
            counts = _label_counts(n, col, weights)
            if len(counts) > 1:
                modal[n] = max(counts.items(), key=lambda kv: (kv[1], str(kv[0]) == str(BY_NAME[n].default)))[0]
        out[m] = modal
    return out


def _configs_by_machine(rows: list[dict], ids: list[int]) -> dict[int, Counter]:
    """machine -> configuration number (config_index's ids) -> how many of its configurations (a
    config_hash; a run without one: the run itself) have that number, by their first run; the machines
    and the numbers in the order they first ran. A machine's configurations found by their first runs
    (the earliest position of each key, at C speed), taken in the order they ran."""
    machines = list(map(operator.itemgetter("machine_id"), rows))
    hashes = column(rows, "config_hash")
    keys = hashes if all(hashes) else [h or r["run_id"] for h, r in zip(hashes, rows)]
    number, out = np.array(ids, dtype=np.int64), {}
    several = len(set(machines)) > 1
    machine_of = np.array(machines) if several else None
    for m in dict.fromkeys(machines):
        at = np.flatnonzero(machine_of == m).tolist() if several else range(len(rows))
        mine = list(map(keys.__getitem__, at)) if several else keys
        first = dict(zip(reversed(mine), reversed(at)))  # each key's earliest run
        firsts = np.sort(np.fromiter(first.values(), dtype=np.int64, count=len(first)))
        out[m] = Counter(number[firsts].tolist())
    return out


def _label_counts(name: str, values: tuple, weights: list[int]) -> Counter:
    """label -> the summed weights of the values with that label (_val), the labels in the order their
    values first come: each distinct value counted at C speed and labelled once. Equal values of two
    types (1 and 1.0, 0.0 and -0.0) may be labelled apart: such a column is labelled value by value."""
    kinds = set(map(type, values))
    if len(kinds - {NoneType}) > 1 or (float in kinds and 0.0 in values):
        per_value: Iterable = zip(map(_val, repeat(name), values), weights)
    else:
        # one value (most columns): its weight is every weight. (Every value equal to the first: of one
        # type, as kinds holds one besides None, which equals only None.)
        if values and values.count(values[0]) == len(values):
            by_value = {values[0]: sum(weights)}
        elif len(distinct := dict.fromkeys(values)) == 1:  # (in the order they first come)
            by_value = dict.fromkeys(distinct, sum(weights))
        elif weights.count(1) == len(weights):
            by_value = Counter(values)
        else:  # each value's number, its weights summed at C speed
            number = dict(zip(distinct, itertools.count()))
            codes = np.fromiter(map(number.__getitem__, values), dtype=np.int64, count=len(values))
            sums = np.bincount(codes, weights=np.asarray(weights, dtype=np.float64), minlength=len(distinct))
            by_value = dict(zip(distinct, map(int, sums.tolist())))
        per_value = zip(map(_val, repeat(name), by_value), by_value.values())
    counts = Counter()
    for label, k in per_value:
        counts[label] += k
    return counts


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
    machines = list(map(operator.itemgetter("machine_id"), rows))
    # each run's key (its machine, its values of the baseline's variables) read at C speed; a key's
    # text made once, in the order the keys first appear (as run by run)
    base_names = {m: tuple(modal.get(m, {})) for m in dict.fromkeys(machines)}
    if index is not None and set().union(*base_names.values()) <= set(CONFIG_NAMES):
        of_run, key_of = _keys_by_number(machines, index, base_names)
    else:
        of_run = list(zip(machines, map(tuple, map(map, map(operator.attrgetter("get"), rows),
                                                   map(base_names.__getitem__, machines)))))
        key_of = {k: k for k in dict.fromkeys(of_run)}
    distinct = list(dict.fromkeys(key_of.values()))
    texts, differing = _config_texts(distinct, modal)
    number = interned["config"]
    number.update(zip(dict.fromkeys(texts), itertools.count()))  # (the first texts interned)
    numbers = list(map(number.__getitem__, texts))
    seen = dict(zip(distinct, numbers))
    config_vars.update(zip(reversed(numbers), reversed(differing)))  # a text's first key's variables
    config = list(map({c: seen[k] for c, k in key_of.items()}.__getitem__, of_run))
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
        why_of: dict = {}  # each distinct reason's line, made once
        for i in np.flatnonzero(np.isin(np.array(cols["status"], dtype=np.int64), stopped)).tolist():
            reason = rows[i].get("reason")
            reasons[i] = why_of[reason] if reason in why_of else why_of.setdefault(reason, short_reason(reason))
    for text in dict.fromkeys(reasons):
        idx("reason", text)
    cols["reason"] = list(map(interned["reason"].__getitem__, reasons))
    cols["disturbed"] = list(map(int, map(disturbed.__contains__, cols["run_id"])))
    dicts = {k: list(v) for k, v in interned.items()}
    return {"n": len(rows), "cols": cols, "dicts": dicts,
            "config_vars": [config_vars[i] for i in range(len(dicts["config"]))]}


def _keys_by_number(machines: list, index: tuple[list[int], list[tuple]], base_names: dict) -> tuple[list, dict]:
    """runs_table's keys (each run's machine and its values of its baseline's variables), made once per
    machine and configuration number (config_index: runs of one number have equal values of every one
    of those variables, so equal keys): (each run's (machine, number), or its number where the runs are
    of one machine; each of those -> its key, in the order the runs first have them)."""
    ids, raws = index
    at = {n: i for i, n in enumerate(CONFIG_NAMES)}
    pick = {m: tuple_getter([at[n] for n in ns]) for m, ns in base_names.items()}
    if len(base_names) == 1:
        (m, get), = pick.items()
        return ids, {i: (m, get(raws[i])) for i in dict.fromkeys(ids)}
    pairs = list(zip(machines, ids))
    return pairs, {p: (p[0], pick[p[0]](raws[p[1]])) for p in dict.fromkeys(pairs)}


def _config_texts(keys: list[tuple], modal: dict[int, dict]) -> tuple[list[str], list[list[str]]]:
    """For each of runs_table's distinct keys (a machine, a run's values of its baseline's variables):
    the runs table's config text of a run with those values, and the variables it names (those of
    config_difference), worked out column by column: each value labelled by _val, each variable's
    words made once per label."""
    texts, differing = [""] * len(keys), [[]] * len(keys)
    at_of: dict = defaultdict(list)  # machine -> the positions of its keys
    for at, key in enumerate(keys):
        at_of[key[0]].append(at)
    for m, ats in at_of.items():
        words, named = [], []  # per variable: each key's "name=label" and name, or None where at the baseline
        for (n, base), values in zip(modal.get(m, {}).items(), zip(*(keys[a][1] for a in ats))):
            labels = list(map(_val, repeat(n), values))
            differ = [label for label in dict.fromkeys(labels) if label != base]
            words.append(list(map({label: f"{n}={label}" for label in differ}.get, labels)))
            named.append(list(map(dict.fromkeys(differ, n).get, labels)))
        if words:
            given = repeat(None)  # filter(None, ...): the words and names given (never empty)
            for a, text, names in zip(ats, map(", ".join, map(filter, given, zip(*words))),
                                      map(list, map(filter, given, zip(*named)))):
                texts[a], differing[a] = text, names
    return [t or "baseline" for t in texts], differing


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
    why_of: dict = {}  # each distinct reason's line, made once
    for r in itertools.compress(rows, stopped):  # only the runs that did not finish (picked at C speed)
        diff = config_difference(r, modal.get(r["machine_id"], {})) or {"(baseline)": "baseline"}
        reason = r.get("reason")
        why = why_of[reason] if reason in why_of else why_of.setdefault(reason, short_reason(reason))
        machine, status = r["machine_id"], r["status"]
        for n, v in diff.items():
            counted[(machine, n)][(v, status, why)] += 1
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
    ids, at = config_index(rows)[0], positions(rows, done)
    if at is None:  # not a subsequence of the rows: look each one up
        number = dict(zip(map(id, rows), ids))
        config = [number[id(r)] for r in done]
    else:
        config = list(map(ids.__getitem__, at))
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


def _clean(x):
    """NaN and infinities to None, recursively (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x
