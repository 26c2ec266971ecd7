"""The report's pictures: one PNG per varied variable (step time and tokens/s against its values) and
one heat map per pair of variables varied jointly. Each picture must read on its own: titles say what
was varied and what was held fixed (and what followed it), axes carry units, the legend carries the
fitted law with its family-wise interval. Dots are the runs as measured (pass drift left in).

matplotlib is imported lazily (it costs ~0.5 s; warm() imports it in the report's drawing children while
the runs are read) and used through Figure objects on the Agg canvas, never pyplot, so no global state
or display is touched.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from orchestrator.stats.effects import Grid, VariableEffect
from common.variables import BY_NAME

# Axis labels with units; variables not listed are labelled by name alone.
UNITS = {
    "cores": "CPUs in the affinity set", "freq_mhz": "MHz", "omp_threads": "threads",
    "intra_threads": "threads", "inter_threads": "threads", "n_layers": "transformer blocks",
    "d_model": "residual width", "n_heads": "attention heads", "head_dim": "width per head",
    "kv_heads": "key/value heads", "mlp_ratio": "MLP width / d_model", "window": "tokens",
    "vocab_size": "tokens in the vocabulary", "seq_len": "tokens per sample",
    "batch_size": "samples per micro-batch", "grad_accum": "micro-batches per step",
    "steps": "timed steps", "warmup_steps": "untimed steps", "dropout": "probability",
}
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
DPI = 110


def warm() -> None:
    """Import what drawing needs (~0.25 s): a child forked for the pictures calls this while the report
    reads the runs, so that its first picture does not wait for matplotlib."""
    import matplotlib.backends.backend_agg
    import matplotlib.backends.backend_svg  # the cost model's check is inlined as SVG too
    import matplotlib.colors
    import matplotlib.figure
    import matplotlib.layout_engine
    import matplotlib.ticker  # noqa: F401 - imported to be warm, used by the drawing functions
    from matplotlib import colormaps  # noqa: F401 - likewise


def figure(width: float, height: float, dpi: float | None = DPI):
    """A Figure on the Agg canvas (no pyplot: no global state, nothing to close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def lay_out(fig) -> None:
    """fig.tight_layout(), without what it leaves behind: its layout engine's placeholder, which makes
    every savefig first draw the whole figure once more without rendering it (a third of each PNG's
    time), for no change in a pixel. The engine's own step, as fig.tight_layout() makes it (rect=None:
    one pass, not two)."""
    from matplotlib.layout_engine import TightLayoutEngine

    TightLayoutEngine(rect=None).execute(fig)


def _save(fig, path: Path) -> None:
    lay_out(fig)
    fig.savefig(path)


def axis_label(name: str) -> str:
    unit = UNITS.get(name)
    return f"{name} ({unit})" if unit else name


def _held(fixed: dict[str, str], limit: int = 8) -> str:
    if not fixed:
        return "nothing else varied"
    items = [f"{k}={v}" for k, v in fixed.items()]
    more = f", +{len(items) - limit} more" if len(items) > limit else ""
    return "other varied variables held at " + ", ".join(items[:limit]) + more


def _wrap(*parts: str, width: int) -> str:
    return "\n".join(textwrap.fill(p, width) for p in parts)


def plot_variable(series: list[VariableEffect], names: dict[int, str], path: Path) -> Path:
    """Median step time and tokens/s against one variable's values, one colour per machine."""
    first = series[0]
    name = first.variable
    size = all(ve.size_like for ve in series)
    fig = figure(12, 6)
    ax_t, ax_s = fig.subplots(1, 2)
    # Categorical x: positions in the union of the values, in catalogue order.
    cats = []
    for ve in series:
        cats.extend(lv.label for lv in ve.levels if lv.label not in cats)
    several = len(series) > 1
    for i, ve in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        who = names[ve.machine_id]
        xs = [float(lv.value) if size else cats.index(lv.label) for lv in ve.levels]
        for ax, metric in ((ax_t, "step_ms"), (ax_s, "tokens_per_s")):
            # Repeats as points, spread a little sideways on categorical axes so they do not hide.
            px, py = [], []
            for x, lv in zip(xs, ve.levels):
                ys = getattr(lv, metric)
                px += [x] * len(ys) if size else [x + 0.06 * (k - (len(ys) - 1) / 2) for k in range(len(ys))]
                py += ys
            ax.scatter(px, py, s=18, color=colour, alpha=0.45, linewidths=0,
                       label="dots: each run (repeats)" if i == 0 else None)
            med = [lv.median_step_ms if metric == "step_ms" else lv.median_tokens_per_s for lv in ve.levels]
            pts = [(x, m) for x, m in zip(xs, med) if m is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=colour, lw=1.8, ms=5,
                    label=f"median: {who}" if several else "median of the repeats")
        e = ve.elasticity
        if size and e is not None:
            # The fitted power law through the slice: exponent from the fit, level from the slice.
            base = ve.baseline
            x0, y0 = float(base.value), base.median_step_ms
            lo, hi = min(xs), max(xs)
            grid = [lo * (hi / lo) ** (k / 40) for k in range(41)]
            ci = f" (family-wise 95% CI {e.ci_low:.2f} to {e.ci_high:.2f})" if e.ci_low is not None else ""
            ax_t.plot(grid, [y0 * (g / x0) ** e.estimate for g in grid], "--", lw=1.2, zorder=5,
                      color=colour if several else "black",
                      label=f"fit: step time ~ {name}^{e.estimate:.2f}{ci}, {e.n_runs} runs"
                      + (f", {who.split(' (')[0]}" if several else ""))
        if not size and not several:
            # The ratio to the baseline above each value: the table's number, on the picture.
            ratios = {r.value: r.estimate for r in ve.ratios}
            for x, lv in zip(xs, ve.levels):
                text = "baseline" if lv is ve.baseline else f"{ratios[lv.label]:.2f}x baseline"
                ax_t.annotate(text, (x, max(lv.step_ms)), textcoords="offset points", xytext=(0, 8),
                              ha="center", fontsize=9, color="#333333")
        if not several:
            ax_t.axhline(ve.baseline.median_step_ms, color="grey", lw=0.8, ls=":",
                         label=f"baseline ({name}={ve.baseline.label})")
    has_rate = any(lv.tokens_per_s for ve in series for lv in ve.levels)  # a child may not report it
    for ax in (ax_t, ax_s):
        ax.set_xlabel(axis_label(name) + (", log scale" if size else ""))
        ax.grid(True, which="major", alpha=0.3)
        if size and (ax is ax_t or has_rate):
            _log_axes(ax, sorted({float(lv.value) for ve in series for lv in ve.levels}))
        else:
            ax.set_xticks(range(len(cats)), cats)
            ax.set_xlim(-0.5, len(cats) - 0.5)
            ax.set_ylim(bottom=0)
    ax_t.set_ylabel("median step time (ms per optimizer step)" + (", log scale" if size else ""))
    ax_t.set_title("Step time (lower is faster)")
    ax_s.set_ylabel("throughput (tokens per second)" + (", log scale" if size else ""))
    ax_s.set_title("Throughput (higher is faster)")
    if not size:
        top = max(y for ve in series for lv in ve.levels for y in lv.step_ms)
        ax_t.set_ylim(0, top * 1.18)  # room for the ratio labels
    for ax in (ax_t, ax_s):  # under the axes: a legend inside would hide points somewhere
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    where = names[first.machine_id] if not several else f"{len(series)} machines"
    follow = f"; {', '.join(first.followers)} follow it (derived values)" if first.followers else ""
    fig.suptitle(_wrap(f"Training speed against {name} ({BY_NAME[name].doc.split(';')[0]})",
                       f"{where}; {_held(first.fixed)}{follow}", width=130), fontsize=11)
    _save(fig, path)
    return path


def _log_axes(ax, xs: list[float]) -> None:
    from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_yscale("log")
    # Ticks at the values tried, written plainly: 64, 128, 256 rather than 10^2.
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = ax.get_ylim()
    # Enough labelled ticks to read values off: a decade apart is too coarse for a narrow range.
    subs = (1, 1.5, 2, 3, 5, 7) if hi / lo < 30 else (1, 2, 5) if hi / lo < 3000 else (1,)
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_minor_formatter(NullFormatter())
    if len(xs) > 1:
        span = math.log(xs[-1] / xs[0])
        ax.set_xlim(xs[0] * math.exp(-0.06 * span), xs[-1] * math.exp(0.06 * span))


def plot_grid(grid: Grid, machine: str, path: Path) -> Path:
    """A heat map of median step time over two jointly varied variables, each cell labelled in ms."""
    import numpy as np

    values = np.array([[np.nan if v is None else v for v in row] for row in grid.step_ms], dtype=float)
    fig = figure(1.6 + 1.1 * len(grid.col_labels) + 2, 1.6 + 0.7 * len(grid.row_labels) + 1)
    ax = fig.subplots()
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm
    from matplotlib.transforms import TransformedPatchPath

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    finite = values[np.isfinite(values)]
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if finite.max() > finite.min() else None
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto", origin="lower")
    ax.set_xticks(range(len(grid.col_labels)), grid.col_labels)
    ax.set_yticks(range(len(grid.row_labels)), grid.row_labels)
    ax.set_xlabel(axis_label(grid.cols))
    ax.set_ylabel(axis_label(grid.rows))
    mid = math.sqrt(finite.min() * finite.max())
    # The cells' labels are not clipped (ax.text's clip_on=False): the clip path ax.text would give each
    # one (its own transforms, each kept by the axes' transforms and walked whenever they change) is
    # never read, so the labels share one.
    unread = TransformedPatchPath(ax.patch)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            text = "no run" if math.isnan(v) else f"{v:.3g} ms"
            colour = "black" if math.isnan(v) or v > mid else "white"
            ax.text(j, i, text, ha="center", va="center", fontsize=9, color=colour, clip_path=unread, in_layout=False)
    bar = fig.colorbar(image, ax=ax, label="median step time (ms, lower is faster)")
    bar.ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    bar.ax.yaxis.set_minor_formatter(lambda v, _pos: f"{v:g}" if str(f"{v:g}")[0] in "25" else "")
    width = int(12 * fig.get_figwidth())
    ax.set_title(_wrap(f"Median step time over {grid.rows} x {grid.cols} (grey: no finished run)",
                       f"{machine}; {_held(grid.fixed)}", width=width), fontsize=10)
    _save(fig, path)
    return path
