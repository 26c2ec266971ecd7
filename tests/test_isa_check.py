"""ISA caps reach MKL and oneDNN, and a library that ignores its cap fails the run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.knobs import isa_check

ROOT = Path(__file__).resolve().parent.parent

MKL_SSE = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
           "Streaming SIMD Extensions 4.2 (Intel(R) SSE4.2) enabled processors, Lnx 2.30GHz lp64 gnu_thread\n"
           "MKL_VERBOSE SGEMM(N,N,8,8,8,...) 24.22ms CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2\n")
MKL_FULL = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
            "Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8, BF16, and FP16 (limited) "
            "instructions, Lnx 2.30GHz lp64 gnu_thread\n")
MKL_NON_INTEL = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) "
                 "Architecture processors, Lnx 2.60GHz lp64 gnu_thread\n")  # an AMD EPYC: no ISA named
DNN_AVX2 = "onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:2\nonednn_verbose,v1,info,cpu,isa:Intel AVX2\n"


def test_banners_parse_to_levels():
    assert isa_check.level_of(isa_check.parse_mkl(MKL_SSE)) == 0
    assert isa_check.level_of(isa_check.parse_mkl(MKL_FULL)) == 4.5
    assert isa_check.level_of(isa_check.parse_onednn(DNN_AVX2)) == 1
    assert isa_check.level_of("Intel AVX 10.1") == 4.5
    assert isa_check.level_of("Intel AVX-512 with Intel DL Boost and bfloat16 support") == 4
    assert isa_check.parse_mkl("nothing") is None and isa_check.parse_onednn("") is None


def test_disobeyed_names_the_library():
    child = {"mkl_isa": isa_check.parse_mkl(MKL_FULL), "onednn_isa": "Intel SSE4.1"}
    wrong = isa_check.disobeyed("baseline", child)
    assert len(wrong) == 1 and "MKL" in wrong[0] and "isa=baseline" in wrong[0]
    assert isa_check.disobeyed("amx", child) == []
    assert isa_check.disobeyed("default", child) == []
    assert isa_check.disobeyed("avx2", {"mkl_isa": None, "onednn_isa": None}) == []  # nothing read back


def test_a_banner_that_names_no_isa_refuses_every_cap_saying_it_cannot_be_confirmed():
    child = {"mkl_isa": isa_check.parse_mkl(MKL_NON_INTEL), "onednn_isa": None}
    assert isa_check.level_of(child["mkl_isa"]) is None
    for cap in ("baseline", "avx2", "amx"):
        (why,) = isa_check.disobeyed(cap, child)
        assert "MKL does not name the instruction set" in why and f"isa={cap} cannot be confirmed" in why
    assert isa_check.disobeyed("default", child) == []


def _child(env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ONEDNN_", "ATEN_"))}
    env.update(env_extra)
    code = "import json, torch; from worker.knobs import isa_check; print(json.dumps(isa_check.library_isas()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # the probe's own verbose output stays off stdout


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or "sse4_2" not in Path("/proc/cpuinfo").read_text(),
                    reason="x86-64 with SSE4.2 only")
def test_real_child_reads_back_the_capped_isa():
    capped = _child({**isa_check.extra_env("baseline"), "ONEDNN_MAX_CPU_ISA": "SSE41"})
    if isa_check.level_of(capped["mkl_isa"]) is None:  # MKL names no ISA on this CPU (non-Intel)
        (why,) = isa_check.disobeyed("baseline", capped)
        assert "cannot be confirmed" in why and "MKL" in why
        return
    assert isa_check.level_of(capped["mkl_isa"]) == 0, capped
    assert isa_check.disobeyed("baseline", capped) == []
    bogus = _child({"MKL_ENABLE_INSTRUCTIONS": "BOGUS"})  # MKL ignores it silently: the read-back sees it
    if "avx2" in Path("/proc/cpuinfo").read_text():
        assert isa_check.disobeyed("baseline", bogus), bogus


HELD_CODE = """
import json, os, torch
from worker.knobs import isa_check
threads = len(os.listdir("/proc/self/task"))
isa_check.hold_library_isas()
out = {"threads_added": len(os.listdir("/proc/self/task")) - threads}
for enabled in (True, False):
    torch.backends.mkldnn.enabled = enabled
    out[str(enabled)] = isa_check.library_isas()
print(json.dumps(out))
"""
DIRECT_CODE = """
import json, sys, torch
from worker.knobs import isa_check
torch.backends.mkldnn.enabled = sys.argv[1] == "True"
print(json.dumps(isa_check.library_isas()))
"""


def _run(code, env_extra, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ONEDNN_", "ATEN_"))}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or "sse4_2" not in Path("/proc/cpuinfo").read_text(),
                    reason="x86-64 with SSE4.2 only")
@pytest.mark.slow
def test_a_fork_server_reads_the_library_isas_once_as_its_children_would():
    capped = {**isa_check.extra_env("baseline"), "ONEDNN_MAX_CPU_ISA": "SSE41"}
    held = _run(HELD_CODE, capped)
    assert held["threads_added"] <= 0  # the probes ran in children: the server starts no library pool
    for enabled in (True, False):
        direct = _run(DIRECT_CODE, capped, str(enabled))
        assert direct["library_isas_read"] == isa_check.READ_HERE
        assert held[str(enabled)]["library_isas_read"] == isa_check.READ_IN_SERVER
        assert {k: held[str(enabled)][k] for k in ("mkl_isa", "onednn_isa")} == \
            {k: direct[k] for k in ("mkl_isa", "onednn_isa")}, (enabled, held, direct)
    assert isa_check.level_of(held["True"]["onednn_isa"]) == 0  # the probe ran under the server's (capped) env


def test_a_stuck_probe_is_killed_and_the_children_read_the_isas_themselves(monkeypatch):
    monkeypatch.setattr(isa_check, "_HELD", {})
    monkeypatch.setattr(isa_check, "PROBE_TIMEOUT_S", 0.0)
    isa_check.hold_library_isas()
    assert isa_check._HELD == {}
    with pytest.raises(ChildProcessError):  # both probes reaped: no zombie left behind
        os.waitpid(-1, os.WNOHANG)
