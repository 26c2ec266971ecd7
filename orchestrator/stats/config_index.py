"""Each run of a report numbered by its configuration: its raw values of every catalogue variable but
the pass (`repeat`), numbered in the order they first ran. Read once per report (the values read at C
speed, no Python call per run) and shared by the parts that group runs by configuration: the page's
baselines and machines side by side (report/html.py) and the cost model's check share
(prediction_report.shares). Runs with equal numbers have equal values of every one of those
variables, so anything computed from those values is computed once per number.
"""

from __future__ import annotations

import functools

from common.variables import NAMES
from orchestrator.stats.columns import conf_values
from orchestrator.stats.ran import numbered

NOT_CONFIG = ("repeat",)  # the pass index: not part of what differs between configurations
CONFIG_NAMES = tuple(n for n in NAMES if n not in NOT_CONFIG)
_last: list = [None, 0, None]  # (rows, their number, config_index(rows)): one report's rows, kept for its parts
_values: list = [None]  # each of those rows' values (conf_values, a configuration's rows sharing one tuple)
_kept: list[list] = []  # the answers kept_for_the_rows keeps, each as _last


def config_index(rows: list[dict]) -> tuple[list[int], list[tuple]]:
    """(each run's number, each number's raw values in CONFIG_NAMES' order), for these rows (the same
    list asked again: the answer kept)."""
    if _last[0] is rows and _last[1] == len(rows):
        return _last[2]
    # (the values once per configuration row where the rows share them, each distinct tuple hashed once)
    values = conf_values(rows, CONFIG_NAMES)
    ids, number = numbered(values)
    _last[:] = [rows, len(rows), (ids, list(number))]
    _values[0] = values
    return _last[2]


def values_of(rows: list[dict], names: tuple[str, ...]) -> list[tuple] | None:
    """conf_values(rows, names), the very tuples, where `names` are CONFIG_NAMES and `rows` some of the rows
    config_index last numbered, in their order (a machine's done runs: as_ran's job values, not read
    again); None otherwise."""
    every, values = _last[0], _values[0]
    if names != CONFIG_NAMES or every is None or values is None or not len(values) == len(every) == _last[1]:
        return None
    at = positions(every, rows)
    return None if at is None else list(map(values.__getitem__, at))


def positions(every: list, some: list) -> list[int] | None:
    """Where in `every` each of `some` is (the very objects), where `some` is a subsequence of `every` (some
    of its items in its order, as a filter keeps them): one walk along both; None where it is not."""
    out, pending = [], iter(some)
    nxt = next(pending, None)
    for i, item in enumerate(every):
        if item is nxt:
            out.append(i)
            nxt = next(pending, None)
    return out if len(out) == len(some) else None


def kept_for_the_rows(fn):
    """fn(rows) worked out once for one list of rows (the same list, as long, asked again: the answer kept),
    for a report's parts that ask alike (summary.md and the page); kept, with the rows, until forget()."""
    last: list = [None, 0, None]  # (rows, their number, fn(rows))
    _kept.append(last)

    @functools.wraps(fn)
    def kept(rows):
        if last[0] is rows and last[1] == len(rows):
            return last[2]
        answer = fn(rows)
        last[:] = [rows, len(rows), answer]
        return answer

    return kept


def forget() -> None:
    """Drop every answer kept (config_index's and kept_for_the_rows'; write_report, when done): a report's rows
    must not outlive it (report --watch would hold the last report's million rows while it reads the next one's)."""
    for last in (_last, *_kept):
        last[:] = [None, 0, None]
    _values[0] = None
