"""The spawning mechanics of worker/child.py on real processes."""

import os
import subprocess
from pathlib import Path

import pytest

from worker.child import ForkServers, _preexec, child_env, drop_to_invoking_user


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
