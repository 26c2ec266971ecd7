"""End to end with the real training child: `once`, and a tiny sweep through `work` and `report`,
with children forked from the fork server and freshly executed."""

import json
import sqlite3
from pathlib import Path

import pytest

from worker.knobs import isa_check
from worker.trainers.harness import METRICS
from tests.conftest import bench

pytestmark = [pytest.mark.trainer, pytest.mark.probe]

TINY = ["n_layers=1", "d_model=32", "n_heads=2", "seq_len=32", "batch_size=4", "steps=4", "warmup_steps=1",
        "vocab_size=512"]


@pytest.mark.smoke
def test_once_prints_one_json_document_with_every_metric_and_the_settings_read_back():
    proc = bench("once", *TINY, "cores=1", "--json", check=True)
    result = json.loads(proc.stdout)  # exactly one document: anything else on stdout fails here
    assert result["status"] == "done"
    assert set(METRICS) <= set(result)
    assert result["step_ms_median"] > 0 and result["wall_s"] >= result["train_s"] > 0
    assert result["applied"]["affinity"] == [0]
    assert result["applied"]["torch_threads"] == 1
    assert result["dataset_used"] in ("ThomasTheMaker/Arc-Corpus-sample", "shakespeare", "builtin")
    assert result["energy_j"] is None and "energy_j" in result["applied"]["sensor_notes"]


@pytest.mark.parametrize("settings, framework", [(["framework=numpy"], "numpy"),
                                                (["framework=jax", "compile=xla"], "jax")])
def test_once_trains_numpy_and_jax_through_the_worker(settings, framework):
    result = json.loads(bench("once", *TINY, "dataset=builtin", *settings, "--json", check=True).stdout)
    assert result["status"] == "done", result["reason"]
    assert set(METRICS) <= set(result) and result["tokens_per_s"] > 0 and result["loss_last"] > 0
    assert result["torch_version"] is None and result["build_info"]["framework"].startswith(framework)
    assert "torch_threads" not in result["applied"]  # the torch trainer did not run it


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_a_tiny_sweep_runs_records_and_reports(db, tmp_path, spawn):
    sets = [arg for item in TINY if not item.startswith("d_model=") for arg in ("--set", item)]  # d_model is an axis
    bench("enqueue", "--db", db, *sets, "--axis", "d_model=32,48", "--axis", "isa=default,avx2", check=True)
    bench("work", "--db", db, env={"BENCH_SPAWN": spawn}, check=True)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT run_id, status, isa, step_ms_median, loss_first, output_path, applied, "
                            "dataset_used, reason FROM v_results").fetchall()
    assert len(rows) == 4
    for run_id, status, isa, step_ms, loss, output_path, applied, dataset_used, reason in rows:
        applied = json.loads(applied)
        if isa == "avx2" and status != "done":  # MKL names no ISA here: the probe read it, refused at claim
            assert status == "skipped" and "MKL does not name" in reason, (status, reason)  # saying why
            assert output_path is None  # before any setup
            continue
        assert status == "done", (run_id, isa)
        assert applied["spawn"] == ("fork server" if spawn == "fork" else "exec")
        # a fork server reads the library ISAs once for its children (worker/knobs/isa_check.py), exec every child
        assert applied["library_isas_read"] == (isa_check.READ_IN_SERVER if spawn == "fork" else isa_check.READ_HERE)
        assert set(applied["setup_phases_s"]) == {"imports", "data", "model", "optimizer", "save", "read_back"}
        assert step_ms > 0 and loss > 0 and dataset_used
        assert Path(output_path).name.startswith(f"run-{run_id}-") and Path(output_path).is_dir()
        if isa == "avx2":
            assert applied["cpu_capability"] == "AVX2"
    report = bench("report", "--db", db, "--out", str(tmp_path / "result"), check=True)
    assert "largest effects" in report.stdout
    assert (tmp_path / "result" / "summary.md").read_text().count("d_model") >= 1
    # The last line names the page to open.
    assert "index.html" in report.stdout.strip().splitlines()[-1]
    assert 'id="var-d_model"' in (tmp_path / "result" / "index.html").read_text()


def test_two_databases_runs_of_the_same_number_keep_their_own_models(tmp_path):
    """Every database numbers its runs from 1: run 1 of a second database must not overwrite the
    model that run 1 of the first recorded as its output_path."""
    paths = []
    for name in ("a.db", "b.db"):
        db = str(tmp_path / name)
        bench("enqueue", "--db", db, *[arg for item in TINY for arg in ("--set", item)], check=True)
        bench("work", "--db", db, check=True)
        with sqlite3.connect(db) as conn:
            (run_id, output_path), = conn.execute(
                "SELECT run_id, output_path FROM runs WHERE status = 'done'").fetchall()
        assert run_id == 1
        paths.append(Path(output_path))
    assert paths[0] != paths[1]
    assert all((p / "config.json").exists() for p in paths)
    assert json.loads((paths[0] / "config.json").read_text())["run_id"] == 1
