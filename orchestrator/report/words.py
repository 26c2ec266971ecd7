"""The report's words and number formatters, one copy for both writers (summary.md and
index.html): how a time, a share, a p-value or an interval is written, a failure's reason in one
line, a machine's name, the machine facts and their labels, an effect in one sentence. Plain text
only (each writer escapes or marks it up); imports no writer.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from itertools import compress, repeat
from operator import is_not

from orchestrator.queue.progress import short_reason  # a failure's reason in one line, as the progress says it
from orchestrator.stats import effects as fx
from orchestrator.stats.effects import Effect, VariableEffect
from common.metrics import peak_text
from orchestrator.stats.columns import column


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


def _failures(rows: list[dict]) -> list[tuple[str, str, int]]:
    counted = Counter()
    stopped = Counter((r["status"], r.get("reason")) for r in rows if r["status"] in ("failed", "skipped"))
    for (status, reason), n in stopped.items():
        counted[(status, short_reason(reason))] += n  # each distinct reason's line made once
    return [(s, why, n) for (s, why), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))]


def _machine_name(machine_id: int, facts: dict) -> str:
    host = facts.get("hostname")
    cpu = facts.get("cpu_model")
    parts = [p for p in (host, cpu) if p]
    return f"machine {machine_id}" + (f" ({', '.join(parts)})" if parts else "")


def probe_load(facts: dict) -> str:
    """Whether the probe's measured figures (GEMM peaks, memory bandwidth, noise) were taken on a
    quiet machine, in words, from machines.facts (worker/machine/probe.py: limits_disturbed). A provisional
    noise figure is not used for the report's noise (write_report)."""
    if "limits_disturbed" not in facts:
        return "load not checked (probed before the check existed)"
    why = facts["limits_disturbed"]
    return (f"provisional: {why}; measured again by the next probe; its noise figure is not used here" if why
            else "measured on a quiet machine")


def mfu_peak(rows: list[dict]) -> str | None:
    """The GEMM peak MFU is taken against on the machine's largest CPU set, in words: the fastest of
    the trainers' libraries there (worker/machine/gemm_peak.py) and the others' figures, from the runs'
    applied.peak_gflops; the probe's torch figure where the runs' peaks were scaled from it (older
    runs, BENCH_PEAK_PER_SET=0); None where no run recorded a peak. Only runs with an `applied` are
    read (a run without one has no peak)."""
    held = list(compress(rows, map(is_not, column(rows, "applied"), repeat(None))))
    best = _largest_library_peak(held, column(held, "cores"))
    if best is None:
        any_peak = any(bool(fx.peak_of(r).get("fp32")) for r in held)
        return "torch's GEMM peak (the probe's, scaled to each run's CPUs): `applied.peak_gflops.basis`" if any_peak \
            else None
    cores, peak = best
    return f"{peak_text(peak)} on {cores} CPU(s): the fastest of the trainers' GEMM libraries"


def _largest_library_peak(rows: list[dict], cores: list) -> tuple | None:
    """(cores, peak) of the first run, in the rows' order, with a library's peak on the largest CPU set
    any such run has (cores: column(rows, "cores")), or None: the runs of each CPU count, largest first,
    found at C speed (list.index), and only their peaks read until one has a library."""
    for n in sorted(set(filter(None, cores)), reverse=True):
        at = -1
        while True:
            try:
                at = cores.index(n, at + 1)
            except ValueError:
                break
            peak = fx.peak_of(rows[at])
            if peak.get("library"):
                return cores[at], peak
    return None


# -- numbers ---------------------------------------------------------------------------------------

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
    if lo is not None and not e.usable:
        return f"unresolved ({e.n_runs} runs; interval {lo:.2g} to {hi:.2g})"
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else " (a value ran once: no CI)"
    return f"{e.estimate:.2f}x{ci}"


def _fact(v) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 100 else f"{v:,.0f}"
    return re.sub(r"\s+", " ", str(v))


def _fmt(x, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        s = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    else:
        s = f"{x:,}" if isinstance(x, int) else str(x)
    return s + unit


# -- effects in words ------------------------------------------------------------------------------

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
    if not h.usable:
        return unresolved_words(ve, h)
    if h.significant:
        return f"{what} ({_ci(h)})" + (f": {size}" if size else "")
    words = f"no detectable effect: {what} ({_ci(h)})"
    if h.repeats_needed:
        words += (f"; an effect this small needs about {h.repeats_needed} runs per value to be seen at this noise"
                  if h.repeats_needed <= fx.MAX_REPEATS_SAID else
                  f"; even {fx.MAX_REPEATS_SAID} runs per value would not resolve an effect this small at this noise")
    return words


def spread(ve: VariableEffect) -> float:
    """The widest spread among the variable's values' runs: largest over smallest step time, less 1."""
    return max((max(lv.step_ms) / min(lv.step_ms) - 1.0 for lv in ve.levels if lv.n >= 2), default=0.0)


def unresolved_words(ve: VariableEffect, e: Effect) -> str:
    """An effect whose interval reaches beyond 0.2x-5x (Effect.usable): its runs and their spread, not
    a number to read."""
    lo, hi = e.ci_adj
    return (f"unresolved: {e.n_runs} runs, spread {_pct(spread(ve))} (the interval, {lo:.2g} to {hi:.2g}, "
            f"is too wide to read; more runs of its values would narrow it)")


def _target_words(e: Effect, target: tuple[float, int] | None) -> str:
    if target is None or e.target_met is None:
        return ""
    hw = e.half_width
    got = f"+-{_pct(hw)}" if hw is not None else "no interval"
    if e.target_met:
        return f"met ({got}) with {e.min_runs} runs"
    return f"not met ({got}) with {e.min_runs} runs" + (" (maximum)" if e.min_runs >= target[1] else "")
