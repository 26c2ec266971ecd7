"""The memory estimate (worker/memory.py) and the enqueue check that refuses a job too big for
the machine: exit 2, the job and its estimate in the message, nothing written."""

import sqlite3

import pytest

from worker import memory
from common import variables as V
from common.errors import BadInput
from orchestrator.queue.sweep import PRESETS_DIR, Machine, load
from tests.conftest import bench

HUGE = ["--set", "n_layers=32", "--set", "d_model=2048", "--set", "n_heads=32", "--set", "seq_len=2048",
        "--set", "batch_size=64", "--set", "vocab_size=65536"]


def resolved(**partial) -> dict:
    config, why = V.resolve(partial, 2)
    assert not why, why
    return config


def test_the_estimate_grows_with_each_term_it_counts():
    base = memory.estimate(resolved()).total
    for change in ({"batch_size": 16}, {"seq_len": 256}, {"n_layers": 4}, {"d_model": 256}, {"vocab_size": 8192},
                   {"attn_backend": "manual"}, {"dropout": 0.1}):
        assert memory.estimate(resolved(**change)).total > base, change
    assert memory.estimate(resolved(precision="bf16")).total < base
    assert memory.estimate(resolved(optimizer="sgd")).total < base
    # a window bounds the scores that a written-out attention keeps
    full = memory.estimate(resolved(seq_len=1024, attn_backend="manual")).activations
    sliding = resolved(seq_len=1024, attn_backend="manual", attention="sliding", window=128)
    assert memory.estimate(sliding).activations < full


def test_every_calibration_run_is_under_its_estimate():
    """The estimate errs high: at or above every peak measured (bench.py once, the child's ru_maxrss),
    and not absurdly so (an estimate 4x the truth would refuse jobs that fit)."""
    assert memory.CALIBRATION, "no measured peaks to validate against"
    for partial, measured_mb in memory.CALIBRATION:
        ratio = memory.estimate(resolved(**partial)).total / (measured_mb * memory.MIB)
        assert 1.0 <= ratio <= 4.0, (partial, measured_mb, ratio)


def test_a_config_over_the_limit_is_refused_naming_it_and_its_estimate():
    plan = load(None, axes=["batch_size=8,4096"], machine=Machine(cpu_count=2))
    with pytest.raises(BadInput) as caught:
        memory.check_plan(plan, 8 * memory.GIB, "8 GiB")
    message = str(caught.value)
    assert "batch_size=4096" in message and "GiB" in message and "more than 8 GiB" in message
    assert "batch_size=8 " not in message  # the one that fits is not named


def test_a_huge_job_is_refused_at_enqueue_with_exit_2_and_nothing_written(db):
    bench("enqueue", "--db", db, "--axis", "d_model=32,64", check=True)
    with sqlite3.connect(db) as conn:
        before = list(conn.iterdump())
    proc = bench("enqueue", "--db", db, *HUGE)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "d_model=2048" in proc.stderr and "needs about" in proc.stderr and "GiB" in proc.stderr
    with sqlite3.connect(db) as conn:
        assert list(conn.iterdump()) == before


def test_a_refused_sweep_creates_no_database_and_a_higher_limit_lets_it_through(tmp_path):
    db = tmp_path / "never.db"
    proc = bench("enqueue", "--db", str(db), *HUGE, "--mem-limit-gb", "4")
    assert proc.returncode == 2 and "more than the limit of 4 GiB" in proc.stderr
    assert not db.exists()
    proc = bench("enqueue", "--db", str(db), *HUGE, "--dry-run", env={"BENCH_MEM_LIMIT_GB": "100000"})
    assert proc.returncode == 0, proc.stderr
    assert bench("enqueue", "--db", str(db), "--mem-limit-gb", "-1").returncode == 2


def test_once_refuses_a_job_over_the_limit_before_starting_it():
    proc = bench("once", "d_model=2048", "n_layers=32", "n_heads=32", "seq_len=2048", "--mem-limit-gb", "2", "--json")
    assert proc.returncode == 2 and "needs about" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
def test_every_preset_fits_a_16_gib_machine(preset):
    """The presets are meant for small machines too: every job of each fits in 16 GiB by estimate."""
    plan = load(None, preset=preset, machine=Machine(cpu_count=16))
    assert memory.check_plan(plan, 16 * memory.GIB, "16 GiB") <= 16 * memory.GIB
