"""What each run ran with, as the report groups it: the values of its variables (read back where the
run records them), its configuration and pass, whether its timed window was disturbed. Pure, no I/O.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from itertools import chain, count, repeat
from operator import attrgetter, itemgetter, ne
from types import NoneType

from common.variables import BY_NAME, CATALOGUE, DERIVATIONS, DERIVED_BY_NAME, NAMES, allocator_of
from common.compute import SIMULATED
from common.metrics import DISTURBED_FLOOR_S, disturbance
from orchestrator.stats.columns import column, conf_values, gc_paused

METRIC = "step_ms_median"
# Not factors: repeat indexes the pass, block the comparison a job was run beside (the run order).
NOT_FACTORS = ("repeat", "block")
FACTORS = tuple(n for n in NAMES if n not in NOT_FACTORS)
# Numeric, but not sizes: a log-log slope means nothing for them.
NOT_SIZES = ("seed", "dropout", "repeat", "lr")

# What really ran, where a run records it: variable -> (where, read-back key), from each catalogue
# entry's ran_from. The worker records a run whose read-back differs from its job as failed; done runs
# of older databases may still differ, and they count under what they ran with. In the order the report
# has always named them in (a variable missing from _NAMED_IN comes last).
_NAMED_IN = ("dataset", "omp_threads", "intra_threads", "inter_threads", "onednn", "allocator", "blas")
RAN_FROM = {v.name: v.ran_from for v in sorted((v for v in CATALOGUE if v.ran_from), key=lambda v: (
    _NAMED_IN.index(v.name) if v.name in _NAMED_IN else len(_NAMED_IN)))}


# -- values -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1 << 16, typed=True)  # a 100k-run report asks millions of times for a few values
def value_of(name: str, raw):
    """A column value as the report groups it: booleans as bool, NULL as its word ('default'; 'none' for
    a learning bound left unset)."""
    var = BY_NAME[name]
    if raw is None:
        return var.words[0] if var.words and var.words[0] == "none" else "default"
    if var.type is bool:
        return bool(raw)
    if var.type is float:
        return float(raw)
    if var.type is int and not isinstance(raw, str):
        return int(raw)
    return raw


def label(name: str, value) -> str:
    if name == "precision" and value in SIMULATED:  # never shown as if it were that format's arithmetic
        return f"{value} ({SIMULATED[value]})"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def sort_key(name: str, value):
    var = BY_NAME[name]
    if var.choices and value in var.choices:
        return (0, var.choices.index(value), "")
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, 0, str(value))  # words like "default" after the numbers


def is_size(name: str, values) -> bool:
    var = BY_NAME[name]
    return (var.type in (int, float) and name not in NOT_SIZES
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values))


@functools.lru_cache(maxsize=None)  # (the derivations are fixed; a grid's groups ask again and again)
def followers_of(name: str) -> frozenset[str]:
    """The variables that follow `name` when left on "auto", directly or through another."""
    out, todo = set(), [name]
    while todo:
        parent = todo.pop()
        for d in DERIVATIONS:
            if parent in d.parents and d.name not in out:
                out.add(d.name)
                todo.append(d.name)
    return frozenset(out)


def _ran_value(name: str, row: dict, applied: dict):
    """What a run ran with for `name` according to its own record, or None where it says nothing."""
    where, key = RAN_FROM[name]
    raw = row.get(key) if where == "column" else applied.get(key)
    if raw is None:
        return None if name != "allocator" or key not in applied else "default"
    return _ran_record(name, raw)


@dataclass(slots=True)
class Run:
    """One done run as the report groups it (slots: a million of them hold no dict each)."""

    row: dict
    values: dict  # factor -> the value it ran with (shared by the runs of a cell: never change it)
    changed: dict  # variable -> (asked, ran) where the run's record differs from its job
    log_ms: float  # log step time
    pass_: int
    derived: dict | None  # recorded at enqueue (jobs.derived); None for older jobs
    adj: float = 0.0  # log step time with its block's effect removed (the model's)
    slow: float = 0.0  # the model's probability that the run was in the slow mode
    disturbed: str | None = None  # why its timed window was disturbed (disturbed()), or None
    cell: object = None  # runs with the same cell ran the same configuration, asked and read back alike (as_ran)
    _key: tuple | None = None  # config_key()'s answer: its cell's (as_ran), or made at its first call

    @property
    def step_ms(self) -> float:
        return float(self.row[METRIC])

    def at_derived(self, name: str) -> bool:
        """Is this follower at the value its rule derives from this run's other values?"""
        d = DERIVED_BY_NAME[name]
        touched = name in self.changed or any(p in self.changed for p in d.parents)
        if self.derived is not None and name in self.derived and not touched:
            return True  # the job says so: resolve() filled it in
        return self.values[name] == d.rule(self.values)  # older jobs, explicit spellings, read-backs

    def config_key(self) -> tuple:
        """The values of every factor: the configuration (computed once; the values never change)."""
        if self._key is None:
            self._key = tuple(self.values[n] for n in FACTORS)
        return self._key


