"""Variances that borrow strength (step_model: empirical Bayes toward the stratum's and the probe's):
the small grid a user types first (tests/scenarios.small_grid, 12 runs), starved by disturbed runs,
with the probe's prior right and wrong. Counts over seeds of data with a known truth."""

import random

from orchestrator.stats import effects as fx
from tests import scenarios as SC

SEEDS = 40


def outcomes(sigma: float, probe: float | None, drop: int) -> tuple[int, int, list]:
    """(seeds whose intervals hold both truths, seeds calling n_layers clear, the n_layers effects)."""
    s = SC.small_grid(sigma)
    covered = clear = 0
    found_n = []
    for seed in range(SEEDS):
        rows = s.rows(seed)
        rng = random.Random(1000 + seed)
        for _ in range(drop):
            rows.pop(rng.randrange(len(rows)))
        a = fx.analyse(rows, probe_cv={rows[0]["machine_id"]: probe} if probe else None)
        found = {(e.kind, e.variable, e.value): e for e in a.effects if e.group is None}
        covered += all(k in found and found[k].ci_low is not None and found[k].ci_low <= t <= found[k].ci_high
                       for k, t in s.truth.items())
        e = found[("ratio", "n_layers", "1")]
        clear += bool(e.significant)
        found_n.append(e)
    return covered, clear, found_n


def test_a_probe_prior_that_is_too_low_or_too_high_keeps_the_intervals_honest():
    for sigma, probe in ((0.10, 0.03), (0.03, 0.10)):
        covered, _, _ = outcomes(sigma, probe, drop=1)
        assert covered >= SEEDS - 3, (sigma, probe, covered)


def test_a_right_prior_lets_a_starved_small_sweep_call_its_effects():
    _, clear_without, _ = outcomes(0.04, None, drop=1)
    _, clear_with, effects = outcomes(0.04, 0.04, drop=1)
    assert clear_with >= 0.8 * SEEDS and clear_with > clear_without
    assert sorted(e.dof for e in effects)[SEEDS // 2] > 6  # 5 of its own at most: the probe's on top


def test_a_sweep_with_every_repeat_gone_still_gets_intervals_from_the_probe():
    s = SC.small_grid(0.04)
    rows = [r for r in s.rows(0) if r["repeat"] == 0]  # nothing repeated
    assert all(e.se is None for e in fx.analyse(rows).effects)
    got = fx.analyse(rows, probe_cv={rows[0]["machine_id"]: 0.04}).effects
    assert got and all(e.se is not None and 1 < e.dof < 3 for e in got)  # the probe's 6 worth about 2.3
