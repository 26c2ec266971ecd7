"""The trainer contract: one metric list the schema follows, analytic counts equal to the module's,
trainer modules free of orchestrator/, one fork server per trainer."""

import ast
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.queue import migrations
from common.variables import parse_value, resolve
from worker.trainers import harness
from worker.trainers.torch.model import (GPT, ModelConfig, add_lora, attention_mask, count_params, flops_per_step,
                                        matmul_params, trainable_params)

REPO = Path(__file__).resolve().parents[1]
BASE = dict(vocab_size=64, seq_len=32, n_layers=2, d_model=32, n_heads=4, head_dim=8, kv_heads=4, window=8)


def test_schema_runs_metric_columns_are_the_harness_list_in_order():
    columns = list(migrations.parse_schema("sqlite").tables["runs"].columns)
    metric_columns = [c for c in columns if c in harness.METRICS]
    assert metric_columns == list(harness.METRICS)
    first = columns.index(harness.METRICS[0])
    assert columns[first:first + len(harness.METRICS)] == list(harness.METRICS)  # one block, nothing between


def test_v_results_shows_every_metric():
    view = migrations.parse_schema("sqlite").views["v_results"]
    shown = set(re.findall(r"\br\.(\w+)", view))
    assert set(harness.METRICS) <= shown


CONFIGS = [
    {},
    {"kv_heads": 2},  # GQA
    {"kv_heads": 1, "activation": "swiglu"},  # MQA + three-matrix MLP
    {"head_dim": 16},  # n_heads * head_dim != d_model
    {"attention": "local", "window": 8},
    {"attention": "local", "window": 12},  # a last block shorter than the window
    {"attention": "sliding", "window": 8},
    {"attention": "sliding", "window": 64},  # window longer than the sequence
    {"mlp_ratio": 2.5, "activation": "relu", "n_layers": 3},
    {"task": "finetune_lora", "lora_rank": 4},
    {"task": "finetune_lora", "lora_rank": 2, "kv_heads": 2, "activation": "swiglu", "head_dim": 16},
]
TASK = ("task", "lora_rank")  # not the model's: the trainer adds the adapters


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "base")
@pytest.mark.parametrize("batch_size,grad_accum", [(8, 1), (3, 4)])
def test_analytic_counts_equal_the_torch_modules_counts(overrides, batch_size, grad_accum):
    arch = asdict(ModelConfig(**(BASE | {k: v for k, v in overrides.items() if k not in TASK})))
    model = GPT(ModelConfig(**arch))
    task = {"task": "pretrain", "lora_rank": 8} | {k: v for k, v in overrides.items() if k in TASK}
    if task["task"] == "finetune_lora":
        add_lora(model, task["lora_rank"])
    config = arch | task | {"batch_size": batch_size, "grad_accum": grad_accum}
    counts = harness.param_counts(config)
    assert counts["params"] == count_params(model)
    assert counts["trainable_params"] == trainable_params(model)
    assert harness.matmul_params(config) == matmul_params(model)
    pairs = int(attention_mask(arch["attention"], arch["seq_len"], arch["window"]).sum())
    assert harness.attended_positions(arch["attention"], arch["seq_len"], arch["window"]) == pairs
    assert harness.flops_per_step(config) == flops_per_step(model, batch_size, grad_accum)
    if task["task"] == "pretrain":  # the module's count, written out
        tokens = batch_size * grad_accum * arch["seq_len"]
        assert flops_per_step(model, batch_size, grad_accum) == (
            6 * matmul_params(model) * tokens
            + 12 * arch["n_layers"] * arch["n_heads"] * arch["head_dim"] * pairs * batch_size * grad_accum)


def test_flops_count_only_attended_positions_and_gqa_only_shrinks_projections():
    def flops(**o):
        return harness.flops_per_step(asdict(ModelConfig(**BASE)) | {"batch_size": 8, "grad_accum": 1} | o)

    assert flops() > flops(attention="sliding") > flops(attention="local")
    assert flops(kv_heads=1) < flops()
    assert flops(grad_accum=2) == 2 * flops()


def test_a_catalogue_config_has_everything_the_counts_need():
    config, why = resolve({"d_model": parse_value("d_model", "64")}, 2)
    assert not why
    assert harness.flops_per_step(config) > 0 and harness.param_counts(config)["params"] > 0


