"""The report's per-run work done column-wise (for a million runs): each fast path gives what the
plain per-run code gives, on rows made to hit its edges (values that are powers of ten, NULLs, runs
that did not finish, disturbed runs, the seed documents' reference configurations among others)."""

from __future__ import annotations

import itertools
import json
import math
import random

from common.variables import NAMES
from orchestrator.stats import config_index, cost_model as cm
from orchestrator.report.sections import prediction as prediction_report, seeds
from orchestrator.report import page_data


def test_round_all_gives_round_of_every_value():
    values = [None, 0, 0.0, -0.0, math.inf, -math.inf, math.nan, True, 1, 7, 100, 1000]
    for k in range(-12, 13):
        p = 10.0 ** k
        values += [p, -p, math.nextafter(p, 0), math.nextafter(p, math.inf), 9.9995 * p, 0.99995 * p]
    rng = random.Random(1)
    values += [rng.lognormvariate(0, 6) * rng.choice((1, -1)) for _ in range(5000)]
    for digits in (3, 4):
        plain = [page_data._round(x, digits) for x in values]
        fast = page_data._round_all(values, digits)
        assert json.dumps(fast) == json.dumps(plain)
        assert [type(x) for x in fast] == [type(x) for x in plain]
    assert page_data._round_all([]) == []


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    refs = [dict(r.config) for r in seeds.PUBLISHED]
    rows = []
    for i in range(n):
        r = dict.fromkeys(NAMES)
        r.update(rng.choice(refs) if rng.random() < 0.4 else {"d_model": rng.choice([32, 64]), "n_layers": 1})
        r.update(run_id=i + 1, machine_id=rng.choice([1, 1, 2]), repeat=rng.choice([0, 1, 2]), steps=20,
                 status=rng.choice(["done"] * 6 + ["failed", "skipped"]), step_ms_median=rng.uniform(1, 100),
                 tokens_per_s=rng.uniform(1, 1e4), mfu=rng.random(), cores=2,
                 other_cpu_s=rng.choice([None, 0.0, 1e6]), train_s=10.0)
        rows.append(r)
    return rows


def test_measured_all_is_measured_of_each_reference():
    rows = _rows(600, 2)
    found = seeds._measured_all(rows)
    assert any(found.values())  # some rows are the references' configurations
    for ref in seeds.PUBLISHED:
        assert repr(found[ref.id]) == repr(seeds.measured(ref, rows))


