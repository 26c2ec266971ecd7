"""The fitted effects recover known laws from synthetic runs written through the real Store, including
the awkward cases: followers set by hand, unequal noise, pass drift, incomplete passes, values that
ran identically, runs whose read-back says they ran under other settings, heavy-tailed noise and
disturbed runs."""

import json
import math
import random

import pytest
from sqlalchemy import text

from orchestrator.stats import effects as fx
from orchestrator.queue.store import Store
from orchestrator.queue.sweep import Machine, load
from common.variables import DERIVED_BY_NAME
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all


def results(store: Store) -> list[dict]:
    with store.transaction() as conn:
        res = conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))
        return [dict(r._mapping) for r in res]


def analyse(store: Store, **kw) -> fx.Analysis:
    return fx.analyse(results(store), **kw)


def only_machine(a: fx.Analysis) -> fx.MachineAnalysis:
    (m,) = a.machines.values()
    return m


def by_variable(a: fx.Analysis) -> dict[str, fx.VariableEffect]:
    return {ve.variable: ve for ve in only_machine(a).variables}


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

    a = analyse(store)

    (ve,) = only_machine(a).variables
    assert ve.variable == "d_model" and ve.size_like
    e = ve.elasticity
    assert e.estimate == pytest.approx(1.7, rel=0.05)
    assert e.ci_low < 1.7 < e.ci_high and e.ci95[0] < 1.7 < e.ci95[1]
    assert e.ci_low < e.ci95[0] and e.ci95[1] < e.ci_high  # the family-wise interval is the wider
    assert e.n_runs == 12 and e.significant and e.p_adjusted < 0.05
    assert only_machine(a).together == ["head_dim"]  # head_dim = d_model / n_heads moved with it, not on its own
    assert ve.followers == ["head_dim"]


def test_categorical_ratio_to_the_baseline_is_recovered_within_5_percent(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"precision": "fp32"}, {"precision": ["fp32", "bf16"]}, repeats=4))
    noise = noisy(1)
    run_all(store, m, lambda c: ("done", None, metrics((20.0 if c["precision"] == "fp32" else 40.0) * noise(), c)))

    (ve,) = only_machine(analyse(store)).variables

    assert not ve.size_like and ve.elasticity is None
    assert ve.baseline.label == "fp32"
    (ratio,) = ve.ratios
    assert (ratio.value, ratio.baseline, ratio.kind) == ("bf16", "fp32", "ratio")
    assert ratio.estimate == pytest.approx(2.0, rel=0.05)
    assert ratio.ci_low < ratio.estimate < ratio.ci_high
    assert ratio.family == 1 and ratio.ci_adj == pytest.approx(ratio.ci95)  # one comparison: nothing to adjust


def test_one_factor_at_a_time_groups_hold_the_other_variables_at_the_base(store):
    m = store.register_machine(machine_facts("alpha"))
    base = {"n_layers": 2, "seq_len": 128}
    enqueue(store, configs(base, {"n_layers": [1, 2, 4], "seq_len": [64, 128, 256]}, repeats=2))
    noise = noisy(2, 0.01)
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["seq_len"] ** 1.2 / 10 * noise(), c)))

    found = by_variable(analyse(store))

    assert found["n_layers"].fixed == {"seq_len": "128"}
    assert found["seq_len"].fixed == {"n_layers": "2"}
    assert found["n_layers"].elasticity.estimate == pytest.approx(1.0, abs=0.03)
    assert found["seq_len"].elasticity.estimate == pytest.approx(1.2, abs=0.03)


