"""The data a report shows, with no text: what write_report reads from the store (the SQL), the
Context the writers draw on (rows, the analysis, grids, counts, facts) and the Report it returns,
and the rows of the `effects` table. Imports neither the words (words.py) nor a writer
(markdown.py, html.py): they depend on it, never the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from orchestrator.stats.effects import FACTORS, Analysis, Effect, Grid, modal_config
from common.variables import NAMES
from orchestrator.stats.columns import column

SELECT_MACHINES = "SELECT * FROM machines"
SELECT_SWEEP_NOTES = "SELECT name, notes FROM sweeps ORDER BY sweep_id"
SELECT_TARGETS = "SELECT machine_id, target_ci, max_repeats FROM adaptive_decisions ORDER BY decision_id"


@dataclass
class Report:
    csv_path: Path
    summary_path: Path
    plot_paths: list[Path]
    top_effects: list[Effect]  # one headline effect per (machine, variable), clearest first
    counts: dict[str, int]  # status -> runs (queued included), as store.counts gives them
    failures: list[tuple[str, str, int]]  # (status, reason, runs) of failed and skipped runs, most first
    machines: int  # machines with runs in the report
    effects: list[Effect]  # every effect written to the effects table
    analysis: Analysis | None = None
    html_path: Path | None = None  # index.html, the page people open
    effects_not_written: str | None = None  # why the effects table was left as it was (a read-only database)


@dataclass
class Context:
    """What the writers draw on: summary.md's sections (markdown.py) and the page (html.py)."""

    rows: list[dict]
    done: list[dict]
    analysis: Analysis
    grids: dict[int, list[Grid]]
    names: dict[int, str]  # machine id -> its name in the text
    facts: dict[int, dict]
    counts: dict
    failures: list
    sweep_notes: list[tuple[str, str]]
    plot_paths: list[Path]
    out_dir: Path
    targets: dict[int, tuple[float, int]]  # machine -> (--target-ci, --max-repeats) of its adaptive passes
    budgets: dict[int, list[dict]] = field(default_factory=dict)  # machine -> its --budget decisions (budget.decisions)
    # "How long here" (sections/prediction.py): the sweeps' texts by name, whether its predictions are
    # checked against the runs (leave-one-out, with pictures), and report --watch's per-machine memo
    sweep_texts: dict[str, str] = field(default_factory=dict)
    check_predictions: bool = True
    memo: dict | None = None
    learning: dict | None = None  # "Time to a trained model" (sections/learning.py: prepare), once prepared

    @property
    def several(self) -> bool:
        return sum(1 for m in self.analysis.machines.values() if m.runs) > 1

    @property
    def varied(self) -> list[str]:
        return [n for n in NAMES if any(n in m.varied for m in self.analysis.machines.values())]

    @property
    def together(self) -> list[str]:
        return sorted({n for m in self.analysis.machines.values() for n in m.together}, key=NAMES.index)

    @cached_property
    def modal(self) -> dict:
        """fx.modal_config of every machine's fitted runs over every variable (FACTORS): summary.md's
        baseline, and where the report has one machine that machine's own (a variable's modal value is
        its own, whatever else is asked with it)."""
        runs = [r for m in self.analysis.machines.values() for r in m.runs]
        return modal_config(runs, list(FACTORS)) if runs else {}

    @cached_property
    def budget_spending(self) -> list[tuple[int, str, dict]]:
        """Per machine with a --budget: (its id, " on NAME" where several machines, else "", budget.spending):
        the section both writers show, computed once."""
        from orchestrator.queue import budget

        out = []
        for m, made in self.budgets.items():
            ma = self.analysis.machines.get(m)
            if ma is not None and made:
                out.append((m, f" on {self.names[m]}" if self.several else "", budget.spending(ma.effects, made)))
        return out

    @cached_property
    def queues(self) -> list[dict]:
        """The queues the runs came from, with their hosts and counts (sections/pools.queues): both writers
        list them."""
        from orchestrator.report.sections import pools

        return pools.queues(self.rows)

    @cached_property
    def sweeps(self) -> list[str]:
        """The sweeps the runs came from, by name: both writers' first lines say them (one scan of the rows)."""
        return sorted(filter(None, set(column(self.rows, "sweep"))))


def effect_row(e: Effect) -> dict:
    """One row of the effects table (orchestrator/queue/effects_table.py: its columns, EFFECT_COLUMNS)."""
    lo, hi = e.ci95
    alo, ahi = e.ci_adj
    return {"machine_id": e.machine_id, "variable": e.variable, "kind": e.kind, "value": e.value,
            "baseline": e.baseline, "estimate": e.estimate, "ci_low": lo, "ci_high": hi, "ci_adj_low": alo,
            "ci_adj_high": ahi, "se": e.se, "dof": e.dof, "p_value": e.p_value, "p_adjusted": e.p_adjusted,
            "significant": e.significant, "family": e.family, "method": e.method, "n_runs": e.n_runs,
            "min_runs": e.min_runs, "n_passes": e.n_passes, "half_width": e.half_width,
            "target_met": e.target_met, "repeats_needed": e.repeats_needed}


def _probe_facts(facts_json: str | dict | None) -> dict:
    """machines.facts: JSON text in the database (a dict where a driver already parsed it)."""
    return facts_json if isinstance(facts_json, dict) else json.loads(facts_json or "{}")
