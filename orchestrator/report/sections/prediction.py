"""The report's section "How long would it take here": the cost model's (orchestrator/stats/cost_model.py)
predictions for the source documents' reference models R1, R3, R4 and R6 on each machine of the
report (step time, time per epoch of WikiText-2 and WikiText-103 in the run's own tokens) beside the
published estimates and their hardware; the same for the configurations the sweeps list in a
[predict] table; and the model's leave-one-configuration-out check on the machine's own runs
(predicted vs measured: a plot, the median and worst error).

data(ctx) computes it once per report; markdown(ctx) and html(ctx) write it for summary.md and
index.html. The report package's writers (report/markdown.py and report/html.py) each call one of them
(a line each).
"""

from __future__ import annotations

import html as html_lib
import math
import operator
import statistics
import tomllib
from itertools import compress, repeat
from pathlib import Path

import numpy as np

from sqlalchemy import text

from common import variables as V
from common.errors import BenchError
from common.tokens import tokens_per_word
from orchestrator.queue.predict import DATASET_WORDS
from orchestrator.stats import cost_model as cm
from orchestrator.stats.config_index import CONFIG_NAMES, config_index
from orchestrator.stats.columns import column, runs_fingerprint
from orchestrator.report.sections.seeds import PUBLISHED
from orchestrator.report.tables import html_table

REFERENCES = ("R1", "R3", "R4", "R6")
PLOT_NAME = "predicted_vs_measured.png"
_cache: dict[int, dict] = {}


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _ms(x: float) -> str:
    return f"{x / 1e3:.3g} s" if x >= 1e3 else f"{x:.3g} ms"


SELECT_SWEEP_TEXTS = "SELECT name, text FROM sweeps ORDER BY sweep_id"


def sweep_texts(store) -> dict[str, str]:
    """Each sweep's text (its file as enqueued), for the [predict] tables; write_report hands it to ctx."""
    with store.transaction() as conn:
        return {name: body for name, body in conn.execute(text(SELECT_SWEEP_TEXTS))}


def sweep_predictions(rows: list[dict], sweep_texts: dict[str, str]) -> dict[str, dict]:
    """name -> partial config of every [predict] table of the sweeps the rows ran."""
    from orchestrator.queue.sweep import predict_configs
    out = {}
    for name in sorted(filter(None, set(column(rows, "sweep")))):
        try:
            out.update(predict_configs(tomllib.loads(sweep_texts.get(name) or ""), f"sweep {name}"))
        except (tomllib.TOMLDecodeError, BenchError):
            continue
    return out


def _predict(model, partial: dict, cpus: int) -> dict:
    config, why = V.resolve(partial, cpus)
    if why:
        return {"refused": "; ".join(why)}
    try:
        p = model.predict(config)
    except BenchError as error:
        return {"refused": str(error)}
    tokens_per_step = config["batch_size"] * config["grad_accum"] * config["seq_len"]
    out = {"step_ms": p.step_ms, "low_ms": p.step_ms_low, "high_ms": p.step_ms_high, "extrapolated": p.extrapolated,
           "flops": p.flops_per_step, "tokens_per_step": tokens_per_step}
    try:
        ratio, _ = tokens_per_word(config["vocab_size"])
    except Exception:  # no tokenizer library or corpus: the epochs stay unsaid
        ratio = None
    out["tokens_per_word"] = ratio
    for dataset, words in DATASET_WORDS.items():
        if ratio is not None:
            out[dataset] = p.train(tokens_per_step, words * ratio)
    return out


def data(ctx) -> dict:
    """Per machine of the report: the model's basis, the references' and [predict] tables' predictions,
    the leave-one-configuration-out check."""
    key_of_ctx = id(ctx)
    if key_of_ctx in _cache:
        if callable(_cache[key_of_ctx]):  # adopted as a promise: asked for now, by the first writer
            _cache[key_of_ctx] = _cache[key_of_ctx]()
        return _cache[key_of_ctx]
    memo = getattr(ctx, "memo", None)  # report --watch: a machine whose runs did not change keeps its entry
    d = fitted(shares(ctx), memo)
    _cache.clear()
    _cache[key_of_ctx] = d
    return d


