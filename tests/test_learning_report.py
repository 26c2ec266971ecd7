"""Time to a trained model (orchestrator/stats/learning.py, orchestrator/report/sections/learning.py):
the factors on step time, tokens to target and time to target tested against runs drawn from a known
truth, censored runs said as bounds, rank changes called out; and the section as a real learning sweep
writes it."""

import math
import random

import pytest

from common.variables import resolve
from orchestrator.stats import learning
from tests.conftest import bench

pytestmark = pytest.mark.probe

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
    rows = _runs(random.Random(4), truth={("precision", "bf16"): (0.7, 1.8), ("d_model", 128): (2.0, 0.3)})
    changes = learning.rank_changes(learning.comparisons(rows))  # each variable's baseline is its own value
    assert sorted((v, s, t) for _, v, s, t in changes) == [("d_model", ["64", "128"], ["128", "64"]),
                                                          ("precision", ["bf16", "fp32"], ["fp32", "bf16"])]


@pytest.mark.trainer
def test_a_learning_sweep_reports_time_to_target_split_into_step_time_and_tokens(db, tmp_path):
    tiny = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "seq_len=32",
            "--set", "vocab_size=256", "--set", "warmup_steps=1", "--set", "cores=1", "--set", "dataset=shakespeare"]
    bench("enqueue", "--db", db, *tiny, "--set", "max_tokens=6144", "--set", "eval_every=256",
          "--set", "target_loss=5.2", "--set", "lr=0.01", "--axis", "batch_size=4,8", "--repeats", "6", check=True)
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

    # a batch size never run: tokens to a loss from the curves' law, step time from the cost model
    import json

    asked = [f"{k}={v}" for k, v in (("d_model", 32), ("n_layers", 1), ("n_heads", 2), ("seq_len", 32),
                                      ("vocab_size", 256), ("dataset", "shakespeare"), ("lr", 0.01),
                                      ("batch_size", 6), ("cores", 1), ("warmup_steps", 1))]
    doc = json.loads(bench("predict", "--db", db, *asked, "--to-loss", "5.3", "--json", check=True).stdout)
    for key in ("time_to_target_s", "time_to_target_s_low", "time_to_target_s_high", "tokens_to_target"):
        assert doc[key] > 0, key
    assert doc["time_to_target_s_low"] < doc["time_to_target_s"] < doc["time_to_target_s_high"]
    refused = bench("predict", "--db", db, *asked, "lr_schedule=cosine", "--to-loss", "5.3")  # the same step cost
    assert refused.returncode == 1, refused.stderr
    assert "lr_schedule=cosine: learning was measured only at lr_schedule=constant" in refused.stderr


def test_tokens_to_a_loss_are_read_off_a_curve_between_its_evaluations():
    curve = [(1000, 6.0), (2000, 5.0), (4000, 4.0)]
    assert learning.tokens_to(curve, 5.0) == pytest.approx(2000)
    assert learning.tokens_to(curve, 4.5) == pytest.approx(math.exp((math.log(2000) + math.log(4000)) / 2))
    assert learning.tokens_to(curve, 6.5) == 1000  # already there at the first evaluation
    assert learning.tokens_to(curve, 3.0) is None  # never: censored


def test_the_tokens_law_recovers_a_known_truth_refuses_what_was_never_measured_and_covers_new_runs():
    rng = random.Random(5)

    def truth(v):  # tokens to the loss: fewer with width, more with batch, a U in the learning rate
        return 1e5 * (v["d_model"] / 64) ** -0.5 * (v["batch"] / 16) ** 0.3 * math.exp(
            0.4 * math.log(v["lr"] / 0.003) ** 2) * (1.3 if v["precision"] == "bitnet" else 1.0)

    base = {"d_model": 64, "n_layers": 2, "n_heads": 4, "mlp_ratio": 4.0, "vocab_size": 1024, "seq_len": 64,
            "batch": 16, "lr": 0.003, "precision": "fp32", "optimizer": "adamw", "lr_schedule": "constant",
            "activation": "gelu", "attention": "full", "dropout": 0.0, "dataset_used": "shakespeare"}
    designs = [{}, {"d_model": 32}, {"d_model": 128}, {"batch": 4}, {"batch": 64}, {"lr": 0.001}, {"lr": 0.01},
               {"precision": "bitnet"}]
    observations = [(base | d, truth(base | d) * math.exp(rng.gauss(0, 0.05))) for d in designs for _ in range(5)]
    observations.append((base | {"lr": 0.03}, None))  # never got there: left out, counted
    law = learning.fit_law(observations, 5.0)
    assert law.censored == 1 and law.runs == 40 and law.squared == ["lr"]
    covered = 0
    new = [{"d_model": 48}, {"d_model": 96}, {"batch": 8}, {"lr": 0.002}, {"lr": 0.005}]
    for d in new:
        p = law.predict(base | d)
        assert p["tokens_to_target"] == pytest.approx(truth(base | d), rel=0.08), d
        covered += sum(p["tokens_to_target_low"] <= truth(base | d) * math.exp(rng.gauss(0, 0.05))
                       <= p["tokens_to_target_high"] for _ in range(20))
    assert covered >= 0.9 * 20 * len(new)
    assert "seq_len=128: learning was measured only at seq_len=64" in law.refusal(base | {"seq_len": 128})
    assert "precision=q4: learning was never measured there" in law.refusal(base | {"precision": "q4"})
    assert law.predict(base | {"d_model": 256})["extrapolated"]["d_model"]["measured_max"] == 128


@pytest.mark.slow
def test_with_several_machines_each_gets_the_time_to_target_measured_or_predicted_from_the_curves(db, tmp_path):
    """A learning sweep run on this host, and a synthetic machine (tests/synthetic.py) that ran the quick
    preset and none of the learning runs: it gets their time to target predicted from its own step
    times and the tokens this host measured, said as such."""
    from orchestrator.report import write_report
    from orchestrator.queue.store import Store
    from tests import synthetic as S

    tiny = ["--set", "d_model=64", "--set", "n_layers=2", "--set", "n_heads=4", "--set", "seq_len=64",
            "--set", "vocab_size=1024", "--set", "warmup_steps=1", "--set", "cores=1", "--set", "dataset=shakespeare",
            "--set", "max_tokens=16384", "--set", "eval_every=1024", "--set", "target_loss=6.6", "--set", "lr=0.01"]
    bench("enqueue", "--db", db, *tiny, "--axis", "batch_size=4,8", "--repeats", "3", check=True)
    bench("work", "--db", db, check=True, timeout=900)
    synthetic = S.build(Store(db), seed=1)  # claims every queued job: the learning ones end done, unmeasured
    report = write_report(Store(db), tmp_path / "result", plots=False)
    section = report.summary_path.read_text().split("### Time to target on each machine", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| batch_size=")]
    assert len(lines) == 2, section
    for line in lines:
        here, there = line.split(" | ")[1:3]
        assert here.startswith("measured: ") and there.startswith("predicted: "), line
        assert "tokens measured on" in there
    assert synthetic in report.analysis.machines


def test_the_geometric_mean_of_tokens_to_target_carries_its_seeds_interval():
    f = learning.geomean([100.0, 400.0])
    assert f.estimate == pytest.approx(200.0) and f.low < 100.0 and f.high > 400.0  # t with 1 dof: wide
    assert learning.geomean([300.0]).low is None and learning.geomean([]).bound == "unresolved"
