"""ISA caps per library, and the proof that each library obeyed them.

An `isa` cap must reach every library that runs the job's kernels, or the run is not at that ISA:
- ATen's own kernels: ATEN_CPU_CAPABILITY (read back: torch.backends.cpu.get_cpu_capability()).
- oneDNN (convolutions, bf16/int8 matmuls, fused ops): ONEDNN_MAX_CPU_ISA (read back: the
  `cpu,isa:` line oneDNN's verbose mode prints).
- MKL (every fp32 GEMM behind nn.Linear, torch.mm/bmm/addmm): MKL_ENABLE_INSTRUCTIONS, which the
  MKL 2024.2 linked statically into torch 2.13 honours (read back: the banner MKL_VERBOSE prints,
  e.g. "Intel(R) Streaming SIMD Extensions 4.2 (Intel(R) SSE4.2) enabled processors"). MKL ignores
  an unknown value silently, hence the read-back.

The child reads each library's dispatch ISA around a tiny op at setup (`library_isas`), and the worker
fails a run whose library runs above the cap (`disobeyed`). A fork server reads it once, in a probe
child forked from itself, for all its children (`hold_library_isas`): MKL's verbose banner waits for
the next whole second to measure the clock, up to 1 s a job. On a non-Intel CPU MKL's banner names no
ISA ("Intel(R) Architecture processors"), and a single-thread SGEMM capped at SSE4_2 was measured on an
AMD EPYC (Zen 4) at 57 GFLOP/s, above what SSE4.2 can reach at its clock: MKL does not honour the cap
there, so a capped run is refused saying the cap cannot be confirmed. A library the child could not read back
(say oneDNN with onednn=off: nothing reaches it) is recorded None and is not held against the run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import select
import signal
import sys
import tempfile
import time

from common.processes import fork_child

# Levels, lowest first: a library obeys a cap when its level is at most the cap's.
LEVELS = {"baseline": 0, "avx2": 1, "avx512": 2, "avx512_vnni": 3, "avx512_bf16": 4, "amx": 5}

# isa value -> MKL_ENABLE_INSTRUCTIONS (oneMKL 2024: SSE4_2, AVX2, AVX512, AVX512_E1 = +VNNI,
# AVX512_E3 = +BF16, AVX512_E4 = +AMX/FP16).
MKL_CAPS = {"baseline": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512", "avx512_vnni": "AVX512_E1",
            "avx512_bf16": "AVX512_E3", "amx": "AVX512_E4"}


def extra_env(target: str) -> dict:
    """The environment that carries the cap to the libraries not covered by ATen/oneDNN's variables."""
    return {"MKL_ENABLE_INSTRUCTIONS": MKL_CAPS[target]} if target in MKL_CAPS else {}


def level_of(text: str | None) -> float | None:
    """The cap level of an ISA description printed by MKL or oneDNN (None if unrecognised).
    Half steps sit between caps: 0.5 plain AVX, 1.5 AVX2 with VNNI, 4.5 AVX-512/AVX10.1 with FP16 but
    no AMX (above an avx512_bf16 cap, below amx)."""
    if not text:
        return None
    t = text.upper().replace("-", "").replace("AVX 10", "AVX10")
    vnni = "DL BOOST" in t or "VNNI" in t
    if "AMX" in t:
        return LEVELS["amx"]
    if "AVX10" in t:
        return 4.5
    if "AVX512" in t:
        if "FP16" in t or re.search(r"(?<!B)FLOAT16", t):
            return 4.5
        if "BFLOAT16" in t or "BF16" in t:
            return LEVELS["avx512_bf16"]
        return LEVELS["avx512_vnni"] if vnni else LEVELS["avx512"]
    if "AVX2" in t or "AVX 2" in t:
        return 1.5 if vnni else LEVELS["avx2"]
    if "AVX" in t:
        return 0.5
    if "SSE4" in t:
        return LEVELS["baseline"]
    return None


def parse_mkl(out: str) -> str | None:
    """The ISA phrase of MKL_VERBOSE's banner ('... for Intel(R) 64 architecture <ISA>, Lnx ...')."""
    for line in out.splitlines():
        if line.startswith("MKL_VERBOSE") and "architecture" in line:
            isa = line.split("architecture", 1)[1].split(", Lnx", 1)[0]
            return isa.replace("Intel(R) ", "").strip() or None
    return None


def parse_onednn(out: str) -> str | None:
    """The ISA oneDNN's verbose mode names ('onednn_verbose,...,info,cpu,isa:Intel AVX2')."""
    for line in out.splitlines():
        if ",cpu,isa:" in line:
            return line.split(",cpu,isa:", 1)[1].strip() or None
    return None