def shares(ctx) -> dict:
    """What the section's fits need from the runs, taken from them where they are held: the [predict]
    configurations wanted and, per machine, its usable runs' share that the fit and the check use
    (cost_model.thin, check_share: bounded for a fleet's machine), with their count and the machine's
    CPUs. Small where the runs are many: write_report sends it to a child process that fits."""
    sweep_texts = getattr(ctx, "sweep_texts", None) or {}
    check_predictions = getattr(ctx, "check_predictions", True)
    done, numbers = _done_by_machine(ctx.rows, ctx.names, check_predictions)
    machines = {}
    for machine_id, name in ctx.names.items():
        rows = cm.usable(done[machine_id])
        cpus = int(ctx.facts.get(machine_id, {}).get("logical_cores") or (rows[0].get("cores") if rows else None) or 1)
        configs, keys = _configs(rows, done[machine_id], numbers and numbers[machine_id],
                                 numbers and config_index(ctx.rows)[1])
        share = {"name": name, "runs": len(rows), "fit_rows": fit_share(rows, configs, keys), "cpus": cpus,
                 "configs": len(configs) if configs is not None else None,
                 "check": cm.check_share(rows, configs) if check_predictions and rows else None,
                 "fingerprint": runs_fingerprint(rows) if getattr(ctx, "memo", None) is not None else None}
        machines[machine_id] = share
    return {"wanted": sweep_predictions(ctx.rows, sweep_texts), "check_predictions": check_predictions,
            "machines": machines}


FIT_MAX_CONFIGS = 2_000  # the section's fit: beyond this many configurations, an even sample of them


def fit_share(rows: list[dict], configs: list[tuple] | None = None, keys: list[tuple] | None = None) -> list[dict]:
    """The rows the section's model is fitted on: cost_model.thin's, and of a grid of more than
    FIT_MAX_CONFIGS configurations only those of an even sample of them (in the order they first ran):
    the fit's cost follows the configurations, and a model of six costs and a few factors is as well
    determined by a few thousand of them. `configs`, `keys`: the rows' distinct configurations
    (cost_model.distinct_config_keys) and each row's (config_keys), where the caller knows them."""
    if configs is None:
        thinned = cm.thin(rows)
        if len(thinned) <= FIT_MAX_CONFIGS:
            return thinned
        rows, keys = thinned, cm.config_keys(thinned)
        configs = list(dict.fromkeys(keys))
    if len(configs) <= FIT_MAX_CONFIGS:
        return cm.thin(rows)
    step = len(configs) / FIT_MAX_CONFIGS
    keep = {configs[int(i * step)] for i in range(FIT_MAX_CONFIGS)}
    return cm.thin(list(compress(rows, map(keep.__contains__, keys))))


def _done_by_machine(rows: list[dict], names: dict, numbered: bool) -> tuple[dict, dict | None]:
    """Each machine's done runs (of `names`, in the rows' order), read at C speed, and where `numbered`
    their configuration numbers (config_index: the page reads the same numbers later)."""
    machine_of = np.array(column(rows, "machine_id"))
    is_done = np.array(list(map(operator.eq, column(rows, "status"), repeat("done"))),
                       dtype=bool)
    ids = config_index(rows)[0] if numbered else None
    done, numbers = {}, {} if numbered else None
    for machine_id in names:
        at = np.flatnonzero(is_done & (machine_of == machine_id)).tolist() if len(rows) else []
        done[machine_id] = list(map(rows.__getitem__, at))
        if numbered:
            numbers[machine_id] = list(map(ids.__getitem__, at))
    return done, numbers


def _configs(rows: list[dict], done: list[dict], numbers: list[int] | None,
             raws: list[tuple]) -> tuple[list[tuple] | None, list[tuple] | None]:
    """(cm.distinct_config_keys(rows), cm.config_keys(rows)) for `rows`, usable()'s runs of `done` (whose
    configuration numbers, config_index's, are `numbers`): each number's key made once, in the order they
    first ran; (None, None) where the numbers are not known. Runs of one number hold equal values of every
    variable config_key() reads, so they have one key."""
    if numbers is None or not rows:
        return None, None
    if len(rows) != len(done):  # usable() left some out: its runs are a subsequence of done
        pending, kept = iter(rows), []
        nxt = next(pending, None)
        for r, i in zip(done, numbers):
            if r is nxt:
                kept.append(i)
                nxt = next(pending, None)
        if len(kept) != len(rows):
            return None, None
        numbers = kept
    # config_key() reads only _KEY_AT's columns: numbers whose values there are equal share a key, so it is
    # made once per distinct such values (equal values give equal words), in the order they first ran
    at = operator.itemgetter(*_KEY_AT)
    of_number = {i: at(raws[i]) for i in dict.fromkeys(numbers)}
    distinct = list(dict.fromkeys(of_number.values()))
    key_of = dict(zip(distinct, cm.keys_of_values(distinct, _KEY_NAMES)))
    of_number = {i: key_of[values] for i, values in of_number.items()}
    return list(dict.fromkeys(key_of.values())), list(map(of_number.__getitem__, numbers))


