"""Bad input: a one-line message naming what and where, exit code 2, no traceback, nothing written."""

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import bench


def dump(db):
    with sqlite3.connect(db) as conn:
        return list(conn.iterdump())


BAD_FILES = {
    "unknown key": "[axes]\nd_modle = [32]\n",
    "wrong type": "[base]\nn_layers = \"two\"\n",
    "empty axis": "[axes]\nn_layers = []\n",
    "bad toml": "[sweep\n",
    "unknown mode": "[sweep]\nmode = \"zigzag\"\n",
    "out of range": "[axes]\ndropout = [2.0]\n",
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_sweep_file_exits_2_and_leaves_the_database_unchanged(db, tmp_path, case):
    bench("enqueue", "--db", db, "--axis", "d_model=32,64", check=True)
    before = dump(db)
    path = tmp_path / "bad.toml"
    path.write_text(BAD_FILES[case])
    proc = bench("enqueue", str(path), "--db", db)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "bad.toml" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert dump(db) == before


def test_a_missing_sweep_file_creates_no_database(tmp_path):
    db = tmp_path / "never.db"
    proc = bench("enqueue", str(tmp_path / "missing.toml"), "--db", str(db))
    assert proc.returncode == 2 and "sweep file not found" in proc.stderr
    assert not db.exists()


def test_bad_set_and_axis_values_exit_2(db):
    for args in (["--set", "precision=fp8"], ["--axis", "n_layers=1,x"], ["--set", "nonsense"], ["--preset", "nope"]):
        proc = bench("enqueue", "--db", db, *args)
        assert proc.returncode == 2, args
        assert "Traceback" not in proc.stderr
    assert not Path(db).exists()


def test_enqueue_twice_gives_the_same_job_count(db):
    first = bench("enqueue", "--db", db, "--preset", "model", check=True)
    second = bench("enqueue", "--db", db, "--preset", "model", check=True)
    assert "added 72 new jobs, 0 already present" in first.stdout  # a result: stdout
    assert "added 0 new jobs, 72 already present" in second.stdout


@pytest.mark.slow
@pytest.mark.probe
def test_dry_run_writes_nothing(db):
    proc = bench("enqueue", "--db", db, "--preset", "quick", "--dry-run", check=True)
    assert "would add" in proc.stdout
    assert not Path(db).exists()  # not even created
    bench("enqueue", "--db", db, "--set", "d_model=32", check=True)
    before = Path(db).read_bytes()
    proc = bench("enqueue", "--db", db, "--preset", "quick", "--dry-run", check=True)
    assert "would add" in proc.stdout and Path(db).read_bytes() == before
    assert sorted(p.name for p in Path(db).parent.iterdir() if p.name.startswith("results.db")) == ["results.db"]


def test_once_rejects_an_impossible_configuration(tmp_path):
    proc = bench("once", "d_model=100", "n_heads=3", "--json")
    assert proc.returncode == 2 and "d_model not divisible by n_heads" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
@pytest.mark.probe
def test_an_auto_range_this_machine_cannot_give_is_kept_as_a_note_for_the_report(db, tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("[axes]\nfreq_mhz = \"auto:400\"\nd_model = [32, 64]\n")
    proc = bench("enqueue", str(path), "--db", db, check=True)
    if "no cpufreq" not in proc.stderr:
        pytest.skip("this machine has cpufreq: the frequency axis was expanded")
    with sqlite3.connect(db) as conn:
        notes = conn.execute("SELECT notes FROM sweeps").fetchone()[0]
    assert "no cpufreq" in notes
    bench("report", "--db", db, "--out", str(tmp_path / "result"), check=True)
    assert "no cpufreq" in (tmp_path / "result" / "summary.md").read_text()


@pytest.mark.parametrize("settings, reason", [
    (["cc_flags=O3"], "cc_flags=O3 needs compile=inductor"),
    (["framework=numpy", "cc_flags=O2"], "cc_flags=O2 needs framework=torch"),
    (["compiler=clang"], "compiler=clang needs compile=inductor"),
    (["framework=jax", "compile=xla", "compiler=clang"], "compiler=clang needs framework=torch"),
    (["blas=openblas"], "blas=openblas needs framework=numpy"),  # torch runs MKL: never another name
    (["framework=jax", "blas=mkl"], "blas=mkl needs framework=torch or numpy"),
])
def test_cc_flags_compiler_and_blas_where_they_mean_nothing_are_refused(db, settings, reason):
    proc = bench("once", *settings, "--json")
    assert proc.returncode == 2 and reason in proc.stderr and proc.stdout == ""
    sets = [arg for s in settings for arg in ("--set", s)]
    proc = bench("enqueue", "--db", db, *sets)  # a sweep whose every job is rejected: bad input, with the reasons
    assert proc.returncode == 2 and "every job is rejected" in proc.stderr and reason in proc.stderr
    assert not Path(db).exists()
