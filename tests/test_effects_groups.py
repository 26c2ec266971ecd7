"""effects' comparison groups and elasticity levels, worked out on whole columns (for 100k configurations),
against the cell-by-cell rules they stand for: a dict of key tuples filled cell by cell, the group chosen
by a max over its items, Model.weights_of's sums and np.mean of each group's list, to the last digit and
in the same order."""

import json
import math
import random
from collections import Counter, defaultdict

import numpy as np

from orchestrator.stats import cells as cl
from orchestrator.stats import effects as fx
from orchestrator.stats import ran
from orchestrator.stats.noise import Model
from common.variables import NAMES


def row(run_id: int, rng: random.Random) -> dict:
    r = {n: None for n in NAMES}
    d_model, n_heads = rng.choice([32, 64, 96]), rng.choice([1, 2, 4])
    hand = rng.random() < 0.2  # head_dim set by hand: not at its derived value
    r.update(run_id=run_id, job_id=run_id // 2, status="done", step_ms_median=rng.uniform(50, 150),
             repeat=rng.randrange(3), other_cpu_s=None, steal_s=None, cores=2, train_s=10.0, applied=None,
             dataset_used=None, d_model=d_model, n_heads=n_heads, n_layers=rng.choice([1, 2, 3]),
             batch_size=rng.choice([1, 2, 4, 8]), head_dim=8 if hand else d_model // n_heads,
             # recorded at enqueue (or not: an older job): one configuration in two cells
             derived=rng.choice([None, json.dumps({"head_dim": d_model // n_heads})]) if not hand else None)
    return r


def cells_of(seed: int, n: int = 300) -> cl.Cells:
    rng = random.Random(seed)
    rows = [row(i, rng) for i in range(n)]
    rows += [dict(r, run_id=n + i) for i, r in enumerate(rng.sample(rows, n // 5))]  # repeats of some cells
    return cl.Cells(ran.as_ran(rows))


VARIED = ["n_layers", "d_model", "n_heads", "head_dim", "batch_size"]


def groups_by_dict(cells: cl.Cells, free: set, varied: list) -> tuple[list, dict]:
    """The comparison groups as a dict of key tuples filled cell by cell."""
    follow = set().union(*(ran.followers_of(n) for n in free)) - free
    keys = [n for n in varied if n not in free]
    groups = defaultdict(list)
    for c, r in enumerate(cells.rep):
        groups[tuple(cl.DERIVED_MARK if n in follow and r.at_derived(n) else r.values[n] for n in keys)].append(c)
    return keys, groups


def best_by_dict(cells: cl.Cells, groups: dict, distinct) -> tuple:
    """The most distinct values, then the most key values at the modal ones, then the most configurations;
    ties: the group seen first."""
    n_configs = {k: len({cells.rep[c]._key for c in ms}) for k, ms in groups.items()}
    modal = []
    for i in range(len(next(iter(groups)))):
        counts = Counter()
        for k in groups:
            counts[k[i]] += n_configs[k]
        modal.append(counts.most_common(1)[0][0])
    return max(groups, key=lambda k: (distinct(groups[k]), sum(a == b for a, b in zip(k, modal)), n_configs[k]))


def test_groups_are_the_dict_of_keys_filled_cell_by_cell_in_its_order():
    for seed in range(6):
        cells = cells_of(seed)
        for free in ({"d_model"}, {"n_heads"}, {"batch_size"}, {"d_model", "n_layers"}):
            keys, want = groups_by_dict(cells, free, VARIED)
            got = cl.Groups(cells, free, VARIED)
            assert got.keys == keys and got.size == len(want)
            assert [got.key(g) for g in range(got.size)] == list(want)
            assert [got.members(g) for g in range(got.size)] == list(want.values())
            runs = got.n_runs()
            assert [int(runs[g]) for g in range(got.size)] == [cells.n_runs(ms) for ms in want.values()]


def test_the_best_group_and_the_groups_in_key_order_are_those_of_the_cell_by_cell_rules():
    for seed in range(6):
        cells = cells_of(seed)
        for free in ({"d_model"}, {"n_heads"}, {"batch_size"}):
            (name,) = free
            keys, want = groups_by_dict(cells, free, VARIED)
            groups = cl.Groups(cells, free, VARIED)
            n_values = groups.distinct(cells.codes(name)[0])
            assert n_values.tolist() == [len(cells.values(ms, name)) for ms in want.values()]
            best = cl.best_group(cells, groups, n_values)
            assert groups.key(best) == best_by_dict(cells, want, lambda ms: len(cells.values(ms, name)))
            in_order = sorted(want, key=lambda k: [ran.sort_key(n, v) if v != cl.DERIVED_MARK else (2, 0, "")
                                                   for n, v in zip(keys, k)])
            assert [groups.key(g) for g in groups.by_key(np.arange(groups.size))] == in_order
            beside = [k for k in want if k != groups.key(best) and all(
                a == b or cl.DERIVED_MARK in (a, b) for a, b in zip(k, groups.key(best)))]
            assert [groups.key(g) for g in np.flatnonzero(groups.beside(best))] == beside


def test_level_weights_are_weights_of_to_the_last_digit_in_its_order():
    rng = random.Random(7)
    cells = cells_of(3)
    configs = list({r._key: None for r in cells.rep})
    rng.shuffle(configs)  # indices in no order of the cells'
    model = Model(None, {k: i for i, k in enumerate(configs)}, {}, [])
    index = cells.configs(model)
    for k in range(60):
        if k % 2:  # levels that overlap, in cells or in configurations
            levels = [rng.sample(list(cells.all), rng.randint(1, 12)) for _ in range(rng.randint(1, 8))]
        else:  # each configuration in one level (a grid's)
            some = rng.sample(sorted({index[c]: c for c in cells.all}.values()), 40)
            levels = [some[i:i + 5] for i in range(0, 40, 5)]
        coefs = [rng.choice([rng.gauss(0, 1), 1 / 3, -0.0, 0.0]) for _ in levels]
        want = model.weights_of([{index[c] for c in lv} for lv in levels], coefs)
        flat = np.array([c for lv in levels for c in lv])
        level = np.repeat(np.arange(len(levels)), [len(lv) for lv in levels])
        got = cells.level_weights(model, flat, level, np.array(coefs))
        assert list(got) == list(want)
        assert [(v, math.copysign(1, v)) for v in got.values()] == [(v, math.copysign(1, v)) for v in want.values()]


def test_each_groups_mean_is_np_mean_of_its_list_to_the_last_digit():
    rng = random.Random(11)
    sizes = [rng.choice([1, 2, 3, 7, 8, 9, 10, 16, 17, 129, 300]) for _ in range(200)]
    lists = [[math.log(rng.uniform(1, 1000)) for _ in range(k)] for k in sizes]
    means = fx._group_means(np.array([x for xs in lists for x in xs]), np.repeat(np.arange(len(sizes)), sizes))
    assert means.tolist() == [float(np.mean(xs)) for xs in lists]


def test_an_elasticitys_levels_are_each_groups_values_as_floats_in_the_order_of_their_first_cells():
    for seed in range(6):
        cells = cells_of(seed)
        _, want = groups_by_dict(cells, {"batch_size"}, VARIED)
        groups = [ms for ms in want.values() if rng_pick(ms)] + [[0]]  # some groups, and one of one value
        col = cells.column("batch_size")
        levels = []
        for g, ms in enumerate(groups):
            by_value = defaultdict(list)
            for c in ms:
                by_value[float(col[c])].append(c)
            if len(by_value) >= 2:
                levels += [(g, math.log(v), cs) for v, cs in by_value.items()]
        slope = fx._slope_cells(cells, groups, "batch_size")
        kept = sorted({g for g, _, _ in levels})
        assert slope.group.tolist() == [kept.index(g) for g, _, _ in levels]
        assert slope.log_value.tolist() == [x for _, x, _ in levels]
        assert [cs.tolist() for cs in slope.level_cells()] == [cs for _, _, cs in levels]
        assert slope.level.tolist() == [i for i, (_, _, cs) in enumerate(levels) for _ in cs]


def rng_pick(members: list) -> bool:
    return len(members) % 3 != 1