# The positions in CONFIG_NAMES of the variables config_key() reads (it reads no other), and their names.
_KEY_NAMES = tuple(n for n in V.NAMES if n not in cm.IGNORED and n in CONFIG_NAMES)
_KEY_AT = tuple(CONFIG_NAMES.index(n) for n in _KEY_NAMES)


def fitted(shares: dict, memo: dict | None = None) -> dict:
    """The section's data from shares(): per machine its model's basis, predictions and check."""
    wanted, machines = shares["wanted"], {}
    for machine_id, share in shares["machines"].items():
        if memo is None:
            machines[machine_id] = _entry(share, wanted, shares["check_predictions"])
            continue
        key = (share["fingerprint"], share["name"], repr(wanted), shares["check_predictions"], share["cpus"])
        if memo.get(machine_id, (None,))[0] != key:
            memo[machine_id] = (key, _entry(share, wanted, shares["check_predictions"]))
        machines[machine_id] = memo[machine_id][1]
    return {"machines": machines}


def _entry(share: dict, wanted: dict, check_predictions: bool) -> dict:
    """One machine's part of the section: the model's basis, its predictions, its check."""
    entry = {"name": share["name"], "runs": share["runs"]}
    try:
        model = cm.fit(share["fit_rows"], n_all=share["runs"])
    except BenchError as error:
        entry["refused"] = str(error)
        return entry
    cpus = share["cpus"]
    # the check refits the model once per configuration: a report without pictures (the statistics
    # tests write hundreds) leaves it out with them, and the intervals then lack the model error
    entry["loo"], used = _loo(*share["check"]) if check_predictions else ({"predicted": 0, "skipped": True}, [])
    if "entries" in entry["loo"]:
        cm.calibrate(model, used, entry["loo"]["entries"])
    of = f"{model.runs_text} runs of {model.n_configs} configurations"
    if (share.get("configs") or 0) > FIT_MAX_CONFIGS:
        of = (f"{model.n_runs} of {model.n_runs_all} runs (an even sample of {model.n_configs} of its "
              f"{share['configs']} configurations, their first passes)")
    entry["basis"] = (f"{of}, log residual "
                      f"{model.rms_log:.3f}, block spread {math.sqrt(model.block_var):.3f}{model.calibration_text}")
    entry["references"] = [(ref, _predict(model, dict(ref.config), cpus)) for ref in PUBLISHED
                           if ref.id in REFERENCES]
    entry["listed"] = [(label, partial, _predict(model, partial, cpus)) for label, partial in wanted.items()]
    return entry


def _loo(keep: set | None, used: list[dict]) -> tuple[dict, list[dict]]:
    """The check (cost_model.check, on its share: check_share) summed up, and the rows it used."""
    out = cm.check_on(keep, used)
    got = [e for e in out if "predicted_ms" in e]
    errors = [abs(e["error"]) for e in got]
    return {"entries": out, "predicted": len(got), "refused": len(out) - len(got),
            "median": statistics.median(errors) if errors else None, "worst": max(errors) if errors else None,
            "covered": sum(e["low_ms"] <= e["measured_ms"] <= e["high_ms"] for e in got)}, used


def plot(ctx, machine_id: int, loo: dict) -> Path | None:
    """predicted vs measured, log-log, with the intervals; plots/predicted_vs_measured[-M].png (once)."""
    if "plot" in loo:
        return loo["plot"]
    loo["plot"] = _draw(ctx, machine_id, loo)
    return loo["plot"]


