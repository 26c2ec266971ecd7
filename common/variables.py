"""The variable catalogue: every variable's name, type, allowed values, default, where it is applied,
and the cross-variable constraints. Names are the SQL column names of `jobs` (schema.sql).

A config is a dict with one value per catalogue variable. `resolve()` turns the user's partial config
into a full, concrete one: defaults filled, derived values ("auto") computed, so that two spellings of
the same run hash to the same job.

Per framework (FRAMEWORK_VALUES, TORCH_ONLY): a value that means nothing for the job's framework is
a constraint violation at enqueue (a counted reason), never a duplicate job nor a silent skip.
- `compile`: eager | inductor on torch, eager | xla on jax, eager on numpy; `precision`: every mode
  on torch, fp32 | bf16 | mixed on jax, fp32 on numpy.
- `cc_flags` (C++ flags of compiled kernels) means something only for torch's inductor: on jax it is
  refused too, although XLA_FLAGS carries LLVM options (--xla_backend_optimization_level,
  --xla_cpu_enable_fast_math...): those are not C++ compiler flags and are neither mapped nor read
  back here; numpy compiles nothing. Off its default with compile=eager: "needs compile=inductor".
  `compiler` (gcc | clang, inductor's C++ compiler) follows the same rules.
- `blas` is the GEMM route of every framework: the NumPy trainer's library (openblas, mkl, blis);
  torch's route for its fp32 GEMMs (mkl as shipped, mkl_intel_path, onednn, cpp_template:
  worker/trainers/torch/gemm_route.py, each read back from what ran); JAX runs XLA's Eigen kernels,
  recorded. A value of another framework is a violation ("blas=openblas needs framework=numpy"),
  never a run under another library's name. auto resolves to BLAS_AUTO; a job stored without
  `blas` (releases before 6 left it out while at its unset value) ran BLAS_OF (torch: mkl), and
  that stays the value canonical_json leaves out, so old jobs keep their hashes and an explicit
  blas=mkl finds them.
- `attn_backend`, `onednn`, `fusion`, `compile_cache` mean something only for torch. On jax and numpy
  resolve() sets them to the one value that describes what really runs there (elsewhere()): manual
  attention (softmax(QK^T)V written out), no oneDNN, fusion only under XLA (compile=xla), and a cold
  compile cache (nothing is cached between runs). Left unset, they take that value; set explicitly
  to it, fine; set to anything else, a violation ("attn_backend=sdpa needs framework=torch"). So a
  jax or numpy row in v_results never claims a torch-only setting, and the presets' OFAT
  `framework` axis (base + framework=jax) still yields exactly one job per framework.
"""

from __future__ import annotations

import math

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import BadInput
from common.datasets import DATASET_BUILTIN, DATASET_HUB, DATASET_SHAKESPEARE
from common.compute import NOT_OFFERED, int4_unsupported  # noqa: F401  (NOT_OFFERED: re-exported)

# Where a variable takes effect; the worker checks each place can honour it.
KNOB = "knob"  # system state the worker sets before the child starts (sysfs, affinity)
ENV = "env"  # the child's environment (threads, allocator, ISA caps)
FRAMEWORK = "framework"  # inside the child, framework switches (compile, attention kernels)
MODEL = "model"  # the architecture
TRAINING = "training"  # the training loop and data

AUTO = "auto"
# The GEMM library each framework ran when `blas` was left unset before release 6 (the value a
# stored job without `blas` ran, and the one canonical_json leaves out).
BLAS_OF = {"torch": "mkl", "jax": "eigen", "numpy": "openblas"}
# What auto picks: the fastest route where it is safe. torch: MKL on its Intel code paths, the same
# kernels as mkl on Intel CPUs and 14-17% less step time than mkl on an AVX-512 AMD EPYC, whose training
# agrees with mkl to fp32 rounding (gemm_route.py, tests/test_gemm_route.py; oneDNN was not faster there).
# A static rule, not a per-machine choice: resolve() runs at enqueue, and a job's identity must not
# depend on the machine that planned it. Jobs stored before it keep theirs: unset_value() is BLAS_OF.
# Where the route cannot run (no C compiler to build its library) a job that left blas on auto
# (jobs.derived) runs torch as shipped, read back as mkl and saying why (gemm_route.auto_fallback).
BLAS_AUTO = dict(BLAS_OF, torch="mkl_intel_path")
TORCH_GEMM_ROUTES = ("mkl", "mkl_intel_path", "onednn", "cpp_template")
BLAS_CHOICES = ("openblas", "mkl", "blis", "eigen", "mkl_intel_path", "onednn", "cpp_template")
DEFAULT = "default"
ALL = "all"
NONE = "none"  # a learning bound left unset: target_loss, max_tokens
EVALUATIONS = 20  # eval_every=auto: this many evaluations over max_tokens
# Old names a sweep may still write, and the value they now enqueue as. q8 was simulated until
# release 6 (fp32 GEMMs on fake-quantized operands); it is folded into int8, which computes in int8
# (torch._int_mm). Old databases' q8 rows keep q8, and their gemm_format says they were simulated.
PRECISION_ALIASES = {"q8": "int8"}
# lr=auto: each optimizer's stated default, high for tiny models (loss must visibly fall in a few steps);
# every trainer reads the resolved lr from the config, so one table serves torch, JAX and NumPy.
LR_OF = {"adamw": 1e-3, "sgd": 0.05}
LR_SCHEDULES = ("constant", "cosine")
FINETUNE_LR_FACTOR = 0.1  # finetuning starts from trained weights: a 10x lower learning rate


