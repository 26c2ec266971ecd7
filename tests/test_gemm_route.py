"""The torch trainer's GEMM route (`blas`, worker/trainers/torch/gemm_route.py): each route trains the
same model to the same losses, each is read back from what ran, one torch cannot take is skipped
with why, and `auto`'s choice keeps old databases' jobs where they were."""

import json
import sqlite3

import pytest

from common import variables as V
from tests.conftest import bench
from worker.trainers.torch import gemm_route

pytestmark = [pytest.mark.trainer, pytest.mark.probe]

TINY = ["n_layers=1", "d_model=32", "n_heads=2", "seq_len=32", "batch_size=4", "steps=4", "warmup_steps=1",
        "vocab_size=512", "dataset=builtin"]


def once(*settings, env: dict | None = None) -> dict:
    return json.loads(bench("once", *TINY, *settings, "--json", env=env, check=True).stdout)


def test_every_route_trains_to_the_same_losses_and_reads_back_the_route_that_ran():
    results = {route: once(f"blas={route}") for route in ("mkl", "mkl_intel_path", "onednn")}
    for route, result in results.items():
        assert result["status"] == "done", (route, result["reason"])
        assert result["applied"]["blas"] == route, result["applied"]["gemm_route"]
    base = results["mkl"]
    for route, result in results.items():  # other kernels, other rounding: fp32 tolerance, not bits
        assert result["loss_first"] == pytest.approx(base["loss_first"], rel=1e-5), route
        assert result["loss_last"] == pytest.approx(base["loss_last"], rel=1e-5), route
    # oneDNN ran every linear product (MKL keeps only SDPA's own small ones); MKL ran them under mkl
    onednn_calls = results["onednn"]["applied"]["gemm_route"]["calls_one_step"]
    mkl_calls = base["applied"]["gemm_route"]["calls_one_step"]
    onednn_gflop = sum(c["gflop"] or 0 for k, c in onednn_calls.items() if k.startswith("onednn") and k.endswith("f32"))
    assert onednn_gflop == pytest.approx(mkl_calls["mkl SGEMM"]["gflop"], rel=0.05)
    # mkl_intel_path: MKL left its generic branch, or this CPU is one MKL takes for Intel's anyway
    path = results["mkl_intel_path"]["applied"]["gemm_route"]
    assert path["mkl_vendor_check"] == "Intel" or path["mkl_branch"] != "COMPATIBLE", path
    assert "libmkl_intel_path" in results["mkl_intel_path"]["applied"]["gemm_route_applied"]


def test_a_worker_proves_each_route_once_and_later_runs_name_the_run_that_proved_it(db):
    """Which library ran a route's products is proved by one verbose step in the first run of each
    route of a fork server; the later runs of the route (other sizes too) read MKL's branch themselves
    and record the proving run, and every run is still judged on what its route read back."""
    bench("enqueue", "--db", db, *(f"--set={s}" for s in TINY if not s.startswith("d_model")),
          "--axis", "d_model=32,48,64", "--axis", "blas=mkl,onednn", check=True)
    bench("work", "--db", db, check=True, timeout=600)
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT r.run_id, r.status, r.reason, j.blas, r.applied FROM runs r "
                            "JOIN jobs j USING (job_id) ORDER BY r.finished").fetchall()
    assert len(runs) == 6
    provers = {}
    for run_id, status, reason, blas, applied in runs:
        assert status == "done", reason
        route = json.loads(applied)["gemm_route"]
        assert json.loads(applied)["blas"] == route["ran"] == blas
        assert route["mkl_branch"] is not None  # read in every run
        if blas not in provers:  # the route's first run in this fork server proves it
            assert route["proven"].startswith("in this run"), route
            provers[blas] = (run_id, route["proof_key"])
        else:
            assert route["proven"].startswith(f"once, by run {provers[blas][0]} "), route
            assert route["proof_key"] == provers[blas][1]
    assert provers["mkl"][1] != provers["onednn"][1]


