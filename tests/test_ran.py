"""ran.as_ran, built column by column (for a million runs), against the one-run rules it must agree
with: disturbed() row by row, a cell per configuration asked and read back alike, a cell of its own for a
run whose read-back cannot be hashed or for every run with share=False."""

import json
import math
import random

import numpy as np

from orchestrator.stats import ran
from common.metrics import DISTURBED_FLOOR_S
from common.variables import NAMES


def row(run_id: int, **kw) -> dict:
    r = {n: None for n in NAMES}
    r.update(run_id=run_id, job_id=run_id, status="done", step_ms_median=100.0 + run_id, repeat=run_id % 3,
             other_cpu_s=None, steal_s=None, cores=2, train_s=10.0, applied=None, derived=None, dataset_used=None)
    r.update(kw)
    return r


def fleet() -> list[dict]:
    quiet = json.dumps({"affinity": [0, 1], "omp_num_threads": 2})
    wide = json.dumps({"affinity": list(range(8)), "timed_window": {"start_unix_s": 0, "end_unix_s": 100}})
    return [
        row(1, d_model=64),
        row(2, d_model=64),  # the same cell as run 1
        row(3, d_model=128, other_cpu_s=0.0),  # surely quiet
        row(4, d_model=128, other_cpu_s=5.0),  # disturbed: 5 s of 2 CPUs x 10 s is above 5%
        row(5, d_model=128, other_cpu_s=5.0, applied=wide),  # not disturbed: 8 CPUs x 100 s
        row(6, d_model=64, steal_s=0.01, cores=0),  # cores 0: asked of _disturbance, quiet
        row(7, d_model=64, other_cpu_s=False),  # equal to 0.0 but not a float: asked of _disturbance
        row(8, d_model=64, applied=quiet),  # read back: another cell
        row(9, d_model=64, applied=quiet),
        row(10, d_model=64, applied={"omp_num_threads": [2]}),  # an unhashable read-back: a cell of its own
        row(11, d_model=64, applied={"omp_num_threads": [2]}),
        row(12, d_model=64, steal_s=0.6, cores=1),  # disturbed by steal at 1 CPU
        row(13, status="failed", d_model=64),  # not done: no run
        row(14, d_model=64, step_ms_median=None),
    ]


def test_as_ran_agrees_with_the_rules_run_by_run():
    rows = fleet()
    runs = ran.as_ran(rows)
    assert [r.row["run_id"] for r in runs] == list(range(1, 13))
    for r in runs:  # disturbed() asks row by row what as_ran asked once per distinct figures
        assert r.disturbed == ran.disturbed(r.row), r.row["run_id"]
        assert r.pass_ == r.row["repeat"] and r.log_ms == math.log(r.row["step_ms_median"])
        assert r.config_key() == tuple(r.values[n] for n in ran.FACTORS)
    assert [r.row["run_id"] for r in runs if r.disturbed] == [4, 12]
    cell = {r.row["run_id"]: r.cell for r in runs}
    assert cell[1] == cell[2] == 0 and runs[0].values is runs[1].values  # a cell's runs share one values dict
    assert cell[3] == cell[4] == cell[5] and cell[8] == cell[9] != cell[1]
    assert cell[10] is not cell[11] and not isinstance(cell[10], int)  # each a cell of its own
    numbered = [c for c in cell.values() if isinstance(c, int)]
    assert sorted(set(numbered)) == list(range(len(set(numbered))))  # numbered by first run
    assert runs[7].values["omp_threads"] == 2 and runs[7].changed == {"omp_threads": ("default", 2)}  # read back


def test_share_false_gives_every_run_a_cell_of_its_own_with_the_same_values():
    rows = fleet()
    shared, alone = ran.as_ran(rows), ran.as_ran(rows, share=False)
    assert len({id(r.cell) for r in alone}) == len(alone)
    for a, b in zip(shared, alone):
        assert a.row is b.row and a.values == b.values and a.changed == b.changed and a.disturbed == b.disturbed
        assert a.config_key() == b.config_key()


