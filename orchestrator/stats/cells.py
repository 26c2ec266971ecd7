"""One machine's runs by cell (the runs that share their values, as_ran) and the comparison groups over
those cells, as columns of codes: each variable's values numbered once and shared by every grouping, so
that grouping, counting and choosing the best group go over numpy columns, not a Python loop per cell.
Pure computation (numpy); the comparisons themselves are effects.py's."""

from __future__ import annotations

from itertools import count
from functools import cached_property
from operator import attrgetter, itemgetter

import numpy as np

from orchestrator.stats.noise import Model
from orchestrator.stats.ran import Run, followers_of, sort_key

DERIVED_MARK = "(derived)"  # the comparison-group key of a follower at its derived value


def distinct_sorted(a: np.ndarray) -> np.ndarray:
    """np.unique(a) of a fresh 1-D array (sorted in place): each value once, in order, from one sort and one
    comparison (np.unique's own work costs a few times more, on the few hundred job ids of a comparison as on
    the hundred thousand cells of a grid's groups)."""
    a.sort()
    if a.size > 1:
        step = a[1:] != a[:-1]
        if not step.all():
            a = a[np.concatenate(([True], step))]
    return a


def distinct_at(coded: tuple[np.ndarray, np.ndarray], at: np.ndarray) -> np.ndarray:
    """distinct_sorted(column[at]) of a column given as (its distinct values sorted, each row's code among them):
    where `at` is many rows, a mark per distinct value rather than a sort of every row's."""
    distinct, code = coded
    if len(at) * 8 < len(distinct):
        return distinct_sorted(distinct[code[at]])
    seen = np.zeros(len(distinct), bool)
    seen[code[at]] = True
    return distinct[seen]


def codes_of(values: list) -> tuple[np.ndarray, list]:
    """Each value's number among the distinct values (equal values one number, as a dict's keys are one),
    numbered in the order of their first appearance; and the distinct values in that order. One pass of
    hashing (a configuration's key is a tuple of some 50 values, hashed anew at each look-up)."""
    first: dict = {}
    at = np.fromiter(map(first.setdefault, values, count()), dtype=np.intp, count=len(values))  # (first position)
    number = np.zeros(len(values), np.intp)
    number[at == np.arange(len(values))] = np.arange(len(first))
    return number[at], list(first)


def first_seen(columns: list[np.ndarray], n: int) -> np.ndarray:
    """Each of n rows' number among the distinct rows of these columns of codes, numbered in the order of
    their first row (as the keys of a dict filled row by row)."""
    combined = np.zeros(n, np.int64)
    for codes in columns:
        width = int(codes.max()) + 1 if n else 1
        if int(combined.max(initial=0)) >= (1 << 62) // width:  # the next column would overflow: renumber first
            combined = np.unique(combined, return_inverse=True)[1]
        combined = combined * width + codes
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)  # (first: a stable sort's)
    number = np.empty(len(first), np.intp)
    number[np.argsort(first)] = np.arange(len(first))
    return number[inverse]


def _int64_or_list(values: list) -> np.ndarray | list:
    """The values as an int64 array where every one is an int that fits, else as they are."""
    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    return values


MANY_CELLS = 256  # from this many cells on, their runs are found by one pass over the runs, not a slice per cell