def done_runs(rows: list[dict]) -> list[dict]:
    """The runs every aggregate uses: done, with a step time (the two columns read at C speed)."""
    return [r for r, status, ms in zip(rows, column(rows, "status"), column(rows, METRIC))
            if status == "done" and ms is not None and ms > 0]


def disturbed(row: dict) -> str | None:
    """Why a done run was disturbed (worker/sensors.disturbance: other processes' CPU time or steal
    above DISTURBED_SHARE of the window), or None. The window is applied.timed_window (train_s
    without one), the CPUs the child's read-back affinity (else `cores`)."""
    return _disturbance(row, _json(row.get("applied")) or {})


def _disturbance(row: dict, applied: dict) -> str | None:
    """disturbed() on the run's `applied` already parsed."""
    other, steal = row.get("other_cpu_s"), row.get("steal_s")
    if other is None and steal is None:  # nothing measured: nothing to exceed
        return None
    window = applied.get("timed_window") or {}
    if window.get("end_unix_s") is not None and window.get("start_unix_s") is not None:
        window_s = float(window["end_unix_s"]) - float(window["start_unix_s"])
    else:
        window_s = float(row.get("train_s") or 0)
    cpus = len(applied.get("affinity") or []) or int(row.get("cores") or 1)
    return disturbance(other, steal, cpus, window_s)


def provisional_peak(row: dict) -> str | None:
    """Why a run's MFU is against a provisional GEMM peak (worker/machine/gemm_peak.py), or None."""
    return peak_of(row).get("provisional")


def peak_of(row: dict) -> dict:
    """The GEMM peak a run's MFU is against (applied.peak_gflops: worker/machine/gemm_peak.py), or {}."""
    return (_json(row.get("applied")) or {}).get("peak_gflops") or {}


_APPLIED_KEYS = tuple(key for where, key in RAN_FROM.values() if where == "applied")


def as_ran(rows: list[dict], *, share: bool = True, read=None) -> list[Run]:
    """The done runs, each with the values it really ran with. Runs whose job columns (but their
    place in the run order), read-backs and derivations are the same share a cell: the report's
    comparisons group on it, so they are worked out once per configuration, not once per run.
    share=False gives every run a cell of its own (the per-run path the tests compare with).
    Built column by column (for a million runs): each distinct `applied` text is parsed once,
    the cells' values are worked out variable by variable over their first runs (_cells_of), and
    disturbed() is asked only where a run's figures could pass a limit (surely_quiet, once per
    distinct figures). `read(runs, names)`: conf_values(runs, names) where the caller holds them already
    (config_index.values_of), else None."""
    with gc_paused():  # a million Runs and no cycle among them: no collection pass over the rows meanwhile
        done = done_runs(rows)
        applied = _applied_of(column(done, "applied"))
        # each run's job values of every factor (where `read` has them: not read again)
        raw = ((read and read(done, FACTORS)) or conf_values(done, FACTORS)) if share else None
        ids, firsts = _cells(done, applied, raw) if share else ([None] * len(done), [])
        known = _cells_of([done[i] for i in firsts], [applied[i] for i in firsts], [raw[i] for i in firsts])
        if None in ids:  # a cell of its own: values of its own, and a cell object no other run has
            per_run = [known[c] if c is not None else _cell_of(row, a) for c, row, a in zip(ids, done, applied)]
            ids = [c if c is not None else object() for c in ids]
        else:
            per_run = list(map(known.__getitem__, ids))
        return list(map(Run, done, map(itemgetter(0), per_run), map(itemgetter(1), per_run),
                        map(math.log, map(float, map(itemgetter(METRIC), done))),
                        [int(p or 0) for p in column(done, "repeat")], map(itemgetter(2), per_run),
                        repeat(0.0), repeat(0.0), _disturbed_all(done, applied), ids,
                        map(itemgetter(3), per_run)))  # (_key: the cell's configuration)