def _capture_stdout(fn) -> str:
    """What fn writes to file descriptor 1 (the libraries print from C), kept off the real stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            fn()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


# In a fork server: {oneDNN enabled: library_isas()} read in probe children forked from it (hold_library_isas).
_HELD: dict[bool, dict] = {}
READ_HERE = "in this process"
READ_IN_SERVER = "once per fork server, in a probe child forked from it like this one"
PROBE_TIMEOUT_S = 60.0


def hold_library_isas() -> None:
    """In a fork server, before its first job: read library_isas() in probe children forked from this
    process (one with oneDNN enabled, one without, as a child with onednn=on/off reads it) and keep
    the answers for every child forked later. Those children share the probe's binary, environment
    and CPU set (one server per start settings, worker/forkserver.py), which is all the libraries
    decide their ISA from; the server itself runs no kernel, so it forks no OpenMP pool. A probe
    that fails or takes longer than PROBE_TIMEOUT_S holds nothing: the children then read it
    themselves."""
    sys.stdout.flush()
    sys.stderr.flush()
    probes = {}
    for enabled in (True, False):
        r, w = os.pipe()
        # the probe: answer on the pipe (exit 0), never return into the server's code
        pid = fork_child(functools.partial(_probe_isas, enabled, w), close=(r,))
        os.close(w)
        probes[enabled] = (pid, r)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    for enabled, (pid, r) in probes.items():  # concurrently: both wait for the same whole second
        raw = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:  # a stuck probe: the children read it
                os.kill(pid, signal.SIGKILL)
                raw = b""
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            raw += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0 and raw:
            _HELD[enabled] = json.loads(raw)


def _probe_isas(onednn: bool, fd: int) -> None:
    """In a probe child (hold_library_isas): library_isas() with oneDNN on or off, written to `fd`."""
    import torch

    torch.backends.mkldnn.enabled = onednn
    os.write(fd, json.dumps(library_isas()).encode())


def library_isas() -> dict:
    """In the training child after importing torch: the ISA MKL and oneDNN dispatch to, and where
    it was read (`library_isas_read`: this process, or once per fork server)."""
    import torch

    held = _HELD.get(bool(torch.backends.mkldnn.enabled))
    if held is not None:
        return {**held, "library_isas_read": READ_IN_SERVER}

    def mkl():
        with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))

    def onednn():
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            torch.ones(2, 4, 8, 8).to_mkldnn().to_dense()

    out = {"mkl_isa": None, "onednn_isa": None}
    try:
        out["mkl_isa"] = parse_mkl(_capture_stdout(mkl))
    except Exception:  # no MKL in this build: recorded None
        pass
    try:
        if torch.backends.mkldnn.is_available():
            out["onednn_isa"] = parse_onednn(_capture_stdout(onednn))
    except Exception:
        pass
    out["library_isas_read"] = READ_HERE
    return out


LIBRARIES = (("mkl_isa", "MKL"), ("onednn_isa", "oneDNN"))


def unconfirmable(target: str, key: str, got: str) -> str:
    """Why a cap cannot be confirmed when a library's banner names no ISA: the same words for the
    run refused at claim (the probe read the banner) and for a child that read it back."""
    lib = dict(LIBRARIES)[key]
    return (f"{key}={got!r}: {lib} does not name the instruction set it dispatches to on this CPU "
            f"(as on non-Intel CPUs), so the cap isa={target} cannot be confirmed")


def unconfirmable_here(target: str, library_isas: dict | None, onednn: bool = True) -> str | None:
    """From the probe's uncapped read of the libraries' banners: why a cap cannot be confirmed on
    this machine before any run tries (None: it can, or nothing was read). oneDNN only counts when
    the run uses it."""
    for key, _lib in LIBRARIES:
        got = (library_isas or {}).get(key)
        if got is not None and level_of(got) is None and (onednn or key != "onednn_isa"):
            return unconfirmable(target, key, got)
    return None


def disobeyed(target: str, child: dict) -> list[str]:
    """The libraries whose read-back dispatch ISA is above the cap `target` (empty for no cap)."""
    if target not in LEVELS:
        return []
    wrong = []
    for key, lib in LIBRARIES:
        got = child.get(key)
        level = level_of(got)
        if got is not None and level is None:
            wrong.append(unconfirmable(target, key, got))
        elif got is not None and level > LEVELS[target]:
            wrong.append(f"{key}={got!r}: {lib} ignored the cap isa={target}")
    return wrong