def test_result_refuses_a_missing_or_unknown_metric():
    full = {m: 1.0 for m in harness.TRAINER_METRICS}
    kwargs = dict(applied={}, timed_window=None, dataset_used=None, output_path=None, torch_version=None,
                  build_info=None, gemm_format="fp32 GEMMs")
    assert harness.result(full, **kwargs)["metrics"] == full
    with pytest.raises(RuntimeError, match="missing metrics \\['mfu'\\]"):
        harness.result({k: v for k, v in full.items() if k != "mfu"}, **kwargs)
    with pytest.raises(RuntimeError, match="unknown metrics \\['made_up'\\]"):
        harness.result(full | {"made_up": 1.0}, **kwargs)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_harness_and_trainers_never_import_orchestrator():
    files = [*(REPO / "worker" / "trainers").rglob("*.py"), REPO / "worker" / "data.py"]
    for path in files:
        offending = {n for n in _imports(path) if n.split(".")[0] == "orchestrator"}
        if path.name == "data.py":  # prepare(), the parent's half, raises BenchError (imported there)
            offending -= {"common.errors"}
        assert not offending, f"{path.relative_to(REPO)} imports {offending}"


def test_the_skip_words_are_written_once():
    """A skip's first words (harness.UNAVAILABLE, NOT_SUPPORTED) are spelled in harness.py alone: a trainer
    that wrote its own drifted from the others' (the same skip worded two ways)."""
    spelled = []
    for path in sorted((REPO / "worker" / "trainers").rglob("*.py")):
        text = path.read_text()
        for words in (harness.UNAVAILABLE, harness.NOT_SUPPORTED):
            if path.name != "harness.py" and (f'"{words}' in text or f"'{words}" in text):
                spelled.append(f"{path.relative_to(REPO)}: {words!r}")
    assert spelled == []
    assert str(harness.unavailable("x")) == "unavailable here: x"
    assert str(harness.not_supported("y")) == "not supported: y"