def peak_lr(config: dict) -> float:
    """The peak learning rate a run's optimizer gets: lr, a tenth of it for a finetune of all weights
    (LoRA adapters start at zero and train at lr). Every trainer and the read-back check use this."""
    lr = config.get("lr", AUTO)
    lr = LR_OF[config["optimizer"]] if lr == AUTO else float(lr)
    return lr * FINETUNE_LR_FACTOR if config.get("task", "pretrain") == "finetune" else lr


@dataclass(frozen=True)
class Variable:
    name: str
    type: type  # int, float, str or bool
    default: object
    applied: str
    doc: str
    choices: tuple = ()  # allowed values for str variables
    min: float | None = None
    max: float | None = None
    words: tuple = ()  # words a numeric variable also accepts ("auto", "default", "all")
    since: int = 1  # the schema version that added it; later ones join a job's identity only off their default
    # What other parts know of it, declared here once and derived there (tests/test_settings_declared.py):
    ran_from: tuple[str, str] | None = None  # where a run records what really ran: ("applied", read-back key) or
    #                                          ("column", runs column); the report groups it so (ran.RAN_FROM)
    per_rank: tuple[str, ...] = ()  # read-back keys each data-parallel rank records of its own (PER_RANK_READBACK)
    compiled: bool = True  # False: torch.compile's code does not depend on it (not in the warm compile cache's key)

    @property
    def sql_type(self) -> str:
        return {int: "INTEGER", float: "REAL", str: "TEXT", bool: "BOOLEAN"}[self.type]

    def parse(self, value, where: str = ""):
        """Check and coerce one value (from TOML or a `K=V` string); raise BadInput naming it."""
        at = f" in {where}" if where else ""
        if isinstance(value, str) and value in self.words:
            return value
        try:
            parsed = _coerce(self.type, value)
        except (TypeError, ValueError):
            allowed = self.describe_allowed()
            raise BadInput(f"{self.name}={value!r}{at}: expected {allowed}") from None
        if self.choices and parsed not in self.choices:
            raise BadInput(f"{self.name}={value!r}{at}: expected one of {', '.join(map(str, self.choices))}")
        if self.min is not None and parsed < self.min:
            raise BadInput(f"{self.name}={value!r}{at}: must be >= {self.min:g}")
        if self.max is not None and parsed > self.max:
            raise BadInput(f"{self.name}={value!r}{at}: must be <= {self.max:g}")
        return parsed

    def describe_allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices + self.words))
        kind = {int: "an integer", float: "a number", bool: "on/off (true/false)", str: "text"}[self.type]
        if self.words:
            kind += " or " + " / ".join(self.words)
        return kind


def _coerce(kind: type, value):
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "on", "yes"):
            return True
        if text in ("0", "false", "off", "no"):
            return False
        raise ValueError(value)
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(str(value).strip()) if isinstance(value, str) else int(value)
    if kind is float:
        if isinstance(value, bool) or not math.isfinite(float(value)):  # nan passes every range check
            raise ValueError(value)
        return float(value)
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _v(name, type_, default, applied, doc, **kw) -> Variable:
    return Variable(name, type_, default, applied, doc, **kw)


