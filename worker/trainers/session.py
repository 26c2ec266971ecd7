"""Every trainer's main: `python -m worker.trainers.<framework>` speaks the harness's protocol
(worker/trainers/harness.py) around the framework's session module, worker/trainers/<framework>/session.py:

    unsupported(config)  why the framework runs the config on no machine (a skip, harness.NOT_SUPPORTED), or None
    Session              JAX and NumPy: this module trains it (below)
    train(request, t0)   torch instead: it drives its own training (data-parallel ranks, inductor and
                         its cache, the GEMM route's proof), with this module's data and saved-model helpers

What is shared here: the framework check, the data (worker/data.py's NumPy batches, the same order
for every framework for a seed; a corpus too short is a skip), the initial weights
(worker/trainers/params.py), finetuning from a saved model (arch_hash, find_saved, save_config), the
timed loop with the Session's sync hook, the analytic counts, the result. No framework is imported at
module level.

    setup_s   module start (before imports, t0 of the package's __main__) to the first step,
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

BASE_PRETRAIN_STEPS = 30  # untimed pretraining when finetune finds no saved model to start from
# the variables that shape the weights; with the tokenizer's text they decide whether a saved model fits
ARCH_KEYS = ("n_layers", "d_model", "n_heads", "head_dim", "kv_heads", "mlp_ratio", "activation",
             "attention", "window", "vocab_size", "seq_len")
WEIGHTS = "model.npz"  # what a JAX or NumPy run saves (worker/trainers/params.py; torch saves model.pt)
# Settings only torch's libraries act on (oneDNN, SDPA kernels, MKL/oneDNN ISA caps, OpenMP binding):
# a JAX or NumPy run takes only what really runs there (the catalogue stores exactly this for
# jax/numpy, common/variables.elsewhere); anything else would be a run under another name.
TORCH_ONLY = {"onednn": False, "attn_backend": "manual", "isa": "default", "pin_threads": False}


def main(framework: str, t0: float) -> None:
    harness.serve(lambda request: run(request, framework, t0))


def run(request: dict, framework: str, t0: float) -> dict:
    """Train one configuration as the request says with this framework; the result dict."""
    config = request["config"]
    if config["framework"] != framework:  # before importing the framework: a skip must be fast
        return harness.skipped(f"the {framework} trainer does not run framework={config['framework']}")
    fw = importlib.import_module(f"worker.trainers.{framework}.session")
    why = fw.unsupported(config)
    if why:
        return harness.skipped(f"{harness.NOT_SUPPORTED}: {why}")
    if not hasattr(fw, "Session"):
        return fw.train(request, t0)
    try:
        return _train(request, fw, t0)
    except Skip as why:
        return harness.skipped(str(why), harness.common_read_back())


def torch_only(config: dict, framework: str) -> str | None:
    """Why a framework other than torch cannot run the config: what only the torch trainer has."""
    if config.get("task", "pretrain") not in ("pretrain", "finetune"):
        return f"task={config['task']}: LoRA adapters exist only in the torch trainer"
    named = [f"{k}={config[k]}" for k, runs in TORCH_ONLY.items() if config.get(k, runs) != runs]
    if named:
        return f"{', '.join(named)} acts only on torch's libraries ({framework} uses none of them)"
    return None


def load_corpus(request: dict, config: dict, applied: dict):
    """(corpus, dataset_used, tokens) of the job's dataset; applied["corpus_tokens"]. A corpus shorter than
    one window is a skip: what this machine prepared (another may hold the full dataset)."""
    from worker import data

    corpus, dataset_used = data.locate(request["data_dir"], config["dataset"])
    tokens = data.load_tokens(corpus, config["vocab_size"])
    applied["corpus_tokens"] = int(len(tokens))
    if len(tokens) < config["seq_len"] + 2:
        raise harness.unavailable(f"seq_len={config['seq_len']} (the corpus has only {len(tokens)} tokens)")
    return corpus, dataset_used, tokens


def measured(metrics: dict, config: dict, request: dict, setup_s: float, learning, loss_of, held_out,
             applied: dict) -> dict:
    """The timed loop's metrics completed: setup_s, the analytic counts and MFU, a step-time run's
    validation (a learning run's val_loss is its last evaluation's); raises if a loss is not finite."""
    metrics["setup_s"] = setup_s
    metrics |= harness.throughput(metrics, config, request.get("peak_gflops"))
    if learning is None:
        metrics |= harness.validation(loss_of, held_out, applied)
    harness.check_finite(metrics)
    return metrics


def arch_hash(config: dict, dataset_used: str) -> str:
    """Identity of a model's shape and vocabulary; a finetune starts only from a model with the same."""
    key = {k: config[k] for k in ARCH_KEYS} | {"dataset_used": dataset_used}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def find_saved(output_root: str | None, wanted_hash: str, weights: str) -> Path | None:
    """The newest model folder under output_root whose config.json has this architecture hash and which
    holds the file `weights` (model.npz, torch's model.pt)."""
    if not output_root or not Path(output_root).is_dir():
        return None
    found = []
    for cfg_file in Path(output_root).glob("*/config.json"):
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads(cfg_file.read_text())
            if saved.get("arch_hash") == wanted_hash and (cfg_file.parent / weights).exists():
                found.append((cfg_file.stat().st_mtime, cfg_file.parent))
    return max(found)[1] if found else None


