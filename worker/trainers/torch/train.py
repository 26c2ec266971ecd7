"""The torch trainer's Session (worker/trainers/session.py's contract): a one-process job, or one rank of
distributed.py's (Session.on_rank), trained by the shared loop there.

This module owns what is torch's: the model and optimizer, bf16/mixed/quantized precision, inductor
(fusion switch, cold/warm cache, cc_flags and compiler through ccflags.py), finetuning from a saved
model.pt (the base pretrain in place, before the bf16 cast), the GEMM route's proof step and the
read-back. The timed loop, the metric names and the analytic FLOP/parameter counts are the harness's;
the corpus, the saved-model rules, the finetune's start and the skip words worker/trainers/session.py's.

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
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from common.variables import NOT_COMPILED  # noqa: E402
from worker.trainers import harness  # noqa: E402
from worker.trainers.harness import Skip, unavailable  # noqa: E402
from worker.trainers import session as shared  # noqa: E402
from worker.trainers.session import BASE_PRETRAIN_STEPS  # noqa: E402

WEIGHTS = "model.pt"  # the state_dict a torch run saves (Session.save)
# inductor switches that turn fusion off (torch 2.13): no node joins another's kernel (max size 1),
# no pointwise epilogue folded into a GEMM/reduction, no pattern rewrites, no horizontal fusion
NO_FUSION = {"max_fusion_size": 1, "epilogue_fusion": False, "pattern_matcher": False,
             "aggressive_fusion": False, "cpp.max_horizontal_fusion_size": 0}


def _compile_cache_dir(config: dict, request: dict) -> str | None:
    """cold: a fresh empty inductor cache for this run; warm: the shared one (pre-warmed in Session.prepare)."""
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


def torch_batches(tokens, config: dict, seed: int):
    """A callable drawing the next (inputs, targets) of the shared NumPy batches, as torch tensors."""
    import torch

    from worker import data

    batches = data.Batches(tokens, config["seq_len"], config["batch_size"], seed)

    def next_batch():
        x, y = batches.next()
        return torch.from_numpy(x), torch.from_numpy(y)

    return next_batch


# -- the Session ------------------------------------------------------------------------------


class Session(shared.Session):
    """One torch run in this process: the model of model.py from the shared init, then (prepare) its
    precision, optimizer and compiler; `step` is what the timed loop calls, `_step` the plain one the
    GEMM route's proof takes after it. Inside a data-parallel rank (on_rank) `dp` is its distributed.Rank."""

    WEIGHTS = WEIGHTS
    PHASES = True
    dp = None

    @classmethod
    def on_rank(cls, dp) -> type[Session]:
        """This Session inside a data-parallel rank: its slice of each global batch, the DDP wrap, the
        all-reduce timing (distributed.Rank)."""
        return type("RankSession", (cls,), {"dp": dp})

    @classmethod
    @contextlib.contextmanager
    def around(cls, request: dict):
        """The run's inductor cache folder, named in this process's environment before torch loads; a cold
        one is removed after the run."""
        config = request["config"]
        cache_dir = _compile_cache_dir(config, request)
        try:
            yield
        finally:
            if cache_dir and config["compile_cache"] == "cold":
                shutil.rmtree(cache_dir, ignore_errors=True)

    @classmethod
    def skipped(cls, reason: str) -> dict:
        import torch

        from worker.trainers.torch.readback import read_back

        return harness.skipped(reason, read_back(), torch.__version__)

    @classmethod
    def begin(cls, request: dict, applied: dict) -> None:
        """torch and this trainer's modules imported (the imports phase), the threads and the oneDNN
        switch set, the GEMM route applied, inductor's precompiled headers kept in the run's cache."""
        import torch  # noqa: F401

        from worker.trainers.torch import gemm_route, model, quant  # noqa: F401
        from worker.trainers.torch.readback import apply_in_child

        config = request["config"]
        apply_in_child(config)
        applied |= gemm_route.apply(config)
        if config["compile"] == "inductor":
            applied["inductor_header_dir"] = headers_inside(os.environ["TORCHINDUCTOR_CACHE_DIR"])

    @classmethod
    def batches(cls, tokens, config: dict, seed: int):
        return torch_batches(tokens, config, seed)

    @classmethod
    def run_batches(cls, tokens, config: dict):
        return cls.dp.batches(tokens, config) if cls.dp else cls.batches(tokens, config, config["seed"])

    @classmethod
    def initial(cls, config: dict, applied: dict):
        """The module of model.py, seeded, with the weights every framework starts from (shared_init)."""
        import torch

        from worker.trainers.torch.model import GPT, ModelConfig

        torch.manual_seed(config["seed"])
        model = GPT(ModelConfig.from_config(config))
        applied["init"] = shared_init(model, config)
        return model

    @classmethod
    def load(cls, params, folder: Path, applied: dict):
        """The saved state_dict loaded into the module (fp32: a bf16 run saved bf16 weights)."""
        import torch

        state = torch.load(folder / cls.WEIGHTS, map_location="cpu", weights_only=True)
        params.load_state_dict({k: v.float() for k, v in state.items()})
        with contextlib.suppress(OSError, ValueError):
            applied["finetune_from_run"] = json.loads((folder / "config.json").read_text()).get("run_id")
        return params

    @classmethod
    def pretrain_base(cls, params, config: dict, lr: float, next_batch):
        """The base pretrain in place on the run's own module (quantized layers included), in fp32 before
        any bf16 cast, with an optimizer of its own."""
        base_step = make_step(params, make_optimizer(params, config, lr), "fp32")
        params.train()
        for _ in range(BASE_PRETRAIN_STEPS):
            base_step([next_batch()])
        return params

    def __init__(self, config: dict, lr: float, params=None):
        from worker.trainers.torch.model import add_lora

        self.config, self.lr = config, lr
        self.model = self.initial(config, {}) if params is None else params  # the plain module, whose state is saved
        if config["task"] == "finetune_lora":  # adapters start at zero (B = 0): the pretraining rate, the base frozen
            add_lora(self.model, config["lora_rank"])
        self.optimizer = self.step = self._step = None  # prepare()

    def prepare(self, request: dict, tokens, applied: dict) -> dict | None:
        """The precision cast, the optimizer, the DDP wrap of a rank, the compiler and its warm cache (a
        prewarm-only process fills it and returns here), the step."""
        import torch

        from worker.trainers.torch.model import ModelConfig, head_loss_path

        config, model, lr = self.config, self.model, self.lr
        if config["task"] == "finetune_lora":
            applied["lora"] = (f"rank {config['lora_rank']} on qkv, attn proj, mlp fc, mlp proj; "
                               "every other weight frozen")
        applied["lr"] = lr
        if config["precision"] == "bf16":
            model = self.model = model.to(torch.bfloat16)
        applied["param_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        applied["autocast"] = "cpu bf16" if config["precision"] == "mixed" else None
        self.optimizer = make_optimizer(model, config, lr)
        applied["optimizer"] = f"{type(self.optimizer).__name__}(lr={lr}, " + (
            "fused)" if self.optimizer.defaults.get("fused") else "foreach)")
        applied["sdpa_kernel"] = _sdpa_kernel_used(ModelConfig.from_config(config), config)
        model.train()

        trained = self.dp.wrap(model) if self.dp else model  # what is called
        if config["compile"] == "inductor":
            cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]  # around()'s
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
            # whether this process had inductor loaded before its timed compile (a later run's would not)
            applied["inductor_loaded_before_compile"] = "torch._inductor.compile_fx" in sys.modules
            trained = torch.compile(model)
            self.compilations = _graphs_compiled

        fused_loss = config["compile"] != "inductor"
        dtype = next(model.parameters()).dtype
        applied["loss_path"] = head_loss_path(dtype, dtype, config["precision"] == "mixed", fused_loss)
        self._step = make_step(trained, self.optimizer, config["precision"], fused_loss=fused_loss)
        self.step = _first_compile_skips(self.dp.step(self._step) if self.dp else self._step, config)
        return None

    @staticmethod
    def sync(loss):
        return loss  # CPU torch: the step has finished when it returns

    def set_lr(self, factor: float) -> None:
        """lr_schedule: every parameter group's learning rate to factor x the peak (harness.timed_loop)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * factor

    def eval_loss(self, x, y) -> float:
        """The mean loss of (inputs, targets) NumPy windows through the plain module (never the compiled
        or DDP-wrapped one: no recompile, no collective), in eval mode (no dropout), without gradients,
        at the run's precision (mixed: under the same autocast)."""
        import torch

        model = self.model
        model.eval()
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                 enabled=self.config["precision"] == "mixed"):
                _, loss = model(torch.from_numpy(x), torch.from_numpy(y), return_logits=False)
        finally:
            model.train()
        return float(loss)

    def read_back(self) -> dict:
        from worker.trainers.torch.readback import read_back

        return {"lr_schedule": self.config["lr_schedule"], "lr_last": self.optimizer.param_groups[0]["lr"]} | (
            read_back())

    def prove(self, request: dict, next_batch, applied: dict) -> dict:
        """Where this route was not proved yet, one more step, outside dp's timing (a rank's all-reduce
        times are its timed loop's alone); then the kernels' compile flags. Ranks of several processes
        always prove it: the step all-reduces, so every rank must take it or none, and another node's
        launcher holds no proof."""
        from worker.trainers.torch import gemm_route

        config = self.config
        held = request.get("proven") if config["ranks"] * config["nodes"] == 1 else None
        route_read, proven = gemm_route.read_back(config["blas"], lambda: self._step([next_batch()]),
                                                  gemm_route.proof_key(config["blas"], config, applied),
                                                  held, request.get("run_id"))
        applied |= route_read
        if config["compile"] == "inductor":
            from worker.trainers.torch import ccflags

            applied["cc_kernel_flags"] = ccflags.read_back()
            applied["cc_kernel_compilers"] = ccflags.compilers_read_back()
        return proven

    def gemm_format(self) -> str:
        from worker.trainers.torch.quant import gemm_format

        return gemm_format(self.config["precision"])

    @staticmethod
    def build_info() -> dict:
        return build_info()

    def torch_version(self) -> str:
        import torch

        return torch.__version__

    def save(self, folder: Path) -> Path:
        """The plain state_dict (model.pt; LoRA adapters merged), written whole or not at all."""
        import torch

        from worker.trainers.torch.model import plain_state_dict

        folder.mkdir(parents=True, exist_ok=True)
        torch.save(plain_state_dict(self.model), folder / f"{WEIGHTS}.tmp")
        os.replace(folder / f"{WEIGHTS}.tmp", folder / WEIGHTS)
        return folder / WEIGHTS