# The order here is the order of the columns in `jobs` and of reports.
CATALOGUE: tuple[Variable, ...] = (
    # -- system, applied by the worker before the child starts
    _v("cores", int, ALL, KNOB, "CPUs in the child's affinity set (physical cores first); 'all' = every CPU "
       "the worker may use, resolved at enqueue", min=1, max=4096, words=(ALL,),
       per_rank=("affinity", "main_thread_affinity"), compiled=False),
    _v("ranks", int, 1, KNOB, "data-parallel processes on the job's machine (torch.distributed's launcher, "
       "DistributedDataParallel over gloo), each pinned to its own equal slice of the job's cores; batch_size "
       "is each rank's micro-batch", min=1, max=4096, since=6),
    _v("nodes", int, 1, KNOB, "machines of a SLURM allocation one job trains on (one launcher per node through "
       "srun, c10d rendezvous on the first node); ranks per node each", min=1, max=1024, since=6),
    _v("interconnect", str, DEFAULT, KNOB, "rate of the links between a job's nodes, shaped with the kernel's tbf "
       "queueing discipline for the run and put back after (only with nodes>1, on links handed to the worker: "
       "BENCH_INTERCONNECT_LINKS); default = the links as they are. No delay: that needs netem",
       choices=(DEFAULT, "100mbit", "1gbit", "10gbit"), since=9),
    _v("freq_mhz", int, DEFAULT, KNOB, "scaling_min = scaling_max frequency of the job's CPUs",
       min=100, max=10000, words=(DEFAULT,), compiled=False),
    _v("governor", str, DEFAULT, KNOB, "cpufreq governor of the job's CPUs",
       choices=(DEFAULT, "performance", "powersave", "schedutil", "ondemand", "conservative", "userspace"),
       compiled=False),
    _v("turbo", str, DEFAULT, KNOB, "turbo/boost", choices=(DEFAULT, "on", "off"), compiled=False),
    _v("pin_threads", bool, False, ENV, "OpenMP threads bound to the affinity set (places=cores, close)",
       per_rank=("omp_places",), compiled=False),
    _v("numa", str, DEFAULT, KNOB, "NUMA memory policy through numactl", choices=(DEFAULT, "local", "interleave"),
       compiled=False),
    _v("allocator", str, DEFAULT, ENV, "malloc replacement by LD_PRELOAD of a known system library",
       choices=(DEFAULT, "jemalloc", "tcmalloc", "mimalloc"), ran_from=("applied", "allocator_lib"),
       compiled=False),
    # -- process environment and framework
    _v("omp_threads", int, AUTO, ENV, "OMP_NUM_THREADS / MKL_NUM_THREADS; auto = cores / ranks (a rank's slice)",
       min=1, max=4096, words=(AUTO,),
       ran_from=("applied", "omp_num_threads"), per_rank=("omp_num_threads",), compiled=False),
    _v("intra_threads", int, AUTO, ENV, "torch.set_num_threads; auto = omp_threads", min=1, max=4096, words=(AUTO,),
       ran_from=("applied", "torch_threads"), per_rank=("torch_threads",), compiled=False),
    _v("inter_threads", int, AUTO, ENV, "torch.set_num_interop_threads; auto = cores / ranks", min=1, max=4096,
       words=(AUTO,),
       ran_from=("applied", "interop_threads"), per_rank=("interop_threads",), compiled=False),
    _v("isa", str, DEFAULT, ENV, "cap on the instruction set ATen, oneDNN and MKL dispatch to, each read back "
       "(a library above the cap fails the run); default = no cap",
       choices=(DEFAULT, "baseline", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx")),
    _v("onednn", bool, True, FRAMEWORK, "torch.backends.mkldnn enabled; off moves convolutions and bf16/int8 "
       "matmuls off oneDNN, fp32 GEMMs stay MKL",
       ran_from=("applied", "mkldnn")),
    _v("framework", str, "torch", FRAMEWORK, "training framework", choices=("torch", "jax", "numpy")),
    _v("compile", str, AUTO, FRAMEWORK, "eager: op by op; inductor: torch.compile (torch); xla: jax.jit of the "
       "whole train step (jax); auto = how the framework's users train (torch eager, jax xla, numpy eager)",
       choices=("eager", "inductor", "xla"), words=(AUTO,)),
    _v("fusion", bool, True, FRAMEWORK, "inductor fusion (only with compile=inductor)"),
    _v("compile_cache", str, "warm", FRAMEWORK, "inductor cache, kernels and precompiled headers: cold = fresh "
       "dir per run, warm = shared, filled first by an untimed process of its own (only with compile=inductor)",
       choices=("cold", "warm")),
    _v("cc_flags", str, DEFAULT, FRAMEWORK, "C++ flags of inductor's kernels (only with compile=inductor): default = "
       "inductor's own; O2/O3 = that level, no -march; native = -O3 -march=native; native_fastmath = native "
       "-ffast-math; lto is skipped (torch is not built from source here)",
       choices=(DEFAULT, "O2", "O3", "native", "native_fastmath", "lto"), since=3),
    _v("compiler", str, "gcc", FRAMEWORK, "C++ compiler of inductor's kernels (only with compile=inductor): gcc = "
       "inductor's own g++, clang = clang++; read back from the compile commands, combinable with cc_flags",
       choices=("gcc", "clang"), since=4),
    _v("blas", str, AUTO, FRAMEWORK, "GEMM route: numpy: openblas (NumPy's own), mkl (PyPI's) or blis (Debian's "
       "threaded BLIS where installed, else PyPI's at one thread); torch (fp32 GEMMs, read back from MKL's "
       "branch in every run and one step's MKL/oneDNN verbose output once per fork server): mkl (as "
       "shipped: MKL's generic path on non-Intel CPUs), "
       "mkl_intel_path (MKL's vendor check answered yes by a preloaded one-line library: kernels by the "
       "CPU's ISA), onednn (every F.linear/mm through torch's oneDNN op, forward and backward; compile=eager), "
       "cpp_template (inductor's C++ GEMM template: skipped, torch takes it for constant weights only); "
       "jax: eigen (XLA's), recorded; auto = the fastest safe route (torch: mkl_intel_path, numpy: openblas; "
       "a torch job left on auto runs mkl where mkl_intel_path cannot, as without a C compiler, and records "
       "why in applied.blas_fallback)",
       choices=BLAS_CHOICES,
       words=(AUTO,), since=4, ran_from=("applied", "blas")),
    _v("attn_backend", str, "sdpa", FRAMEWORK, "attention kernel", choices=("manual", "sdpa", "sdpa_math")),
    # -- model
    _v("n_layers", int, 2, MODEL, "transformer blocks", min=1, max=256),
    _v("d_model", int, 128, MODEL, "residual width", min=8, max=16384),
    _v("n_heads", int, 4, MODEL, "query heads", min=1, max=256),
    _v("head_dim", int, AUTO, MODEL, "width of one head; auto = d_model / n_heads", min=4, max=1024, words=(AUTO,)),
    _v("kv_heads", int, AUTO, MODEL, "key/value heads (GQA/MQA); auto = n_heads", min=1, max=256, words=(AUTO,)),
    _v("mlp_ratio", float, 4.0, MODEL, "MLP hidden width / d_model", min=0.25, max=16),
    _v("dropout", float, 0.0, MODEL, "dropout probability", min=0.0, max=0.9),
    _v("activation", str, "gelu", MODEL, "MLP activation", choices=("gelu", "relu", "silu", "swiglu")),
    _v("attention", str, "full", MODEL, "full causal; local = block-diagonal windows; sliding = previous "
       "`window` tokens", choices=("full", "local", "sliding")),
    _v("window", int, 64, MODEL, "window of local/sliding attention", min=1, max=1 << 20),
    _v("vocab_size", int, 4096, MODEL, "BPE vocabulary trained on the corpus", min=256, max=65536),
    # -- training
    _v("seq_len", int, 128, TRAINING, "tokens per sample", min=8, max=1 << 16),
    _v("batch_size", int, 8, TRAINING, "samples per micro-batch", min=1, max=65536),
    _v("grad_accum", int, 1, TRAINING, "micro-batches per optimizer step", min=1, max=1024, compiled=False),
    _v("precision", str, "fp32", TRAINING, "number format of weights and activations (docs/precision.md); q8 is an "
       "alias of int8 (it was simulated in fp32 before release 6: old rows keep q8)",
       choices=("fp32", "bf16", "mixed", "q8", "q4", "bitnet", "int8")),
    _v("optimizer", str, "adamw", TRAINING, "optimizer", choices=("adamw", "sgd"), compiled=False),
    _v("lr", float, AUTO, TRAINING, "peak learning rate; auto = the optimizer's default (LR_OF: adamw 1e-3, "
       "sgd 0.05); a finetune trains at a tenth of it", min=1e-6, max=10.0, words=(AUTO,), since=7,
       compiled=False),
    _v("lr_schedule", str, "constant", TRAINING, "constant: lr at every step; cosine: linear warm-up over the "
       "first tenth of the run's optimizer steps, then cosine decay to a tenth of lr at its last step",
       choices=LR_SCHEDULES, since=7, compiled=False),
    _v("task", str, "pretrain", TRAINING, "pretrain from scratch; finetune all weights of a saved model; "
       "finetune_lora: rank-lora_rank adapters on a frozen saved model",
       choices=("pretrain", "finetune", "finetune_lora"),
       compiled=False),
    _v("lora_rank", int, 8, TRAINING, "rank of the LoRA adapters (only with task=finetune_lora)", min=1, max=4096,
       since=3),
    _v("steps", int, 20, TRAINING, "timed optimizer steps (a learning run, with max_tokens, trains to its "
       "token budget instead)", min=1, max=1_000_000, compiled=False),
    _v("warmup_steps", int, 3, TRAINING, "untimed steps before timing (lets the loop settle)", min=0, max=100_000,
       compiled=False),
    _v("max_tokens", int, NONE, TRAINING, "a learning run: train this many tokens (a whole number of optimizer "
       "steps), evaluating every eval_every tokens; none = a step-time run of warmup_steps + steps",
       min=1, max=10**15, words=(NONE,), since=7),
    _v("target_loss", float, NONE, TRAINING, "a learning run to a quality target: stop at the first evaluation "
       "whose validation loss is at or below it (reached), or at max_tokens (not reached); needs max_tokens",
       min=1e-6, max=1e6, words=(NONE,), since=7),
    _v("eval_every", int, AUTO, TRAINING, "tokens between a learning run's evaluations of the held-out split "
       f"(rounded to whole steps); auto = max_tokens / {EVALUATIONS}, 0 without max_tokens", min=1, max=10**15,
       words=(AUTO,), since=7),
    _v("seed", int, 0, TRAINING, "seed of torch, data order and init; repeat r of a learning run (max_tokens) "
       "trains with seed + r, its own init and data order (read back as applied.seed)", min=0, max=2**31 - 1,
       compiled=False),
    _v("dataset", str, DATASET_HUB, TRAINING, "training text",
       choices=(DATASET_HUB, DATASET_SHAKESPEARE, DATASET_BUILTIN), ran_from=("column", "dataset_used")),
    _v("repeat", int, 0, TRAINING, "repeat index; set by the sweep's `repeats`", min=0, max=10_000, compiled=False),
)

BY_NAME: dict[str, Variable] = {v.name: v for v in CATALOGUE}
NAMES: tuple[str, ...] = tuple(BY_NAME)

# Derived from the entries' declarations; nothing else lists them.
NOT_COMPILED = frozenset(v.name for v in CATALOGUE if not v.compiled)
PER_RANK_READBACK = tuple(key for v in CATALOGUE for key in v.per_rank)
# The allocators a run may preload: the catalogue's words but default. Each is a library lib<word>.
ALLOCATORS = tuple(word for word in BY_NAME["allocator"].choices if word != DEFAULT)


def allocator_of(library: str | None) -> str | None:
    """The allocator a library file is (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 -> jemalloc), or None:
    how the child's read-back (its mapped files), its check and the report name it."""
    name = os.path.basename(library or "")
    return next((word for word in ALLOCATORS if name.startswith(f"lib{word}")), None)


# What a sweep or --set may not choose itself.
SET_BY_SWEEP = ("repeat",)


def lookup(name: str, where: str = "") -> Variable:
    try:
        return BY_NAME[name]
    except KeyError:
        at = f" in {where}" if where else ""
        close = [n for n in NAMES if n.startswith(name[:3])] if name else []
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise BadInput(f"unknown variable {name!r}{at}{hint}") from None


def parse_value(name: str, value, where: str = ""):
    return lookup(name, where).parse(value, where)


@dataclass(frozen=True)
class Derivation:
    """A value resolve() computes from other variables when it is left on its word ("auto")."""

    name: str
    parents: tuple[str, ...]  # the variables it follows
    rule: Callable[[dict], int]  # its value from a config that has the parents' values


# In resolution order (intra_threads follows omp_threads, so omp_threads comes first). The report
# reads the same rules to know which runs have their followers at the derived values.
DERIVATIONS: tuple[Derivation, ...] = (
    # compile first: fusion follows it. A framework comparison runs each framework the way its users
    # train (JAX under jax.jit); eager JAX is its own comparison (compile=eager, xla on jax).
    Derivation("compile", ("framework",), lambda c: COMPILE_OF[c["framework"]]),
    # threads follow a rank's slice of the cores (cores // ranks: the whole set with one rank)
    # ranks: a job stored before release 6 leaves it out (one process)
    Derivation("omp_threads", ("cores", "ranks"), lambda c: max(1, c["cores"] // c.get("ranks", 1))),
    Derivation("intra_threads", ("omp_threads",), lambda c: c["omp_threads"]),
    Derivation("inter_threads", ("cores", "ranks"), lambda c: max(1, c["cores"] // c.get("ranks", 1))),
    Derivation("head_dim", ("d_model", "n_heads"), lambda c: max(1, c["d_model"] // c["n_heads"])),
    Derivation("kv_heads", ("n_heads",), lambda c: c["n_heads"]),
    Derivation("blas", ("framework",), lambda c: BLAS_AUTO[c["framework"]]),
    Derivation("lr", ("optimizer",), lambda c: LR_OF[c["optimizer"]]),
    Derivation("eval_every", ("max_tokens",),
               lambda c: 0 if c["max_tokens"] == NONE else max(1, c["max_tokens"] // EVALUATIONS)),
    # The torch-only variables follow the framework: on jax/numpy, what really runs there (elsewhere());
    # on torch they are free, and "at the derived value" means at their default.
    *(Derivation(name, ("framework", "compile") if name == "fusion" else ("framework",),
                 lambda c, name=name: elsewhere(c)[name] if c["framework"] != "torch" else BY_NAME[name].default)
      for name in ("attn_backend", "onednn", "fusion", "compile_cache")),
)
DERIVED_BY_NAME: dict[str, Derivation] = {d.name: d for d in DERIVATIONS}


# compile=auto: the mode each framework's users train with.
COMPILE_OF = {"torch": "eager", "jax": "xla", "numpy": "eager"}

# What each framework can run; a value outside its tuple is a violation at enqueue.
FRAMEWORK_VALUES: dict[str, dict[str, tuple]] = {
    "torch": {"compile": ("eager", "inductor"), "blas": TORCH_GEMM_ROUTES},
    "jax": {"compile": ("eager", "xla"), "precision": ("fp32", "bf16", "mixed"), "task": ("pretrain", "finetune"),
            "cc_flags": (DEFAULT,), "compiler": ("gcc",), "blas": ("eigen",)},
    "numpy": {"compile": ("eager",), "precision": ("fp32",), "task": ("pretrain", "finetune"), "cc_flags": (DEFAULT,),
              "compiler": ("gcc",), "blas": ("openblas", "mkl", "blis")},
}
# Offered nowhere (harness.NOT_OFFERED: IPEX), and why: `bench.py machine` and docs/backends.md say so.
TORCH_ONLY = ("attn_backend", "onednn", "fusion", "compile_cache")


def elsewhere(config: dict) -> dict:
    """The torch-only variables' values on jax and numpy: what really runs there. Attention is
    written out (manual), oneDNN is torch's, XLA fuses under jit (compile=xla) and NumPy never does,
    and no compile cache is carried between runs."""
    return {"attn_backend": "manual", "onednn": False, "fusion": config["compile"] == "xla", "compile_cache": "cold"}


def _framework_rules(c: dict, partial: dict) -> list[str]:
    """Normalise the torch-only variables of a jax/numpy config in place; the reasons it cannot run."""
    framework, why = c["framework"], []
    for name, allowed in FRAMEWORK_VALUES[framework].items():
        if c[name] not in allowed:
            where = " or ".join(f for f, rules in FRAMEWORK_VALUES.items() if c[name] in rules.get(name, (c[name],)))
            why.append(f"{name}={_word(c[name])} needs framework={where}")
    if framework != "torch":
        for name, value in elsewhere(c).items():
            if name in partial and partial[name] != value:
                why.append(f"{name}={_word(partial[name])} needs framework=torch")
            c[name] = value
    return why


def _word(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def derived_words(partial: dict) -> dict[str, str]:
    """The variables resolve() fills from a word for this partial config, e.g. {"cores": "all",
    "omp_threads": "auto"}: what `jobs.derived` records, so a report need not guess."""
    out = {}
    for name in ("cores", *DERIVED_BY_NAME):
        value = partial.get(name, BY_NAME[name].default)
        if isinstance(value, str) and value in (AUTO, ALL):
            out[name] = value
    return out


def resolve(partial: dict, cpu_count: int) -> tuple[dict, list[str]]:
    """A full concrete config and the constraints it violates (empty: it can be a job).

    Values must already be parsed. Defaults are filled and auto/all resolved against `cpu_count` CPUs;
    `freq_mhz`, `governor` and `turbo` keep the word "default" (leave the machine as it is), every
    other variable gets a concrete value, so two spellings of one run hash alike.
    derived_words(partial) names the values resolved here.
    """
    c = {v.name: partial.get(v.name, v.default) for v in CATALOGUE}
    if c["cores"] == ALL:
        c["cores"] = cpu_count
    c["precision"] = PRECISION_ALIASES.get(c["precision"], c["precision"])
    why = []
    if c["head_dim"] == AUTO and c["d_model"] % c["n_heads"]:
        why.append("d_model not divisible by n_heads")
    for d in DERIVATIONS:
        if c[d.name] == AUTO:
            c[d.name] = d.rule(c)
    check_learning(c)
    why += _framework_rules(c, partial)
    return c, why + violations(c, cpu_count)


def tokens_per_step(config: dict) -> int:
    """Tokens one optimizer step trains, over every rank and node."""
    ranks = config.get("ranks", 1) * config.get("nodes", 1)
    return config["batch_size"] * config["grad_accum"] * config["seq_len"] * ranks


def steps_trained(config: dict) -> int:
    """Optimizer steps a run trains at most: warmup_steps + steps, or a learning run's token budget in
    whole steps (one that reaches its target stops sooner)."""
    if is_learning(config):
        return config["max_tokens"] // tokens_per_step(config)
    return config["warmup_steps"] + config["steps"]


def run_seed(config: dict) -> int:
    """The seed a run trains with: its seed, and for repeat r of a learning run seed + r, so that the
    repeats of a quality result hold convergence variance (init and data order), not only timing noise."""
    return config["seed"] + config.get("repeat", 0) if is_learning(config) else config["seed"]


def is_learning(config: dict) -> bool:
    """A learning run (max_tokens set) trains to a token budget or a target loss, evaluating as it goes."""
    return config.get("max_tokens", NONE) not in (NONE, None)  # None: the column's NULL for the word


def check_learning(config: dict) -> None:
    """A learning run's bounds that cannot be a job at all: BadInput (exit 2, nothing enqueued), not a
    counted violation, since no value of another variable would make them sensible."""
    target, budget = config.get("target_loss", NONE), config.get("max_tokens", NONE)
    if target != NONE and budget == NONE:
        raise BadInput(f"target_loss={target:g} needs max_tokens: the budget after which a run that never reaches "
                       f"it ends as not reached")
    if budget == NONE:
        if config.get("eval_every", 0) not in (0, AUTO):
            raise BadInput(f"eval_every={config['eval_every']} needs max_tokens "
                           "(only a learning run evaluates as it goes)")
        return
    if budget < tokens_per_step(config):
        raise BadInput(f"max_tokens={budget} is below one optimizer step of this config ({tokens_per_step(config)} "
                       f"tokens: batch_size x grad_accum x seq_len x ranks x nodes)")
    if target != NONE and config.get("dataset") == DATASET_BUILTIN:
        raise BadInput(f"target_loss={target:g} on dataset={DATASET_BUILTIN}: generated text has no held-out "
                       f"language to learn; use dataset=shakespeare (or the hub dataset)")


def violations(config: dict, cpu_count: int) -> list[str]:
    """Why a resolved config cannot be a job; each reason is a short stable text that is counted."""
    why = []
    if config["kv_heads"] > config["n_heads"]:
        why.append("kv_heads greater than n_heads")
    elif config["n_heads"] % config["kv_heads"]:
        why.append("kv_heads does not divide n_heads")
    if config["cores"] > cpu_count:
        why.append(f"cores greater than this machine's {cpu_count} CPUs")
    why += parallel_violations(config)
    if config["framework"] == "torch" and config["compile"] == "eager" and not config["fusion"]:
        why.append("fusion=off needs compile=inductor")
    if config["framework"] == "torch" and config["compile"] == "eager" and config["compile_cache"] == "cold":
        why.append("compile_cache=cold needs compile=inductor")
    if config["framework"] == "torch" and config["compile"] == "eager" and config["cc_flags"] != DEFAULT:
        why.append(f"cc_flags={config['cc_flags']} needs compile=inductor")
    if config["framework"] == "torch" and config["compile"] == "eager" and config["compiler"] != "gcc":
        why.append(f"compiler={config['compiler']} needs compile=inductor")
    if config["framework"] == "torch" and config["blas"] == "onednn" and config["compile"] != "eager":
        why.append("blas=onednn needs compile=eager")
    if config["framework"] == "torch" and config["blas"] == "onednn" and not config["onednn"]:
        why.append("blas=onednn needs onednn=on")
    if config["precision"] == "q4" and (why_int4 := int4_unsupported(config)):
        why.append(why_int4)
    if config["task"] != "finetune_lora" and config["lora_rank"] != BY_NAME["lora_rank"].default:
        why.append("lora_rank needs task=finetune_lora")
    if config["attention"] != "full" and config["window"] >= config["seq_len"]:
        why.append("window >= seq_len makes local/sliding attention full")
    if config["activation"] == "swiglu" and int(config["mlp_ratio"] * config["d_model"] * 2 / 3) < 1:
        why.append("mlp_ratio too small for swiglu")
    return why


# Why a framework other than torch cannot run ranks or nodes above 1 (a counted reason at enqueue).
NO_DATA_PARALLEL = {
    "numpy": "the NumPy trainer has no collective library to all-reduce gradients with",
    "jax": "JAX's CPU data parallelism is one process over forced host devices (xla_force_host_platform_device_count) "
           "sharing one XLA thread pool, not ranks pinned to their own cores: not implemented",
}


def parallel_violations(config: dict) -> list[str]:
    """Why ranks/nodes cannot run as set: a rank needs a whole, equal slice of the job's cores."""
    ranks, nodes, why = config.get("ranks", 1), config.get("nodes", 1), []
    if ranks > config["cores"]:
        why.append("ranks greater than cores")
    elif config["cores"] % ranks:
        why.append("cores not divisible by ranks")
    if (ranks > 1 or nodes > 1) and config["framework"] in NO_DATA_PARALLEL:
        what = "ranks>1" if ranks > 1 else "nodes>1"
        why.append(f"{what} needs framework=torch ({NO_DATA_PARALLEL[config['framework']]})")
    if config.get("interconnect", DEFAULT) != DEFAULT and nodes < 2:
        why.append("interconnect needs nodes>1 (one node has no link between nodes)")
    return why


def canonical_json(config: dict) -> str:
    """The text a job's identity is taken of: every catalogue variable, sorted, compact. A variable a
    later release added is left out while at its default, so the jobs of older databases and sweeps
    keep their hashes (they ran with that default)."""
    return json.dumps({v.name: config[v.name] for v in CATALOGUE
                       if v.since == 1 or config[v.name] != unset_value(v, config)},
                      sort_keys=True, separators=(",", ":"))


def complete(stored: dict) -> dict:
    """A job's stored config (canonical_json leaves out a later release's variables at their unset
    value) with every catalogue variable back: those left out take that value."""
    config = {v.name: v.default for v in CATALOGUE} | stored
    for var in CATALOGUE:
        if var.name not in stored:
            config[var.name] = unset_value(var, config)
    return config


def unset_value(var: Variable, config: dict):
    """The value `var` takes in this config when a sweep leaves it unset: its default, or for a derived
    one on auto the value its rule gives; blas: what it ran before release 6 (BLAS_OF), since auto
    moved on (BLAS_AUTO) and the old jobs must keep their hashes."""
    if var.name == "blas":
        return BLAS_OF[config["framework"]]
    if var.default == AUTO and var.name in DERIVED_BY_NAME:
        return DERIVED_BY_NAME[var.name].rule(config)
    return var.default


def identity_text(canonical: str, block: str | None = None) -> str:
    """What a job's config_hash is taken of: the canonical JSON, and the block where it has one
    (an ofat sweep's baseline is a job of its own in every block). Jobs without a block (grid,
    random and list sweeps, and every job planned before blocks) keep the hash of their config alone."""
    return canonical if block is None else f"{canonical}\nblock={block}"


def config_hash(config: dict, block: str | None = None) -> str:
    """Identity of a job: sha256 of the canonical JSON of the full config (repeat included), and of
    its block if it has one."""
    return hashlib.sha256(identity_text(canonical_json(config), block).encode()).hexdigest()


def column_value(name: str, value):
    """The value stored in the typed `jobs` column: the words default/auto become NULL."""
    var = BY_NAME[name]
    if isinstance(value, str) and value in var.words:
        return None
    return value

