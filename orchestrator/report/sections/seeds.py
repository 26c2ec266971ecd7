"""The seed documents' reference runs (R1..R8 of the project's source documents) and the report section
that puts this machine's figures beside the published ones.

PUBLISHED is the one table of those figures: each reference's configuration in the catalogue's names
(what the `seeds` preset runs; a test keeps the preset and this table equal), the hardware it was
measured on, the figure as published and its kind (measured, claimed, estimated or expected). Where a
reference lies outside the catalogue (R8's 45-character vocabulary) or leaves a value unsaid (R1's
vocabulary), the configuration is the nearest honest one and `nearest` says what differs.

The section compares figures taken on different hardware: it shows them side by side and never
concludes that one CPU is faster than another. MFU (achieved FLOP/s over the CPU's peak) carries across
machines better than tokens per second does.
"""

from __future__ import annotations

import operator
import statistics
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from orchestrator.report.tables import markdown_table
from orchestrator.stats.config_index import CONFIG_NAMES, config_index, kept_for_the_rows

# The variables a reference fixes; the rest (steps, threads, system settings) is this machine's choice.
MATCH_KEYS = ("n_layers", "d_model", "n_heads", "mlp_ratio", "dropout", "vocab_size", "seq_len", "batch_size",
              "grad_accum", "precision", "framework")


@dataclass(frozen=True)
class Reference:
    id: str
    model: str
    config: dict  # catalogue names -> values; what the seeds preset runs
    hardware: str
    figure: str  # as published
    kind: str  # measured | claimed | estimated | expected | none
    s_per_step: float | None = None  # published seconds per optimizer step (effective step), if any
    tokens_per_s: float | None = None  # published tokens per second, if any
    mfu: float | None = None  # published model FLOPs utilisation, if any
    nearest: str = ""  # how the configuration differs from the document's, if it does
    ratio_to: tuple[str, float] | None = None  # (reference id, its s/step over this one's) a claim compares
    caveat: str = ""

    @property
    def tokens_per_step(self) -> int:
        c = self.config
        return c["batch_size"] * c.get("grad_accum", 1) * c["seq_len"]


def _cfg(**kw) -> dict:
    return {"mlp_ratio": 4.0, "dropout": 0.0, "grad_accum": 1, "precision": "fp32", "framework": "torch", **kw}


R1_CONFIG = _cfg(n_layers=12, d_model=768, n_heads=12, vocab_size=8192, seq_len=512, batch_size=1, grad_accum=4)

PUBLISHED: tuple[Reference, ...] = (
    Reference("R1", "~80M decoder", R1_CONFIG,
              "Intel i5-1240P (8 cores / 16 threads), 19 GB, PyTorch 2.8 CPU",
              "4.55 s per effective step (0.22 steps/s); ~60 s initialisation", "measured", s_per_step=4.55,
              nearest="vocabulary not published: 8192 here"),
    Reference("R2a", "R1 'optimized': seq 128", dict(R1_CONFIG, seq_len=128, grad_accum=8),
              "Intel i5-1240P (as R1)", "seq 128 about 4x faster than seq 512", "claimed", ratio_to=("R1", 4.0),
              nearest="vocabulary not published: 8192 here",
              caveat="R2a's step holds 1024 tokens (8 x 128), R1's 2048 (4 x 512)"),
    Reference("R2b", "R1 'optimized': 8 layers", dict(R1_CONFIG, seq_len=128, grad_accum=8, n_layers=8),
              "Intel i5-1240P (as R1)", "8 layers about 33% faster than 12", "claimed", ratio_to=("R2a", 1.33),
              nearest="vocabulary not published: 8192 here; compared with R2a (12 layers, same sequence)"),
    Reference("R3", "~25M decoder",
              _cfg(n_layers=4, d_model=256, n_heads=4, vocab_size=32000, seq_len=512, batch_size=2, grad_accum=8,
                   dropout=0.1),
              "i5-8400 (6c) / i7-10700K (8c) / Ryzen 7 3700X (8c) / Xeon E5-2680 (14c)",
              "12-18 h / 8-12 h / 8-12 h / 6-10 h for WikiText-2", "estimated",
              nearest="lr 8e-4 in the document; the trainer's own schedule here",
              caveat="a whole-dataset estimate, not a per-step measurement"),
    Reference("R4", "~117M decoder",
              _cfg(n_layers=12, d_model=768, n_heads=12, vocab_size=50000, seq_len=1024, batch_size=1, grad_accum=16),
              "i7-10700K / Ryzen 9 3900X / Xeon Gold 6248",
              "3-5 days / 2-3 days / 1-2 days for WikiText-103", "estimated",
              caveat="a whole-dataset estimate, not a per-step measurement"),
    Reference("R5", "forward benchmark",
              _cfg(n_layers=2, d_model=128, n_heads=4, vocab_size=1000, seq_len=256, batch_size=4),
              "any", "a timing script, no figure", "none",
              nearest="the document times forward passes only; a training step here"),
    Reference("R6", "~24M decoder",
              _cfg(n_layers=6, d_model=512, n_heads=8, vocab_size=16000, seq_len=256, batch_size=16),
              "Intel i5-1135G7 (8 logical cores, AVX-512)",
              "54-56 tokens/s (~75 s per batch of 4,096 tokens); 2.1 GFLOP/s, ~1.4% of a ~153 GFLOP/s peak",
              "measured", s_per_step=75.0, tokens_per_s=55.0, mfu=0.014,
              caveat="a streaming data loader ran inside the document's timed loop; cpubench times training "
                     "steps only, so its figure should be far higher on the same hardware"),
    Reference("R7", "R6 variant",
              _cfg(n_layers=3, d_model=256, n_heads=8, vocab_size=16000, seq_len=128, batch_size=32),
              "Intel i5-1135G7 (as R6)", "~500 tokens/s; batch 32 alone ~80-100 tokens/s", "expected",
              tokens_per_s=500.0, nearest="heads and vocabulary not published: R6's (8, 16000) here",
              caveat="an expectation, with R6's data loader in the loop"),
    Reference("R8", "tiny character model",
              _cfg(n_layers=4, d_model=128, n_heads=4, vocab_size=256, seq_len=64, batch_size=16),
              "a laptop CPU", "10-20 min per epoch of ~11k sequences (250 batches in 12 min 34 s, ~3.0 s per batch)",
              "claimed", s_per_step=3.0,
              nearest="vocabulary 45 characters in the document, below the catalogue's minimum: 256 BPE tokens "
                      "here; heads not published: 4"),
)
BY_ID = {r.id: r for r in PUBLISHED}


