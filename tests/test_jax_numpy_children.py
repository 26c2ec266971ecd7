"""`python -m worker.trainers.jax` / `.numpy` end to end: one JSON request in, one result line out
with every trainer metric, the same losses as each other from the shared init and batches, a model
saved by one that the other finetunes from, and a request for another framework skipped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.variables import parse_value, resolve
from worker import data
from worker.trainers import harness
from worker.trainers.harness import TRAINER_METRICS

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[1]
TINY = dict(d_model=32, n_layers=1, n_heads=4, seq_len=32, batch_size=2, vocab_size=256, steps=4,
            warmup_steps=1, dataset="builtin", optimizer="sgd", compile="eager")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    data.prepare(folder, "builtin")
    return folder


def request(data_dir, tmp_path, run_id=None, **overrides):
    config, why = resolve({k: parse_value(k, v) for k, v in (TINY | overrides).items()}, 2)
    assert not why, why
    out = tmp_path / "output"
    return {"config": config, "run_id": run_id, "data_dir": str(data_dir), "output_root": str(out),
            "output_dir": str(out / f"run-{run_id}") if run_id is not None else None,
            "peak_gflops": {"fp32": 100.0, "bf16": 200.0}, "compile_cache_dir": None}


def run_child(framework: str, req: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", f"worker.trainers.{framework}"], input=json.dumps(req), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # library chatter goes to stderr
    return json.loads(lines[0])


def test_numpy_and_jax_children_train_alike_and_report_every_metric(data_dir, tmp_path):
    results = {"numpy": run_child("numpy", request(data_dir, tmp_path, framework="numpy")),
               "jax": run_child("jax", request(data_dir, tmp_path, framework="jax", compile="xla"))}
    for framework, result in results.items():
        assert result["status"] == "done", result["reason"]
        assert set(result["metrics"]) == set(TRAINER_METRICS)
        one_process = ("allreduce_ms", "allreduce_share")  # data parallelism's: NULL with one process
        no_target = ("reached", "tokens_to_target", "steps_to_target", "time_to_target_s")  # a learning run's
        missing = [m for m, v in result["metrics"].items() if v is None and m not in one_process + no_target]
        assert [result["metrics"][m] for m in no_target] == [None] * 4
        assert not missing, (framework, missing)
        assert result["torch_version"] is None and result["build_info"]["framework"].startswith(framework)
        assert result["applied"]["affinity"] and result["timed_window"]["end_unix_s"] > 0
        assert result["dataset_used"] == "builtin"
    numpy_m, jax_m = results["numpy"]["metrics"], results["jax"]["metrics"]
    assert results["jax"]["applied"]["jit"] is True and results["numpy"]["applied"]["blas"] == "openblas"
    assert abs(numpy_m["loss_first"] - jax_m["loss_first"]) < 1e-4
    assert abs(numpy_m["loss_last"] - jax_m["loss_last"]) < 1e-3
    assert numpy_m["flops_per_step"] == jax_m["flops_per_step"] and numpy_m["params"] == jax_m["params"]


def test_a_model_saved_by_numpy_is_finetuned_by_jax(data_dir, tmp_path):
    saved = run_child("numpy", request(data_dir, tmp_path, run_id=1, framework="numpy", steps=8))
    assert saved["status"] == "done" and Path(saved["output_path"], "model.npz").exists()
    tuned = run_child("jax", request(data_dir, tmp_path, framework="jax", task="finetune"))
    assert tuned["status"] == "done", tuned["reason"]
    assert tuned["applied"]["finetune_from"] == saved["output_path"]
    # it starts where the saved model ended, not from the fresh init's loss
    assert tuned["metrics"]["loss_first"] < saved["metrics"]["loss_first"] - 0.01


@pytest.mark.parametrize("framework, change, words", [
    ("numpy", {"framework": "jax"}, "does not run framework=jax"),
    ("numpy", {"precision": "bf16"}, "fp32 only"),
    ("jax", {"task": "finetune_lora", "lora_rank": 4}, "only in the torch trainer"),
    ("numpy", {"attn_backend": "sdpa"}, "attn_backend=sdpa acts only on torch"),
])
def test_a_request_the_child_cannot_run_is_skipped_with_its_reason(data_dir, tmp_path, framework, change, words):
    # the catalogue refuses these at enqueue; a request that bypasses it is still refused by the child
    req = request(data_dir, tmp_path, framework=framework, compile="eager")
    req["config"].update(change)
    result = run_child(framework, req)
    assert result["status"] == "skipped" and words in result["reason"]


def test_eager_jax_with_grad_accum_compiles_nothing_while_timed_and_a_recompiling_step_is_caught(data_dir, tmp_path):
    """compile=eager with grad_accum=2 once traced a new lax.scan every step (1.3 s a step, recorded
    done); now its timed window counts no compilation, and a step that does compile is counted."""
    result = run_child("jax", request(data_dir, tmp_path, framework="jax", compile="eager", grad_accum=2,
                                      steps=3, warmup_steps=1))
    assert result["status"] == "done", result["reason"]
    assert result["timed_window"]["compilations"] == 0
    assert harness.compiled_while_timed(result["timed_window"]) is None

    import jax
    import jax.numpy as jnp

    from worker.trainers.jax import runtime

    def recompiling_step(micro):  # a fresh closure each step: jax.jit cannot reuse the last one
        return jax.jit(lambda x: (x * len(micro)).sum())(jnp.ones(4))

    config = {"grad_accum": 1, "warmup_steps": 1, "steps": 3, "batch_size": 1, "seq_len": 4}
    _, window, _ = harness.timed_loop(recompiling_step, float, lambda: None, config, runtime.compilations)
    assert window["compilations"] == 3
    assert "3 compilation(s) during the timed steps" in harness.compiled_while_timed(window)


def test_numpy_and_jax_follow_one_cosine_schedule_and_measure_one_validation_loss(data_dir, tmp_path):
    runs = {f: run_child(f, request(data_dir, tmp_path, framework=f, compile="xla" if f == "jax" else "eager",
                                    steps=9, lr=0.2, lr_schedule="cosine"))
            for f in ("numpy", "jax")}
    constant = run_child("numpy", request(data_dir, tmp_path, framework="numpy", steps=9, lr=0.2))
    for framework, result in runs.items():
        assert result["status"] == "done", result["reason"]
        assert result["applied"]["lr"] == 0.2 and result["applied"]["lr_schedule"] == "cosine"
        assert result["applied"]["lr_last"] == pytest.approx(0.2 * harness.LR_FLOOR, rel=1e-6), framework
        assert result["metrics"]["eval_s"] > 0
    numpy_m, jax_m = runs["numpy"]["metrics"], runs["jax"]["metrics"]
    assert abs(numpy_m["loss_last"] - jax_m["loss_last"]) < 1e-3  # the same rate at every step
    assert abs(numpy_m["val_loss"] - jax_m["val_loss"]) < 1e-3  # the same held-out windows, the same weights
    assert abs(numpy_m["loss_last"] - constant["metrics"]["loss_last"]) > 1e-4  # the schedule changed training


def test_numpy_and_jax_learning_runs_evaluate_alike_as_they_train(data_dir, tmp_path):
    runs = {}
    for framework in ("numpy", "jax"):
        req = request(data_dir, tmp_path, framework=framework, compile="xla" if framework == "jax" else "eager",
                      max_tokens=64 * 12, eval_every=64 * 4)  # TINY: 64 tokens a step, 12 steps
        req["curve_path"] = str(tmp_path / framework / "curve.jsonl")
        result = run_child(framework, req)
        assert result["status"] == "done", result["reason"]
        runs[framework] = [json.loads(line) for line in Path(req["curve_path"]).read_text().splitlines()]
        assert result["metrics"]["val_loss"] == runs[framework][-1]["val_loss"]
        assert result["timed_window"]["compilations"] in (0, None)  # jax's evaluation graph is not a timed compile
    assert [r["step"] for r in runs["numpy"]] == [r["step"] for r in runs["jax"]] == [4, 8, 12]
    for a, b in zip(runs["numpy"], runs["jax"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-3