def _draw(ctx, machine_id: int, loo: dict) -> Path | None:
    fig = _figure(loo)
    if fig is None:
        return None
    several = len(ctx.names) > 1
    path = Path(ctx.out_dir) / "plots" / (f"predicted_vs_measured-{machine_id}.png" if several else PLOT_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    import io
    svg = io.StringIO()
    fig.savefig(svg, format="svg")
    loo["svg"] = svg.getvalue()[svg.getvalue().index("<svg"):]  # inline in the page: it loads nothing
    return path


def _figure(loo: dict):
    got = [e for e in loo["entries"] if "predicted_ms" in e]
    if not got:
        return None
    from orchestrator.report.plots import figure, lay_out

    fig = figure(5.5, 5, dpi=None)  # the Agg canvas, not pyplot; dpi: matplotlib's default (saved at 110)
    ax = fig.subplots()
    xs = [e["measured_ms"] for e in got]
    ys = [e["predicted_ms"] for e in got]
    ax.errorbar(xs, ys, yerr=[[e["predicted_ms"] - e["low_ms"] for e in got],
                              [e["high_ms"] - e["predicted_ms"] for e in got]],
                fmt="o", ms=3, alpha=0.7, elinewidth=0.6)
    lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured median step (ms)",
           ylabel="predicted without its runs (ms)",
           title=f"leave one configuration out: median error {100 * loo['median']:.1f}%")
    lay_out(fig)
    return fig


def _published(ref) -> str:
    return f"{ref.figure} ({ref.kind}; {ref.hardware})"


def _pred_cell(p: dict) -> str:
    if "refused" in p:
        return f"not predicted: {p['refused']}"
    return f"{_ms(p['step_ms'])} ({_ms(p['low_ms'])} to {_ms(p['high_ms'])})"


def _epoch_cell(p: dict, dataset: str) -> str:
    t = p.get(dataset)
    if not t:
        return "-"
    return f"{_duration(t['train_s'])} ({_duration(t['train_s_low'])} to {_duration(t['train_s_high'])})"


def _extrapolated(p: dict) -> str:
    ex = p.get("extrapolated") or {}
    return ", ".join(f"{k} {e['beyond']:.2g}x" for k, e in ex.items() if e.get("beyond")) or "none"


TOKENS_NOTE = ("Epochs: WikiText-2's training split is 2,088,628 and WikiText-103's 103,227,021 word-level tokens "
               "(Merity et al. 2016, after the Moses tokenizer; the datasets cannot be downloaded here); each is "
               "converted to the run's own tokens with the tokens per word its byte-level BPE (of the run's "
               "vocab_size) gives on the project's built-in corpus (shown per row). One epoch = those tokens at the "
               "configuration's tokens per step.")
MODEL_NOTE = ("Predictions come from the cost model of each machine (docs/prediction.md): the exact operations of a "
              "step priced by GEMM FLOPs and operand traffic, attention, memory-bound elements, kernel calls and "
              "the traffic of tensors larger than the last-level cache, fitted to every done run of the machine, "
              "with setting factors (on compute alone as well, for a setting run at two sizes); the interval is a "
              "95% prediction interval for one run's median step, with the model's own error as the leave-one-out "
              "check below measured it (more the further a configuration lies beyond the runs). 'beyond' names the "
              "sizes outside the measured range and how far. "
              "The published figures come from other hardware: they sit beside ours, they are not compared.")