def test_failed_and_skipped_runs_never_enter_an_average(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2}, {"cores": [1, 2]}, repeats=3))

    def outcome(c):
        if c["repeat"] == 2:  # a failed run that still left a (wrong) metric behind
            return "failed", "boom", {"step_ms_median": 1e6}
        return "done", None, metrics(100.0 / c["cores"] * (1.01 if c["repeat"] else 1.0), c)
    run_all(store, m, outcome)

    ma = only_machine(analyse(store))

    (ve,) = ma.variables
    assert ve.variable == "cores"
    assert sorted(ma.together) == ["inter_threads", "intra_threads", "omp_threads"]
    assert [lv.n for lv in ve.levels] == [2, 2]
    assert ve.elasticity is None  # two values: the ratio is the one test, not counted twice
    (r,) = ve.ratios
    assert r.estimate == pytest.approx(2.0 if r.value == "1" else 0.5, rel=1e-9)


def test_a_two_variable_grid_is_found_but_a_one_at_a_time_cross_is_not(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"n_layers": 2, "d_model": 64}, {"n_layers": [1, 2], "d_model": [64, 128]}, repeats=1,
                           grid=True))
    enqueue(store, configs({"n_layers": 2, "d_model": 64}, {"seq_len": [64, 128]}, repeats=1), sweep="ofat")
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["d_model"] * c["seq_len"] / 1000, c)))

    (grid,) = fx.grids(only_machine(analyse(store)))

    assert {grid.rows, grid.cols} == {"n_layers", "d_model"}
    assert all(v is not None for row in grid.step_ms for v in row)


# -- followers ----------------------------------------------------------------------------------

def test_a_follower_set_by_hand_stays_out_of_its_parents_comparison(store):
    """The audit's case: cores varied with the threads following it, and omp_threads=1 set by hand at
    cores=2. Pooling the omp_threads=1 runs into cores=2 halved the cores exponent."""
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2}, {"cores": [1, 2], "omp_threads": [1, 2]}, repeats=3))
    noise = noisy(3, 0.02)
    # step time ~ cores^-0.1 * omp_threads^-0.7: -0.8 when the threads follow cores
    run_all(store, m, lambda c: ("done", None,
                                 metrics(100 * c["cores"] ** -0.1 * c["omp_threads"] ** -0.7 * noise(), c)))

    found = by_variable(analyse(store))

    cores, omp = found["cores"], found["omp_threads"]
    (r,) = cores.ratios  # cores=1 vs 2: 2^0.8 with the threads following
    true = 2 ** 0.8 if r.value == "1" else 2 ** -0.8
    assert r.estimate == pytest.approx(true, rel=0.05)
    assert r.ci_low < true < r.ci_high
    assert [lv.n for lv in cores.levels] == [3, 3]  # the omp_threads=1 runs at cores=2 are not in it
    assert cores.left_out == 3
    assert cores.followers == ["omp_threads", "intra_threads", "inter_threads"]
    assert omp.ratios[0].estimate == pytest.approx(2 ** 0.7 if omp.ratios[0].value == "1" else 2 ** -0.7, rel=0.05)
    assert omp.fixed == {"cores": "2"}


def test_jobs_record_which_values_were_derived_and_the_rules_agree_with_the_record(store):
    plan = load(preset="quick", machine=Machine(cpu_count=2))
    store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.jobs)
    with store.transaction() as conn:
        jobs = [(json.loads(c), json.loads(d)) for c, d in conn.execute(text("SELECT config, derived FROM jobs"))]

    assert len(jobs) == len(plan.jobs)
    hand = [(c, d) for c, d in jobs if c["omp_threads"] == 1 and c["cores"] == 2]
    assert hand and all("omp_threads" not in d and d["intra_threads"] == "auto" for _, d in hand)
    base = [d for c, d in jobs if c["cores"] == 2 and c["omp_threads"] == 2 and c["head_dim"] == 64]
    assert any(d == {"cores": "all", "compile": "auto", "omp_threads": "auto", "intra_threads": "auto",
                     "inter_threads": "auto", "head_dim": "auto", "kv_heads": "auto", "blas": "auto", "lr": "auto",
                     "eval_every": "auto"}
               for d in base)
    for config, derived in jobs:  # the fallback for jobs without a record gives the same answer
        for name in derived:  # a later release's variable at its unset value is left out of the JSON (blas)
            if name in DERIVED_BY_NAME and name in config:
                assert config[name] == DERIVED_BY_NAME[name].rule(config), (name, config)


