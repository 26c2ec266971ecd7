"""Where the project lives: the repository root, which the data, schema and child processes are found from."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
