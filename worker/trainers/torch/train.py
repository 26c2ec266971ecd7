"""The torch trainer's training in one process (a one-process job, or one rank of distributed.py's):
what session.py's train() runs once the shared main (worker/trainers/session.py) has taken the request.

This module owns what is torch's: the model and optimizer, bf16/mixed/quantized precision, inductor
(fusion switch, cold/warm cache, cc_flags and compiler through ccflags.py), finetuning from a saved
model.pt, and the read-back. The timed loop, the metric names and the analytic FLOP/parameter counts
are the harness's; the corpus, the saved-model rules and the skip words worker/trainers/session.py's.

    setup_s       the trainer's start (t0, before imports) to the first step: imports, data, tokenizer, model,
                  optimizer; minus the untimed extra work recorded apart in `applied`
                  (base_pretrain_s of a finetune without a saved model, prewarm_s of a warm cache:
                  the seconds an untimed process of its own took to compile the config into it)
    applied.setup_phases_s  where a job's time outside its steps goes: imports, data, model (with any
                  finetune start), optimizer (with compile settings and prewarm), then save, read_back
                  (the GEMM route's proof only where this fork server had none: gemm_route.py)
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # setup_s starts here where the caller gives no t0 of its own (a rank)

import contextlib  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from common.variables import NOT_COMPILED, peak_lr  # noqa: E402
from worker.trainers import harness  # noqa: E402
from worker.trainers.harness import Skip, unavailable  # noqa: E402
from worker.trainers.session import (BASE_PRETRAIN_STEPS, arch_hash, find_saved, load_corpus,  # noqa: E402
                                     measured, save_config)

WEIGHTS = "model.pt"  # the state_dict a torch run saves (save_model)
# inductor switches that turn fusion off (torch 2.13): no node joins another's kernel (max size 1),
# no pointwise epilogue folded into a GEMM/reduction, no pattern rewrites, no horizontal fusion
NO_FUSION = {"max_fusion_size": 1, "epilogue_fusion": False, "pattern_matcher": False,
             "aggressive_fusion": False, "cpp.max_horizontal_fusion_size": 0}


def run(request: dict, dp=None, t0: float | None = None) -> dict:
    """Train one configuration in this process as the request says; the result dict. dp: inside a
    data-parallel rank, its distributed.Rank. t0: where setup_s starts (None: this module's import)."""
    config = request["config"]
    cache_dir = _compile_cache_dir(config, request)  # before torch: inductor reads it from the env
    try:
        return _train(request, cache_dir, dp, _T0 if t0 is None else t0)
    except Skip as why:
        import torch

        from worker.trainers.torch.readback import read_back

        return harness.skipped(str(why), read_back(), torch.__version__)
    finally:
        if cache_dir and config["compile_cache"] == "cold":
            shutil.rmtree(cache_dir, ignore_errors=True)


def _compile_cache_dir(config: dict, request: dict) -> str | None:
    """cold: a fresh empty inductor cache for this run; warm: the shared one (pre-warmed in _train)."""
    if config["compile"] != "inductor":
        return None
    if config["compile_cache"] == "cold":
        path = tempfile.mkdtemp(prefix="cpubench-inductor-")
    else:
        path = request.get("compile_cache_dir") or str(Path(tempfile.gettempdir()) / "cpubench-inductor")
        os.makedirs(path, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path  # this process's own environment only
    return path


def headers_inside(cache_dir: str) -> str:
    """Keep inductor's precompiled headers in this run's cache (inductor puts them in one folder per
    user under /tmp for every run otherwise), in a folder named after this torch install; the folder.

    Two reasons. A cold run must build them itself: reusing a header an earlier run compiled (150 MB
    with g++; some 7 s of a 23 s cold compile on 2 cores) makes its compile time partly warm. And
    clang refuses a precompiled header whose sources are newer than it (g++ ignores one and reads the
    sources): after torch is installed again at the same path, every clang kernel failed with "has
    been modified since the precompiled header was built". The install's mtime in the folder's name
    keeps a warm cache's headers apart from the last install's."""
    import torch
    from torch._inductor import codecache

    prefix = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor" / "cpp_prefix.h"
    stamp = prefix.stat().st_mtime_ns if prefix.exists() else 0
    folder = str(Path(cache_dir) / "precompiled_headers" / f"torch-{torch.__version__}-{stamp}")
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = folder, str(Path(folder) / "locks")
    return folder


def compile_error(e: BaseException) -> str:
    """An inductor failure in a few hundred characters that say why: the compiler's own error lines
    where it is a C++ compile error (its command line alone, 2 kB of flags, says nothing)."""
    text = str(e)
    output = text.split("\nOutput:\n", 1)[1] if "\nOutput:\n" in text else ""
    errors = [line.strip() for line in output.splitlines() if "error" in line.lower()]
    if errors:
        return f"C++ compile error: {' | '.join(errors[:3])}"[:400]
    return text[:300]


# -- training ----------------------------------------------------------------------------------


def make_optimizer(model, config: dict, lr: float):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if config["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=True)
    # no weight decay on gains (nanoGPT); fused: one kernel over all tensors instead of a loop
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)


def make_step(model, optimizer, precision: str, fused_loss: bool = True):
    """One optimizer step over a list of (inputs, targets) micro-batches; returns the mean loss.

    fused_loss: the model skips the logits (GPT.forward return_logits=False: the chunked head +
    cross-entropy, the same loss); off for a torch.compile'd model, where inductor fuses the loss."""
    import torch

    autocast = precision == "mixed"

    def step(micro_batches):
        total = 0.0
        for x, y in micro_batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                _, loss = model(x, y, return_logits=not fused_loss)
            (loss / len(micro_batches)).backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / len(micro_batches)

    return step


def scaled_lr(optimizer, peak: float):
    """set_lr for harness.timed_loop: every parameter group's learning rate to factor x the peak."""

    def set_lr(factor: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = peak * factor

    return set_lr


def eval_loss(model, precision: str):
    """loss_of for harness.evaluate: the mean loss of (inputs, targets) NumPy windows through the plain
    module (never the compiled or DDP-wrapped one: no recompile, no collective), in eval mode (no
    dropout), without gradients, at the run's precision (mixed: under the same autocast)."""
    import torch

    def loss_of(x, y) -> float:
        model.eval()
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
                _, loss = model(torch.from_numpy(x), torch.from_numpy(y), return_logits=False)
        finally:
            model.train()
        return float(loss)

    return loss_of


def _set_inductor_config(fusion: bool) -> dict:
    """Apply the fusion switch; return the inductor settings now in force (read back)."""
    import torch._inductor.config as inductor_config

    applied = {}
    for name, value in NO_FUSION.items():
        owner, _, attr = name.rpartition(".")
        target = getattr(inductor_config, owner) if owner else inductor_config
        if not fusion:
            setattr(target, attr, value)
        applied[name] = getattr(target, attr)
    return applied


def _set_cc_flags(value: str) -> dict:
    """Apply cc_flags to inductor's C++ kernels (worker/trainers/torch/ccflags.py); lto is a skip."""
    from worker.knobs import ccflags as meaning
    from worker.trainers.torch import ccflags

    why = meaning.unavailable(value)
    if why:
        raise unavailable(why)
    return ccflags.apply(value)


def _set_compiler(value: str) -> dict:
    """Give inductor the job's C++ compiler (worker/trainers/torch/ccflags.py); one it cannot use is a skip."""
    from worker.knobs import ccflags as meaning
    from worker.trainers.torch import ccflags

    why = meaning.compiler_unavailable(value)
    if why:
        raise unavailable(why)
    return ccflags.apply_compiler(value)


def _check_inductor_possible() -> None:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:
        raise unavailable(f"compile=inductor (no working C++ compiler: {e})") from None


def warm_marker(config: dict, cache_dir: str) -> Path:
    """compile_cache=warm: the file that records a run compiled this config into the shared cache, one
    per (config minus what its compiled code does not depend on: variables.NOT_COMPILED; torch version)."""
    import torch

    key = {k: v for k, v in config.items() if k not in NOT_COMPILED} | {"torch": torch.__version__}
    return Path(cache_dir) / "cpubench-warmed" / (hashlib.sha256(json.dumps(key, sort_keys=True).encode())
                                                  .hexdigest()[:16] + ".json")


def _prewarm(model, config: dict, batch, marker: Path) -> None:
    """In prewarm_apart's process: compile the model and run it forward + backward, so every graph
    lands in inductor's on-disk FX graph cache; then write the marker."""
    import torch

    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config["precision"] == "mixed"):
        _, loss = torch.compile(model)(x, y)
    loss.backward()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(config, sort_keys=True, default=str))


def prewarm_apart(request: dict) -> float:
    """compile_cache=warm where the cache lacks this config (prewarm_reason): compile it untimed in a
    process of its own (this module, with prewarm_only), so this one then compiles as any later run
    will, a new process over a warm on-disk cache. A prewarm in this process left inductor imported
    and its kernels loaded: the timed first step took 1.3 s where later runs took 3.0-3.2 s. The
    seconds it took; raises RuntimeError with the process's last error line if it failed."""
    import subprocess

    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "worker.trainers.torch"], capture_output=True, text=True,
                          input=json.dumps({**request, "prewarm_only": True}))  # this process's env: its cache dir
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if done.returncode == 0 and lines else {}
    if result.get("status") == "skipped":
        raise Skip(result["reason"])
    if not result.get("prewarm_only"):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(f"the prewarm process failed: {last}")
    return time.perf_counter() - started