def save_config(out: Path, config: dict, request: dict, dataset_used: str, **extra) -> None:
    """config.json beside a saved model (run id, architecture hash, config), written whole or not at all."""
    meta = {"run_id": request.get("run_id"), "arch_hash": arch_hash(config, dataset_used),
            "dataset_used": dataset_used, "config": config} | extra
    (out / "config.json.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / "config.json.tmp", out / "config.json")


def _train(request: dict, fw, t0: float) -> dict:
    from worker import data
    from worker.trainers.params import load_params

    config = request["config"]
    applied: dict = {"precision": config["precision"], "compile": config["compile"]}
    excluded_s = 0.0
    corpus, dataset_used, tokens = load_corpus(request, config, applied)
    batches = data.Batches(tokens, config["seq_len"], config["batch_size"], config["seed"])
    lr = peak_lr(config | {"task": "pretrain"})  # a finetune's tenth is taken below, after its base pretrain

    params = None  # the shared init
    if config["task"] == "finetune":
        saved = find_saved(request.get("output_root"), arch_hash(config, dataset_used), WEIGHTS)
        if saved is not None:
            params = load_params(saved / WEIGHTS)
            applied["finetune_from"] = str(saved)
        else:  # nothing to start from: a short untimed fp32 pretrain on other batches of the same text
            t = time.perf_counter()
            base = fw.Session(config | {"precision": "fp32"}, lr)
            base_batches = data.Batches(tokens, config["seq_len"], config["batch_size"], config["seed"] + 1)
            for _ in range(BASE_PRETRAIN_STEPS):
                base.sync(base.step([base_batches.next()]))
            params = base.params()
            del base
            applied["finetune_from"] = f"fresh base pretrain ({BASE_PRETRAIN_STEPS} untimed steps)"
            applied["base_pretrain_s"] = time.perf_counter() - t
            excluded_s += applied["base_pretrain_s"]
        lr = peak_lr(config)

    session = fw.Session(config, lr, params)
    held_out = functools.partial(data.validation_windows, corpus, config)
    learning = harness.learning_for(config, request, session.eval_loss, held_out, applied)
    metrics, window, first_step_start = harness.timed_loop(session.step, session.sync, batches.next, config,
                                                           getattr(session, "compilations", None), session.set_lr,
                                                           learning)
    measured(metrics, config, request, first_step_start - t0 - excluded_s, learning, session.eval_loss, held_out,
             applied)

    output_path = _save(session, config, request, dataset_used)
    applied |= session.read_back()
    return harness.result(metrics, applied=applied, timed_window=window, dataset_used=dataset_used,
                          output_path=output_path, torch_version=None, build_info=session.build_info(),
                          gemm_format=session.gemm_format())


def _save(session, config: dict, request: dict, dataset_used: str) -> str | None:
    """model.npz (the torch state_dict's names) and config.json under output_dir."""
    out = request.get("output_dir")
    if not out:
        return None
    out = Path(out)
    session.save(out)
    save_config(out, config, request, dataset_used, framework=config["framework"])
    return str(out)