def disturbed_run_ids(rows: list[dict]) -> set:
    """The run ids of the done runs among `rows` whose timed window was disturbed, as as_ran marks them."""
    done = done_runs(rows)
    return {r.get("run_id") for r, why in zip(done, _disturbed_all(done, _applied_of(column(done, "applied")))) if why}


def _cells(done: list[dict], applied: list[dict], raw: list[tuple]) -> tuple[list[int | None], list[int]]:
    """Each run's cell (numbered by first run; None: an unhashable read-back, a cell of its own) and
    each numbered cell's first run. raw: each run's job values of FACTORS (conf_values)."""
    of_applied: dict[int, tuple] = {}  # id of a parsed applied (shared by the runs of a text) -> its part of the key

    def read_back(a: dict) -> tuple:
        part = of_applied.get(id(a))
        if part is None:
            part = of_applied[id(a)] = (tuple(map(a.__contains__, _APPLIED_KEYS)), tuple(map(a.get, _APPLIED_KEYS)))
        return part

    def keys(jobs):  # made as they are numbered, never all held: a million keys of 50 values are 0.3 GB
        return zip(jobs, column(done, "dataset_used"), column(done, "derived"), map(read_back, applied))
    first: dict[tuple, int] = {}
    try:
        # each run's cell as the index of its first run; the job values as their number (numbered):
        # a configuration's tuple of 50 values hashed once, not once per run
        at = list(map(first.setdefault, keys(numbered(raw)[0]), count()))
    except TypeError:  # an unhashable key: run by run
        first.clear()
        keys = functools.partial(keys, raw)
        ids: list[int | None] = []
        firsts: list[int] = []
        for i, key in enumerate(keys()):
            try:
                cell = first.get(key)
            except TypeError:
                ids.append(None)
                continue
            if cell is None:
                cell = first[key] = len(firsts)
                firsts.append(i)
            ids.append(cell)
        return ids, firsts
    firsts = list(first.values())
    number = dict(zip(firsts, count()))
    return list(map(number.__getitem__, at)), firsts


def numbered(values: list) -> tuple[list[int], dict]:
    """Each value's number among the distinct values (equal values one number, numbered in the order of
    their first appearance), and value -> number (the first of equal values as its key). Each distinct
    object is hashed once: values shared between runs (a cell's tuples) cost a look-up by identity."""
    objects = {id(v): v for v in values}  # (in the order of first appearance)
    number: dict = {}
    if len(objects) == len(values):  # no object shared: numbered as they come
        return [number.setdefault(v, len(number)) for v in values], number
    of_object = {i: number.setdefault(v, len(number)) for i, v in objects.items()}
    return list(map(of_object.__getitem__, map(id, values))), number


def _disturbed_all(done: list[dict], applied: list[dict]) -> list[str | None]:
    """_disturbance of each run, asked only where its figures are not surely_quiet."""
    quiet = quiet_runs(*(column(done, c) for c in ("other_cpu_s", "steal_s", "cores")))
    if quiet is None:
        return [None] * len(done)
    return [None if q else _disturbance(row, a) for q, row, a in zip(quiet, done, applied)]


def _cells_of(rows: list[dict], applied: list[dict], raw: list[tuple]) -> list[tuple]:
    """_cell_of of each of these runs (each a cell's first run), variable by variable: each variable's
    asked and read-back values worked out once per distinct raw value (_each). raw: each run's job
    values of FACTORS (conf_values)."""
    flat = list(chain.from_iterable(raw))  # (cells x FACTORS), cell after cell
    asked = {n: flat[k::len(FACTORS)] for k, n in enumerate(FACTORS)}
    values_of, changed = [], [{} for _ in rows]
    for n in FACTORS:  # not repeat and block: the run's own (Run.pass_, row["block"])
        column_asked = _each(functools.partial(value_of, n), asked[n])
        if n not in RAN_FROM:
            values_of.append(column_asked)
            continue
        column_ran = _ran_values(n, rows, applied)
        for i, (a, r) in enumerate(zip(column_asked, column_ran)):
            if r is not None and r != a:
                changed[i][n] = (a, r)
        values_of.append([a if r is None else r for a, r in zip(column_asked, column_ran)])
    configs = list(zip(*values_of))  # each cell's configuration: its values in FACTORS' order
    derived = [d if isinstance(d, dict) else None for d in map(_json, column(rows, "derived"))]
    return list(zip([dict(zip(FACTORS, c)) for c in configs], changed, derived, configs))