def markdown(ctx) -> list[str]:
    """The section for summary.md."""
    d = data(ctx)
    lines = ["## How long would it take here", "", MODEL_NOTE, "", TOKENS_NOTE, ""]
    for machine_id, m in d["machines"].items():
        lines.append(f"### {m['name']}")
        lines.append("")
        if "refused" in m:
            lines += [f"No prediction: {m['refused']}", ""]
            continue
        lines += [f"Fitted on {m['basis']}.", "",
                  "| ref | model | step (95% interval) | tokens/word | WikiText-2 epoch | WikiText-103 epoch | beyond "
                  "measured | published |", "|---|---|---|---|---|---|---|---|"]
        for ref, p in m["references"]:
            tpw = f"{p['tokens_per_word']:.2f}" if p.get("tokens_per_word") else "-"
            lines.append(f"| {ref.id} | {ref.model} | {_pred_cell(p)} | {tpw} | {_epoch_cell(p, 'wikitext-2')} | "
                         f"{_epoch_cell(p, 'wikitext-103')} | {_extrapolated(p)} | {_published(ref)} |")
        lines.append("")
        if m["listed"]:
            lines += ["Configurations the sweep files list under [predict]:", "",
                      "| name | settings | step (95% interval) | WikiText-2 epoch | WikiText-103 epoch "
                      "| beyond measured |",
                      "|---|---|---|---|---|---|"]
            for label, partial, p in m["listed"]:
                settings = " ".join(f"{k}={v}" for k, v in partial.items())
                lines.append(f"| {label} | {settings} | {_pred_cell(p)} | {_epoch_cell(p, 'wikitext-2')} | "
                             f"{_epoch_cell(p, 'wikitext-103')} | {_extrapolated(p)} |")
            lines.append("")
        loo = m["loo"]
        if loo["predicted"]:
            path = plot(ctx, machine_id, loo)
            lines += [f"Leave one configuration out: each configuration predicted by a model fitted without any of "
                      f"its runs: median error {100 * loo['median']:.1f}%, worst {100 * loo['worst']:.1f}%, the 95% "
                      f"interval covers {loo['covered']} of {loo['predicted']}; {loo['refused']} not predictable "
                      f"without their own runs (a setting measured only there)."
                      + (f" Plot: plots/{path.name}" if path else ""), ""]
    return lines


def html(ctx) -> str:
    """The section for index.html (self-contained: the plot is inlined)."""
    d = data(ctx)
    e = html_lib.escape
    parts = ['<section id="predict"><h2>How long would it take here</h2>', f"<p>{e(MODEL_NOTE)}</p>",
             f"<p>{e(TOKENS_NOTE)}</p>"]
    for machine_id, m in d["machines"].items():
        parts.append(f"<h3>{e(m['name'])}</h3>")
        if "refused" in m:
            parts.append(f"<p>No prediction: {e(m['refused'])}</p>")
            continue
        parts.append(f"<p>Fitted on {e(m['basis'])}.</p>")
        head = ["ref", "model", "step (95% interval)", "tokens/word", "WikiText-2 epoch", "WikiText-103 epoch",
                "beyond measured", "published (hardware)"]
        body = []
        for ref, p in m["references"]:
            tpw = f"{p['tokens_per_word']:.2f}" if p.get("tokens_per_word") else "-"
            body.append([ref.id, ref.model, _pred_cell(p), tpw, _epoch_cell(p, "wikitext-2"),
                         _epoch_cell(p, "wikitext-103"), _extrapolated(p), _published(ref)])
        parts.append(_table(head, body))
        if m["listed"]:
            parts.append("<p>Configurations the sweep files list under <code>[predict]</code>:</p>")
            parts.append(_table(["name", "settings", "step (95% interval)", "WikiText-2 epoch", "WikiText-103 epoch",
                                 "beyond measured"],
                                [[label, " ".join(f"{k}={v}" for k, v in partial.items()), _pred_cell(p),
                                  _epoch_cell(p, "wikitext-2"), _epoch_cell(p, "wikitext-103"), _extrapolated(p)]
                                 for label, partial, p in m["listed"]]))
        loo = m["loo"]
        if loo["predicted"]:
            parts.append(f"<p>Leave one configuration out: median error {100 * loo['median']:.1f}%, worst "
                         f"{100 * loo['worst']:.1f}%, the 95% interval covers {loo['covered']} of {loo['predicted']}; "
                         f"{loo['refused']} not predictable without their own runs.</p>")
            if plot(ctx, machine_id, loo) is not None and loo.get("svg"):
                parts.append(f'<figure class="predict-plot">{loo["svg"]}</figure>')
    parts.append("</section>")
    return "".join(parts)


def _table(head: list[str], body: list[list[str]]) -> str:
    return html_table(head, body, None, escape=True)  # plain-text cells, a table with no class


def adopt(ctx, d) -> None:
    """Take the section's data worked out elsewhere (write_report fits it in a forked child) as ctx's:
    the data, or a function that returns it, called when a writer first asks (the writers meanwhile
    write the other sections while the child fits)."""
    _cache.clear()
    _cache[id(ctx)] = d
