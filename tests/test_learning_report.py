"""Time to a trained model (orchestrator/learning.py, learning_report.py): the factors on step time,
tokens to target and time to target tested against runs drawn from a known truth, censored runs
said as bounds, rank changes called out; and the section as a real learning sweep writes it."""

import math
import random

import pytest

from common.variables import resolve
from orchestrator import learning
from tests.conftest import bench

BASE = {"d_model": 64, "batch_size": 8, "seq_len": 64, "max_tokens": 200_000, "target_loss": 5.0,
        "dataset": "shakespeare"}


def _runs(rng, machine_id=1, seeds=5, truth=None, step_sigma=0.03, tokens_sigma=0.1, reach=1.0, run_id=None):
    """Learning runs of the base and of batch_size=16 and precision=bf16, from known factors."""
    truth = truth or {("batch_size", 16): (0.6, 1.8), ("precision", "bf16"): (0.7, 1.2)}
    run_id = run_id if run_id is not None else [0]
    rows = []
    for change, (step_f, tokens_f) in [(None, (1.0, 1.0)), *truth.items()]:
        config, why = resolve(BASE | (dict([change]) if change else {}), 2)
        assert not why
        for seed in range(seeds):
            run_id[0] += 1
            step = 20.0 * step_f * math.exp(rng.gauss(0, step_sigma))
            tokens = 40_000 * tokens_f * math.exp(rng.gauss(0, tokens_sigma))
            reached = rng.random() < reach and tokens <= config["max_tokens"]
            rows.append(config | {"run_id": run_id[0], "machine_id": machine_id, "seed": 0, "repeat": seed,
                                  "step_ms_median": step, "reached": reached, "train_tokens": tokens if reached else
                                  config["max_tokens"], "tokens_to_target": tokens if reached else None,
                                  "time_to_target_s": tokens / 512 * step / 1e3 if reached else None})
    return rows


def test_the_factors_recover_a_known_truth_and_their_intervals_cover_it():
    truth = {("batch_size", 16): (0.6, 1.8), ("precision", "bf16"): (0.7, 1.2)}
    covered = {"step": 0, "tokens": 0, "time": 0}
    trials = 200
    rng = random.Random(3)
    for _ in range(trials):
        comps = learning.comparisons(_runs(rng, truth=truth))
        assert sorted((c.variable, c.value.config[c.variable]) for c in comps) == sorted(truth)
        for c in comps:
            step_f, tokens_f = truth[(c.variable, c.value.config[c.variable])]
            for name, f, want in (("step", c.step, step_f), ("tokens", c.tokens, tokens_f),
                                  ("time", c.time, step_f * tokens_f)):
                covered[name] += f.low <= want <= f.high
    for name, n in covered.items():  # 95% intervals, 2 comparisons a trial
        assert 0.90 <= n / (2 * trials) <= 0.995, (name, n / (2 * trials))


def test_a_value_whose_runs_did_not_all_reach_the_target_has_a_bound_not_an_interval():
    rows = _runs(random.Random(1), truth={("batch_size", 16): (0.6, 5.0)})  # 200k tokens: at the budget
    (c,) = learning.comparisons(rows)
    assert c.value.reached < c.value.n and c.tokens.bound == ">=" and c.tokens.high is None
    assert c.time.bound == ">=" and c.value.olympic_time() == math.inf
    assert c.baseline.olympic_time() is not None and math.isfinite(c.baseline.olympic_time())


def test_a_seed_run_in_every_block_counts_once_for_tokens_to_target():
    rows = _runs(random.Random(2))
    base = [r for r in rows if r["batch_size"] == 8 and r["precision"] == "fp32"]
    again = [r | {"run_id": 1000 + r["run_id"]} for r in base]  # the baseline of a second block: the same seeds
    (v,) = [v for v in learning.values(rows + again)[1].values() if v.config["batch_size"] == 8
            and v.config["precision"] == "fp32"]
    assert v.n == 10 and len(v.tokens) == 5


def test_a_faster_step_that_trains_slower_is_called_out():
    rows = _runs(random.Random(4), truth={("precision", "bf16"): (0.7, 1.8), ("batch_size", 16): (0.8, 1.0)})
    changes = learning.rank_changes(learning.comparisons(rows))
    assert [(v, s, t) for _, v, s, t in changes] == [("precision", ["bf16", "fp32"], ["fp32", "bf16"])]


def test_a_learning_sweep_reports_time_to_target_split_into_step_time_and_tokens(db, tmp_path):
    tiny = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "seq_len=32",
            "--set", "vocab_size=256", "--set", "warmup_steps=1", "--set", "cores=1", "--set", "dataset=shakespeare"]
    bench("enqueue", "--db", db, *tiny, "--set", "max_tokens=6144", "--set", "eval_every=256",
          "--set", "target_loss=5.2", "--set", "lr=0.01", "--axis", "batch_size=4,8", "--repeats", "2", check=True)
    bench("work", "--db", db, check=True, timeout=900)
    out = tmp_path / "result"
    done = bench("report", "--db", db, "--out", str(out), check=True, timeout=600)
    assert done.returncode == 0
    md = (out / "summary.md").read_text()
    section = md.split("## Time to a trained model", 1)[1].split("\n## ", 1)[0]
    assert "| batch_size | 8 vs 4 |" in section
    assert "step time" in section and "tokens to target" in section and "time to target" in section
    assert (out / "plots" / "learning_batch_size.png").exists()
    page = (out / "index.html").read_text()
    assert 'id="learning"' in page and page.index('id="learning"') < page.index('id="effects"')