def _ran_values(name: str, rows: list[dict], applied: list[dict]) -> list:
    """_ran_value of each run, once per distinct record."""
    where, key = RAN_FROM[name]
    records = column(rows, key) if where == "column" else [a.get(key) for a in applied]
    values = _each(functools.partial(_ran_record, name), records)
    if name == "allocator":  # a run that records its allocator but not which library: the default
        return [v if r is not None or key not in a else "default" for v, r, a in zip(values, records, applied)]
    return values


def _ran_record(name: str, raw):
    """What a run's record `raw` says it ran with for `name` (_ran_value's, where raw is not None), or None."""
    if raw is None:
        return None
    if name == "allocator":
        return allocator_of(str(raw))
    try:
        return BY_NAME[name].parse(raw)
    except Exception:  # an unreadable record says nothing
        return None


def _each(f, values) -> list:
    """[f(v) for v in values], f called once per distinct value. Equal values may differ in f where
    they differ in type (1, 1.0, True) or sign (0.0, -0.0): values of more than one type, a float
    zero among them or an unhashable value are mapped value by value."""
    kinds = set(map(type, values))
    kinds.discard(NoneType)
    try:
        distinct = dict.fromkeys(values)
    except TypeError:
        return list(map(f, values))
    if len(kinds) > 1 or (float in kinds and 0.0 in distinct):
        return list(map(f, values))
    if len(distinct) == 1:  # (a column of one value: most of a sweep's)
        return [f(values[0])] * len(values)
    for v in distinct:
        distinct[v] = f(v)
    return list(map(distinct.__getitem__, values))


def _cell_of(row: dict, applied: dict) -> tuple:
    """(values, changed, derived, configuration) of a run: one values dict per cell, shared by its runs."""
    values, changed = {}, {}
    for n in FACTORS:  # not repeat and block: the run's own (Run.pass_, row["block"])
        asked = value_of(n, row[n])
        ran = _ran_value(n, row, applied) if n in RAN_FROM else None
        if ran is not None and ran != asked:
            changed[n] = (asked, ran)
        values[n] = asked if ran is None else ran
    derived = _json(row.get("derived"))
    return values, changed, derived if isinstance(derived, dict) else None, tuple(values[n] for n in FACTORS)


def _applied_of(texts: list) -> list[dict]:
    """Each run's `applied` parsed ({} where NULL or unreadable), each distinct text once."""
    try:
        parsed = {t: _json(t) or {} for t in set(texts)}
    except TypeError:  # a row that holds its applied already parsed (a dict)
        return [_json(t) or {} for t in texts]
    return list(map(parsed.__getitem__, texts))


def all_surely_quiet(others: list, steals: list, cores: list) -> bool:
    """Whether surely_quiet holds for every run, from the runs' columns at C speed (a run's figures are
    its own numbers: a million calls at a million runs). surely_quiet asks each figure alone, so this is
    each column's check: the figures None or numbers (not NaN) none above the floor, the cores falsy or
    ints of at least 1."""
    for figures in (others, steals):
        kinds = set(map(type, figures))
        kinds.discard(NoneType)
        if not kinds <= {float, int}:
            return False
        values = list(filter(None, figures))  # the nonzero ones
        if values and (any(map(ne, values, values)) or max(values) > DISTURBED_FLOOR_S):  # (NaN != NaN)
            return False
    counts = list(filter(None, cores))  # the truthy ones: `not cores` passes the rest
    return set(map(type, counts)) <= {int} and (not counts or min(counts) >= 1)


def quiet_runs(others: list, steals: list, cores: list) -> list[bool] | None:
    """surely_quiet of each run, from the runs' columns (a run's figures are its own numbers: no call per run
    where the columns allow): None where every run is (all_surely_quiet); else each run's, column by column
    (surely_quiet_each), or once per distinct (other, steal, cores) and their types (surely_quiet tells
    0 from False, which are equal); where a figure is unhashable, no run is taken as surely quiet (each is
    asked whether it was disturbed)."""
    if all_surely_quiet(others, steals, cores):
        return None
    each = surely_quiet_each(others, steals, cores)
    if each is not None:
        return each
    keys = list(zip(others, steals, cores, map(type, others), map(type, steals), map(type, cores)))
    try:
        seen = {k: surely_quiet(*k[:3]) for k in set(keys)}
    except TypeError:
        return [False] * len(keys)
    return list(map(seen.__getitem__, keys))


