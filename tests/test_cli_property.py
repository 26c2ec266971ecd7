"""A property test of the whole CLI: random command lines over every command, option and value
(tests/cli_lines.py draws them from bench.py's own click command) keep the promises of the README:
exit 0, 1 or 2, never a traceback, a failure in one line, and an exit 2 leaves every file byte for
byte; status, docs --check and dry runs change no file. Bounded here (a fixed, derandomized set of
lines, in process); benchmarks/cli_property.py runs thousands. The regressions it once found are
pinned as examples."""

from __future__ import annotations

import uuid

import pytest
import typer
from hypothesis import HealthCheck, example, given, settings

from bench import app
from tests.cli_lines import command_line, make_template, run_line

CLI = typer.main.get_command(app)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "template.db"
    make_template(path)
    return path


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(line=command_line(CLI))
@example(line=["enqueue", "sweeps[old]/my.toml", "--db", "new.db"])  # brackets kept, nothing written
@example(line=["enqueue", "latin1.toml", "--db", "new.db"])  # not UTF-8: one line, exit 2
@example(line=["enqueue", "axis.toml", "--db", "results.db"])
@example(line=["report", "--out", "afile"])  # --out names a file
@example(line=["status", "--db", "foo://x"])
@example(line=["merge", "missing.db", "--db", "new.db"])
@example(line=["merge", "copy[1].db", "copy[1].db"])  # found by the benchmark: a KeyError
@example(line=["merge", "sqlite:///new-url.db", "foo://x"])  # found by the benchmark: the URL source was created
@example(line=["merge", "copy[1].db", "--db", "new.db"])  # and the source keeps no -wal/-shm
@example(line=["enqueue", "--dry-run", "--db", "new.db", "--set", "d_model=32"])
@example(line=["retry", "--db", "typo.db"])
@example(line=["retry", "--pool", "nosuch"])
@example(line=["retry", "--pool", " ", "--db", "empty.db"])
@example(line=["enqueue", "--set", "d_model=32", "--set", "n_layers=1", "--axis", "n_layers=1,2", "--name", "w[x]"])
@example(line=["enqueue", "--axis", "d_model=64", "--axis", "d_model=128"])
@example(line=["enqueue", "--axis", "d_model=64,,128"])
@example(line=["enqueue", "repeats.toml"])
@example(line=["enqueue", "random.toml"])
@example(line=["enqueue", "rejected.toml"])
@example(line=["status", "--pool", "p", "--all-machines"])
@example(line=["enqueue", "--repeats", "abc"])
@example(line=["enqueue", "--mem-limit-gb", "1e309"])
@example(line=["status", "--db", "other.db"])
@example(line=["enqueue", "a folder"])
@pytest.mark.slow
@pytest.mark.probe
def test_every_command_line_exits_0_1_or_2_without_a_traceback_and_exit_2_writes_nothing(tmp_path, template, line):
    broken = run_line(app, line, tmp_path / uuid.uuid4().hex, template)
    assert broken is None, f"{line}: {broken}"
