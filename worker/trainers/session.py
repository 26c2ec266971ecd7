"""Every trainer's main: `python -m worker.trainers.<framework>` speaks the harness's protocol
(worker/trainers/harness.py) around the framework's session module, worker/trainers/<framework>/session.py:

    unsupported(config)  why the framework runs the config on no machine (a skip, harness.NOT_SUPPORTED), or None
    Session              the framework's half of one run, a subclass of this module's Session; train() drives it

What is shared here: the framework check, the data (worker/data.py's NumPy batches, the same order
for every framework for a seed; a corpus too short is a skip), the initial weights
(worker/trainers/params.py), finetuning from a saved model (arch_hash, find_saved, save_config), the
timed loop with the Session's sync hook, the analytic counts, the result. No framework is imported at
module level.

    setup_s   module start (before imports, t0 of the package's __main__) to the first step,
              minus the untimed extra work inside that window (EXCLUDED_S: a finetune's base pretrain
              without a saved model, torch's prewarm of a warm inductor cache)
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
# the seconds of untimed extra work inside the setup window, each recorded in `applied`: setup_s leaves them out
EXCLUDED_S = ("base_pretrain_s", "prewarm_s")
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
    launched = fw.Session.launch(request, t0)
    return launched if launched is not None else train(request, fw.Session, t0)


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


class Session:
    """One run of a framework: its model, optimizer and step. A framework's Session subclasses this one
    and implements

        Session(config, lr, params)  the model from `params` (what initial/load/pretrain_base returned;
                                     None: the shared init) and its optimizer at peak learning rate lr
        step(micro_batches)          one optimizer step over [(inputs, targets), ...]; the loss, maybe unsynced
        sync(loss)                   wait for the step's work; the loss (inside the timed region)
        set_lr(factor), eval_loss(inputs, targets), read_back(), gemm_format(), build_info(), save(folder),
        params()                     the weights as NumPy arrays (the default pretrain_base's)

    The hooks below have the defaults JAX and NumPy train with; torch overrides them (its own weights
    file and tensors, the base pretrain in place before its bf16 cast, inductor's cache and the prewarm
    process, the GEMM route's proof step, data-parallel ranks: worker/trainers/torch/train.py)."""

    WEIGHTS = WEIGHTS  # the saved model's file beside config.json (find_saved)
    PHASES = False  # whether `applied.setup_phases_s` records where the time outside the steps goes
    compilations = None  # () -> the framework's compilations so far (harness.timed_loop), or None

    @classmethod
    def launch(cls, request: dict, t0: float) -> dict | None:
        """The result of a job trained in other processes (torch's data-parallel ranks); None: train here."""
        return None

    @classmethod
    def around(cls, request: dict):
        """What the process holds around its training (torch: its inductor cache folder)."""
        return contextlib.nullcontext()

    @classmethod
    def skipped(cls, reason: str) -> dict:
        """The result of a run this machine cannot honour as asked (a Skip raised while training)."""
        return harness.skipped(reason, harness.common_read_back())

    @classmethod
    def begin(cls, request: dict, applied: dict) -> None:
        """The framework's in-process settings, before the data (torch: threads, the GEMM route)."""

    @classmethod
    def batches(cls, tokens, config: dict, seed: int):
        """() -> the next (inputs, targets) of worker/data.py's batches for this seed, as step() takes them."""
        from worker import data

        return data.Batches(tokens, config["seq_len"], config["batch_size"], seed).next

    @classmethod
    def run_batches(cls, tokens, config: dict):
        """The timed loop's batches (a data-parallel rank: its slice of each global batch)."""
        return cls.batches(tokens, config, config["seed"])

    @classmethod
    def initial(cls, config: dict, applied: dict):
        """The weights a run starts from before any finetune start: None, the Session's shared init."""
        return None

    @classmethod
    def load(cls, params, folder: Path, applied: dict):
        """The weights of the saved model in `folder` (a finetune's start)."""
        from worker.trainers.params import load_params

        return load_params(folder / cls.WEIGHTS)

    @classmethod
    def pretrain_base(cls, params, config: dict, lr: float, next_batch):
        """A finetune without a saved model: BASE_PRETRAIN_STEPS untimed fp32 steps from `params` on
        batches of another seed; the weights they leave."""
        base = cls(config | {"precision": "fp32"}, lr, params)
        for _ in range(BASE_PRETRAIN_STEPS):
            base.sync(base.step([next_batch()]))
        return base.params()

    def prepare(self, request: dict, tokens, applied: dict) -> dict | None:
        """What the run sets up between the model and the first step (torch: precision, optimizer,
        compiler); a result instead ends the process there (torch's prewarm-only process)."""
        return None

    def prove(self, request: dict, next_batch, applied: dict) -> dict:
        """After the read-back, what this run proves for later children ({key: proof}: harness.result)."""
        return {}

    def torch_version(self) -> str | None:
        return None


class Phases:
    """`applied.setup_phases_s` of a Session that records them (PHASES): the seconds each phase took."""

    def __init__(self, t0: float, applied: dict, recorded: bool):
        self.seconds = applied.setdefault("setup_phases_s", {}) if recorded else {}
        self.mark = t0

    def end(self, name: str) -> None:
        self.seconds[name], self.mark = time.perf_counter() - self.mark, time.perf_counter()

    def restart(self) -> None:
        self.mark = time.perf_counter()


def train(request: dict, session_class: type[Session], t0: float) -> dict:
    """Train one configuration in this process with a framework's Session; the result dict."""
    with session_class.around(request):
        try:
            return _train(request, session_class, t0)
        except Skip as why:
            return session_class.skipped(str(why))


def _train(request: dict, session_class: type[Session], t0: float) -> dict:
    from worker import data

    config = request["config"]
    applied: dict = {"precision": config["precision"], "compile": config["compile"]}
    session_class.begin(request, applied)
    phases = Phases(t0, applied, session_class.PHASES)
    phases.end("imports")
    corpus, dataset_used, tokens = load_corpus(request, config, applied)
    phases.end("data")

    params = session_class.initial(config, applied)
    batches = session_class.run_batches(tokens, config)
    lr = peak_lr(config | {"task": "pretrain"})  # a finetune's is taken below, after its base pretrain
    if config["task"] != "pretrain":
        saved = find_saved(request.get("output_root"), arch_hash(config, dataset_used), session_class.WEIGHTS)
        if saved is not None:
            applied["finetune_from"] = str(saved)
            params = session_class.load(params, saved, applied)
        else:  # nothing to start from: a short untimed fp32 pretrain on other batches of the same text
            t = time.perf_counter()
            base_batches = session_class.batches(tokens, config, config["seed"] + 1)
            params = session_class.pretrain_base(params, config, lr, base_batches)
            applied["finetune_from"] = f"fresh base pretrain ({BASE_PRETRAIN_STEPS} untimed steps)"
            applied["base_pretrain_s"] = time.perf_counter() - t
        lr = peak_lr(config)
    session = session_class(config, lr, params)
    phases.end("model")
    stopped = session.prepare(request, tokens, applied)
    if stopped is not None:
        return stopped
    phases.end("optimizer")

    held_out = functools.partial(data.validation_windows, corpus, config)
    learning = harness.learning_for(config, request, session.eval_loss, held_out, applied)
    metrics, window, first_step_start = harness.timed_loop(session.step, session.sync, batches, config,
                                                           session.compilations, session.set_lr, learning)
    excluded_s = 0.0
    for name in EXCLUDED_S:
        excluded_s += applied.get(name, 0.0)
    measured(metrics, config, request, first_step_start - t0 - excluded_s, learning, session.eval_loss, held_out,
             applied)

    phases.restart()
    output_path = _save(session, config, request, dataset_used)
    phases.end("save")
    applied |= session.read_back()
    proven = session.prove(request, batches, applied)
    phases.end("read_back")
    return harness.result(metrics, applied=applied, timed_window=window, dataset_used=dataset_used,
                          output_path=output_path, torch_version=session.torch_version(),
                          build_info=session.build_info(), gemm_format=session.gemm_format(), proven=proven)


def _save(session, config: dict, request: dict, dataset_used: str) -> str | None:
    """The Session's weights (its WEIGHTS) and config.json under output_dir."""
    out = request.get("output_dir")
    if not out:
        return None
    out = Path(out)
    session.save(out)
    save_config(out, config, request, dataset_used, framework=config["framework"])
    return str(out)
