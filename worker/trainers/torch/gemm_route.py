"""The torch trainer's GEMM route (`blas`): which kernels run the fp32 matrix products of a torch
run, applied in the child and read back from what ran.

    mkl             torch as shipped: ATen hands every fp32 mm/addmm/bmm/linear to MKL's sgemm. On a
                    CPU MKL does not take for Intel's, it runs its generic code path (read back: MKL's
                    own branch, mkl_serv_cbwr_get_auto_branch(), is COMPATIBLE there).
    mkl_intel_path  MKL on the code path of the CPU's own ISA, on any x86 CPU: a one-line C library
                    preloaded into the child (LD_PRELOAD, built once with the system's C compiler)
                    answers MKL's vendor check, mkl_serv_intel_cpu_true, with yes; MKL then picks
                    its kernels by the CPU's ISA flags alone (read back: the branch, AVX512_E1 on an
                    AVX-512 + VNNI EPYC). The same kernels as mkl on an Intel CPU. It is `auto`'s
                    choice (common/variables.py): on the AVX-512 EPYC the model's fp32 GEMMs ran
                    17% faster and training agrees with mkl to fp32 rounding
                    (tests/test_gemm_route.py).
    onednn          oneDNN's fp32 matmul (brgemm) for every F.linear, torch.mm and addmm_ of the model,
                    forward and backward: a TorchFunctionMode sends them to torch's own oneDNN op
                    (torch.ops.mkldnn._linear_pointwise, a @ b.T) inside an autograd Function whose
                    backward does the same. Attention's products stay inside SDPA's kernel (MKL);
                    the read-back counts both. compile=eager only: inductor lowers the GEMMs itself.
    cpp_template    inductor's C++ GEMM template (max-autotune, CPP backend): skipped wherever torch
                    takes it only for constant weights (a frozen inference graph), as 2.13 does.

MKL's own dispatch switches are not routes: on the AMD EPYC, MKL_ENABLE_INSTRUCTIONS=AVX512,
MKL_CBWR=AVX512 and MKL_DEBUG_CPU_TYPE=5 each left MKL's branch at COMPATIBLE (read back as above).

The read-back (`read_back`) says which route ran (`blas`), which worker/knobs/verify.py compares with the
job's, from two kinds of evidence:
- MKL's branch and whether its vendor check was answered (`mkl_branch`, one call): read in every run.
  It alone decides mkl_intel_path (MKL left its generic branch) against mkl.
- Which library ran the route's products (`count_calls`: one training step after the timed ones, and
  after the model is saved, under MKL's and oneDNN's verbose modes). It decides onednn (oneDNN ran
  fp32 products). It costs 0.6 s a run, mostly MKL's verbose banner waiting for the next whole second,
  and its answer is the same for every run of the same route, settings and process start: it is
  proved once per fork server (or per worker, for children it executes) and per `proof_key`, and
  each later run of that key records which run proved it and when (`proven`). Model sizes are not in
  the key: the verdict does not depend on them (mkl_intel_path is judged by MKL's branch alone; onednn's
  mode sends every fp32 F.linear to oneDNN whatever its shape). The counts do, and are recorded as the
  proving run's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROUTES = ("mkl", "mkl_intel_path", "onednn", "cpp_template")
SHIM_SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
# MKL's conditional-numerical-reproducibility branches (mkl_cbwr.h), the ones named in read-backs
MKL_BRANCHES = {1: "AUTO", 2: "COMPATIBLE", 3: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX",
                10: "AVX2", 12: "AVX512", 14: "AVX512_E1", 16: "AVX512_E3", 17: "AVX512_E4"}


# -- in the worker (no torch import) -------------------------------------------------------------

def c_compiler() -> str | None:
    """The C compiler that builds mkl_intel_path's library: $CC where set (its first word; one that is
    not there means none), else cc, gcc or clang on PATH."""
    if os.environ.get("CC", "").strip():
        return shutil.which(shlex.split(os.environ["CC"])[0])
    return next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)


def _no_compiler() -> str:
    where = f"CC={os.environ['CC']} is not an executable" if os.environ.get("CC", "").strip() else \
        "no cc, gcc or clang on PATH"
    return f"blas=mkl_intel_path: no C compiler ({where}) to build the one-line vendor-check library"


def unavailable(route: str, facts: dict | None = None) -> str | None:
    """Why this machine or this torch cannot take the route, or None. `facts`: the probe's (torch
    build: blas, mkldnn_available; arch)."""
    torch_facts = (facts or {}).get("torch") or {}
    arch = (facts or {}).get("arch") or platform.machine()
    if route in ("mkl", "mkl_intel_path") and torch_facts.get("blas") not in (None, "mkl"):
        return f"blas={route}: this torch runs its fp32 GEMMs on {torch_facts['blas']}, not MKL"
    if route == "mkl_intel_path":
        if arch != "x86_64":
            return f"blas=mkl_intel_path: MKL's Intel code paths are x86-64 ones (this is {arch})"
        if not c_compiler():
            return _no_compiler()
    if route == "onednn" and torch_facts.get("mkldnn_available") is False:
        return "blas=onednn: this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if route == "cpp_template":
        return cpp_template_unavailable()
    return None


def auto_fallback(config: dict, derived: dict | None, facts: dict | None = None) -> str | None:
    """Where a torch job's route is auto's choice (`derived`, jobs.derived, names blas) and that route
    cannot run here while torch as shipped (mkl) can, as on a slim container without a C compiler:
    what the run records (applied.blas_fallback), and it runs mkl, read back and judged as mkl. None
    otherwise: a route the job names itself is never swapped (it is skipped with why)."""
    from common.variables import AUTO, BLAS_AUTO

    route = config.get("blas")
    if config.get("framework") != "torch" or (derived or {}).get("blas") != AUTO or route != BLAS_AUTO["torch"]:
        return None
    why = unavailable(route, facts)
    if why is None or unavailable("mkl", facts) is not None:
        return None
    return f"blas=auto ran mkl (torch as shipped): auto's {why.removeprefix('blas=')}"


def cpp_template_unavailable() -> str | None:
    """Why inductor's C++ GEMM template cannot run a training step's GEMMs with this torch, read from
    its source (the worker does not import torch): use_cpp_gemm_template requires a constant mat2."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    source = Path(spec.origin).parent / "_inductor" / "utils.py" if spec and spec.origin else None
    text = source.read_text() if source and source.exists() else ""
    if "require_constant_mat2: bool = True" in text:
        return ("blas=cpp_template: this torch's inductor takes its C++ GEMM template only for constant "
                "weights (torch/_inductor/utils.py use_cpp_gemm_template: require_constant_mat2, a frozen "
                "inference graph); a training step's weights change every step, so max-autotune falls back "
                "to ATen's GEMMs (MKL)")
    return "blas=cpp_template: not wired for this torch (the route is defined for torch 2.13's inductor)"


