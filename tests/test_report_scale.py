"""The report's fast path (runs grouped once per configuration: ran.as_ran's cells) says exactly what
the per-run path says, on the same databases: every effect's every number, the comparisons, what
was lost and regrouped; and the page's per-configuration shortcuts match their plain definitions."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from sqlalchemy import text

from orchestrator import effects as fx
from orchestrator import html_report, seeds
from orchestrator.report import effect_row, write_report
from orchestrator.store import Store
from tests import scenarios
from tests.scaledb import build


def _rows(store: Store) -> list[dict]:
    with store.transaction() as conn:
        result = conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))
        return [dict(r._mapping) for r in result]


def _said(analysis: fx.Analysis) -> dict:
    """Everything the report takes from an analysis, as plain values."""
    out = {"family": analysis.family}
    for m, ma in analysis.machines.items():
        out[m] = {
            "effects": [effect_row(e) | {"job_ids": e.job_ids, "group": e.group, "log_range": e.log_range,
                                         "why": e.why_untested} for e in ma.effects],
            "levels": [[(lv.label, lv.n, sorted(lv.passes), lv.median_step_ms, lv.cv) for lv in ve.levels]
                       for ve in ma.variables],
            "fixed": [ve.fixed for ve in ma.variables], "followers": [ve.followers for ve in ma.variables],
            "left_out": [ve.left_out for ve in ma.variables],
            "interactions": [(i.statistic, i.df1, i.df2, i.p_value) for i in ma.interactions],
            "together": ma.together, "varied": ma.varied, "identical": ma.identical, "regrouped": ma.regrouped,
            "lost": [(x.variable, x.value, x.why) for x in ma.lost], "uncompared": ma.uncompared,
            "disturbed": len(ma.disturbed), "sigma2": ma.model.fit.sigma2 if ma.model else None,
            "grids": [(g.rows, g.cols, g.step_ms, g.fixed) for g in fx.grids(ma)],
        }
    return out


def _assert_same(rows: list[dict]) -> fx.Analysis:
    fast, slow = fx.analyse(rows), fx.analyse(rows, per_run=True)
    assert _said(fast) == _said(slow)
    assert fast.effects, "a comparison with nothing in it compares nothing"
    return fast


def test_a_synthetic_fleet_database_gets_the_same_effects_grouped_per_configuration_as_per_run(tmp_path):
    store = build(str(tmp_path / "r.db"), 2400, machines=2, shape="small", disturbed=23, read_back=17, quiet=True)
    rows = _rows(store)
    analysis = _assert_same(rows)
    ma = analysis.machines[min(analysis.machines)]
    assert ma.disturbed and ma.regrouped  # the awkward runs are there, and grouped alike both ways
    report = write_report(store, tmp_path / "result", plots=False)  # the report uses the fast path
    assert [effect_row(e) for e in report.effects] == [effect_row(e) for e in analysis.effects]


@pytest.mark.parametrize("make", [scenarios.quick, scenarios.interaction_grid, scenarios.failed_baseline,
                                  scenarios.bimodal_one_side, scenarios.drifting_pass])
def test_the_statistics_scenarios_get_the_same_effects_grouped_per_configuration_as_per_run(make):
    _assert_same(make().rows(seed=3))


def test_the_pages_baselines_and_the_seeds_lookup_match_their_plain_definitions(tmp_path):
    rows = _rows(build(str(tmp_path / "r.db"), 1500, machines=2, shape="small", read_back=11, quiet=True))
    # baselines: each configuration (config_hash) counted once, the most common label, ties to the default
    plain = {}
    by_machine: dict = defaultdict(dict)
    for r in rows:
        by_machine[r["machine_id"]].setdefault(r["config_hash"], r)
    for m, configs in by_machine.items():
        modal = {}
        for n in html_report.NAMES:
            if n in html_report.NOT_CONFIG:
                continue
            counts = Counter(html_report._val(n, c.get(n)) for c in configs.values())
            if len(counts) > 1:
                modal[n] = max(counts.items(),
                               key=lambda kv: (kv[1], str(kv[0]) == str(html_report.BY_NAME[n].default)))[0]
        plain[m] = modal
    assert html_report.baselines(rows) == plain and plain[min(plain)]
    # the runs table's configuration text: each run's own difference from its machine's baseline
    table = html_report.runs_table(rows, plain, {}, set())
    texts = table["dicts"]["config"]
    for r, ci in zip(rows, table["cols"]["config"]):
        diff = html_report.config_difference(r, plain[r["machine_id"]])
        assert texts[ci] == (", ".join(f"{k}={v}" for k, v in diff.items()) or "baseline")
    # a reference's runs: every done run that matches it (some rows made to match the first references)
    twins = [dict(r, **{k: ref.config[k] for k in seeds.MATCH_KEYS}) for ref in seeds.PUBLISHED[:3] for r in rows[:10]]
    both = rows + twins
    found = seeds.measured_all(both)
    assert found == {ref.id: seeds.measured(ref, both) for ref in seeds.PUBLISHED}
    assert sum(1 for v in found.values() if v) >= 2