OFAT_FOLLOWERS = """
[sweep]
name = "followers"
mode = "ofat"
repeats = 2
[base]
d_model = 64
n_heads = 4
[axes]
cores = [1, 2]
omp_threads = [1, 2]
n_heads = [2, 4]
head_dim = [8, 16]
kv_heads = [2, 4]
"""


def test_jobs_without_a_derived_record_are_grouped_by_the_rules_alike(store, tmp_path):
    """An old database has no jobs.derived: the rules recomputed from the config give the same groups."""
    (tmp_path / "followers.toml").write_text(OFAT_FOLLOWERS)
    plan = load(tmp_path / "followers.toml", machine=Machine(cpu_count=2))
    store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.jobs)
    m = store.register_machine(machine_facts("alpha"))
    noise = noisy(4, 0.02)
    run_all(store, m, lambda c: ("done", None, metrics(
        50 * c["cores"] ** -0.5 * c["omp_threads"] ** -0.3 * c["head_dim"] ** 0.3 * c["kv_heads"] ** 0.1 * noise(), c)))
    recorded = results(store)
    assert all(r["derived"] is not None for r in recorded)
    old = [dict(r, derived=None) for r in recorded]

    def table(rows):
        return sorted((e.variable, e.value or "", round(e.estimate, 9), e.n_runs) for e in fx.analyse(rows).effects)
    assert table(recorded) == table(old)
    assert {v for v, *_ in table(old)} == {"cores", "omp_threads", "n_heads", "head_dim", "kv_heads"}


COPIES = """
[sweep]
mode = "ofat"
repeats = 4
[base]
d_model = 64
[axes]
cores = { values = [1, 2], blocks_per_pass = 3 }
n_layers = [1, 2, 4]
"""


def test_an_axis_with_three_blocks_a_pass_is_one_block_of_the_model_per_pass(store, tmp_path):
    """cores = { blocks_per_pass = 3 }: the model takes a pass's three copies (each a cores=1 job and
    its baseline job) as one block of six runs. Three blocks of two runs would leave each run's block
    effect fitted to it and its partner, and the 1-core runs with no residual of their own."""
    (tmp_path / "copies.toml").write_text(COPIES)
    plan = load(tmp_path / "copies.toml", machine=Machine(cpu_count=2))
    store.enqueue(name=plan.name, source=plan.source, sweep_text=plan.text, jobs=plan.jobs)
    m = store.register_machine(machine_facts("alpha"))
    rng, level = random.Random(3), [0.0]

    def outcome(c):  # the machine wanders in time (a random walk), 1-core runs noisier than 2-core ones
        level[0] += rng.gauss(0, 0.03)
        ms = 50 * (1.5 if c["cores"] == 1 else 1.0) * c["n_layers"] ** 0.9 / 2 ** 0.9
        return "done", None, metrics(ms * math.exp(level[0] + rng.gauss(0, 0.06 if c["cores"] == 1 else 0.02)), c)
    run_all(store, m, outcome)

    ma = only_machine(a := analyse(store))
    assert len(ma.model.block_index) == 4 * 2  # passes x stretches, not passes x blocks (4 x 4)
    assert all(math.isfinite(s.sigma2) for s in ma.noise.strata)
    (cores,) = [e for e in a.effects if e.variable == "cores" and e.kind == "ratio"]
    assert cores.n_runs >= 12 and cores.ci_low <= 1.5 <= cores.ci_high and cores.significant


# -- noise and intervals --------------------------------------------------------------------------

