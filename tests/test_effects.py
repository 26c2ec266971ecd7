"""The fitted effects recover known laws from synthetic runs written through the real Store."""

import math
import random

import pytest

from orchestrator import effects as fx
from orchestrator.store import Store
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all
from sqlalchemy import text


def results(store: Store) -> list[dict]:
    with store.transaction() as conn:
        res = conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))
        return [dict(r._mapping) for r in res]


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "results.db"))


def noisy(seed: int = 0, sigma: float = 0.03):
    rng = random.Random(seed)
    return lambda: math.exp(rng.gauss(0, sigma))


def test_power_law_exponent_of_step_time_is_recovered_within_5_percent(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"d_model": 128, "n_heads": 4}, {"d_model": [64, 128, 256, 512]}, repeats=3))
    noise = noisy()
    run_all(store, m, lambda c: ("done", None, metrics(0.01 * c["d_model"] ** 1.7 * noise(), c)))

    ves, together = fx.analyse_machine(results(store), m)

    (ve,) = ves
    assert ve.variable == "d_model" and ve.size_like
    assert ve.elasticity.estimate == pytest.approx(1.7, rel=0.05)
    assert ve.elasticity.ci_low < 1.7 < ve.elasticity.ci_high
    assert ve.elasticity.n_runs == 12
    assert together == ["head_dim"]  # head_dim = d_model / n_heads moved with it, not on its own
    assert ve.followers == ["head_dim"]


def test_categorical_ratio_to_the_baseline_is_recovered_within_5_percent(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"precision": "fp32"}, {"precision": ["fp32", "bf16"]}, repeats=4))
    noise = noisy(1)
    run_all(store, m, lambda c: ("done", None, metrics((20.0 if c["precision"] == "fp32" else 40.0) * noise(), c)))

    (ve,), _ = fx.analyse_machine(results(store), m)

    assert not ve.size_like and ve.elasticity is None
    assert ve.baseline.label == "fp32"
    (ratio,) = ve.ratios
    assert (ratio.value, ratio.baseline, ratio.kind) == ("bf16", "fp32", "ratio")
    assert ratio.estimate == pytest.approx(2.0, rel=0.05)
    assert ratio.ci_low < ratio.estimate < ratio.ci_high


def test_one_factor_at_a_time_slices_hold_the_other_variables_at_the_base(store):
    m = store.register_machine(machine_facts("alpha"))
    base = {"n_layers": 2, "seq_len": 128}
    enqueue(store, configs(base, {"n_layers": [1, 2, 4], "seq_len": [64, 128, 256]}, repeats=2))
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["seq_len"] ** 1.2 / 10, c)))

    ves, _ = fx.analyse_machine(results(store), m)

    by_name = {ve.variable: ve for ve in ves}
    assert by_name["n_layers"].fixed == {"seq_len": "128"}
    assert by_name["seq_len"].fixed == {"n_layers": "2"}
    assert by_name["n_layers"].elasticity.estimate == pytest.approx(1.0, abs=1e-6)
    assert by_name["seq_len"].elasticity.estimate == pytest.approx(1.2, abs=1e-6)
    assert [ve.variable for ve in ves] == ["seq_len", "n_layers"]  # 5.3x over its values before 4x
    assert ves[0].span >= ves[1].span


def test_failed_and_skipped_runs_never_enter_an_average(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2}, {"cores": [1, 2]}, repeats=3))

    def outcome(c):
        if c["repeat"] == 2:  # a failed run that still left a (wrong) metric behind
            return "failed", "boom", {"step_ms_median": 1e6}
        return "done", None, metrics(100.0 / c["cores"], c)
    run_all(store, m, outcome)

    (ve,), together = fx.analyse_machine(results(store), m)

    assert ve.variable == "cores"
    assert sorted(together) == ["inter_threads", "intra_threads", "omp_threads"]
    assert [len(lv.step_ms) for lv in ve.levels] == [2, 2]
    assert ve.elasticity.estimate == pytest.approx(-1.0, abs=1e-9)


def test_a_two_variable_grid_is_found_but_a_one_at_a_time_cross_is_not(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"n_layers": 2, "d_model": 64}, {"n_layers": [1, 2], "d_model": [64, 128]}, repeats=1, grid=True))
    enqueue(store, configs({"n_layers": 2, "d_model": 64}, {"seq_len": [64, 128]}, repeats=1), sweep="ofat")
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["d_model"] * c["seq_len"] / 1000, c)))
    rows = results(store)
    ves, together = fx.analyse_machine(rows, m)

    (grid,) = fx.grids(rows, m, [ve.variable for ve in ves], together)

    assert {grid.rows, grid.cols} == {"n_layers", "d_model"}
    assert all(v is not None for row in grid.step_ms for v in row)


def test_t_quantiles_fall_towards_the_normal_one():
    assert fx.t975(1) == pytest.approx(12.706)
    assert fx.t975(25) == pytest.approx(2.064)  # the tabulated dof below: conservative
    assert fx.t975(10_000) == pytest.approx(1.96)


def test_effects_read_as_table_rows():
    e = fx.Effect(1, "d_model", "elasticity", None, None, 1.7, 1.6, 1.8, 12)
    r = fx.Effect(1, "precision", "ratio", "bf16", "fp32", 2.0, None, None, 2)
    assert e.row() == ("d_model", "step time ~ d_model^e", "e = 1.70", "1.60 to 1.80", "12")
    assert r.row() == ("precision", "bf16 vs fp32", "2.00x", "-", "2")
