"""The training child honours every training/framework variable and keeps its stdout protocol."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.variables import FINETUNE_LR_FACTOR, LR_OF, parse_value, resolve
from worker import data
from worker.trainers import harness, session
from worker.trainers.torch import train
from worker.trainers.torch.model import GPT, ModelConfig

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[1]
TINY = dict(d_model=32, n_layers=1, n_heads=2, seq_len=32, batch_size=4, vocab_size=512, steps=4,
            warmup_steps=1, dataset="builtin")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")  # one tokenizer for the whole file


def request(data_dir, tmp_path, run_id=None, **overrides):
    partial = {k: parse_value(k, v) for k, v in (TINY | overrides).items()}
    config, why = resolve(partial, 2)
    assert not why, why
    out = tmp_path / "output"
    return {"config": config, "run_id": run_id, "data_dir": str(data_dir), "output_root": str(out),
            "output_dir": str(out / f"run-{run_id}") if run_id is not None else None,
            "peak_gflops": None, "compile_cache_dir": str(tmp_path / "inductor")}


def run(req):
    """The torch trainer as `python -m worker.trainers.torch` runs it, in this process."""
    return session.run(req, "torch", train._T0)


def metrics(data_dir, tmp_path, **overrides):
    result = run(request(data_dir, tmp_path, **overrides))
    assert result["status"] == "done", result["reason"]
    return result


@pytest.mark.parametrize("framework", ["jax", "numpy"])
def test_the_torch_trainer_skips_other_frameworks_saying_so(data_dir, tmp_path, framework):
    result = run(request(data_dir, tmp_path, framework=framework))
    assert result["status"] == "skipped"
    assert result["reason"] == f"the torch trainer does not run framework={framework}"


def test_same_config_gives_the_same_first_loss_and_another_seed_does_not(data_dir, tmp_path):
    a, b = metrics(data_dir, tmp_path)["metrics"], metrics(data_dir, tmp_path)["metrics"]
    assert a["loss_first"] == b["loss_first"] and a["loss_last"] == b["loss_last"]
    assert metrics(data_dir, tmp_path, seed=1)["metrics"]["loss_first"] != a["loss_first"]


def test_optimizer_sgd_and_adamw_give_different_updates(data_dir, tmp_path):
    adamw = metrics(data_dir, tmp_path, optimizer="adamw")
    sgd = metrics(data_dir, tmp_path, optimizer="sgd")
    assert adamw["metrics"]["loss_first"] == sgd["metrics"]["loss_first"]  # same start
    assert adamw["metrics"]["loss_last"] != sgd["metrics"]["loss_last"]
    assert sgd["applied"]["optimizer"].startswith("SGD") and adamw["applied"]["optimizer"].startswith("AdamW")


def test_timed_loop_runs_warmup_plus_timed_steps_with_grad_accum_micro_batches_each():
    calls, synced = [], []

    def step(micro_batches):
        calls.append(len(micro_batches))
        return torch.tensor(1.0)

    def sync(loss):
        synced.append(len(calls))  # called after each step, before the next
        return loss

    batches = data.Batches(np.arange(500), 8, 2, seed=0)
    config = {"grad_accum": 2, "warmup_steps": 3, "steps": 5, "batch_size": 2, "seq_len": 8, "compile": "eager"}
    before = time.time()
    m, window, first_start = harness.timed_loop(step, sync, batches.next, config)
    assert calls == [2] * 8 and synced == list(range(1, 9))
    assert before <= window["start_unix_s"] <= window["end_unix_s"] <= time.time()
    assert m["tokens_per_s"] == pytest.approx(2 * 2 * 8 / (m["step_ms_median"] / 1e3))
    assert m["step_ms_p10"] <= m["step_ms_median"] <= m["step_ms_p90"]


def test_grad_accum_averages_the_loss_over_more_micro_batches(data_dir, tmp_path):
    one = metrics(data_dir, tmp_path, grad_accum=1)["metrics"]
    two = metrics(data_dir, tmp_path, grad_accum=2)["metrics"]
    assert two["loss_first"] != one["loss_first"]
    assert two["flops_per_step"] == 2 * one["flops_per_step"]


def test_make_step_runs_one_forward_per_micro_batch():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, seq_len=8, n_layers=1, d_model=16, n_heads=2, head_dim=8, kv_heads=2))
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    step = train.make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), "fp32")
    micro = [(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))) for _ in range(3)]
    step(micro)
    assert len(forwards) == 3
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)


def test_dropout_changes_the_training_losses(data_dir, tmp_path):
    assert (metrics(data_dir, tmp_path, dropout=0.3)["metrics"]["loss_first"]
            != metrics(data_dir, tmp_path)["metrics"]["loss_first"])


def test_bf16_trains_bf16_weights_and_saves_them(data_dir, tmp_path):
    result = metrics(data_dir, tmp_path, precision="bf16", run_id=5)
    assert result["applied"]["param_dtype"] == "bfloat16"
    state = torch.load(Path(result["output_path"]) / "model.pt", weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in state.values())


def test_mixed_precision_runs_matmuls_in_bf16_with_fp32_weights():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, seq_len=8, n_layers=1, d_model=16, n_heads=2, head_dim=8, kv_heads=2))
    seen = []
    model.blocks[0].mlp.fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    micro = [(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))]
    for precision in ("mixed", "fp32"):
        train.make_step(model, torch.optim.SGD(model.parameters(), lr=0.1), precision)(micro)
    assert seen == [torch.bfloat16, torch.float32]
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("precision", ["mixed", "q8", "q4", "bitnet", "int8"])
def test_each_precision_trains_to_a_different_loss(data_dir, tmp_path, precision):
    fp32 = metrics(data_dir, tmp_path)["metrics"]["loss_last"]
    other = metrics(data_dir, tmp_path, precision=precision)["metrics"]
    assert math.isfinite(other["loss_last"]) and other["loss_last"] != fp32


def test_the_loss_path_is_read_back_chunked_for_fp32_and_logits_for_bf16(data_dir, tmp_path):
    assert metrics(data_dir, tmp_path)["applied"]["loss_path"].startswith("chunked: HeadCrossEntropy")
    assert metrics(data_dir, tmp_path, precision="bf16")["applied"]["loss_path"].startswith("logits: chunked is fp32")


def test_attn_backend_and_attention_kind_are_recorded_and_change_the_run(data_dir, tmp_path):
    manual = metrics(data_dir, tmp_path, attn_backend="manual", attention="sliding", window=8)
    math_ = metrics(data_dir, tmp_path, attn_backend="sdpa_math")
    assert manual["applied"]["sdpa_kernel"] == "manual"
    assert math_["applied"]["sdpa_kernel"] == "MATH (forced)"
    assert manual["metrics"]["loss_first"] != math_["metrics"]["loss_first"]  # sliding vs full


def test_finetune_starts_from_the_saved_model_of_the_same_architecture(data_dir, tmp_path):
    base = metrics(data_dir, tmp_path, steps=30, run_id=1)
    saved = json.loads((Path(base["output_path"]) / "config.json").read_text())
    assert saved["run_id"] == 1 and saved["arch_hash"] == session.arch_hash(base_config(data_dir, tmp_path), "builtin")
    tuned = metrics(data_dir, tmp_path, task="finetune")
    assert tuned["applied"]["finetune_from"] == base["output_path"]
    assert tuned["applied"]["lr"] == pytest.approx(LR_OF["adamw"] * FINETUNE_LR_FACTOR)
    assert tuned["metrics"]["loss_first"] < base["metrics"]["loss_first"]
    other_shape = metrics(data_dir, tmp_path, task="finetune", d_model=48, n_heads=2)
    assert other_shape["applied"]["finetune_from"].startswith("fresh base pretrain")


def base_config(data_dir, tmp_path):
    return request(data_dir, tmp_path)["config"]


def test_finetune_without_a_saved_model_pretrains_untimed_first(data_dir, tmp_path):
    fresh = metrics(data_dir, tmp_path)
    tuned = metrics(data_dir, tmp_path, task="finetune")
    assert tuned["applied"]["finetune_from"].startswith("fresh base pretrain")
    assert tuned["applied"]["base_pretrain_s"] > 0
    assert tuned["metrics"]["loss_first"] < fresh["metrics"]["loss_first"]


def test_finetune_lora_trains_only_adapters_on_the_saved_model_and_saves_a_plain_one(data_dir, tmp_path):
    base = metrics(data_dir, tmp_path, steps=30, run_id=1)
    lora = metrics(data_dir, tmp_path, task="finetune_lora", lora_rank=4, steps=10, run_id=2)
    assert lora["applied"]["finetune_from"] == base["output_path"]
    assert lora["applied"]["finetune_from_run"] == 1
    m = lora["metrics"]
    # 1 block: rank 4 on qkv (32 -> 96), proj (32 -> 32), fc (32 -> 128), proj (128 -> 32)
    assert m["trainable_params"] == 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert m["params"] == base["metrics"]["params"] + m["trainable_params"]
    assert m["loss_first"] < base["metrics"]["loss_first"]  # starts from the trained base (B = 0)
    assert m["flops_per_step"] < base["metrics"]["flops_per_step"]
    # saved with the adapters merged: it loads into a plain GPT and is the start of the next finetune
    state = torch.load(Path(lora["output_path"]) / "model.pt", weights_only=True)
    before = torch.load(Path(base["output_path"]) / "model.pt", weights_only=True)
    # the adapters learned (B moved off zero: the merged weights differ), everything else stayed frozen.
    # (Not loss_last < loss_first: on this tiny corpus 10 steps' losses are within batch-to-batch noise.)
    adapted = [k for k in state if any(f".{n}.weight" in k for n in ("qkv", "proj", "fc"))]
    assert len(adapted) == 4 and all(not torch.equal(state[k], before[k]) for k in adapted)
    assert all(torch.equal(state[k], before[k]) for k in state if k not in adapted)
    cfg = ModelConfig.from_config(base_config(data_dir, tmp_path))
    GPT(cfg).load_state_dict(state)
    again = metrics(data_dir, tmp_path, task="finetune")
    assert again["applied"]["finetune_from"] == lora["output_path"]


def three_consumers(x):
    """Pointwise ops and a reduction sharing an input: inductor fuses their loops unless told not to."""
    a = x.sin()
    b = a.cos() * 2.0
    return a, b.sum(dim=-1), (b + a).relu()


def test_fusion_off_sets_the_inductor_switches_and_splits_kernels():
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics as inductor_metrics

    saved = {k: v for k, v in inductor_config.get_config_copy().items()}

    def kernels(fusion: bool) -> int:
        torch._dynamo.reset()
        inductor_metrics.reset()
        applied = train._set_inductor_config(fusion)
        fn = torch.compile(three_consumers, backend="inductor")
        fn(torch.randn(64, 64))
        return applied, inductor_metrics.generated_kernel_count

    try:
        with inductor_config.patch(fx_graph_cache=False):
            on, fused = kernels(True)
            off, split = kernels(False)
    finally:
        inductor_config.load_config(saved)
        torch._dynamo.reset()
    assert off == train.NO_FUSION and on["max_fusion_size"] > 1
    assert split > fused


def test_compile_inductor_really_compiles_the_model_slow(data_dir, tmp_path, monkeypatch):
    """The one slow test (~30-60 s on 2 cores): a cold inductor compile of a one-layer model."""
    from torch._dynamo.utils import counters

    from torch._inductor import codecache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))  # run() sets it; restore after
    for name in ("_HEADER_DIR", "_HEADER_LOCK_DIR"):  # and moves the precompiled headers into its cache
        monkeypatch.setattr(codecache, name, getattr(codecache, name))
    torch._dynamo.reset()
    counters.clear()
    result = metrics(data_dir, tmp_path, compile="inductor", compile_cache="cold", steps=2)
    assert counters["stats"]["unique_graphs"] >= 1
    assert counters["inductor"]  # inductor's own counters move only when it generated code
    assert result["applied"]["compile"] == "inductor" and result["applied"]["inductor"]["max_fusion_size"] > 1
    eager = metrics(data_dir, tmp_path, steps=2)["metrics"]
    assert result["metrics"]["loss_first"] == pytest.approx(eager["loss_first"], rel=1e-4)
    torch._dynamo.reset()


def child(req: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worker.trainers.torch"], input=json.dumps(req), cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)


def test_child_process_prints_exactly_one_json_result_and_saves_the_model(data_dir, tmp_path):
    req = request(data_dir, tmp_path, run_id=17, steps=10, warmup_steps=2, d_model=64)
    req["peak_gflops"] = {"fp32": 100.0, "bf16": 50.0}
    done = child(req)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["status"] == "done" and result["reason"] is None and result["dataset_used"] == "builtin"
    wanted = list(harness.TRAINER_METRICS)
    m = result["metrics"]
    assert sorted(m) == sorted(wanted)
    one_process = ("allreduce_ms", "allreduce_share")  # data parallelism's: NULL with one process
    no_target = ("reached", "tokens_to_target", "steps_to_target", "time_to_target_s")  # a learning run's
    assert all(isinstance(m[k], (int, float)) and math.isfinite(m[k]) for k in wanted
               if k not in one_process + no_target)
    assert [m[k] for k in no_target] == [None] * 4
    assert [m[k] for k in one_process] == [None, None] and (m["world_size"], m["global_batch"]) == (1, 4)
    assert m["loss_last"] < m["loss_first"] - 0.3  # it learns within a dozen steps
    assert m["mfu"] == pytest.approx(m["gflops"] / 100.0)
    assert result["applied"]["affinity"] and result["build_info"]["blas"]
    assert set(harness.READBACK) <= set(result["applied"])
    assert result["timed_window"]["start_unix_s"] < result["timed_window"]["end_unix_s"]
    out = Path(result["output_path"])
    assert out == tmp_path / "output" / "run-17"
    assert (out / "model.pt").exists() and json.loads((out / "config.json").read_text())["run_id"] == 17


def test_child_process_skips_jax_with_one_json_line(data_dir, tmp_path):
    done = child(request(data_dir, tmp_path, framework="jax"))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["status"] == "skipped"


def test_child_process_fails_loudly_without_a_result_on_bad_input(data_dir, tmp_path):
    req = request(data_dir, tmp_path)
    del req["config"]["d_model"]
    done = child(req)
    assert done.returncode != 0 and done.stdout == "" and "Traceback" in done.stderr


def test_cc_flags_o2_reaches_inductors_compiler_and_is_read_back_slow(data_dir, tmp_path):
    """A real cold inductor compile (~1-2 min on 2 busy cores) in its own process: inductor's
    compiler patch must not leak into this one."""
    from worker.knobs import settings as knobs, startspec

    req = request(data_dir, tmp_path, compile="inductor", compile_cache="cold", cc_flags="O2", steps=2)
    done = child(req)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "done", result["reason"]
    applied = result["applied"]
    assert applied["cc_kernel_flags"] == ["-O2"]  # every kernel command: -O2 and no -march
    assert applied["inductor"]["cpp.march"] == ""
    spec = startspec.spec_for(req["config"], {}, applied["affinity"])  # this child's env is not the spec's:
    assert not [w for w in knobs.not_in_force(req["config"], spec, applied) if w.startswith("cc_")]  # judge cc only


def test_compiler_clang_builds_every_kernel_with_clang_and_is_read_back_slow(data_dir, tmp_path):
    """A real cold inductor compile by clang++ (with cc_flags=O3: the two combine), in its own process."""
    from worker.knobs import ccflags, settings as knobs, startspec

    if ccflags.compiler_unavailable("clang"):
        pytest.skip(ccflags.compiler_unavailable("clang"))
    req = request(data_dir, tmp_path, compile="inductor", compile_cache="cold", compiler="clang", cc_flags="O3",
                  steps=2)
    tmp = tmp_path / "tmp"  # the child's temp dir: inductor's per-user folder and the cold cache go here
    tmp.mkdir()
    done = child(req, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "done", result["reason"]
    applied = result["applied"]
    # the precompiled headers were built in the cold cache (gone with it), not in inductor's per-user
    # folder, where one left by an earlier torch install at this path fails every clang kernel
    assert applied["inductor_header_dir"].startswith(str(tmp / "cpubench-inductor-"))
    assert not list(tmp.glob("torchinductor_*/precompiled_headers/*.h")) and not list(tmp.iterdir())
    assert applied["cc_kernel_compilers"] == ["clang++"] and applied["cc_kernel_flags"] == ["-O3"]
    assert applied["inductor"]["cpp.cxx"] == "clang++" and "clang" in applied["inductor"]["cxx_version"]
    assert result["gemm_format"] == "fp32 GEMMs"
    # torch's auto route (mkl_intel_path), asked without the worker's start environment, so without the
    # preloaded answer to MKL's vendor check: MKL takes its Intel path where its own check says Intel (it ran
    # as asked), and its generic path (mkl) on other CPUs
    route = applied["gemm_route"]
    assert route["asked"] == "mkl_intel_path"
    assert applied["blas"] == ("mkl_intel_path" if route["mkl_vendor_check"] == "Intel" else "mkl"), route
    spec = startspec.spec_for(req["config"], {}, applied["affinity"])
    assert not [w for w in knobs.not_in_force(req["config"], spec, applied) if w.startswith("cc_")]


def test_an_inductor_compile_error_is_reported_by_the_compilers_own_error_lines():
    from torch._inductor.exc import CppCompileError

    flags = " ".join(f"-D FLAG_{i}" for i in range(300))  # a real command line is 2 kB of flags
    output = ("In file included from <built-in>:1:\n"
              "fatal error: file '/v/torch/include/ATen/cpu/vec/vec.h' has been modified since the precompiled "
              "header '/tmp/x.h.pch' was built: mtime changed\n1 error generated.\n")
    why = train.compile_error(CppCompileError(["clang++", "k.cpp", flags], output))
    assert why.startswith("C++ compile error: fatal error: file '/v/torch/include/ATen/cpu/vec/vec.h' "
                          "has been modified")
    assert "FLAG_" not in why and "1 error generated." in why
    assert train.compile_error(RuntimeError("no compiler output at all")) == "no compiler output at all"


def test_cc_flags_lto_skips_the_run_saying_why(data_dir, tmp_path):
    result = run(request(data_dir, tmp_path, compile="inductor", cc_flags="lto", steps=1))
    assert result["status"] == "skipped"
    assert "cc_flags=lto" in result["reason"] and "built from source" in result["reason"]


def test_a_warm_run_compiles_first_untimed_where_the_cache_lacks_its_config_or_this_installs_header(tmp_path):
    """compile_cache=warm times a compile from a warm cache. A new venv has no precompiled header of
    its own in the cache (headers_inside names the folder after the install): building it inside the
    timed first step made it 15.5 s where warm runs took 3.1 s, so the untimed prewarm runs then too."""
    from worker.trainers.torch.train import prewarm_reason

    marker, header_dir = tmp_path / "cpubench-warmed" / "abc.json", tmp_path / "precompiled_headers" / "torch-x-1"
    assert "not compiled into the cache" in prewarm_reason(marker, str(header_dir))
    marker.parent.mkdir()
    marker.write_text("{}")
    assert "no precompiled header" in prewarm_reason(marker, str(header_dir))
    (header_dir / "locks").mkdir(parents=True)  # inductor's lock folder alone: nothing built yet
    assert "no precompiled header" in prewarm_reason(marker, str(header_dir))
    (header_dir / "k.h.gch").write_bytes(b"pch")
    assert prewarm_reason(marker, str(header_dir)) is None
    assert prewarm_reason(marker, None) is None  # no header folder of its own (no compile cache dir)


def test_a_warm_cache_is_filled_by_a_process_of_its_own_and_the_timed_compile_starts_as_a_new_process_slow(
        data_dir, tmp_path):
    """compile_cache=warm on an empty cache: the config is compiled untimed in another process
    (prewarm_apart), so the timed run compiles as every later run does, over a warm disk cache with
    nothing of inductor in memory (a prewarm in-process made its first step 1.3 s against 3.0 s)."""
    cache = tmp_path / "shared-cache"
    req = request(data_dir, tmp_path, compile="inductor", compile_cache="warm", steps=2)
    req["compile_cache_dir"] = str(cache)
    runs = []
    for _ in range(2):
        done = child(req)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = (r["applied"] for r in runs)
    assert runs[0]["status"] == runs[1]["status"] == "done", [r["reason"] for r in runs]
    assert first["cache_prewarmed_now"] and first["prewarm_s"] > 0
    assert first["prewarm_reason"] == "the config was not compiled into the cache yet"
    assert not first["inductor_loaded_before_compile"]  # the prewarm's imports stayed in its own process
    assert not second["cache_prewarmed_now"] and "prewarm_s" not in second
    assert list((cache / "cpubench-warmed").glob("*.json"))
    assert list(Path(first["inductor_header_dir"]).glob("*.h"))  # the header, built by the prewarm


def test_validation_loss_is_measured_on_the_held_out_windows_after_the_timed_steps(data_dir, tmp_path):
    short = metrics(data_dir, tmp_path, steps=1)
    again = metrics(data_dir, tmp_path, steps=1)
    longer = metrics(data_dir, tmp_path, steps=40)
    for result in (short, longer):
        m = result["metrics"]
        assert math.isfinite(m["val_loss"]) and m["eval_s"] > 0
        # the held-out windows of a step-time run: STEP_TIME_EVAL_TOKENS of the split, whole windows of seq_len
        assert result["applied"]["val_tokens"] == data.STEP_TIME_EVAL_TOKENS // 32 * 32
    assert short["metrics"]["val_loss"] == again["metrics"]["val_loss"]  # the same windows, the same weights
    assert longer["metrics"]["val_loss"] < short["metrics"]["val_loss"] - 0.2  # it learned text it never saw


def test_the_learning_rate_and_its_cosine_schedule_are_the_optimizers_own_read_back(data_dir, tmp_path):
    constant = metrics(data_dir, tmp_path, steps=9, lr=0.004)
    cosine = metrics(data_dir, tmp_path, steps=9, lr=0.004, lr_schedule="cosine")
    assert constant["applied"]["lr"] == 0.004 and constant["applied"]["lr_last"] == 0.004
    assert constant["applied"]["lr_schedule"] == "constant" and cosine["applied"]["lr_schedule"] == "cosine"
    assert cosine["applied"]["lr_last"] == pytest.approx(0.004 * harness.LR_FLOOR)
    # the first step already ran at a tenth of the peak (warm-up): the two runs train apart
    assert cosine["metrics"]["loss_last"] != constant["metrics"]["loss_last"]
    default = metrics(data_dir, tmp_path, optimizer="sgd")
    assert default["applied"]["lr"] == LR_OF["sgd"]  # lr=auto: the optimizer's stated default


def test_a_learning_run_stops_at_the_first_evaluation_at_its_target_and_appends_each_evaluation(data_dir, tmp_path):
    budget = request(data_dir, tmp_path, max_tokens=128 * 24, eval_every=128 * 4)  # TINY: 128 tokens a step
    budget["curve_path"] = str(tmp_path / "budget" / "curve.jsonl")
    whole = run(budget)
    assert whole["status"] == "done", whole["reason"]
    curve = [json.loads(line) for line in Path(budget["curve_path"]).read_text().splitlines()]
    assert [row["step"] for row in curve] == [4, 8, 12, 16, 20, 24]  # the warm-up step counts and is evaluated
    assert whole["metrics"]["val_loss"] == curve[-1]["val_loss"] and whole["metrics"]["reached"] is None
    assert whole["metrics"]["train_tokens"] == 128 * 24 and curve[-1]["val_loss"] < curve[0]["val_loss"]

    target = curve[3]["val_loss"] + 1e-6
    first = next(row for row in curve if row["val_loss"] <= target)
    to_target = request(data_dir, tmp_path, max_tokens=128 * 24, eval_every=128 * 4)
    to_target["config"]["target_loss"] = target  # builtin text: resolve() refuses a target there, the trainer need not
    to_target["curve_path"] = str(tmp_path / "target" / "curve.jsonl")
    m = run(to_target)["metrics"]
    assert m["reached"] is True and m["steps_to_target"] == first["step"] and m["tokens_to_target"] == first["tokens"]
    assert m["val_loss"] == pytest.approx(first["val_loss"], abs=1e-5)
    assert m["time_to_target_s"] > 0 and m["train_tokens"] == first["tokens"]
    assert len(Path(to_target["curve_path"]).read_text().splitlines()) == curve.index(first) + 1

    unreachable = request(data_dir, tmp_path, max_tokens=128 * 24, eval_every=128 * 4)
    unreachable["config"]["target_loss"] = 0.01
    m = run(unreachable)["metrics"]
    assert m["reached"] is False and m["tokens_to_target"] is None and m["train_tokens"] == 128 * 24
