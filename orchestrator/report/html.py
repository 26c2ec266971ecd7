"""result/index.html: the page people read after a sweep, one self-contained file that works offline
from file:// (plotly's JavaScript is inlined once; no network, no CDN).

What the page holds, in order: the effects as a forest plot (every effect with its family-wise
interval and verdict, clearest first, each a link to its variable), one section per varied variable
(its runs as dots over the fitted power law or ratios, the values that failed or were skipped and
why, interaction plots of the grids it is part of), the machine (facts, measured peaks, noise and
what it means for the intervals), the runs (a table sorted, filtered and paginated in JavaScript),
the seed documents' reference runs beside this machine's, and the machines and pools side by side.

In the report package it is the page's writer: it writes what page_data.py works out (the
statistics as plain dicts, the runs column by column) with data.py's Context and words.py's words
and numbers; its CSS and JavaScript are files of their own (static/page.css, static/page.js), and
it imports no other writer (markdown.py).

Scale: a database of 100k runs must give a page under ~10 MB that opens in seconds. The runs
travel once, gzip-compressed and base64-encoded (the browser inflates them with
DecompressionStream); the table shows one page of rows at a time, and plots are drawn when they
scroll into view.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import time
from pathlib import Path

import msgspec
import numpy as np

from orchestrator.stats import effects as fx
from orchestrator.queue import budget
from orchestrator.report import page_data
from orchestrator.report.page_data import DOTS_PER_LEVEL, var_anchor
from orchestrator.report.sections import learning as learning_report, parallel as parallel_report, seeds
from orchestrator.report.sections import prediction as prediction_report
from orchestrator.report.tables import html_table
from orchestrator.report.words import FACTS, _fact, _fmt, _p, _pct
from common.variables import BY_NAME

SECTIONS = (("effects", "Effects"), ("variables", "Variables"), ("machine", "Machine and noise"),
            ("runs", "Runs"), ("seeds", "Reference runs"), ("predict", "How long here"),
            ("machines", "Machines and pools"))
# The page's CSS and JavaScript are files of their own (static/), read once; a newline after
# <style> and <script>, as the page has always had.
STATIC = Path(__file__).resolve().parent / "static"
CSS = "\n" + (STATIC / "page.css").read_text(encoding="utf-8")
JS = "\n" + (STATIC / "page.js").read_text(encoding="utf-8")


# -- HTML ----------------------------------------------------------------------------------------

def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _budget_section(ctx) -> str:
    """`run --budget`: how the time went (budget.spending, as summary.md says it)."""
    out = []
    for m, who, sp in ctx.budget_spending:
        out.append(f'<section id="budget-{m}"><h2>How the time budget was spent{_e(who)}</h2><p>{_e(sp["words"])}</p>'
                   + (html_table(budget.GIVEN_HEADER, [[_e(c) for c in row] for row in sp["given"]])
                      if sp["given"] else "")
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
{html_table(header, rows, "effects")}</section>"""  # noqa: E501 (the page's lines as they are)


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
        follow = (f" {', '.join(v['followers'])} moved with it, at the values derived from it." if v["followers"]
                  else "")
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
                + (f", {x['slow_share']:.0%} of runs in a slow mode {_pct(x['slow_shift'])} slower "
                   "(effects use the fast mode)" if x["slow_share"] else "") for x in strata)
        drift = ", ".join(f"pass {p}: {100 * (x - 1):+.0f}%" for p, x in sorted(nz["drift"].items())[1:]) or "-"
        if nz.get("block_cv") is not None:
            drift += f"; blocks (stretches of time) vary by {_pct(nz['block_cv'])} beyond the runs in them"
        meaning = "-"
        if nz.get("half_widths"):
            hw, mde = nz["half_widths"], nz["resolvable"]
            meaning = (f"the shown ratio intervals are ±{_pct(hw[len(hw) // 2])} (median of {len(hw)}); "
                       f"changes smaller than about {_pct(mde[len(mde) // 2])} are not resolved (80% power)"
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
    more = (f"<p>... and {len(ctx.failures) - 30} more reasons (results.csv has every run).</p>"
            if len(ctx.failures) > 30 else "")
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
</section>"""  # noqa: E501 (the page's lines as they are)


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
<details><summary>Caveats and nearest configurations</summary><ul>{caveats}</ul></details></section>"""  # noqa: E501 (the page's lines as they are)


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


def ahead_of_analysis(rows: list[dict], names: dict[int, str]) -> dict | None:
    """page_data.ahead_of_analysis, its runs table packed as the page carries it ("packed") and of the
    table itself only what the page's text reads (_runs_section: its count and statuses): what a child
    forked after the read works out while the report's process analyses (write_page's `ahead`)."""
    part = page_data.ahead_of_analysis(rows, names)
    if part is not None:
        runs = part["runs"]
        part["packed"] = _packed_runs(runs)
        part["runs"] = {"n": runs["n"], "dicts": {"status": runs["dicts"]["status"]}}
    return part


def _packed_runs(runs: dict) -> str:
    """The runs table as the page carries it: its JSON, gzipped, in base64 (the page inflates it)."""
    return base64.b64encode(gzip.compress(compact_json(runs), 6)).decode()


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")  # (compact_json: a digit before an "e" is "0e")


def compact_json(value) -> bytes:
    """json.dumps(value, separators=(",", ":")).encode() of a value whose floats are finite (the runs table's:
    page_data's rounding gives None for NaN and infinities), written by msgspec (~6x faster: a 100k-run table
    is ~17 MB) where its bytes are surely the same. They differ only where msgspec writes a text as UTF-8
    (json escapes every character past ASCII, and DEL), a float with an exponent ("1e16" for "1e+16") or one
    below 1e-4 without ("0.00001" for "1e-05"): output that is not ASCII, or that holds a digit before an
    "e", "0.0000" or DEL, is written by json.dumps (a text holding those too: the same bytes, more slowly),
    as is a value of a type msgspec does not write."""
    try:
        out = msgspec.json.encode(value)
    except TypeError:
        out = None
    if out is None or not out.isascii() or _msgspec_only(out):
        return json.dumps(value, separators=(",", ":")).encode()
    return out


def _msgspec_only(out: bytes) -> bool:
    """Whether msgspec's JSON `out` (ASCII) may not be json.dumps': it holds DEL, "0.0000" or a digit before
    an "e". Substring tests and one translate, each a pass in C (docs/measurements.md: a regex's scan was ~7x
    slower)."""
    return b"\x7f" in out or b"0.0000" in out or b"0e" in out.translate(_DIGITS_AS_ZERO)


def write_page(ctx, path: Path, ahead: dict | None = None) -> Path:
    """Write the page for a report's Context (orchestrator/report/data.py) to `path`. `ahead`: what
    ahead_of_analysis worked out of its rows, or None."""
    import plotly.offline

    path = Path(path)
    several = ctx.several
    pg = page_data.page(ctx, ahead)
    st, runs = pg.stats, pg.runs
    var_html = "".join(_variable_section(pg.variables.get(k), k[1], k[0], ctx, st, pg.lost.get(k, []),
                                         pg.grids.get(k, []), several) for k in pg.order)
    index = "".join(f'<a href="#{var_anchor(n, m, several)}"><code>{_e(n)}</code></a> '
                    for n, m in pg.first_section.items())
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
    # the runs need no cleaning: their floats come from page_data's rounding, which gives None for NaN and infinities
    packed = ahead["packed"] if ahead is not None and runs is ahead["runs"] else _packed_runs(runs)
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
        _runs_section(ctx, runs, pg.varied),
        _seeds_section(ctx),
        prediction_report.html(ctx),
        _machines_section(ctx, pg.data["shared"], pg.pools),
        '</main>',
        _json_script("page-data", pg.data),
        f'<script type="application/octet-stream" id="runs-data">{packed}</script>',
        f"<script>{plotly.offline.get_plotlyjs()}</script>",
        f"<script>{JS}</script></body></html>",
    ])
    path.write_text(body, encoding="utf-8")
    return path

