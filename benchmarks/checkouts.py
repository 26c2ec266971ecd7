"""Old code vs new on the same rows: each benchmark that compares two checkouts runs its own hidden
`--evaluate ROWS --code CHECKOUT` step in a fresh process inside each checkout, and reads the JSON
that step prints. The baseline is a checkout of the release before (e.g. `git worktree add
/work/baseline c6a4c6a`); the new code is this one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


EFFECTS = ("orchestrator/stats/effects.py", "orchestrator/effects.py")  # where effects.py is, now and before the split


def effects_module(code: Path):
    """The effects module of the checkout `code` (put first on sys.path): orchestrator.stats.effects, or
    orchestrator.effects in a checkout from before orchestrator/ was split by job."""
    sys.path.insert(0, str(code))
    import importlib

    name = "orchestrator.stats.effects" if (code / EFFECTS[0]).exists() else "orchestrator.effects"
    return importlib.import_module(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--baseline, and the hidden --evaluate/--code of the step run inside a checkout."""
    parser.add_argument("--baseline", type=Path, default=Path("/work/baseline"),
                        help="a checkout of the release before (default /work/baseline)")
    parser.add_argument("--evaluate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)


def evaluate_in_each(script: str, rows_path: Path, baseline: Path, labels: tuple[str, str] = ("old", "new")) -> dict:
    """label -> the parsed JSON `script --evaluate rows_path` printed in that checkout; a checkout
    that is missing or whose step failed is left out, saying so."""
    results = {}
    for label, code in zip(labels, (baseline, ROOT)):
        if not any((code / path).exists() for path in EFFECTS):
            print(f"{label}: no checkout at {code}, left out")
            continue
        proc = subprocess.run([sys.executable, script, "--evaluate", str(rows_path), "--code", str(code)],
                              capture_output=True, text=True, cwd=code)
        if proc.returncode:
            print(f"{label}: failed, left out\n{proc.stderr[-2000:]}")
            continue
        results[label] = json.loads(proc.stdout)
    return results