def three_levels(store, *, sigmas: dict, drift=(0.0, 0.0, 0.0), repeats=3, seed=5, others=12):
    """precision at three levels (fp32 1x, bf16 1.5x, mixed 1.2x), each with its own noise, and `others`
    configurations of an unrelated axis (n_layers) that share the passes."""
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"precision": "fp32", "n_layers": 2},
                           {"precision": ["fp32", "bf16", "mixed"],
                            "vocab_size": [256 + 64 * i for i in range(others)]},
                           repeats=repeats))
    rng = random.Random(seed)
    truth = {"fp32": 1.0, "bf16": 1.5, "mixed": 1.2}

    def outcome(c):
        shift = drift[c["repeat"]] if c["repeat"] < len(drift) else 0.0
        log_t = math.log(30 * truth[c["precision"]]) + shift + rng.gauss(0, sigmas[c["precision"]])
        return "done", None, metrics(math.exp(log_t), c)
    run_all(store, m, outcome)
    return m


def width(e: fx.Effect) -> float:
    lo, hi = e.ci95
    return math.log(hi / lo)


def test_each_value_keeps_its_own_noise_so_one_noisy_value_widens_only_its_own_interval(store):
    three_levels(store, sigmas={"fp32": 0.01, "bf16": 0.15, "mixed": 0.01}, repeats=4, drift=(0.0,) * 4)

    ve = by_variable(analyse(store))["precision"]

    ratios = {e.value: e for e in ve.ratios}
    assert width(ratios["bf16"]) > 5 * width(ratios["mixed"])
    assert ratios["mixed"].estimate == pytest.approx(1.2, rel=0.03)
    assert ratios["mixed"].ci_low < 1.2 < ratios["mixed"].ci_high
    assert ratios["bf16"].ci_low < 1.5 < ratios["bf16"].ci_high
    assert ratios["mixed"].significant  # a pooled variance (0.09 over three values) would hide it
    noise = only_machine(analyse(store)).noise
    assert noise.noisiest[0][0] == "precision=bf16"


def test_pass_drift_shared_by_a_pass_is_removed_before_comparing(store, tmp_path):
    three_levels(store, sigmas={"fp32": 0.02, "bf16": 0.02, "mixed": 0.02}, drift=(0.0, 0.25, -0.2))
    calm = Store(str(tmp_path / "calm.db"))
    three_levels(calm, sigmas={"fp32": 0.02, "bf16": 0.02, "mixed": 0.02})

    drifting, steady = analyse(store), analyse(calm)

    for a, b in zip(by_variable(drifting)["precision"].ratios, by_variable(steady)["precision"].ratios):
        assert a.estimate == pytest.approx(b.estimate, rel=1e-6)  # the same noise draws: drift gone
        assert width(a) == pytest.approx(width(b), rel=0.05)
    rel = only_machine(drifting).drift.relative()
    assert rel[1] == pytest.approx(math.exp(0.25), rel=0.02) and rel[2] == pytest.approx(math.exp(-0.2), rel=0.02)
    noise = only_machine(drifting).noise
    assert noise.cv == pytest.approx(0.02, abs=0.01) and noise.cv_with_drift > 0.1


def test_a_pass_with_few_shared_configurations_still_has_its_drift_estimated_in_the_model(store):
    """The audit's case: a fourth pass of only the precision comparison (three configurations) used
    to keep shift 0 while the others were centred, biasing its values. The model estimates every
    block's effect from whatever configurations it shares, and pays for it in degrees of freedom."""
    m = three_levels(store, sigmas={"fp32": 0.02, "bf16": 0.02, "mixed": 0.02}, repeats=3, others=6)
    fourth = [c for c in configs({"precision": "fp32", "n_layers": 2}, {"precision": ["fp32", "bf16", "mixed"]},
                                 repeats=4)
              if c["repeat"] == 3]
    enqueue(store, fourth, sweep="more")
    # the fourth pass ran 6% slower than the first, as the audit's later passes did
    run_all(store, m, lambda c: ("done", None,
                                 metrics(30 * 1.06 * {"fp32": 1.0, "bf16": 1.5, "mixed": 1.2}[c["precision"]], c)))

    ma = only_machine(analyse(store))

    assert ma.drift.not_estimated == []
    ve = by_variable(analyse(store))["precision"]
    ratios = {e.value: e for e in ve.ratios}
    assert ratios["bf16"].estimate == pytest.approx(1.5, rel=0.03)
    assert ratios["mixed"].estimate == pytest.approx(1.2, rel=0.03)
    assert all(e.ci_low < {"bf16": 1.5, "mixed": 1.2}[e.value] < e.ci_high for e in ve.ratios)
    assert [lv.n for lv in ve.levels] == [4, 4, 4]