@dataclass
class Measured:
    """This machine's figures for one reference: medians over its finished runs."""

    runs: int
    s_per_step: float
    tokens_per_s: float | None
    mfu: float | None
    steps: list[int] = field(default_factory=list)


def matches(ref: Reference, row: dict) -> bool:
    return all(_same(row.get(k), ref.config[k]) for k in MATCH_KEYS)


def _same(a, b) -> bool:
    if isinstance(b, float) or isinstance(a, float):
        return a is not None and abs(float(a) - float(b)) < 1e-9
    return a == b


def measured(ref: Reference, rows: list[dict]) -> dict[int, Measured]:
    """machine_id -> this machine's figures for ref, from finished runs of its configuration."""
    by_machine: dict[int, list[dict]] = {}
    for r in rows:
        if r.get("status") == "done" and r.get("step_ms_median") and matches(ref, r):
            by_machine.setdefault(r["machine_id"], []).append(r)
    out = {}
    for m, rs in by_machine.items():
        def med(key):
            xs = [float(r[key]) for r in rs if r.get(key) is not None]
            return statistics.median(xs) if xs else None
        out[m] = Measured(len(rs), med("step_ms_median") / 1e3, med("tokens_per_s"), med("mfu"),
                          sorted({int(r["steps"]) for r in rs if r.get("steps")}))
    return out


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _config_words(c: dict) -> str:
    words = [f"{c['n_layers']}L", f"d{c['d_model']}", f"{c['n_heads']}h", f"vocab {c['vocab_size']}",
             f"seq {c['seq_len']}", f"batch {c['batch_size']}"]
    if c.get("grad_accum", 1) > 1:
        words.append(f"accum {c['grad_accum']}")
    if c.get("dropout"):
        words.append(f"dropout {c['dropout']:g}")
    return ", ".join(words)


def _published_rate(ref: Reference) -> str:
    if ref.tokens_per_s is not None:
        return _num(ref.tokens_per_s)
    if ref.s_per_step is not None:  # derived from the published step time and the configuration
        return f"≈{_num(ref.tokens_per_step / ref.s_per_step)}"
    return "-"


@kept_for_the_rows
def measured_all(rows: list[dict]) -> dict[str, dict[int, Measured]]:
    """reference id -> measured(ref, rows), each reference looking only at the runs whose matched
    columns are its own: the rows are grouped on those columns once (a 100k-run report), and the
    answer is kept for the same list of rows (summary.md's section and the page's both ask)."""
    return _measured_all(rows)