def test_a_proof_holds_for_other_sizes_but_not_other_settings():
    config, _ = V.resolve({"d_model": 32, "n_heads": 2}, 2)
    in_force = {"affinity": [0, 1], "torch_threads": 2, "cpu_capability": "AVX512", "mkldnn": True,
                "mkl_isa": "AVX-512", "onednn_isa": "AVX-512"}
    key = gemm_route.proof_key("mkl", config, in_force)
    assert gemm_route.proof_key("mkl", {**config, "d_model": 64, "steps": 99}, in_force) == key
    for other in ({"precision": "bf16"}, {"onednn": False}, {"attn_backend": "manual"}, {"compile": "inductor"}):
        assert gemm_route.proof_key("mkl", {**config, **other}, in_force) != key, other
    for other in ({"torch_threads": 1}, {"cpu_capability": "AVX2"}, {"affinity": [0]}, {"mkl_isa": "AVX2"}):
        assert gemm_route.proof_key("mkl", config, {**in_force, **other}) != key, other
    assert gemm_route.proof_key("onednn", config, in_force) != key


def test_a_held_proof_replaces_the_verbose_step_and_a_route_that_did_not_run_proves_nothing():
    steps = []
    calls = {"onednn inner_product brg_matmul:avx512_core f32": {"calls": 4, "gflop": 0.1}}
    held = {"k": {"calls_one_step": calls, "run_id": 7, "at": "2026-01-01T00:00:00+0000", "pid": 42}}
    read, made = gemm_route.read_back("onednn", lambda: steps.append(1), "k", held, run_id=8)
    assert not steps and not made  # no extra step; nothing new to hand on
    assert read["blas"] == "onednn" and read["gemm_route"]["proven"].startswith("once, by run 7 (pid 42)")
    read, made = gemm_route.read_back("onednn", lambda: steps.append(1), "other", held, run_id=8)
    assert steps == [1]  # proved now: the step ran, printing no oneDNN product here
    assert read["blas"] == "mkl" and made == {}  # a route that did not run is proved again next time


def test_without_a_c_compiler_auto_runs_mkl_as_shipped_and_says_so_while_a_named_route_is_skipped(db, tmp_path):
    """A slim container: no cc, gcc or clang on PATH and CC naming nothing. A job that left blas on
    auto runs torch as shipped, read back and judged as mkl, and records why; one that names
    mkl_intel_path is skipped with the reason, never run under another route."""
    (tmp_path / "bin").mkdir()
    no_cc = {"PATH": str(tmp_path / "bin"), "CC": str(tmp_path / "no-such-cc")}
    tiny = [f"--set={s}" for s in TINY if not s.startswith("d_model")]
    bench("enqueue", "--db", db, *tiny, "--axis", "d_model=32,48", check=True)
    bench("enqueue", "--db", db, *tiny, "--set", "d_model=64", "--set", "blas=mkl_intel_path", check=True)
    bench("work", "--db", db, env=no_cc, check=True, timeout=600)
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT j.d_model, j.derived, r.status, r.reason, r.applied FROM runs r "
                            "JOIN jobs j USING (job_id) ORDER BY j.d_model").fetchall()
    for d_model, derived, status, reason, applied in runs[:2]:
        assert json.loads(derived)["blas"] == "auto"
        assert status == "done", reason
        applied = json.loads(applied)
        assert applied["blas"] == applied["gemm_route"]["asked"] == "mkl"
        assert "LD_PRELOAD" not in applied["env"] and applied["gemm_route_applied"] == "torch as shipped"
        assert applied["blas_fallback"].startswith("blas=auto ran mkl (torch as shipped): auto's mkl_intel_path: "
                                                   "no C compiler (CC=")
    d_model, derived, status, reason, applied = runs[2]
    assert "blas" not in json.loads(derived or "{}")
    assert status == "skipped" and "blas=mkl_intel_path: no C compiler" in reason
    once_run = once(env=no_cc)
    assert once_run["status"] == "done" and once_run["applied"]["blas"] == "mkl"
    assert "no C compiler" in once_run["applied"]["blas_fallback"]
    knobs = json.loads(bench("machine", "--json", env=no_cc, check=True).stdout)["knobs"]
    assert "jobs that leave blas on auto run mkl here" in knobs["blas=mkl_intel_path (torch)"]