def shim_library(cache_dir: str | None = None) -> str:
    """The preloaded library of mkl_intel_path, built once per source text (atomically: a parallel
    worker never loads a half-written file); its path."""
    folder = Path(cache_dir or Path(tempfile.gettempdir()) / f"cpubench-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:12]
    lib = folder / f"libmkl_intel_path-{digest}.so"
    if not lib.exists():
        src = folder / f"mkl_intel_path-{digest}-{os.getpid()}.c"
        src.write_text(SHIM_SOURCE)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([c_compiler(), "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src)], check=True,
                       capture_output=True, timeout=60)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
        src.unlink(missing_ok=True)
    return str(lib)


def start_env(route: str, env: dict) -> dict:
    """The start environment the route needs (applied before the interpreter starts, so a fork
    server keyed on it loads it before torch): mkl_intel_path preloads its library after any
    allocator already in `env`."""
    if route != "mkl_intel_path":
        return {}
    return {"LD_PRELOAD": ":".join(p for p in (env.get("LD_PRELOAD"), shim_library()) if p)}


# -- in the child ---------------------------------------------------------------------------------

def apply(config: dict) -> dict:
    """Put the job's route in force in this process (onednn: the mode below, entered for good);
    what was applied."""
    route = config["blas"]
    if route == "onednn":
        onednn_mode().__enter__()  # this thread's mode stack: autograd runs CPU backwards on it
        return {"gemm_route_applied": "TorchFunctionMode: F.linear, torch.mm, addmm_ (fp32) -> "
                                      "torch.ops.mkldnn._linear_pointwise, forward and backward"}
    if route == "mkl_intel_path":
        return {"gemm_route_applied": f"LD_PRELOAD {os.environ.get('LD_PRELOAD')}"}
    return {"gemm_route_applied": "torch as shipped"}


def _mm_t(a, b):
    """a @ b.T on oneDNN (fp32 brgemm; strided operands are taken as they are)."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [None], "")


def _onednn_linear():
    import torch

    class OneDnnLinear(torch.autograd.Function):
        """y = x @ w.T with both backward products on oneDNN too."""

        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return _mm_t(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            g2 = g.reshape(-1, g.shape[-1])  # (N, out)
            dx = _mm_t(g2, w.t()).view(x.shape) if ctx.needs_input_grad[0] else None  # g @ w
            dw = _mm_t(g2.t(), x.reshape(-1, x.shape[-1]).t()) if ctx.needs_input_grad[1] else None  # g.T @ x
            return dx, dw

    return OneDnnLinear


def _fp32(*tensors) -> bool:
    import torch

    return all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


@functools.cache
def _make_mode():
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    linear = _onednn_linear()

    class Mode(TorchFunctionMode):
        """fp32 F.linear (autograd through OneDnnLinear), and torch.mm / addmm_ where no autograd
        graph is recorded through them (the head's hand-written products), on oneDNN; every other
        call as it was."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear and len(args) >= 2 and _fp32(args[0], args[1]) and args[1].dim() == 2 \
                    and (args[2] if len(args) > 2 else kwargs.get("bias")) is None:
                return linear.apply(args[0], args[1])
            tracked = torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args)
            if func in (torch.mm, torch.Tensor.mm) and len(args) == 2 and _fp32(*args) and not tracked \
                    and set(kwargs) <= {"out"}:
                product = _mm_t(args[0], args[1].t())
                return kwargs["out"].copy_(product) if kwargs.get("out") is not None else product
            if func is torch.Tensor.addmm_ and len(args) == 3 and not kwargs and _fp32(*args) and not tracked:
                return args[0].add_(_mm_t(args[1], args[2].t()))
            return func(*args, **kwargs)

    return Mode


def onednn_mode():
    """A new instance of the mode (its class is made once: torch is imported late in the child)."""
    return _make_mode()()


def mkl_branch() -> dict:
    """MKL's code path in this process: the branch it picks on its own (auto), and whether its
    vendor check says Intel (the check's own answer, from libtorch_cpu, not any preloaded one)."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        branch = int(lib.mkl_serv_cbwr_get_auto_branch())
        genuine = bool(lib.mkl_serv_intel_cpu_true())
    except (OSError, AttributeError):
        return {"mkl_branch": None, "mkl_vendor_check": None}
    return {"mkl_branch": MKL_BRANCHES.get(branch, f"branch {branch}"),
            "mkl_vendor_check": "Intel" if genuine else "not Intel (MKL's generic path unless answered yes)"}


def count_calls(out: str) -> dict:
    """GEMM work per library in verbose output: {key: {"calls", "gflop"}}, keyed by MKL's routine
    (SGEMM...) or oneDNN's primitive, implementation and source type ('onednn inner_product
    brg_matmul:avx512_core f32'); gflop from the printed shapes (2mnk), None where none is printed."""
    calls: dict[str, dict] = {}
    for line in out.splitlines():
        flop = None
        mkl = re.match(r"MKL_VERBOSE (\w+)\(([^)]*)\)", line)
        if mkl:
            key, args = f"mkl {mkl.group(1)}", mkl.group(2).split(",")
            if mkl.group(1).endswith("GEMM") and len(args) > 4 and all(a.isdigit() for a in args[2:5]):
                flop = 2 * int(args[2]) * int(args[3]) * int(args[4])
        elif line.startswith("onednn_verbose") and ",exec," in line:
            fields = line.split(",")
            at = fields.index("exec")
            src = re.search(r"src:(\w+)", line)
            key = f"onednn {fields[at + 2]} {fields[at + 3]} {src.group(1) if src else ''}".strip()
            shape = re.search(r"mb(\d+)ic(\d+)oc(\d+)", line) or re.search(r",(\d+)x(\d+):\d+x(\d+),", line)
            if shape:
                flop = 2 * int(shape.group(1)) * int(shape.group(2)) * int(shape.group(3))
        else:
            continue
        entry = calls.setdefault(key, {"calls": 0, "gflop": None})
        entry["calls"] += 1
        if flop is not None:
            entry["gflop"] = round((entry["gflop"] or 0) + flop / 1e9, 3)
    return calls


def route_ran(route: str, calls: dict, branch: dict) -> str:
    """Which route the counted calls show: onednn where oneDNN ran fp32 products, mkl_intel_path
    where MKL ran off its own vendor answer (or on an Intel CPU, where it is mkl's path), else mkl."""
    fp32_onednn = sum(c["calls"] for k, c in calls.items() if k.startswith("onednn") and k.endswith("f32")
                      and ("matmul" in k or "inner_product" in k))
    if route == "onednn" and fp32_onednn:
        return "onednn"
    if route == "mkl_intel_path" and (branch.get("mkl_vendor_check") == "Intel"
                                      or branch.get("mkl_branch") not in (None, "COMPATIBLE")):
        return "mkl_intel_path"
    return "mkl"


# What besides the route could change which library runs its products, for a proof (proof_key):
# the job's variables that pick the ops and dtypes (precision, compile, attention's kernel...), what the
# child read back of its threads and ISAs, and the start environment the libraries read when they load.
PROOF_CONFIG = ("framework", "precision", "compile", "fusion", "cc_flags", "compiler", "attn_backend", "attention",
                "task", "onednn", "isa", "ranks", "nodes")
PROOF_IN_FORCE = ("affinity", "torch_threads", "interop_threads", "cpu_capability", "mkldnn", "mkl_isa",
                  "onednn_isa", "allocator_lib")
PROOF_ENV = ("LD_PRELOAD", "MKL_", "ONEDNN_", "DNNL_", "ATEN_", "OMP_", "KMP_", "GOMP_")


def proof_key(route: str, config: dict, in_force: dict) -> str:
    """The identity of what a proof of `route` holds for in this process: the route, the job's variables
    and the settings read back (PROOF_CONFIG, PROOF_IN_FORCE), the libraries' start environment and this
    torch install. Any difference and the route is proved again."""
    import torch

    key = {"route": route, "config": {k: config.get(k) for k in PROOF_CONFIG},
           "in_force": {k: in_force.get(k) for k in PROOF_IN_FORCE},
           "env": {k: v for k, v in os.environ.items() if k.startswith(PROOF_ENV)},
           "torch": [torch.__version__, torch.__file__]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_back(route: str, one_step, key: str, held: dict | None = None, run_id: int | None = None) -> tuple[dict, dict]:
    """Which route ran: ({"blas": it, "gemm_route": the evidence}, the proof this run made, {key: proof},
    empty unless it proved the asked route). MKL's branch is read here; which library ran the products
    comes from `held[key]`, a proof an earlier run of this key made, or is proved now by running
    one_step() (one training step) under MKL's and oneDNN's verbose modes and counting the calls."""
    import torch

    from worker.knobs.isa_check import _capture_stdout

    def verbose_step():
        with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON), \
                torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            one_step()

    t = time.perf_counter()
    branch = mkl_branch()
    proof = (held or {}).get(key)
    fresh = proof is None
    if fresh:
        proof = {"calls_one_step": count_calls(_capture_stdout(verbose_step)), "run_id": run_id,
                 "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid()}
        proven = "in this run (one step under MKL's and oneDNN's verbose modes)"
    else:
        proven = (f"once, by run {proof['run_id']} (pid {proof['pid']}) at {proof['at']}: the same route, "
                  f"settings and process start (proof_key); MKL's branch read in this run")
    ran = route_ran(route, proof["calls_one_step"], branch)
    made = {key: proof} if fresh and ran == route else {}  # a route that did not run is proved again
    return {"blas": ran, "gemm_route": {"asked": route, "ran": ran, **branch, "calls_one_step": proof["calls_one_step"],
                                        "proven": proven, "proof_key": key,
                                        "read_back_s": round(time.perf_counter() - t, 3)}}, made
