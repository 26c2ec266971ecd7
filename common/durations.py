"""Durations as people type them: `5m`, `90s`, `2h`, `1h30m` (a budget's length)."""

from __future__ import annotations

import re

from common.errors import BadInput

_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(value: str, where: str = "--budget") -> float | None:
    """'5m', '90s', '2h', '1h30m' or plain seconds -> seconds; 'none' -> None (no budget)."""
    word = str(value).strip().lower()
    if word in ("none", "off"):
        return None
    parts = re.fullmatch(r"((?:\d+(?:\.\d+)?[smh])+|\d+(?:\.\d+)?)", word)
    if parts is None:
        raise BadInput(f"{where} {value!r}: expected a duration like 5m, 90s, 2h or 1h30m (or none)")
    if word[-1].isdigit():
        seconds = float(word)
    else:
        seconds = sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", word))
    if not seconds > 0:
        raise BadInput(f"{where} {value!r}: a budget must be more than 0 seconds")
    return seconds
