"""THE synthetic-truth test: the real `quick` preset planned for a fixed 2-CPU machine, every job given a
step time from a known law (tests/synthetic.py: followers varied on their own axes while their parents
vary, one much noisier level, a drift shared by each repeat pass), finished through the real Store,
and the real report written. The report must find every true effect, inside its interval, and must not
call no-effect comparisons significant more often than the family-wise 5% it states."""

import math
import re

import pytest
from sqlalchemy import text

from orchestrator.report import write_report
from orchestrator.queue.store import Store
from tests import synthetic as S

SEEDS = 20
ALPHA = 0.05


def effects_table(store: Store) -> list[dict]:
    with store.transaction() as conn:
        return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM effects ORDER BY effect_id"))]


def key(row: dict) -> tuple:
    return (row["kind"], row["variable"], row["value"])


def is_null(row: dict, truth: dict) -> bool:
    return abs(truth[key(row)] - (1.0 if row["kind"] == "ratio" else 0.0)) < 1e-12


def is_noisy(row: dict) -> bool:
    return (row["variable"], row["value"]) == S.NOISY


def within_10_percent(row: dict, true: float) -> bool:
    """Within 10% on the step-time scale: a ratio, or the factor a doubling gives; an exponent of
    0.5 or more also within 10% of itself."""
    if row["kind"] == "ratio":
        return abs(row["estimate"] / true - 1) <= 0.10
    ok = abs(2 ** row["estimate"] / 2 ** true - 1) <= 0.10
    return ok and (abs(true) < 0.5 or abs(row["estimate"] / true - 1) <= 0.10)


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.slow
def test_the_quick_report_finds_every_true_effect_within_10_percent_inside_its_interval(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    S.build(store, seed=0)

    report = write_report(store, tmp_path / "result")

    truth = S.truth_by_label()
    rows = effects_table(store)
    assert {key(r) for r in rows} == set(truth)  # every comparison the preset makes, nothing else
    quiet_widths = []
    for r in rows:
        true = truth[key(r)]
        assert r["ci_adj_low"] <= true <= r["ci_adj_high"], (key(r), r["estimate"], true)
        if is_noisy(r):
            continue  # 15% noise, 3 runs: no estimator gets within 10% reliably; its interval must say so
        assert within_10_percent(r, true), (key(r), r["estimate"], true)
        if r["kind"] == "ratio":
            quiet_widths.append(math.log(r["ci_high"] / r["ci_low"]))
        if is_null(r, truth):
            assert not r["significant"], key(r)
    noisy = next(r for r in rows if is_noisy(r))
    assert math.log(noisy["ci_high"] / noisy["ci_low"]) > 2.5 * sorted(quiet_widths)[len(quiet_widths) // 2]

    # The audit's cases, by name: cores with the threads following it, omp_threads on its own.
    by_key = {key(r): r for r in rows}
    # (two values each on the 2-CPU machine: a ratio only, the same test is not counted twice)
    assert ("elasticity", "cores", None) not in by_key
    assert by_key[("ratio", "cores", "1")]["estimate"] == pytest.approx(2 ** 0.8, rel=0.06)
    assert by_key[("ratio", "omp_threads", "1")]["estimate"] == pytest.approx(2 ** 0.7, rel=0.06)
    assert by_key[("elasticity", "d_model", None)]["estimate"] == pytest.approx(1.5, abs=0.15)
    assert by_key[("ratio", "cores", "1")]["significant"]

    md = report.summary_path.read_text()
    assert "| `optimizer` | adamw, sgd | no detectable effect: sgd vs adamw" in md
    # the drift it removed (+12.7%, -7.7%), stated
    assert re.search(r"pass 1: \+1[123]%, pass 2: -[789]% vs pass 0", md)
    assert "`omp_threads`, `intra_threads`, `inter_threads` moved with it, at the values derived from it" in md
    assert len(report.plot_paths) == len({r["variable"] for r in rows})
    ranks = [ve.variable for ve in report.analysis.ranked()]
    assert ranks.index("d_model") < ranks.index("optimizer") and ranks.index("cores") < ranks.index("pin_threads")


@pytest.mark.slow
def test_over_seeds_the_report_is_unbiased_and_its_family_wise_error_and_coverage_hold(tmp_path):
    truth = S.truth_by_label()
    # With a true family-wise rate of 5%, SEEDS seeds show more than ALLOWED seeds with an error with
    # probability below 2%; a report without the adjustment errs in most seeds.
    allowed = next(k for k in range(SEEDS) if binomial_tail(SEEDS, ALPHA, k + 1) < 0.02)
    false_alarms = uncovered = 0
    errors: dict[tuple, list[float]] = {}
    for seed in range(SEEDS):
        store = Store(str(tmp_path / f"seed{seed}.db"))
        S.build(store, seed=seed)
        write_report(store, tmp_path / f"seed{seed}", plots=False)
        rows = effects_table(store)
        false_alarms += any(r["significant"] for r in rows if is_null(r, truth))
        uncovered += any(not r["ci_adj_low"] <= truth[key(r)] <= r["ci_adj_high"] for r in rows)
        for r in rows:
            true = truth[key(r)]
            err = math.log(r["estimate"] / true) if r["kind"] == "ratio" else r["estimate"] - true
            errors.setdefault(key(r), []).append(err)

    print(f"{SEEDS} seeds: {false_alarms} with a false positive, {uncovered} with an interval missing its truth "
          f"(allowed {allowed} each)")
    assert allowed == 3
    assert false_alarms <= allowed
    assert uncovered <= allowed
    for k, errs in errors.items():  # no bias: the followers' pooling made cores 20% off in every seed
        mean = sum(errs) / len(errs)
        sd = math.sqrt(sum((e - mean) ** 2 for e in errs) / (len(errs) - 1))
        assert abs(mean) <= max(0.02, 4 * sd / math.sqrt(len(errs))), (k, mean, sd)


def test_where_the_hub_is_unreachable_the_dataset_is_not_an_effect(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    S.build(store, seed=1, dataset_used=lambda config: "builtin")

    report = write_report(store, tmp_path / "result", plots=False)

    assert "dataset" not in {e.variable for e in report.effects}
    md = report.summary_path.read_text()
    assert "**Ran identically**: `dataset`: ThomasTheMaker/Arc-Corpus-sample, builtin were asked for" in md


HEAVY_SEEDS = 10
HEAVY_REPEATS = 12  # enough runs per configuration for the model to see the slow runs as a mode


@pytest.mark.slow
def test_heavy_tails_and_disturbed_runs_move_neither_the_estimates_nor_the_intervals(tmp_path):
    """The shared VM's noise: 6% of runs slowed by 20-100% with no sensor seeing it (S.TAIL), 5% as
    much with other_cpu_s showing another process (S.DISTURBED), 12 passes. Every true effect must
    be found within 10%, inside its interval, in every seed but the few the stated error allows,
    and the disturbed runs left out and counted. Means of log step time (the estimator before)
    missed: a few slow runs moved a value's mean by 5-15%."""
    truth = S.truth_by_label()
    allowed = next(k for k in range(HEAVY_SEEDS) if binomial_tail(HEAVY_SEEDS, ALPHA, k + 1) < 0.02)
    false_alarms = uncovered = off = 0
    for seed in range(HEAVY_SEEDS):
        store = Store(str(tmp_path / f"seed{seed}.db"))
        S.build(store, seed=seed, repeats=HEAVY_REPEATS, tail=S.TAIL, disturbed=S.DISTURBED)
        report = write_report(store, tmp_path / f"seed{seed}", plots=False)
        rows = effects_table(store)
        assert {key(r) for r in rows} == set(truth)
        false_alarms += any(r["significant"] for r in rows if is_null(r, truth))
        uncovered += any(not r["ci_adj_low"] <= truth[key(r)] <= r["ci_adj_high"] for r in rows)
        off += any(not within_10_percent(r, truth[key(r)]) for r in rows if not is_noisy(r))
        (ma,) = report.analysis.machines.values()
        flagged = len(ma.disturbed)
        assert flagged > 0 and not ma.disturbed_kept
        assert all(not r.disturbed for r in ma.runs)
        md = report.summary_path.read_text()
        assert f"Disturbed runs: {flagged} of {len(ma.runs) + flagged} done runs" in md
        assert "They are left out of every fit and interval" in md
    print(f"{HEAVY_SEEDS} seeds, heavy tails: {false_alarms} with a false positive, {uncovered} with an interval "
          f"missing its truth, {off} with an estimate more than 10% off (allowed {allowed} each)")
    assert allowed == 2
    assert false_alarms <= allowed
    assert uncovered <= allowed
    assert off <= allowed


def test_a_machine_whose_every_run_was_disturbed_is_still_reported_and_says_so(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    S.build(store, seed=3, disturbed=(1.0, 0.0, 0.0))  # every run flagged, none slowed

    report = write_report(store, tmp_path / "result", plots=False)

    (ma,) = report.analysis.machines.values()
    assert ma.disturbed_kept and len(ma.runs) == len(ma.disturbed) > 0
    assert report.effects  # the fits still run on them
    assert "Every done run was disturbed, so they are kept in the fits" in report.summary_path.read_text()