def test_a_comparisons_job_ids_are_its_cells_distinct_job_ids_sorted_whatever_their_type():
    from orchestrator.stats.effects import Cells
    for big in (None, 2 ** 70):  # int64 arrays; an int beyond int64: frozensets
        rows = fleet()
        rows[1]["job_id"] = rows[0]["job_id"]  # two runs of one job
        rows[3]["job_id"] = rows[0]["job_id"]  # and one in another cell: counted once in a comparison of both
        if big is not None:
            rows[6]["job_id"] = big
        runs = ran.as_ran(rows)
        cells = Cells(runs)
        some = [c for c in cells.all if c % 2 == 0]
        for chosen in (list(cells.all), some, some[:1], []):
            ids = {r.row["job_id"] for r in cells.runs_of(chosen)}
            got = cells.job_ids(chosen)
            assert list(got) == sorted(ids)
            assert got.dtype == np.int64 if big is None else all(type(j) is int for j in got)  # (beyond int64: ints)


def test_a_run_loud_in_one_figure_alone_is_asked_of_the_rules():
    """as_ran's shortcut checks each figure's column alone (every run surely quiet when every distinct
    value of each column is): a run whose only figure above the floor is its steal, or its other
    processes' CPU time, is still asked, and flagged as disturbed() flags it."""
    for loud in ({"steal_s": 0.6, "cores": 1}, {"other_cpu_s": 5.0}):
        rows = [row(1, d_model=64), row(2, d_model=128, other_cpu_s=0.0, steal_s=0.0), row(3, d_model=64, **loud)]
        runs = ran.as_ran(rows)
        assert [r.disturbed for r in runs] == [ran.disturbed(r) for r in rows]
        assert runs[2].disturbed and not runs[0].disturbed


def test_the_column_check_of_quiet_runs_says_yes_exactly_where_every_run_is_surely_quiet():
    """The shortcut of as_ran and cost_model.usable (all_surely_quiet, at C speed over each column)
    says what surely_quiet (per run, the reference) says of every run together: never quiet where one
    run would be left to disturbed(), and quiet wherever each run is."""
    floor = DISTURBED_FLOOR_S
    figures = [None, 0, 0.0, -0.0, 0.5 * floor, floor, floor * 1.001, -1.0, math.nan, math.inf, 3, True, False,
               "0.1", 10 ** 400]
    cores = [None, 0, 0.0, False, [], "", 1, 16, -1, 2.0, True, "4", [2], math.nan]
    rng = random.Random(7)
    said_yes = 0
    for _ in range(3000):
        n = rng.randint(1, 4)
        o, s, c = ([rng.choice(pool) for _ in range(n)] for pool in (figures, figures, cores))
        every = all(ran.surely_quiet(*f) for f in zip(o, s, c))
        assert ran.all_surely_quiet(o, s, c) == every, (o, s, c)
        said_yes += every
    assert said_yes > 100


def test_each_runs_quiet_check_says_what_surely_quiet_says_of_that_run():
    """quiet_runs (what as_ran and cost_model.usable ask before parsing a run's applied) gives each run
    what surely_quiet (the reference) gives it, column by column or per distinct figures: None only where
    every run is surely quiet, and never quiet where surely_quiet would leave the run to disturbed()."""
    floor = DISTURBED_FLOOR_S
    figures = [None, 0, 0.0, -0.0, 0.5 * floor, floor, floor * 1.001, -1.0, math.nan, math.inf, 3, True, False,
               "0.1", 10 ** 400]
    cores = [None, 0, 0.0, False, "", 1, 16, -1, 2.0, True, "4", math.nan]
    rng = random.Random(11)
    mixed = 0
    for _ in range(3000):
        n = rng.randint(1, 5)
        o, s, c = ([rng.choice(pool) for _ in range(n)] for pool in (figures, figures, cores))
        each = [ran.surely_quiet(*f) for f in zip(o, s, c)]
        got = ran.quiet_runs(o, s, c)
        assert (got if got is not None else [True] * n) == each, (o, s, c)
        mixed += any(each) and not all(each)
    assert mixed > 100
    assert ran.quiet_runs([0.0, None], [None, [1]], [1, 2]) == [False, False]  # unhashable: every run asked