def test_a_value_that_ran_once_gets_no_interval_and_no_test(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"optimizer": "adamw"}, {"optimizer": ["adamw", "sgd"]}, repeats=1))
    run_all(store, m, lambda c: ("done", None, metrics(20.0 if c["optimizer"] == "adamw" else 30.0, c)))

    a = analyse(store)

    (e,) = a.effects
    assert e.estimate == pytest.approx(1.5)
    assert e.se is None and e.p_value is None and e.significant is None and e.ci_low is None
    assert a.family == 0 and e.verdict() == "not tested: nothing was repeated, so the machine's noise is not known"


def test_bonferroni_adjusts_every_test_once_and_the_verdict_agrees_with_the_interval_shown():
    effects = [fx.Effect(1, f"v{i}", "ratio", "b", "a", math.exp(t * 0.01), 0.01, 10.0, 6,
                         p_value=fx.two_sided_p(t, 10.0)) for i, t in enumerate([3.0, 4.5, 5.2, 6.0, 2.0])]
    untested = fx.Effect(1, "w", "ratio", "b", "a", 1.1, None, None, 2)

    assert fx.adjust(effects + [untested]) == 5

    for e in effects:
        assert e.p_adjusted == pytest.approx(min(1.0, 5 * e.p_value))
        lo, hi = e.ci_adj
        assert e.significant == (not lo <= 1.0 <= hi), (e.variable, e.p_adjusted, lo, hi)
    assert untested.significant is None and untested.family == 5


def test_variables_rank_by_effect_relative_to_uncertainty_not_by_size(store):
    """A large but noisy difference ranks below a small, clear one, and is called no detectable effect."""
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"optimizer": "adamw", "activation": "gelu"},
                           {"optimizer": ["adamw", "sgd"], "activation": ["gelu", "relu"]}, repeats=3))
    rng = random.Random(6)

    def outcome(c):
        if c["optimizer"] == "sgd":  # 1.4x on average, but 60% noise
            return "done", None, metrics(20 * 1.4 * math.exp(rng.gauss(0, 0.6)), c)
        factor = 1.15 if c["activation"] == "relu" else 1.0
        return "done", None, metrics(20 * factor * math.exp(rng.gauss(0, 0.005)), c)
    run_all(store, m, outcome)

    a = analyse(store)
    ranked = a.ranked()

    assert [ve.variable for ve in ranked] == ["activation", "optimizer"]
    assert ranked[0].headline.significant and not ranked[1].headline.significant
    assert ranked[1].span > ranked[0].span or ranked[1].headline.ci_high > 2  # large, but not resolved


def test_t_quantiles_are_students():
    assert fx.t975(2) == pytest.approx(4.303, abs=1e-3)
    assert fx.t975(2.5) < fx.t975(2)  # fractional (Satterthwaite) degrees of freedom
    assert fx.t975(math.inf) == pytest.approx(1.95996, abs=1e-4)
    assert fx.two_sided_p(4.303, 2) == pytest.approx(0.05, abs=1e-3)