def prewarm_reason(marker: Path, header_dir: str | None) -> str | None:
    """Why a compile_cache=warm run must compile its config untimed first, or None: no run compiled
    the config into the cache (`marker`), or this torch install has no precompiled header there yet
    (`header_dir`: files beside inductor's locks folder)."""
    if not marker.exists():
        return "the config was not compiled into the cache yet"
    folder = Path(header_dir) if header_dir else None
    if folder is not None and not (folder.is_dir() and any(p.is_file() for p in folder.iterdir())):
        return "this torch install has no precompiled header in the cache yet"
    return None


def _train(request: dict, cache_dir: str | None, dp, t0: float) -> dict:
    config = request["config"]
    import torch

    from worker import data
    from worker.trainers.torch import gemm_route
    from worker.trainers.torch.model import GPT, ModelConfig, add_lora, head_loss_path
    from worker.trainers.torch.quant import gemm_format
    from worker.trainers.torch.readback import apply_in_child, read_back

    apply_in_child(config)
    applied: dict = {"precision": config["precision"], "compile": config["compile"]} | gemm_route.apply(config)
    if cache_dir:
        applied["inductor_header_dir"] = headers_inside(cache_dir)
    excluded_s = 0.0  # untimed extra work inside the setup window, reported apart
    phases = applied["setup_phases_s"] = {"imports": time.perf_counter() - t0}  # where setup and the end go
    mark = time.perf_counter()

    corpus, dataset_used, tokens = load_corpus(request, config, applied)

    phases["data"], mark = time.perf_counter() - mark, time.perf_counter()
    torch.manual_seed(config["seed"])
    cfg = ModelConfig.from_config(config)
    model = GPT(cfg)
    applied["init"] = shared_init(model, config)
    batches = dp.batches(tokens, config) if dp else torch_batches(tokens, config, config["seed"])
    lr = peak_lr(config | {"task": "pretrain"})  # a finetune's tenth is taken below, after its base pretrain

    if config["task"] in ("finetune", "finetune_lora"):
        saved = find_saved(request.get("output_root"), arch_hash(config, dataset_used), WEIGHTS)
        if saved is not None:
            state = torch.load(saved / WEIGHTS, map_location="cpu", weights_only=True)
            model.load_state_dict({k: v.float() for k, v in state.items()})
            applied["finetune_from"] = str(saved)
            with contextlib.suppress(OSError, ValueError):
                applied["finetune_from_run"] = json.loads((saved / "config.json").read_text()).get("run_id")
        else:  # nothing to start from: a short untimed fp32 pretrain on other batches of the same text
            t = time.perf_counter()
            base_batches = torch_batches(tokens, config, config["seed"] + 1)
            base_step = make_step(model, make_optimizer(model, config, lr), "fp32")
            model.train()
            for _ in range(BASE_PRETRAIN_STEPS):
                base_step([base_batches()])
            applied["finetune_from"] = f"fresh base pretrain ({BASE_PRETRAIN_STEPS} untimed steps)"
            applied["base_pretrain_s"] = time.perf_counter() - t
            excluded_s += applied["base_pretrain_s"]
        if config["task"] == "finetune":
            lr = peak_lr(config)
        else:  # adapters start at zero (B = 0): they train at the pretraining rate, the base is frozen
            add_lora(model, config["lora_rank"])
            applied["lora"] = (f"rank {config['lora_rank']} on qkv, attn proj, mlp fc, mlp proj; "
                               "every other weight frozen")
    applied["lr"] = lr

    phases["model"], mark = time.perf_counter() - mark, time.perf_counter()
    if config["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    applied["param_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    applied["autocast"] = "cpu bf16" if config["precision"] == "mixed" else None
    optimizer = make_optimizer(model, config, lr)
    applied["optimizer"] = f"{type(optimizer).__name__}(lr={lr}, " + (
        "fused)" if optimizer.defaults.get("fused") else "foreach)")
    applied["sdpa_kernel"] = _sdpa_kernel_used(cfg, config)
    model.train()

    trained = dp.wrap(model) if dp else model  # what is called; `model` stays the plain module whose state is saved
    if config["compile"] == "inductor":
        _check_inductor_possible()
        applied["inductor"] = _set_inductor_config(bool(config["fusion"]))
        applied["inductor"] |= _set_cc_flags(config.get("cc_flags", "default"))
        applied["inductor"] |= _set_compiler(config.get("compiler", "gcc"))
        applied["compile_mode"] = "torch.compile(model, backend='inductor', mode=None)"
        applied["compile_cache_dir"] = cache_dir
        if config["compile_cache"] == "warm":
            # a batch of its own: the timed run's data order stays that of the seed
            marker = warm_marker(config, cache_dir)
            if request.get("prewarm_only"):  # the process prewarm_apart started: fill the cache and stop
                _prewarm(model, config, torch_batches(tokens, config, config["seed"] + 2)(), marker)
                return {"status": "done", "prewarm_only": True}
            why = prewarm_reason(marker, applied.get("inductor_header_dir"))
            applied["cache_prewarmed_now"] = why is not None
            if why is not None:
                applied["prewarm_reason"] = why
                applied["prewarm_s"] = prewarm_apart(request)
                excluded_s += applied["prewarm_s"]
        # whether this process had inductor loaded before its timed compile (a later run's would not)
        applied["inductor_loaded_before_compile"] = "torch._inductor.compile_fx" in sys.modules
        trained = torch.compile(model)

    phases["optimizer"] = time.perf_counter() - mark  # and compile settings, prewarm
    fused_loss = config["compile"] != "inductor"
    applied["loss_path"] = head_loss_path(next(model.parameters()).dtype, next(model.parameters()).dtype,
                                          config["precision"] == "mixed", fused_loss)
    step = make_step(trained, optimizer, config["precision"], fused_loss=fused_loss)
    held_out = functools.partial(data.validation_windows, corpus, config)
    loss_of = eval_loss(model, config["precision"])
    learning = harness.learning_for(config, request, loss_of, held_out, applied)
    metrics, window, first_step_start = harness.timed_loop(
        _first_compile_skips(dp.step(step) if dp else step, config), lambda loss: loss, batches, config,
        _graphs_compiled if config["compile"] == "inductor" else None, scaled_lr(optimizer, lr), learning)
    applied["lr_schedule"] = config["lr_schedule"]
    applied["lr_last"] = optimizer.param_groups[0]["lr"]
    measured(metrics, config, request, first_step_start - t0 - excluded_s, learning, loss_of, held_out, applied)

    mark = time.perf_counter()
    output_path = save_model(model, config, request, dataset_used)
    phases["save"], mark = time.perf_counter() - mark, time.perf_counter()
    applied |= read_back()
    # after save: where this route was not proved yet, one more step, outside dp's timing (a rank's
    # all-reduce times are its timed loop's alone). Ranks of several processes always prove it: the step
    # all-reduces, so every rank must take it or none, and another node's launcher holds no proof.
    held = request.get("proven") if config["ranks"] * config["nodes"] == 1 else None
    route_read, proven = gemm_route.read_back(config["blas"], lambda: step([batches()]),
                                              gemm_route.proof_key(config["blas"], config, applied),
                                              held, request.get("run_id"))
    applied |= route_read
    if config["compile"] == "inductor":
        from worker.trainers.torch import ccflags

        applied["cc_kernel_flags"] = ccflags.read_back()
        applied["cc_kernel_compilers"] = ccflags.compilers_read_back()
    phases["read_back"] = time.perf_counter() - mark
    return harness.result(metrics, applied=applied, timed_window=window, dataset_used=dataset_used,
                          output_path=output_path, torch_version=torch.__version__, build_info=build_info(),
                          gemm_format=gemm_format(config["precision"]), proven=proven)


def shared_init(model, config: dict) -> str:
    """Start from the weights every framework starts from for this seed (worker/trainers/params.py:
    the same GPT-2 init as the module's own), so torch, JAX and NumPy runs of one config compare.
    A model with other weights (the quantized layers' extra tensors) keeps the module's init, and
    says so."""
    from worker.trainers.params import init_params, torch_state_dict

    state = torch_state_dict(init_params(config))
    if set(state) != set(model.state_dict()):
        return "torch module init (its weights differ from the shared layout)"
    model.load_state_dict(state)
    return "shared (worker/trainers/params.py)"


def _graphs_compiled() -> int:
    """Graphs dynamo captured and inductor compiled so far: a recompile (a guard that failed) adds one."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def torch_batches(tokens, config: dict, seed: int):
    """A callable drawing the next (inputs, targets) of the shared NumPy batches, as torch tensors."""
    import torch

    from worker import data

    batches = data.Batches(tokens, config["seq_len"], config["batch_size"], seed)

    def next_batch():
        x, y = batches.next()
        return torch.from_numpy(x), torch.from_numpy(y)

    return next_batch


def _first_compile_skips(step, config: dict):
    """The step, where inductor failing to compile the first step makes the run skipped, not failed."""
    import torch

    calls = [0]

    def guarded(micro):
        calls[0] += 1
        try:
            return step(micro)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            if config["compile"] == "inductor" and calls[0] == 1:
                raise unavailable(f"compile=inductor (inductor failed here: {compile_error(e)})") from e
            raise

    return guarded


def _sdpa_kernel_used(cfg, config: dict) -> str:
    """The attention kernel: 'manual', or the SDPA backend torch picks for these shapes and dtype."""
    import torch
    from torch.nn.attention import SDPBackend

    if cfg.attn_backend == "manual":
        return "manual"
    if cfg.attn_backend == "sdpa_math":
        return "MATH (forced)"
    dtype = torch.bfloat16 if config["precision"] in ("bf16", "mixed") else torch.float32
    B, T = config["batch_size"], config["seq_len"]
    L = S = T  # full: one causal attention over the sequence
    if cfg.attention != "full":  # windowed_attention: B * n blocks of W queries, W (local) or 2W keys
        L = min(cfg.window, T)
        B, S = B * -(-T // L), L if cfg.attention == "local" else 2 * L
    q = torch.empty(B, cfg.n_heads, L, cfg.head_dim, dtype=dtype)
    kv = torch.empty(B, cfg.kv_heads, S, cfg.head_dim, dtype=dtype)
    causal = cfg.attention != "sliding"
    mask = None if causal else torch.ones(B, 1, L, S, dtype=torch.bool)
    choice = torch._fused_sdp_choice(q, kv, kv, mask, cfg.dropout, causal, scale=None,
                                     enable_gqa=cfg.kv_heads != cfg.n_heads)
    return SDPBackend(choice).name


def save_model(model, config: dict, request: dict, dataset_used: str) -> str | None:
    """state_dict (model.pt) and config.json (run id, architecture hash, config) under output_dir."""
    import torch

    out = request.get("output_dir")
    if not out:
        return None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from worker.trainers.torch.model import plain_state_dict

    torch.save(plain_state_dict(model), out / f"{WEIGHTS}.tmp")
    os.replace(out / f"{WEIGHTS}.tmp", out / WEIGHTS)
    save_config(out, config, request, dataset_used)
    return str(out)


def build_info() -> dict:
    import torch

    shown = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", shown) or re.search(r"oneDNN (v[\d.]+)", shown)
    openmp = re.search(r"OpenMP (\d+)", shown)
    backend = re.search(r"ATen parallel backend: (.*)", torch.__config__.parallel_info())
    return {"blas": blas.group(1) if blas else None,
            "onednn": onednn.group(1) if onednn else None,
            "openmp": f"{backend.group(1).strip() if backend else '?'} {openmp.group(1) if openmp else ''}".strip(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
