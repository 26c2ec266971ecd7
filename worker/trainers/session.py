"""The JAX and NumPy training children: `python -m worker.trainers.jax` / `.numpy` speak the harness's
protocol (worker/trainers/harness.py) around a framework's Session (worker/trainers/<framework>/session.py).

What is shared here: the data (worker/data.py's NumPy batches, the same order as torch's for a
seed), the initial weights (worker/trainers/params.py: the same as every framework's for a seed),
finetuning from a saved model.npz (saved by either framework), the timed loop with the Session's
sync hook, the analytic counts, the result. Neither torch nor the other framework is imported.

    setup_s   module start (before imports, _T0 of the package's __main__) to the first step,
              minus the untimed base pretrain of a finetune without a saved model (base_pretrain_s)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import time
from pathlib import Path

from common.variables import peak_lr
from worker.trainers import harness
from worker.trainers.harness import Skip

BASE_PRETRAIN_STEPS = 30
ARCH_KEYS = ("n_layers", "d_model", "n_heads", "head_dim", "kv_heads", "mlp_ratio", "activation",
             "attention", "window", "vocab_size", "seq_len")
WEIGHTS = "model.npz"
# Settings only torch's libraries act on (oneDNN, SDPA kernels, MKL/oneDNN ISA caps, OpenMP binding):
# a JAX or NumPy run takes only what really runs there (the catalogue stores exactly this for
# jax/numpy, common/variables.elsewhere); anything else would be a run under another name.
TORCH_ONLY = {"onednn": False, "attn_backend": "manual", "isa": "default", "pin_threads": False}


def main(framework: str, t0: float) -> None:
    harness.serve(lambda request: run(request, framework, t0))


def run(request: dict, framework: str, t0: float) -> dict:
    config = request["config"]
    if config["framework"] != framework:
        return harness.skipped(f"the {framework} trainer does not run framework={config['framework']}")
    child = importlib.import_module(f"worker.trainers.{framework}.session")
    why = child.unsupported(config)
    if not why and config.get("task", "pretrain") not in ("pretrain", "finetune"):
        why = f"task={config['task']}: LoRA adapters exist only in the torch trainer"
    torch_only = [f"{k}={config[k]}" for k, runs in TORCH_ONLY.items() if config.get(k, runs) != runs]
    if not why and torch_only:
        why = f"{', '.join(torch_only)} acts only on torch's libraries ({framework} uses none of them)"
    if why:
        return harness.skipped(f"not supported: {why}")
    try:
        return _train(request, child, t0)
    except Skip as why:
        return harness.skipped(str(why), harness.common_read_back())


def arch_hash(config: dict, dataset_used: str) -> str:
    """Identity of a model's shape and vocabulary (the torch trainer's rule)."""
    key = {k: config[k] for k in ARCH_KEYS} | {"dataset_used": dataset_used}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def find_saved_weights(output_root: str | None, wanted_hash: str) -> Path | None:
    """The newest model.npz under output_root whose config.json has this architecture hash."""
    if not output_root or not Path(output_root).is_dir():
        return None
    found = []
    for cfg_file in Path(output_root).glob("*/config.json"):
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads(cfg_file.read_text())
            if saved.get("arch_hash") == wanted_hash and (cfg_file.parent / WEIGHTS).exists():
                found.append((cfg_file.stat().st_mtime, cfg_file.parent / WEIGHTS))
    return max(found)[1] if found else None


def _train(request: dict, child, t0: float) -> dict:
    from worker import data
    from worker.trainers.params import load_params

    config = request["config"]
    applied: dict = {"precision": config["precision"], "compile": config["compile"]}
    excluded_s = 0.0
    corpus, dataset_used = data.locate(request["data_dir"], config["dataset"])
    tokens = data.load_tokens(corpus, config["vocab_size"])
    applied["corpus_tokens"] = int(len(tokens))
    if len(tokens) < config["seq_len"] + 2:
        raise Skip(f"not supported: seq_len={config['seq_len']} (the corpus has only {len(tokens)} tokens)")
    batches = data.Batches(tokens, config["seq_len"], config["batch_size"], config["seed"])
    lr = peak_lr(config | {"task": "pretrain"})  # a finetune's tenth is taken below, after its base pretrain

    params = None  # the shared init
    if config["task"] == "finetune":
        saved = find_saved_weights(request.get("output_root"), arch_hash(config, dataset_used))
        if saved is not None:
            params = load_params(saved)
            applied["finetune_from"] = str(saved.parent)
        else:  # the torch trainer's rule: a short untimed fp32 pretrain on other batches of the same text
            t = time.perf_counter()
            base = child.Session(config | {"precision": "fp32"}, lr)
            base_batches = data.Batches(tokens, config["seq_len"], config["batch_size"], config["seed"] + 1)
            for _ in range(BASE_PRETRAIN_STEPS):
                base.sync(base.step([base_batches.next()]))
            params = base.params()
            del base
            applied["finetune_from"] = f"fresh base pretrain ({BASE_PRETRAIN_STEPS} untimed steps)"
            applied["base_pretrain_s"] = time.perf_counter() - t
            excluded_s += applied["base_pretrain_s"]
        lr = peak_lr(config)

    session = child.Session(config, lr, params)
    held_out = functools.partial(data.validation_windows, corpus, config)
    learning = harness.learning_for(config, request, session.eval_loss, held_out, applied)
    metrics, window, first_step_start = harness.timed_loop(session.step, session.sync, batches.next, config,
                                                           getattr(session, "compilations", None), session.set_lr,
                                                           learning)
    metrics["setup_s"] = first_step_start - t0 - excluded_s
    metrics |= harness.throughput(metrics, config, request.get("peak_gflops"))
    if learning is None:  # a learning run's val_loss is its last evaluation's
        metrics |= harness.validation(session.eval_loss, held_out, applied)
    harness.check_finite(metrics)

    output_path = _save(session, config, request, dataset_used)
    applied |= session.read_back()
    return harness.result(metrics, applied=applied, timed_window=window, dataset_used=dataset_used,
                          output_path=output_path, torch_version=None, build_info=session.build_info(),
                          gemm_format=session.gemm_format())


def _save(session, config: dict, request: dict, dataset_used: str) -> str | None:
    """model.npz (the torch state_dict's names) and config.json under output_dir, as the torch trainer."""
    out = request.get("output_dir")
    if not out:
        return None
    out = Path(out)
    session.save(out)
    meta = {"run_id": request.get("run_id"), "arch_hash": arch_hash(config, dataset_used),
            "dataset_used": dataset_used, "config": config, "framework": config["framework"]}
    (out / "config.json.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / "config.json.tmp", out / "config.json")
    return str(out)