class Cells:
    """One machine's runs by cell (as_ran: the runs of one configuration, asked and read back alike,
    share their values): what the comparisons need of each cell (its values, runs, passes, job ids,
    configuration in the model), worked out once, so that grouping and counting go over the cells,
    not over every run. Cells are numbered in the order of their first run, so a group of cells in
    that order keeps the order of the runs' groups; `runs_of` gives a list of cells' runs in run order.
    A run without a cell (built by hand) is a cell of its own."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        cell = list(map(attrgetter("cell"), runs))
        self.of_run, distinct = codes_of(cell if None not in cell else [c if c is not None else id(r)
                                                                       for c, r in zip(cell, runs)])
        self.counts = np.bincount(self.of_run, minlength=len(distinct))  # runs per cell
        self.n = self.counts.tolist()
        self._by_cell = np.argsort(self.of_run, kind="stable")  # the runs cell after cell, each cell's in run order
        self._start = np.concatenate(([0], np.cumsum(self.counts)))
        self.rep = list(map(runs.__getitem__, self._by_cell[self._start[:-1]].tolist()))  # each cell's first run
        self.all = range(len(self.rep))

    def _positions(self, cells) -> np.ndarray:
        """Where these cells' runs are in `runs` (cell after cell; with MANY_CELLS or more, in run order)."""
        if len(cells) >= MANY_CELLS:
            chosen = np.zeros(len(self.n), bool)
            chosen[cells] = True
            return np.flatnonzero(chosen[self.of_run])
        start = self._start
        return np.concatenate([self._by_cell[start[c]:start[c + 1]] for c in cells] or [np.empty(0, np.intp)])

    def runs_of(self, cells) -> list[Run]:
        """The runs of these cells, in run order."""
        at = self._positions(cells)
        return list(map(self.runs.__getitem__, (at if len(cells) == 1 else np.sort(at)).tolist()))

    def values(self, cells, name: str) -> set:
        return set(map(self.column(name).__getitem__, cells))

    def column(self, name: str) -> list:
        """Each cell's value of `name` (made once per variable: a grid's groups read it over and over)."""
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = list(map(itemgetter(name), map(attrgetter("values"), self.rep)))
        return col

    def at_derived(self, name: str) -> list[bool]:
        """Each cell's Run.at_derived(name) (a follower's, asked once per cell however many groupings ask)."""
        flags = self._columns.get((name, DERIVED_MARK))
        if flags is None:
            flags = self._columns[(name, DERIVED_MARK)] = [r.at_derived(name) for r in self.rep]
        return flags

    def key_column(self, name: str, derived: bool = False) -> list:
        """Each cell's value of `name` as a comparison group's key holds it: derived=True (a follower of the
        free variables) DERIVED_MARK where at its derived value."""
        if not derived:
            return self.column(name)
        col = self._columns.get((name, "key"))
        if col is None:
            col = self._columns[(name, "key")] = [DERIVED_MARK if at else v for at, v in
                                                  zip(self.at_derived(name), self.column(name))]
        return col

    def codes(self, name: str, derived: bool = False) -> tuple[np.ndarray, list]:
        """key_column(name, derived) as _codes: each cell's value as a number, and the distinct values."""
        got = self._columns.get((name, "codes", derived))
        if got is None:
            got = self._columns[(name, "codes", derived)] = codes_of(self.key_column(name, derived))
        return got

    @cached_property
    def _columns(self) -> dict:
        return {}

    def n_runs(self, cells) -> int:
        return int(self.counts[cells].sum())

    def n_configs(self, cells) -> int:
        """Distinct configurations among these cells (each counted once, however many runs it has)."""
        configs = self.config_codes
        if configs is None:  # every cell a configuration of its own
            return len(set(cells))
        return len(set(map(configs.__getitem__, cells)))

    @property
    def config_codes(self) -> np.ndarray | None:
        """Each cell's configuration as a number; None where no two cells share one (a grid run once each:
        then the cells are the configurations)."""
        codes, distinct = self._configurations
        return None if len(distinct) == len(codes) else codes

    @cached_property
    def _configurations(self) -> tuple[np.ndarray, list]:
        """_codes of the cells' configurations (_key: config_key()'s cache, read without the call)."""
        return codes_of(list(map(attrgetter("_key"), self.rep)))

    def passes(self, cells) -> set:
        at, passes = self._positions(cells), self._passes
        if isinstance(passes, np.ndarray):  # (every pass an int64: the distinct ones, then a set of ints)
            return set(distinct_at(self._coded("_passes"), at).tolist())
        return set(map(passes.__getitem__, at.tolist()))

    def job_ids(self, cells) -> np.ndarray | tuple:
        """The cells' distinct job ids, sorted: an int64 array where every job id is an int64, as a store's
        are (8 bytes a job: a tuple of ints took 36, and at a million runs each effect rests on up to
        half a million jobs), else a tuple."""
        jobs, at = self._jobs, self._positions(cells)
        if isinstance(jobs, list):
            return tuple(sorted(set(map(jobs.__getitem__, at.tolist()))))
        return distinct_at(self._coded("_jobs"), at)

    def _coded(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """An int64 column of the runs (_passes, _jobs) as its distinct values, sorted, and each run's code among
        them (made once: every effect asks for its runs' distinct ones)."""
        got = self._coded_columns.get(name)
        if got is None:
            got = self._coded_columns[name] = np.unique(getattr(self, name), return_inverse=True)
        return got

    @cached_property
    def _coded_columns(self) -> dict:
        return {}

    @cached_property
    def _passes(self) -> np.ndarray | list[int]:
        """Each run's pass (_int64_or_list)."""
        return _int64_or_list([r.pass_ for r in self.runs])

    @cached_property
    def _jobs(self) -> np.ndarray | list:
        """Each run's job id (_int64_or_list)."""
        return _int64_or_list(list(map(itemgetter("job_id"), map(attrgetter("row"), self.runs))))

    def drop_counts(self) -> None:
        """Let go of the runs' passes and job ids (tens of MB at a million runs) once the effects are made."""
        for name in ("_passes", "_jobs", "_coded_columns"):
            self.__dict__.pop(name, None)

    def configs(self, model: Model) -> list[int]:
        """Each cell's configuration index in the model."""
        if getattr(self, "_model", None) is not model:
            codes, distinct = self._configurations  # (each configuration looked up once)
            self._config_array = np.array(list(map(model.config_index.__getitem__, distinct)), np.int64)[codes]
            self._model, self._configs = model, self._config_array.tolist()
        return self._configs

    def weights(self, model: Model, levels: list, coefs: list[float]) -> dict[int, float]:
        """Model.weights of levels given as lists of cells."""
        config = self.configs(model)
        return model.weights_of([set(map(config.__getitem__, cells)) for cells in levels], coefs)

    def level_weights(self, model: Model, cells: np.ndarray, level: np.ndarray, coefs: np.ndarray) -> dict[int, float]:
        """weights() of levels given flat, to the last digit: cells and the level of each (levels numbered from
        0 in order), coefs per level. Each level's distinct configurations in ascending order, level after
        level, each given its level's coefficient over their number, summed per configuration in that order."""
        self.configs(model)
        width = len(model.config_index)
        pairs = distinct_sorted(level.astype(np.int64) * width + self._config_array[cells])
        level_of, config = np.divmod(pairs, width)
        share = coefs[level_of] / np.bincount(level_of, minlength=len(coefs))[level_of]
        if np.bincount(config).max(initial=0) <= 1:  # each configuration in one level (a grid's): its share
            return dict(zip(config.tolist(), (0.0 + share).tolist()))  # (added to 0.0, as weights_of: no -0.0)
        keys, first, inverse = np.unique(config, return_index=True, return_inverse=True)
        total = np.zeros(len(keys))
        np.add.at(total, inverse, share)  # (in order, from 0.0: weights_of's sums)
        seen = np.argsort(first)  # the configurations in the order weights_of meets them
        return dict(zip(keys[seen].tolist(), total[seen].tolist()))

    def mean_adj(self, cells) -> float:
        return np.mean([r.adj for r in self.runs_of(cells)])


class Groups:
    """The comparison groups of some free variables: the cells by their key, the other varied variables
    at their values and the free ones' followers as DERIVED_MARK where at their derived value; numbered in
    the order of their first cells, as a dict filled cell by cell holds them. Worked out on whole columns
    of codes (Cells.codes, shared by every grouping), not a key tuple per cell."""

    def __init__(self, cells: Cells, free: set[str], varied: list[str]):
        follow = set().union(*(followers_of(n) for n in free)) - free
        self.cells = cells
        self.keys = [n for n in varied if n not in free]
        self._derived = [n in follow for n in self.keys]
        self._codes = [cells.codes(n, d) for n, d in zip(self.keys, self._derived)]
        self.of_cell = first_seen([codes for codes, _ in self._codes], len(cells.rep))
        self.n_cells = np.bincount(self.of_cell)
        self.size = len(self.n_cells)
        self._by_group = np.argsort(self.of_cell, kind="stable")  # the cells group after group, each group's in order
        self._start = np.concatenate(([0], np.cumsum(self.n_cells)))
        self.first = self._by_group[self._start[:-1]]  # each group's first cell: its key

    def members(self, g: int) -> list[int]:
        return self.cells_of(g).tolist()

    def cells_of(self, g: int) -> np.ndarray:
        return self._by_group[self._start[g]:self._start[g + 1]]

    def key(self, g: int) -> tuple:
        c = int(self.first[g])
        return tuple(self.cells.key_column(n, d)[c] for n, d in zip(self.keys, self._derived))

    def key_codes(self) -> list[tuple[np.ndarray, list]]:
        """Per key variable: each group's value as its code, and the distinct values."""
        return [(codes[self.first], distinct) for codes, distinct in self._codes]

    def distinct(self, codes: np.ndarray) -> np.ndarray:
        """Per group, how many distinct codes its cells have."""
        width = int(codes.max()) + 1 if len(codes) else 1
        return np.bincount(distinct_sorted(self.of_cell * width + codes) // width, minlength=self.size)

    def n_runs(self) -> np.ndarray:
        return np.add.reduceat(self.cells.counts[self._by_group], self._start[:-1]) if self.size else self.n_cells

    def beside(self, g: int) -> np.ndarray:
        """The other groups whose key is g's but where a follower is at its derived value in one of the two."""
        alike = np.ones(self.size, bool)
        for at, distinct in self.key_codes():
            mark = distinct.index(DERIVED_MARK) if DERIVED_MARK in distinct else -1
            alike &= (at == at[g]) | (at == mark) | (at[g] == mark)
        alike[g] = False
        return alike

    def by_key(self, gs: np.ndarray) -> list[int]:
        """These groups in the order of their keys (each value's sort_key, a derived follower after every
        value; ties in the groups' order)."""
        ranks = []
        for n, (at, distinct) in zip(self.keys, self.key_codes()):
            order = [sort_key(n, v) if v != DERIVED_MARK else (2, 0, "") for v in distinct]
            rank = dict(zip(sorted(set(order)), range(len(order))))
            ranks.append(np.array([rank[k] for k in order], dtype=np.intp)[at[gs]])
        return gs[np.lexsort(ranks[::-1])].tolist() if ranks else gs.tolist()  # (lexsort: stable)


def best_group(cells: Cells, groups: Groups, distinct: np.ndarray) -> int | None:
    """The group with the most distinct values of the free variables (`distinct`, per group), then closest
    to the modal key, then with the most configurations (each counted once, so repeats added to some do not
    move it; ties: the group seen first)."""
    if not groups.size:
        return None
    configs = cells.config_codes
    n_configs = groups.n_cells if configs is None else groups.distinct(configs)
    matches = np.zeros(groups.size, np.intp)
    for at, _ in groups.key_codes():
        # the modal value: the most configurations, ties to the value seen first (its code is the lowest)
        matches += at == np.argmax(np.bincount(at, weights=n_configs))
    # the last of an ascending sort of (distinct, matches, configurations, -group)
    return int(np.lexsort((-np.arange(groups.size), n_configs, matches, distinct))[-1])