def surely_quiet_each(others: list, steals: list, cores: list) -> list[bool] | None:
    """surely_quiet of each run, from the runs' columns (a run's figures are its own numbers: a call per run
    at a million runs), where every figure is None, a float or an int and every cores an int or None (as a
    store's are; None otherwise): each figure None or at most the floor, each cores None or at least 1."""
    for column_ in (others, steals):
        kinds = set(map(type, column_))
        kinds.discard(NoneType)
        if not kinds <= {float, int}:
            return None
    kinds = set(map(type, cores))
    kinds.discard(NoneType)
    if not kinds <= {int}:
        return None
    floor = DISTURBED_FLOOR_S
    return [(o is None or o <= floor) and (s is None or s <= floor) and (c is None or c >= 1 or c == 0)
            for o, s, c in zip(others, steals, cores)]


def surely_quiet(other, steal, cores) -> bool:
    """True where _disturbance(row, applied) is None whatever the run's applied says: neither other
    processes' CPU time nor steal above DISTURBED_FLOOR_S, the least a limit can be (the floor times
    the CPUs, and those are one or more: the affinity's, else `cores` or 1). Anything else (a value of
    another type, cores below 1) is left to _disturbance itself."""
    return ((other is None or (type(other) is float or type(other) is int) and other <= DISTURBED_FLOOR_S)
            and (steal is None or (type(steal) is float or type(steal) is int) and steal <= DISTURBED_FLOOR_S)
            and (not cores or type(cores) is int and cores >= 1))


def _json(text):
    """A JSON column parsed (None where it is NULL or unreadable). A text is parsed once however many
    runs repeat it (a fleet's runs share their `derived` and often their `applied`): the parsed value
    is shared, so no caller may change it."""
    if text is None or isinstance(text, dict):
        return text
    if isinstance(text, str):
        return _parsed(text)
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=1 << 12)
def _parsed(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _columns(values: list[dict], names: tuple) -> list[list]:
    """Each name's values over these values dicts, a column per name. Read a dict at a time into one
    list, row after row, then sliced: a dict's entries lie together in memory, where a name at a time
    (or zip's transposition) would fetch all 100k dicts again for each name."""
    if not names:
        return []
    if len(names) == 1:
        return [list(map(itemgetter(names[0]), values))]
    flat = list(chain.from_iterable(map(itemgetter(*names), values)))
    return [flat[k::len(names)] for k in range(len(names))]


def varied_variables(runs: list[Run]) -> list[str]:
    """Variables that ran with more than one value among these runs, in catalogue order."""
    distinct = list({r.cell if r.cell is not None else id(r): r for r in runs}.values())  # (as_ran)
    return [n for n, values in zip(FACTORS, _config_columns(distinct, FACTORS))
            if values and values.count(values[0]) != len(values)]  # (one value: found at C speed)


def _configs(runs: list[Run]) -> list[Run]:
    """One run per distinct configuration: what the plan holds, however often each one was repeated
    (work --target-ci repeats only some, and must not move the baseline by doing so)."""
    return list({r._key: r for r in runs}.values())  # (_key: config_key()'s cache, read without the call)


def _config_columns(configs: list[Run], names: tuple) -> list:
    """Each name's values over these runs: from their configurations (config_key's tuples, in FACTORS'
    order: one list of all their values, then sliced) where every run holds its own, else from their
    values dicts (_columns)."""
    if not names:
        return []
    keys = list(map(attrgetter("_key"), configs))
    if None in keys or not set(names) <= set(FACTORS):
        return _columns([r.values for r in configs], names)
    if names != FACTORS:
        at = [FACTORS.index(n) for n in names]
        if len(at) == 1:
            return [list(map(itemgetter(at[0]), keys))]
        keys = map(itemgetter(*at), keys)
    flat = list(chain.from_iterable(keys))
    return [flat[k::len(names)] for k in range(len(names))]


def modal_config(runs: list[Run], names) -> dict:
    """Per variable, the value most configurations share, counting each configuration once however
    many runs it has (ties: the catalogue default, then the lowest)."""
    out = {}
    names = tuple(names)
    for n, values in zip(names, _config_columns(_configs(runs), names)):
        if values and values.count(values[0]) == len(values):  # one value (most columns), found at C speed
            tied = [values[0]]
        else:
            counts = Counter(values)
            top = max(counts.values())
            tied = sorted((v for v, c in counts.items() if c == top), key=lambda v: sort_key(n, v))
        default = BY_NAME[n].default
        default = default if isinstance(default, str) else value_of(n, default)
        out[n] = default if default in tied else tied[0]
    return out