def test_effects_read_as_table_rows():
    e = fx.Effect(1, "d_model", "elasticity", None, None, 1.7, 0.02, 10.0, 12, family=1)
    r = fx.Effect(1, "precision", "ratio", "bf16", "fp32", 2.0, None, None, 2)
    lo, hi = e.ci_adj
    assert lo == pytest.approx(1.7 - 2.228 * 0.02, abs=1e-3)  # t(10 dof) for one comparison
    assert e.row() == ("d_model", "step time ~ d_model^e", "e = 1.70", f"{lo:.2f} to {hi:.2f}", "12")
    assert r.row() == ("precision", "bf16 vs fp32", "2.00x", "-", "2")


# -- what really ran ----------------------------------------------------------------------------

def test_asked_values_that_ran_identically_are_said_to_be_so_not_reported_as_an_effect(store):
    m = store.register_machine(machine_facts("alpha"))
    hub = "ThomasTheMaker/Arc-Corpus-sample"
    enqueue(store, configs({"dataset": hub}, {"dataset": [hub, "builtin"], "n_layers": [1, 2]}, repeats=2))
    noise = noisy(7)
    # The hub could not be reached: every run trained on the built-in corpus.
    run_all(store, m, lambda c: ("done", None, {**metrics(10 * c["n_layers"] * noise(), c), "dataset_used": "builtin"}))

    ma = only_machine(analyse(store))

    assert "dataset" not in {ve.variable for ve in ma.variables}
    (note,) = ma.identical
    assert "`dataset`" in note and "ran identically" in note and "builtin" in note
    (ve,) = ma.variables
    assert ve.baseline.n == 4  # the hub-asked and builtin-asked runs at n_layers=2 ran the same


def test_a_done_run_whose_read_back_differs_counts_under_what_it_ran_with(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2, "intra_threads": 2}, {"intra_threads": [1, 2]}, repeats=3))

    def outcome(c):
        ran = 1 if c["intra_threads"] == 1 or c["repeat"] == 0 else 2  # one intra_threads=2 run really ran 1
        return "done", None, {**metrics(30.0 / ran, c), "applied": {"torch_threads": ran}}
    run_all(store, m, outcome)

    ma = only_machine(analyse(store))

    (ve,) = ma.variables
    assert [lv.n for lv in ve.levels] == [4, 2]
    assert (ve.baseline.label, ve.ratios[0].value) == ("1", "2")  # the value most runs really ran with
    assert ve.ratios[0].estimate == pytest.approx(0.5)
    assert ma.regrouped == ["1 run(s) asked for intra_threads=2 ran with intra_threads=1 (read back in the child) "
                            "and count under 1"]


@pytest.mark.parametrize("kind", ["ratio", "elasticity"])
def test_runs_needed_comes_from_the_same_standard_error_quantile_and_family_as_the_test(kind):
    """An unresolved effect with 20 runs per value is never told that 20 or fewer would resolve it,
    and the figure is the first run count at which the shown test reaches 80% power."""
    e = fx.Effect(machine_id=1, variable="cores", kind=kind, value="1" if kind == "ratio" else None,
                  baseline="2" if kind == "ratio" else None, estimate=0.9 if kind == "ratio" else -0.15,
                  se=0.10, dof=38.0, n_runs=40, min_runs=20, significant=False, log_range=math.log(2))
    needed = fx._repeats_needed(e, family=4)
    z = fx.family_quantile(4, 38.0) + fx.t_quantile(fx.POWER, 38.0)
    size = abs(e.log_effect)
    assert needed > 20
    assert z * e.se * math.sqrt(20 / needed) <= size < z * e.se * math.sqrt(20 / (needed - 1))