def test_a_route_torch_cannot_take_is_skipped_with_the_reason():
    result = once("blas=cpp_template")
    assert result["status"] == "skipped" and "constant weights" in result["reason"]


def test_a_preload_that_did_not_take_reads_back_as_plain_mkl():
    generic = {"mkl_branch": "COMPATIBLE", "mkl_vendor_check": "not Intel (MKL's generic path unless answered yes)"}
    assert gemm_route.route_ran("mkl_intel_path", {}, generic) == "mkl"  # worker/knobs/verify.py then fails the run
    assert gemm_route.route_ran("mkl_intel_path", {}, {**generic, "mkl_branch": "AVX512_E1"}) == "mkl_intel_path"
    assert gemm_route.route_ran("onednn", {"mkl SGEMM": {"calls": 9, "gflop": 1.0}}, generic) == "mkl"


def test_verbose_lines_are_counted_per_library_with_their_flops():
    out = "\n".join([
        "MKL_VERBOSE SGEMM(T,N,2048,2048,512,0x7ffc,0x7f71,512,0x7f71,512,0x7ffc,0x7f71,2048) 73.64ms CNR:OFF",
        "onednn_verbose,v1,primitive,exec,cpu,inner_product,brg_matmul:avx512_core,forward_inference,"
        "src:f32::blocked:ab::f0 wei:f32::blocked:ab::f0 bia:undef::undef::: dst:f32::blocked:ab::f0,"
        "attr-scratchpad:user,,mb2048ic512oc2048,55.574",
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support"])
    calls = gemm_route.count_calls(out)
    assert calls == {"mkl SGEMM": {"calls": 1, "gflop": round(2 * 2048 * 2048 * 512 / 1e9, 3)},
                     "onednn inner_product brg_matmul:avx512_core f32": {
                         "calls": 1, "gflop": round(2 * 2048 * 512 * 2048 / 1e9, 3)}}


def test_auto_picks_mkl_intel_path_while_old_jobs_keep_mkl_and_their_hashes():
    config, why = V.resolve({}, 2)
    assert not why and config["blas"] == "mkl_intel_path"
    explicit_mkl, _ = V.resolve({"blas": "mkl"}, 2)
    stored = json.loads(V.canonical_json(explicit_mkl))
    assert "blas" not in stored  # what an older release stored for its torch jobs: they ran mkl
    assert V.complete(stored)["blas"] == "mkl"
    assert V.config_hash(V.complete(stored)) == V.config_hash(explicit_mkl)
    assert V.config_hash(config) != V.config_hash(explicit_mkl)  # the new default is a job of its own
    numpy_auto, _ = V.resolve({"framework": "numpy"}, 2)
    assert numpy_auto["blas"] == "openblas" and "blas" not in json.loads(V.canonical_json(numpy_auto))


@pytest.mark.parametrize("partial, reason", [
    ({"blas": "onednn", "compile": "inductor"}, "blas=onednn needs compile=eager"),
    ({"blas": "onednn", "onednn": False}, "blas=onednn needs onednn=on"),
    ({"blas": "mkl_intel_path", "framework": "numpy"}, "blas=mkl_intel_path needs framework=torch"),
    ({"blas": "blis"}, "blas=blis needs framework=numpy"),
])
def test_a_route_of_another_framework_or_mode_is_refused_at_enqueue(partial, reason):
    _, why = V.resolve(partial, 2)
    assert reason in why
