"""The report people read after a sweep (index.html, results.csv, summary.md, plots/*.png and the effects
table), written by write_report (write.py).

This face names what callers use (bench.py, watch.py, tests, benchmarks) and imports each name where it is
first asked for: importing a light part of the package (rows.py, results_csv.py) then imports none of the
statistics, so that bench.py report starts results.csv's child (rows.results_csv_ahead) while this process
still imports them. The package's parts and how they depend on each other: write.py's docstring.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["Context", "FACTS", "Report", "SECTIONS", "SELECT_RESULTS", "effect_row", "short_reason", "write_report"]
_FROM = {"Context": "data", "Report": "data", "effect_row": "data", "FACTS": "words", "short_reason": "words",
         "SECTIONS": "markdown", "SELECT_RESULTS": "view_sql", "write_report": "write"}


def __getattr__(name: str):
    """A name of __all__, imported from its module (once: then it is this module's own)."""
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_FROM[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