def test_disturbed_runs_are_left_out_of_every_fit_and_counted(store):
    m = store.register_machine(machine_facts("busy"))
    enqueue(store, configs({"precision": "fp32"}, {"precision": ["fp32", "mixed"]}, repeats=4))
    rng = random.Random(1)
    seen = []

    def outcome(c):
        seen.append(c)
        ms = 30 * (1.2 if c["precision"] == "mixed" else 1.0) * math.exp(rng.gauss(0, 0.01))
        other = 0.0
        if c["precision"] == "mixed" and len([s for s in seen if s["precision"] == "mixed"]) == 2:
            ms, other = ms * 2.0, 0.2 * 10.0 * c["cores"]  # another process took 20% of its CPUs
        fields = metrics(ms, c) | {"train_s": 10.0, "steal_s": 0.0, "other_cpu_s": other}
        return "done", None, fields
    run_all(store, m, outcome)

    a = analyse(store)
    ma = only_machine(a)
    (gone,) = ma.disturbed
    assert gone.values["precision"] == "mixed" and gone.step_ms > 50
    assert len(ma.runs) == 7 and not ma.disturbed_kept
    (mixed,) = by_variable(a)["precision"].ratios
    assert mixed.estimate == pytest.approx(1.2, rel=0.02) and mixed.n_runs == 7
    assert mixed.significant


def test_repeats_added_to_some_configurations_move_neither_the_baseline_nor_the_group(store):
    """work --target-ci repeats only the jobs of wide comparisons, so some configurations gain runs.
    The baseline and the comparison group count each configuration once: they stay where the plan
    put them (the adaptive run on the VM flipped 'd_model=64 vs 128' to '128 vs 64' mid-run)."""
    m = store.register_machine(machine_facts("alpha"))
    grid = configs({"d_model": 96, "n_layers": 2}, {"d_model": [96, 160], "n_layers": [2, 3]}, repeats=3, grid=True)
    extra = [c for c in configs({"d_model": 160, "n_layers": 3}, {}, repeats=9) if c["repeat"] >= 3]
    enqueue(store, grid + extra)
    rng = random.Random(2)
    run_all(store, m, lambda c: ("done", None, metrics(
        10 * (c["d_model"] / 96) * (c["n_layers"] / 2) * math.exp(rng.gauss(0, 0.01)), c)))

    a = analyse(store)
    ve = by_variable(a)["d_model"]

    assert ve.baseline.label == "96"  # 2 configurations each (neither the default): the lower, not the most run
    assert ve.fixed == {"n_layers": "2"}  # the group at n_layers=2, though n_layers=3 has 9 runs per value
    (r,) = ve.ratios
    assert r.value == "160" and r.estimate == pytest.approx(160 / 96, rel=0.02)


def test_blas_is_compared_within_the_numpy_trainer_and_the_framework_comparison_keeps_each_own_library(store):
    """blas follows framework (torch: mkl_intel_path, numpy: openblas); a blas comparison exists only where it
    takes several values, the NumPy trainer; a numpy run on MKL is not pooled into the framework one."""
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"framework": "torch"}, {"framework": ["torch", "numpy"]}, repeats=4)
            + configs({"framework": "numpy"}, {"blas": ["openblas", "mkl", "blis"]}, repeats=4))
    noise = noisy(5, 0.01)
    truth = {("torch", "mkl_intel_path"): 100.0, ("numpy", "openblas"): 300.0, ("numpy", "mkl"): 360.0,
             ("numpy", "blis"): 450.0}
    run_all(store, m, lambda c: ("done", None, metrics(truth[(c["framework"], c["blas"])] * noise(), c)))

    found = by_variable(analyse(store))

    blas, framework = found["blas"], found["framework"]
    assert blas.fixed.get("framework") == "numpy"
    medians = {lv.label: lv.median_step_ms for lv in blas.levels}
    assert medians == pytest.approx({"openblas": 300.0, "mkl": 360.0, "blis": 450.0}, rel=0.03)
    assert {lv.label: lv.n for lv in framework.levels} == {"torch": 4, "numpy": 4}  # numpy at openblas only
    assert "blas" in framework.followers