def test_the_harness_imports_only_the_standard_library():
    """And the shared vocabulary (common/metrics.py, common/compute.py, common/variables.py), which
    imports only the standard library and itself."""
    import sys

    def outside(path):
        return {n for n in _imports(path) if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"}
    assert outside(REPO / "worker" / "trainers" / "harness.py") == {"common.metrics", "common.compute",
                                                                    "common.variables"}
    assert outside(REPO / "common" / "metrics.py") == set()
    assert outside(REPO / "common" / "compute.py") == set()
    assert {n.split(".")[0] for n in outside(REPO / "common" / "variables.py")} == {"common"}



def test_a_trainer_package_without_a_main_counts_as_missing():
    from worker.loop import _trainer_missing

    assert _trainer_missing("worker.trainers.torch") is None
    assert _trainer_missing("tests.stub_child") is None and _trainer_missing("tests.stub_trainer") is None
    assert (_trainer_missing("worker.trainers.fortran")
            == "unavailable: no trainer worker.trainers.fortran in this checkout")


def test_a_cosine_schedule_warms_up_linearly_then_decays_to_a_tenth_of_the_peak_at_the_last_step():
    total = 50
    factors = [harness.lr_factor(i, total, "cosine") for i in range(total)]
    warm = 5  # a tenth of the steps
    assert factors[:warm] == pytest.approx([(i + 1) / warm for i in range(warm)])
    assert max(factors) == 1.0 and factors[warm - 1] == 1.0
    assert all(a >= b for a, b in zip(factors[warm - 1:], factors[warm:]))  # never rises again
    assert factors[-1] == pytest.approx(harness.LR_FLOOR)
    assert [harness.lr_factor(i, total, "constant") for i in range(total)] == [1.0] * total
    assert harness.lr_factor(0, 1, "cosine") == 1.0  # one step: the peak, no division by zero
    with pytest.raises(ValueError, match="lr_schedule='linear'"):
        harness.lr_factor(0, 10, "linear")


def test_the_timed_loop_sets_the_scheduled_rate_before_every_step_and_never_for_a_constant_one():
    config = {"grad_accum": 1, "warmup_steps": 2, "steps": 8, "batch_size": 1, "seq_len": 4, "lr_schedule": "cosine"}
    seen, rates = [], []

    def step(micro):
        seen.append(rates[-1])
        return 1.0

    harness.timed_loop(step, float, lambda: (None, None), config, set_lr=rates.append)
    assert seen == [harness.lr_factor(i, 10, "cosine") for i in range(10)]  # warm-up steps included
    rates.clear()
    harness.timed_loop(lambda micro: 1.0, float, lambda: (None, None), config | {"lr_schedule": "constant"},
                       set_lr=rates.append)
    assert rates == []


def test_evaluation_weights_each_chunk_of_held_out_windows_by_its_size():
    import numpy as np

    inputs = np.arange(40 * 3).reshape(40, 3)  # 40 windows: chunks of 16, 16 and 8
    calls = []

    def loss_of(x, y):
        calls.append(len(x))
        return float(x[:, 0].mean())  # a "loss" whose mean over every window is known

    mean, seconds = harness.evaluate(loss_of, inputs, inputs)
    assert calls == [16, 16, 8] and seconds >= 0
    assert mean == pytest.approx(inputs[:, 0].mean())


def _learning_config(**overrides):
    config, why = resolve({"batch_size": 2, "seq_len": 4, "grad_accum": 1, "warmup_steps": 2, "max_tokens": 80,
                           "eval_every": 16, "dataset": "shakespeare", **overrides}, 2)
    assert not why, why
    return config


def _learn(config, tmp_path, compiles_per_eval=0, start=10.0):
    """A learning run of a fake session whose validation loss is `start` - the optimizer steps it took."""
    import numpy as np

    state = {"steps": 0, "compilations": 0}

    def step(micro):
        state["steps"] += 1
        return 5.0

    def loss_of(x, y):
        state["compilations"] += compiles_per_eval
        return start - state["steps"]

    windows = np.zeros((3, 4), dtype=np.int64)
    learning = harness.Learning(loss_of, lambda: (windows, windows), str(tmp_path / "out" / "curve.jsonl"))
    metrics, window, _ = harness.timed_loop(step, float, lambda: (None, None), config,
                                            lambda: state["compilations"], learning=learning)
    return metrics, window, state


def test_a_learning_run_evaluates_every_eval_every_tokens_and_stops_at_its_target(tmp_path):
    import json

    config = _learning_config(target_loss=4.5)  # 8 tokens a step: an evaluation every 2 steps, 10 steps at most
    metrics, window, state = _learn(config, tmp_path, compiles_per_eval=1)
    curve = [json.loads(line) for line in (tmp_path / "out" / "curve.jsonl").read_text().splitlines()]
    assert [row["step"] for row in curve] == [2, 4, 6]  # 10 - 6 = 4 <= 4.5: reached at the third
    assert [row["val_loss"] for row in curve] == [8.0, 6.0, 4.0] and curve[-1]["tokens"] == 48
    assert state["steps"] == 6 and metrics["train_tokens"] == 48
    assert metrics["reached"] is True and metrics["tokens_to_target"] == 48 and metrics["steps_to_target"] == 6
    assert metrics["time_to_target_s"] == pytest.approx(curve[-1]["train_s"] + curve[-1]["eval_s"])
    assert metrics["val_loss"] == 4.0 and metrics["eval_s"] == pytest.approx(curve[-1]["eval_s"])
    assert window["compilations"] == 0  # the evaluations' own compiles are not the timed steps'
    assert all(a["train_s"] <= b["train_s"] for a, b in zip(curve, curve[1:]))


def test_a_learning_run_that_never_reaches_its_target_is_done_and_says_so(tmp_path):
    metrics, _, state = _learn(_learning_config(target_loss=0.5), tmp_path, start=20.0)
    assert state["steps"] == 10  # the whole budget: 80 tokens / 8 a step
    assert metrics["reached"] is False and metrics["val_loss"] == 10.0
    assert metrics["tokens_to_target"] is None and metrics["time_to_target_s"] is None


def test_a_token_budget_without_a_target_trains_it_all_and_reports_the_last_validation_loss(tmp_path):
    metrics, _, state = _learn(_learning_config(eval_every="auto", max_tokens=83), tmp_path)
    assert state["steps"] == 10 and metrics["reached"] is None and metrics["val_loss"] == 0.0
    rows = (tmp_path / "out" / "curve.jsonl").read_text().splitlines()
    assert len(rows) == 10  # auto: max_tokens / 20 = 4 tokens -> every step


@pytest.mark.parametrize("settings, words", [
    ({"target_loss": 3.0}, "target_loss=3 needs max_tokens"),
    ({"max_tokens": 100, "batch_size": 4, "seq_len": 32}, "max_tokens=100 is below one optimizer step"),
    ({"max_tokens": 4096, "target_loss": 3.0, "dataset": "builtin"}, "generated text has no held-out language"),
    ({"eval_every": 64}, "eval_every=64 needs max_tokens"),
])
def test_a_learning_bound_that_cannot_be_a_job_is_bad_input(settings, words):
    from common.errors import BadInput

    with pytest.raises(BadInput, match=re.escape(words)):
        resolve({k: parse_value(k, v) for k, v in settings.items()}, 2)