def _measured_all(rows: list[dict]) -> dict[str, dict[int, Measured]]:
    # group the runs' configurations (config_index: each run's number, read once per report) on the
    # matched columns; measured() then sees only the runs of the groups a reference matches, which are
    # the runs it would pick out of all the rows (it keeps the done ones itself). A group's shape is its
    # first run's, as grouping run by run would keep.
    ids, raws = config_index(rows)
    shape_of = operator.itemgetter(*(CONFIG_NAMES.index(k) for k in MATCH_KEYS))
    groups: dict[tuple, list[int]] = {}  # shape -> its configuration numbers
    for number, raw in enumerate(raws):
        groups.setdefault(shape_of(raw), []).append(number)
    found, numbered = {}, None
    # matches() of a shape, key by key: each key's distinct values that match the reference's, found once
    values = [dict.fromkeys(column) for column in zip(*groups)] if groups else [{} for _ in MATCH_KEYS]
    for ref in PUBLISHED:
        same = [{v for v in vs if _same(v, ref.config[k])} for k, vs in zip(MATCH_KEYS, values)]
        hit = [numbers for shape, numbers in groups.items() if all(map(operator.contains, same, shape))]
        if not hit:
            found[ref.id] = {}
            continue
        if numbered is None:
            numbered = np.array(ids, dtype=np.int64)
        # in the rows' order (the machines' order in the answer follows it)
        at = np.flatnonzero(np.isin(numbered, np.fromiter(chain(*hit), dtype=np.int64))).tolist()
        found[ref.id] = measured(ref, list(map(rows.__getitem__, at)))
    return found


def _slashed(cell: object) -> str:
    """A cell of the references' table: a `|` (in a published figure or hardware) written as `/`."""
    return str(cell).replace("|", "/")


def seeds_lines(rows: list[dict], names: dict[int, str]) -> list[str]:
    """Markdown lines (none when no run has a reference's configuration): this machine's s/step, tok/s
    and MFU beside each published figure, with the hardware and the caveats."""
    found = measured_all(rows)
    if not any(found.values()):
        return []
    lines = ["## The seed documents' reference runs", "",
             "This machine's figures (medians over finished runs of each configuration, `seeds` preset) beside the "
             "figures the source documents publish. **The hardware differs**: the columns sit side by side, they "
             "do not say that one CPU is faster than another. MFU (achieved over peak FLOP/s) carries across "
             "machines better than tokens per second. Published tokens/s marked ≈ are derived from a published "
             "step time and the configuration.", ""]
    header = ["id", "config", "machine", "runs", "s/step", "tok/s", "MFU", "published", "published s/step",
              "published tok/s", "published MFU", "published hardware", "kind"]
    body = []
    for ref in PUBLISHED:
        mine = found[ref.id] or {None: None}
        for machine_id, got in sorted(mine.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            body.append([ref.id, _config_words(ref.config), names.get(machine_id, "-") if got else "not run",
                         got.runs if got else 0, _num(got.s_per_step) if got else "-",
                         _num(got.tokens_per_s) if got else "-", _num(got.mfu, 2) if got else "-",
                         ref.figure, _num(ref.s_per_step), _published_rate(ref), _num(ref.mfu, 2), ref.hardware,
                         ref.kind])
    lines += markdown_table(header, body, escape=_slashed)
    claims = []
    for ref in PUBLISHED:
        if ref.ratio_to is None:
            continue
        other_id, claimed = ref.ratio_to
        for machine_id, got in found[ref.id].items():
            other = found[other_id].get(machine_id)
            if other:
                claims.append(f"- {ref.id} ({ref.figure}, {ref.kind}: {claimed:g}x): here {other_id}'s step takes "
                              f"{other.s_per_step / got.s_per_step:.2f}x {ref.id}'s on {names.get(machine_id)}.")
    if claims:
        lines += ["Claimed ratios, checked here:", "", *claims, ""]
    lines.append("Caveats and nearest configurations:")
    lines.append("")
    for ref in PUBLISHED:
        notes = "; ".join(x for x in (ref.nearest, ref.caveat) if x)
        if notes:
            lines.append(f"- {ref.id}: {notes}.")
    steps = sorted({s for f in found.values() for g in f.values() for s in g.steps})
    if steps:
        lines.append(f"- This machine's figures come from short runs ({', '.join(map(str, steps))} timed steps, "
                     "after untimed warm-up steps), as the preset keeps big configurations cheap.")
    lines.append("")
    return lines


def seeds_section(ctx) -> list[str]:
    """The report's section (orchestrator/report/markdown.py SECTIONS): the reference runs beside this machine's."""
    return seeds_lines(ctx.rows, ctx.names)
