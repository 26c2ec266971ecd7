"""A database written by the last release before blocks (version 3: tests/v3, made by
tests/v3/make_v3_ofat_db.py from commit c6a4c6a: an ofat sweep, shuffled passes) opens in this release,
keeps every run and job identity with block NULL (its passes were one shuffled block), and takes the
same sweep again as a blocked plan of new jobs beside the old ones."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from orchestrator.queue.migrations import LATEST
from orchestrator.queue.store import Store
from tests.conftest import bench
from tests.test_migrations import sqlite_rows

V3 = Path(__file__).resolve().parent / "v3"


@pytest.fixture
def v3_db(tmp_path) -> str:
    path = tmp_path / "v3.db"
    shutil.copyfile(V3 / "results-v3-ofat.db", path)
    return str(path)


@pytest.mark.slow
def test_a_version_3_database_keeps_its_jobs_unblocked_and_plans_the_same_sweep_anew_in_blocks(v3_db, tmp_path):
    assert sqlite_rows(v3_db, "SELECT MAX(version) FROM schema_version") == [(3,)]
    runs_before = sqlite_rows(v3_db, "SELECT run_id, job_id, status, step_ms_median FROM runs ORDER BY run_id")
    jobs_before = sqlite_rows(v3_db, "SELECT job_id, config_hash, run_order FROM jobs ORDER BY job_id")

    store = Store(v3_db)
    assert store.migrated == "migrated from version 3"
    assert (sqlite_rows(v3_db, "SELECT version FROM schema_version ORDER BY version")
            == [(v,) for v in range(3, LATEST + 1)])
    assert sqlite_rows(v3_db, "SELECT run_id, job_id, status, step_ms_median FROM runs ORDER BY run_id") == runs_before
    assert sqlite_rows(v3_db, "SELECT job_id, config_hash, run_order FROM jobs ORDER BY job_id") == jobs_before
    assert sqlite_rows(v3_db, "SELECT COUNT(*) FROM jobs WHERE block IS NOT NULL") == [(0,)]
    assert sqlite_rows(v3_db, "SELECT COUNT(*), COUNT(block) FROM v_results") == [(len(runs_before), 0)]

    sweep = tmp_path / "v3-ofat.toml"
    sweep.write_text((V3 / "make_v3_ofat_db.py").read_text().split('SWEEP = """')[1].split('"""')[0])
    proc = bench("enqueue", str(sweep), "--db", v3_db, check=True)
    # every job of the blocked plan is new: its identity has its block
    assert "added 14 new jobs, 0 already present" in proc.stdout
    blocks = sqlite_rows(v3_db, "SELECT block, COUNT(*) FROM jobs WHERE block IS NOT NULL "
                                "GROUP BY block ORDER BY block")
    assert blocks == [("d_model", 6), ("framework", 4), ("n_layers", 4)]  # values + own baseline, 2 repeats
    assert sqlite_rows(v3_db, "SELECT DISTINCT compile FROM jobs WHERE block = 'framework' AND framework = 'jax'") == [
        ("xla",)]  # compile follows framework now; the old eager JAX jobs keep theirs
    assert sqlite_rows(v3_db, "SELECT run_id, job_id, status, step_ms_median FROM runs ORDER BY run_id") == runs_before

    counts = json.loads(bench("status", "--all-machines", "--json", "--db", v3_db, check=True).stdout)
    assert counts["done"] + counts["failed"] == len(runs_before) and counts["queued"] == 14
    bench("report", "--db", v3_db, "--out", str(tmp_path / "result"), check=True)
    with (tmp_path / "result" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(runs_before) and "block" in rows[0]
