"""Each run of a report numbered by its configuration: its raw values of every catalogue variable but
the pass (`repeat`), numbered in the order they first ran. Read once per report (the values read at C
speed, no Python call per run) and shared by the parts that group runs by configuration: the page's
baselines and machines side by side (report/html.py) and the cost model's check share
(prediction_report.shares). Runs with equal numbers have equal values of every one of those
variables, so anything computed from those values is computed once per number.
"""

from __future__ import annotations

from common.variables import NAMES
from orchestrator.stats.columns import conf_values
from orchestrator.stats.ran import numbered

NOT_CONFIG = ("repeat",)  # the pass index: not part of what differs between configurations
CONFIG_NAMES = tuple(n for n in NAMES if n not in NOT_CONFIG)
_last: list = [None, 0, None]  # (rows, their number, config_index(rows)): one report's rows, kept for its parts


def config_index(rows: list[dict]) -> tuple[list[int], list[tuple]]:
    """(each run's number, each number's raw values in CONFIG_NAMES' order), for these rows (the same
    list asked again: the answer kept)."""
    if _last[0] is rows and _last[1] == len(rows):
        return _last[2]
    # (the values once per configuration row where the rows share them, each distinct tuple hashed once)
    ids, number = numbered(conf_values(rows, CONFIG_NAMES))
    _last[:] = [rows, len(rows), (ids, list(number))]
    return _last[2]


def forget() -> None:
    """Drop the answer kept (write_report, when done): a report's rows must not outlive it (report --watch
    would hold the last report's million rows while it reads the next one's)."""
    _last[:] = [None, 0, None]
