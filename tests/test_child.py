"""The spawning mechanics of worker/spawn.py on real processes."""

import os
import subprocess
from pathlib import Path

import pytest

from worker.spawn import ForkServers, _preexec, child_env, drop_to_invoking_user


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_a_root_worker_runs_its_child_as_the_invoking_user(monkeypatch):
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    user = drop_to_invoking_user()
    assert user == (65534, 65534)
    out = subprocess.run(["/bin/sh", "-c", "id -u; id -g"], capture_output=True, text=True, check=True,
                         preexec_fn=_preexec([0], user, os.getpid())).stdout.split()
    assert out == ["65534", "65534"]


def test_the_child_is_pinned_before_it_starts():
    out = subprocess.run(["/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"], capture_output=True,
                         text=True, check=True, preexec_fn=_preexec([1], None, os.getpid())).stdout
    assert out.split()[-1] == "1"


def test_the_child_environment_is_a_whitelist(monkeypatch, tmp_path):
    monkeypatch.setenv("SECRET_TOKEN", "x")
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # the worker's own setting must not leak into a job
    env = child_env({"OMP_NUM_THREADS": "2"}, tmp_path, tmp_path / "data")
    assert "SECRET_TOKEN" not in env and env["OMP_NUM_THREADS"] == "2"
    assert env["PATH"] == os.environ["PATH"]


def test_one_fork_server_per_trainer_kept_across_alternating_frameworks(tmp_path):
    servers = ForkServers()
    repo = Path(__file__).resolve().parents[1]
    job = {"config": {"seed": 0, "steps": 0, "d_model": 32}, "run_id": 1, "output_root": str(tmp_path)}
    common = dict(argv_prefix=[], env=child_env({}, repo, tmp_path), cpus=sorted(os.sched_getaffinity(0)), cwd=repo,
                  timeout_s=60, heartbeat_s=5, on_heartbeat=lambda pid: None)
    try:
        pids = []
        for module in ("tests.stub_child", "tests.stub_trainer", "tests.stub_child", "tests.stub_trainer"):
            outcome = servers.run(job, module=module, **common)
            assert outcome.status == "done", outcome.reason
            assert outcome.timed_window is not None
            pids.append(servers.servers[module].proc.pid)
        assert set(servers.servers) == {"tests.stub_child", "tests.stub_trainer"}
        assert pids[0] == pids[2] and pids[1] == pids[3] and pids[0] != pids[1]  # none restarted
    finally:
        servers.close()


@pytest.mark.slow
def test_a_torch_fork_server_reads_the_library_isas_once_for_its_children(tmp_path):
    from common.variables import parse_value, resolve
    from worker.knobs import isa_check

    tiny = dict(d_model=32, n_layers=1, n_heads=2, seq_len=32, batch_size=4, vocab_size=512, steps=2,
                warmup_steps=1, dataset="builtin", cores=1)
    config, why = resolve({k: parse_value(k, v) for k, v in tiny.items()}, 1)
    assert not why, why
    repo = Path(__file__).resolve().parents[1]
    servers = ForkServers()
    common = dict(argv_prefix=[], env=child_env({}, repo, tmp_path / "data"), cpus=sorted(os.sched_getaffinity(0))[:1],
                  cwd=repo, timeout_s=300, heartbeat_s=5, on_heartbeat=lambda pid: None)
    try:
        applied = []
        for run_id in (1, 2):  # the second child finds the token ids the first one wrote held by the server
            job = {"config": config, "run_id": run_id, "data_dir": str(tmp_path / "data"),
                   "output_root": str(tmp_path / "out"), "output_dir": str(tmp_path / "out" / f"run-{run_id}"),
                   "peak_gflops": None, "compile_cache_dir": str(tmp_path / "inductor")}
            outcome = servers.run(job, module="worker.trainers.torch", **common)
            assert outcome.status == "done", outcome.reason
            applied.append(outcome.applied)
        assert [a["library_isas_read"] for a in applied] == [isa_check.READ_IN_SERVER] * 2
        assert applied[0]["mkl_isa"] == applied[1]["mkl_isa"] and applied[0]["onednn_isa"] == applied[1]["onednn_isa"]
        assert applied[0]["corpus_tokens"] == applied[1]["corpus_tokens"] > 0
    finally:
        servers.close()
