"""The command line's promises, one test each, through the real CLI in process (typer's runner) in a fresh
folder: what the user typed is printed as typed, bad input is one line and exit 2 with every file
left as it was, options for one variable are given once, status counts each job once, results go to
stdout."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import app
from tests.cli_lines import snapshot


@pytest.fixture
def here(tmp_path):
    folder = tmp_path / "here"
    folder.mkdir()
    cwd = os.getcwd()
    os.chdir(folder)
    yield folder
    os.chdir(cwd)


def cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stdout + result.stderr
    return result


def refused(folder: Path, *args: str, words: str):
    """Exit 2, one line on stderr naming the fault, no file created or changed."""
    before = snapshot(folder)
    result = cli(*args)
    assert result.exit_code == 2, (args, result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert words in result.stderr, result.stderr
    assert snapshot(folder) == before
    return result


def test_brackets_in_paths_tables_and_sweep_names_are_printed_as_typed(here):
    refused(here, "enqueue", "sweeps[old]/my.toml", "--db", "r.db", words="sweep file not found: sweeps[old]/my.toml")
    (here / "s.toml").write_text("[axis]\nd_model = [32]\n")
    refused(here, "enqueue", "s.toml", "--db", "r.db", words="unknown table [axis] in s.toml")
    assert cli("enqueue", "--db", "r.db", "--set", "d_model=32", "--name", "width[test]").exit_code == 0
    table = cli("status", "--db", "r.db", "--all-machines").stdout
    assert "width[test]" in table
    assert "[default: BENCH_DB_RETRY_S or 600]" in " ".join(cli("work", "--help").stdout.split())
    assert "<bool>" not in cli("retry", "--help").stdout


def test_a_non_utf8_sweep_an_out_naming_a_file_and_foreign_urls_are_one_line(here):
    (here / "latin1.toml").write_bytes(b"[sweep]\nname = '\xff'\n")
    refused(here, "enqueue", "latin1.toml", "--db", "r.db", words="is not UTF-8")
    assert cli("enqueue", "--db", "r.db", "--set", "d_model=32").exit_code == 0
    (here / "f.txt").write_text("x")
    refused(here, "report", "--db", "r.db", "--out", "f.txt", words="--out f.txt is a file")
    refused(here, "status", "--db", "foo://x", words="only SQLite and PostgreSQL")
    refused(here, "status", "--db", "mysql://u@h/db", words="only SQLite and PostgreSQL")
    refused(here, "enqueue", "--repeats", "abc", words="--repeats")


def test_bad_input_and_dry_runs_create_and_change_no_file(here):
    refused(here, "merge", "missing.db", "--db", "new.db", words="missing.db is not a file")
    before = snapshot(here)
    assert "would add 1 new jobs" in cli("enqueue", "--dry-run", "--db", "new.db", "--set", "d_model=32").stdout
    assert snapshot(here) == before  # no database made
    refused(here, "retry", "--db", "typo.db", words="no database file")
    assert cli("enqueue", "--db", "r.db", "--set", "d_model=32").exit_code == 0
    refused(here, "retry", "--db", "r.db", "--pool", "nosuch", words="no pool named 'nosuch'")
    before = snapshot(here)
    assert "added 0 new jobs, 1 already present" in cli("enqueue", "--db", "r.db", "--set", "d_model=32").stdout
    assert snapshot(here) == before  # an idempotent re-enqueue leaves the file byte for byte
    (here / "empty.db").write_bytes(b"")
    refused(here, "retry", "--db", "empty.db", words="no cpubench database")
    refused(here, "status", "--db", "empty.db", "--all-machines", words="no cpubench database")


def test_merge_leaves_no_wal_or_shm_beside_its_source(here):
    assert cli("enqueue", "--db", "src.db", "--set", "d_model=32").exit_code == 0
    source = snapshot(here)
    result = cli("merge", "src.db", "--db", "r.db")
    assert result.exit_code == 0 and "merged src.db" in result.stdout
    after = snapshot(here)
    assert {k: v for k, v in after.items() if k.startswith("src.db")} == source


@pytest.mark.parametrize("args, words", [
    (["--axis", "d_model=64", "--axis", "d_model=128"], "d_model is already given by --axis d_model=64"),
    (["--set", "d_model=64", "--set", "d_model=128"], "d_model is already given by --set d_model=64"),
    (["--set", "d_model=64", "--axis", "d_model=128,256"], "d_model is already given by --set d_model=64"),
    (["--axis", "d_model=64,,128"], "an empty value between commas"),
    (["--set", "d_model=33", "--set", "n_heads=2"], "every job is rejected: d_model not divisible by n_heads"),
])
def test_options_for_one_variable_are_given_once_and_a_sweep_must_plan_a_job(here, args, words):
    refused(here, "enqueue", "--db", "r.db", *args, words=words)


def test_sweep_files_refuse_text_numbers_too_many_samples_and_an_axis_overridden_by_set(here):
    (here / "repeats.toml").write_text('[sweep]\nrepeats = "3"\n')
    refused(here, "enqueue", "repeats.toml", "--db", "r.db", words="sweep.repeats='3'")
    (here / "random.toml").write_text('[sweep]\nmode = "random"\nsamples = 20\n[axes]\nd_model = [32, 64, 128]\n'
                                      'n_layers = [1, 2, 3]\n')
    refused(here, "enqueue", "random.toml", "--db", "r.db", words="only 9 combinations")
    (here / "random.toml").write_text('[sweep]\nmode = "random"\nsamples = 9\n[axes]\nd_model = [32, 64, 128]\n'
                                      'n_layers = [1, 2, 3]\n')
    assert "added 9 new jobs" in cli("enqueue", "random.toml", "--db", "r.db").stdout  # distinct: all nine
    refused(here, "enqueue", "random.toml", "--db", "r.db", "--set", "d_model=32", words="d_model is an axis")
    refused(here, "once", "d_model=33", "d_model=32", words="d_model is already given")
    refused(here, "status", "--db", "r.db", "--pool", "p", "--all-machines", words="--pool and --all-machines")


def test_cores_auto_on_the_command_line_is_the_machine_range(here):
    result = cli("enqueue", "--dry-run", "--db", "r.db", "--axis", "cores=auto")
    assert result.exit_code == 0 and "sweep cores (grid" in result.stdout


def test_command_line_sweeps_are_named_and_status_counts_each_job_once(here):
    assert cli("enqueue", "--db", "r.db", "--axis", "d_model=32,64,128", "--axis", "n_layers=1,2,3").exit_code == 0
    second = cli("enqueue", "--db", "r.db", "--axis", "d_model=32,64,128", "--axis", "n_layers=1,2,3",
                 "--axis", "n_heads=2,4")  # n_heads=4 is the default: 9 of its 18 jobs are the first's
    assert "added 9 new jobs, 9 already present" in second.stdout
    doc = json.loads(cli("status", "--db", "r.db", "--json", "--all-machines").stdout)
    assert doc["total"] == 18
    assert {k: v["total"] for k, v in doc["sweeps"].items()} == {"d_model x n_layers": 9,
                                                                 "d_model x n_layers x n_heads": 9}
    assert cli("enqueue", "--db", "r.db", "--set", "d_model=32", "--name", "mine").exit_code == 0
    with sqlite3.connect(here / "r.db") as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sweeps")}
    assert names == {"d_model x n_layers", "d_model x n_layers x n_heads", "mine"}


def test_results_go_to_stdout_and_notes_to_stderr(here):
    result = cli("enqueue", "--db", "r.db", "--set", "d_model=32")
    assert "added 1 new jobs" in result.stdout and "added" not in result.stderr
    result = cli("report", "--db", "r.db", "--out", "res")
    assert result.exit_code == 0 and "no finished run" in result.stderr and "┏" not in result.stdout