def test_page_runs_keeps_every_step_th_run_the_unfinished_and_the_drawn():
    rows = _rows(500, 3)
    st = {"variables": [{"levels": [{"run_ids": [5, 77, 400]}]}]}
    for cap in (7, 50, 499):
        step = -(-len(rows) // cap)
        plain = [r for i, r in enumerate(rows) if not i % step or r["status"] != "done" or r["run_id"] in (5, 77, 400)]
        assert page_data.page_runs(rows, st, cap) == plain


def test_the_check_shares_configurations_are_distinct_config_keys():
    rows = _rows(800, 4)
    config_index._last[:] = [None, 0, None]
    names = {1: "one", 2: "two"}
    done, numbers = prediction_report._done_by_machine(rows, names, True)
    raws = config_index.config_index(rows)[1]
    for m in names:
        assert done[m] == [r for r in rows if r["status"] == "done" and r["machine_id"] == m]
        usable = cm.usable(done[m])
        assert len(usable) < len(done[m])  # some were disturbed: the configurations of a subsequence
        configs, keys = prediction_report._configs(usable, done[m], numbers[m], raws)
        assert configs == cm.distinct_config_keys(usable) and keys == cm.config_keys(usable)
    assert list(itertools.chain(*(numbers[m] for m in names)))  # numbered


def test_runs_table_keys_by_configuration_number_are_the_per_run_keys():
    """The page's runs table made from config_index's numbers gives the table made run by run: the
    same configuration texts, numbered in the same order, from the same first runs (rows whose values
    are equal but of another type, 1 and 1.0, share a key either way)."""
    rows = _rows(900, 5)
    for r in rows[::7]:
        r["n_layers"] = float(r["n_layers"]) if r["n_layers"] is not None else None
        r["repeat"] = None
    config_index._last[:] = [None, 0, None]
    modal = page_data.baselines(rows)
    assert any(modal.values())
    names = {1: "one", 2: "two"}
    plain = page_data.runs_table(rows, modal, names, {3, 4})
    fast = page_data.runs_table(rows, modal, names, {3, 4}, config_index.config_index(rows))
    assert json.dumps(fast) == json.dumps(plain) and len(plain["dicts"]["config"]) > 2
    config_index._last[:] = [None, 0, None]


def test_the_sections_fit_takes_an_even_sample_of_a_grids_configurations():
    """Beyond FIT_MAX_CONFIGS configurations the cost model's section fits the runs of an even sample of
    them (in the order they first ran); at or below it, cost_model.thin's rows as they were."""
    most = prediction_report.FIT_MAX_CONFIGS
    rows = [{**dict.fromkeys(NAMES), "run_id": i + 1, "d_model": 32 + i // 2, "n_layers": 1, "repeat": i % 2,
             "status": "done", "step_ms_median": 1.0} for i in range(2 * (most + 500))]
    keys = cm.config_keys(rows)
    configs = list(dict.fromkeys(keys))
    assert len(configs) == most + 500
    kept = prediction_report.fit_share(rows)
    assert kept == prediction_report.fit_share(rows, configs, keys)
    step = len(configs) / most
    assert list(dict.fromkeys(cm.config_keys(kept))) == [configs[int(i * step)] for i in range(most)]
    assert all(keys.count(k) == 2 for k in cm.config_keys(kept[:10]))  # every run of a kept configuration
    small = rows[:2 * most]
    assert prediction_report.fit_share(small) == cm.thin(small)


def test_a_sampled_fit_says_it_rests_on_a_sample_of_the_configurations():
    """The section's basis line names the sample where the fit took one, not "the first passes"."""
    from common.variables import resolve

    most = prediction_report.FIT_MAX_CONFIGS
    base = resolve({}, 2)[0]
    rows = [{**base, "run_id": i + 1, "d_model": 32 + i, "repeat": 0, "block": None, "status": "done",
             "step_ms_median": 1.0 + 0.01 * i} for i in range(most + 100)]
    keys = cm.config_keys(rows)
    configs = list(dict.fromkeys(keys))
    share = {"name": "m", "runs": len(rows), "fit_rows": prediction_report.fit_share(rows, configs, keys),
             "cpus": 2, "configs": len(configs), "check": None}
    entry = prediction_report._entry(share, {}, False)
    assert "refused" not in entry, entry
    assert entry["basis"].startswith(f"{most} of {most + 100} runs (an even sample of {most} of its "
                                     f"{most + 100} configurations, their first passes)"), entry["basis"]


def test_as_ran_takes_config_indexs_values_where_it_read_them_and_finds_the_same():
    """as_ran's job values from config_index (values_of: the very tuples it numbered, of a subsequence of its
    rows) give the runs as_ran reads itself; rows that are not a subsequence get None (read again)."""
    from orchestrator.stats import ran

    rows = _rows(900, 6)
    config_index._last[:] = [None, 0, None]
    config_index.config_index(rows)
    for m in (1, 2):
        mine = [r for r in rows if r["machine_id"] == m]
        done = ran.done_runs(mine)
        assert config_index.values_of(done, config_index.CONFIG_NAMES) == [tuple(map(r.get, ran.FACTORS)) for r in done]
        read, plain = ran.as_ran(mine, read=config_index.values_of), ran.as_ran(mine)
        assert [(r.row, r.values, r.changed, r.disturbed, r.config_key()) for r in read] == \
               [(r.row, r.values, r.changed, r.disturbed, r.config_key()) for r in plain]
        assert [r.cell for r in read].count(read[0].cell) == [r.cell for r in plain].count(plain[0].cell)
    assert config_index.values_of(rows[::-1], config_index.CONFIG_NAMES) is None
    assert config_index.values_of(rows[:3], ("d_model",)) is None
    config_index.forget()
    assert config_index.values_of(rows[:3], config_index.CONFIG_NAMES) is None


def test_positions_finds_a_subsequence_by_identity_and_nothing_else():
    """positions: where each of some items of a list is, where they are some of its very objects in its
    order; None for equal copies, a reordering, or an item twice."""
    items = [{"i": i % 3} for i in range(7)]
    assert config_index.positions(items, items[1::2]) == [1, 3, 5]
    assert config_index.positions(items, []) == []
    assert config_index.positions(items, [dict(items[0])]) is None
    assert config_index.positions(items, [items[4], items[2]]) is None
    assert config_index.positions(items, [items[2], items[2]]) is None


def test_modal_config_and_varied_variables_from_the_configurations_are_those_from_the_values():
    """modal_config and varied_variables read the runs' configuration tuples: the same answers as from
    each run's values dict, for every factor and for a few."""
    from collections import Counter

    from orchestrator.stats import ran

    runs = ran.as_ran(_rows(900, 7))
    configs = ran._configs(runs)

    def plain_modal(names):
        out = {}
        for n in names:
            counts = Counter(r.values[n] for r in configs)
            top = max(counts.values())
            tied = sorted((v for v, c in counts.items() if c == top), key=lambda v: ran.sort_key(n, v))
            default = ran.BY_NAME[n].default
            default = default if isinstance(default, str) else ran.value_of(n, default)
            out[n] = default if default in tied else tied[0]
        return out

    varied = [n for n in ran.FACTORS if len({r.values[n] for r in runs}) > 1]
    assert ran.varied_variables(runs) == varied and len(varied) > 1 and ran.varied_variables([]) == []
    for names in (ran.FACTORS, varied, varied[:1], ()):  # (): a machine whose runs vary no variable
        assert ran.modal_config(runs, names) == plain_modal(names)


def test_the_pages_parts_worked_out_ahead_are_the_pages_own():
    """ahead_of_analysis (a child's, before the analysis) finds the disturbed runs as as_ran marks them, and
    its parts are those page() works out itself with them."""
    from orchestrator.stats import ran

    rows = _rows(700, 8)
    names = {1: "one", 2: "two"}
    config_index._last[:] = [None, 0, None]
    disturbed = {r.row["run_id"] for r in ran.as_ran(rows) if r.disturbed}
    assert disturbed and ran.disturbed_run_ids(rows) == disturbed
    ahead = page_data.ahead_of_analysis(rows, names)
    own = page_data.rows_part(rows, names, disturbed, None, ran.done_runs(rows))
    assert ahead == own and ahead["runs"]["n"] == len(rows)
    assert page_data.ahead_of_analysis(rows, names) is not None
    config_index.forget()
