"""Learning runs through the queue as users run them: real `bench.py` processes, real torch children,
real SQLite files, a real kill -9 of a child mid-curve; and the learning bounds refused at enqueue."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, bench
from worker.data import EVAL_TOKENS

pytestmark = [pytest.mark.trainer, pytest.mark.probe]

TINY = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "seq_len=32", "--set",
        "batch_size=4", "--set", "vocab_size=256", "--set", "warmup_steps=1", "--set", "dataset=builtin",
        "--set", "cores=1"]  # 128 tokens a step


def rows(db, sql, *args):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def test_a_learning_sweep_keeps_every_evaluation_in_curves_and_v_curves(db):
    bench("enqueue", "--db", db, *TINY, "--set", f"max_tokens={128 * 12}", "--set", f"eval_every={128 * 4}",
          "--axis", "lr=0.001,0.004", check=True)
    bench("work", "--db", db, check=True, timeout=600)
    runs = rows(db, "SELECT run_id, lr, status, val_loss, train_tokens, reached FROM v_results ORDER BY lr")
    assert [r[2] for r in runs] == ["done", "done"] and [r[4] for r in runs] == [128 * 12] * 2
    # a learning run evaluates the whole fixed set (a step-time run only its first STEP_TIME_EVAL_TOKENS)
    assert rows(db, "SELECT DISTINCT json_extract(applied, '$.val_tokens') FROM runs") == [(EVAL_TOKENS // 32 * 32,)]
    assert [r[5] for r in runs] == [None, None]  # no target: nothing to reach
    for run_id, lr, _, val_loss, _, _ in runs:
        curve = rows(db, "SELECT attempt, final, step, tokens, train_s, eval_s, time_s, val_loss, lr FROM v_curves "
                         "WHERE run_id = ? ORDER BY step", run_id)
        assert [c[2] for c in curve] == [4, 8, 12] and [c[3] for c in curve] == [512, 1024, 1536]
        assert {(c[0], c[1], c[8]) for c in curve} == {(1, 1, lr)}
        assert curve[-1][7] == pytest.approx(val_loss)  # the run's val_loss is its last evaluation's
        assert all(c[6] == pytest.approx(c[4] + c[5]) for c in curve)
    # two learning rates, one text, one seed: they learn apart
    assert runs[0][3] != runs[1][3]


def test_a_killed_learning_run_keeps_its_partial_curve_and_the_retry_starts_clean(db, tmp_path):
    steps = 200
    bench("enqueue", "--db", db, *TINY, "--set", f"max_tokens={128 * steps}", "--set", "eval_every=128", check=True)
    # One strike fails the run: a child killed by a signal is otherwise tried again at once (worker/loop.py).
    worker = subprocess.Popen([sys.executable, str(ROOT / "bench.py"), "work", "--db", db], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "BENCH_MAX_ATTEMPTS": "1"})
    try:
        deadline = time.monotonic() + 120
        curve_files = []
        while time.monotonic() < deadline:  # the child appends an evaluation per step: kill it a few in
            curve_files = list((tmp_path / "output").glob("run-*/curve.jsonl"))
            if curve_files and len(curve_files[0].read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        (child_pid,) = rows(db, "SELECT child_pid FROM runs WHERE status = 'running'")[0]
        os.kill(child_pid, signal.SIGKILL)
        assert worker.wait(timeout=120) == 0, worker.stderr.read()
    finally:
        if worker.poll() is None:
            worker.kill()
    (status, reason), = rows(db, "SELECT status, reason FROM runs")
    assert status == "failed" and "SIGKILL" in reason
    partial = rows(db, "SELECT attempt, final, step FROM v_curves ORDER BY step")
    assert len(partial) >= 3 and {(a, f) for a, f, _ in partial} == {(1, 0)}  # kept, never final
    assert len(partial) < steps

    bench("retry", "--db", db, "--failed", check=True)
    bench("work", "--db", db, check=True, timeout=600)
    assert rows(db, "SELECT status FROM runs") == [("done",)]
    by_attempt = dict(rows(db, "SELECT attempt, COUNT(*) FROM curves GROUP BY attempt"))
    assert by_attempt == {1: len(partial), 2: steps}  # the failed attempt's curve kept, the retry's whole
    assert rows(db, "SELECT DISTINCT attempt FROM v_curves WHERE final") == [(2,)]
    first_steps = rows(db, "SELECT step FROM curves WHERE attempt = 2 ORDER BY step LIMIT 3")
    assert first_steps == [(1,), (2,), (3,)]  # it started clean, from step 1


@pytest.mark.parametrize("settings, words", [
    (["--set", "target_loss=3"], "target_loss=3 needs max_tokens"),
    (["--set", "target_loss=-1", "--set", "max_tokens=4096"], "target_loss='-1'"),
    (["--set", "target_loss=nan", "--set", "max_tokens=4096"], "target_loss='nan'"),
    (["--set", "max_tokens=64"], "max_tokens=64 is below one optimizer step"),
    (["--set", "max_tokens=4096", "--set", "target_loss=4", "--set", "dataset=builtin"], "generated text"),
])
def test_a_learning_bound_that_cannot_be_a_job_exits_2_in_one_line_and_writes_nothing(db, settings, words):
    done = bench("enqueue", "--db", db, "--set", "seq_len=32", "--set", "batch_size=4", *settings)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not os.path.exists(db) or rows(db, "SELECT COUNT(*) FROM jobs") == [(0,)]


def test_each_repeat_of_a_learning_run_trains_with_a_seed_of_its_own(db):
    bench("enqueue", "--db", db, *TINY, "--set", f"max_tokens={128 * 6}", "--set", "seed=5", "--repeats", "2",
          check=True)
    bench("enqueue", "--db", db, *TINY, "--set", "steps=3", "--set", "seed=5", "--repeats", "2", check=True)
    bench("work", "--db", db, check=True, timeout=600)
    got = rows(db, "SELECT max_tokens, repeat, seed, json_extract(applied, '$.seed'), val_loss FROM v_results "
                   "ORDER BY max_tokens IS NULL, repeat")
    learning, timing = got[:2], got[2:]
    assert [(r[2], r[3]) for r in learning] == [(5, 5), (5, 6)]  # the column keeps the sweep's seed
    assert learning[0][4] != learning[1][4]  # their own init and data order: they learned apart
    assert [r[3] for r in timing] == [5, 5]  # a step-time run's repeats time one configuration
