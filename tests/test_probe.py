"""The machine probe: static facts from a fake tree, the real machine's facts with quick
measurements, caching per boot, re-measuring on demand, the fingerprint, the debug CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from worker.machine import probe

from worker.knobs import sysfs
from tests.fake_sysfs import put

REPO = Path(__file__).resolve().parents[1]


def machines_columns() -> list[str]:
    """The facts columns of `machines` in schema.sql (the store fills the bookkeeping ones)."""
    sql = (REPO / "schema.sql").read_text()
    body = re.search(r"CREATE TABLE IF NOT EXISTS machines \((.*?)\n\);", sql, re.S).group(1)
    names = [line.split()[0] for line in body.splitlines() if line.strip() and not line.strip().startswith("--")]
    return [n for n in names if n not in ("machine_id", "facts", "first_seen", "last_seen")]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def facts(state_dir):
    return probe.probe(state_dir, quick=True)


@pytest.mark.slow
def test_the_facts_have_every_machines_column(facts):
    missing = [c for c in machines_columns() if c not in facts]
    assert not missing
    assert isinstance(facts["knobs"], dict) and facts["knobs"]["cores"] is None
    assert facts["logical_cores"] >= facts["physical_cores"] >= 1
    assert sorted(sum(facts["core_cpus"], [])) == facts["cpus"]


def test_the_torch_build_is_recorded(facts):
    assert facts["torch_version"].startswith("2.")
    assert facts["torch"]["openmp"] in ("GNU libgomp", "Intel libiomp5", "LLVM libomp")
    assert facts["torch"]["cpu_capability"]
    assert facts["gemm_gflops_fp32_1c"] > 0 and facts["mem_bw_gbs_1t"] > 0


@pytest.mark.slow
def test_a_second_probe_is_served_from_the_cache_and_remeasure_measures_again(state_dir, facts):
    first = facts
    again = probe.probe(state_dir, quick=True)
    assert again["limits_measured_at"] == first["limits_measured_at"]
    assert again["fingerprint"] == first["fingerprint"]
    assert again["probe_s"] < 1.0  # no subprocess, no torch: a cache read
    fresh = probe.probe(state_dir, quick=True, remeasure=True)
    assert fresh["limits_measured_at"] > first["limits_measured_at"]
    assert fresh["fingerprint"] == first["fingerprint"]  # measurements never move the fingerprint


def test_static_facts_read_topology_caches_and_cpufreq_from_the_tree(tmp_path):
    root = tmp_path / "root"
    put(root, f"{sysfs.CPU}/online", "0-3")
    put(root, "/proc/cpuinfo", "\n\n".join(
        f"processor\t: {c}\nvendor_id\t: AuthenticAMD\nmodel name\t: Fake EPYC\n"
        "flags\t\t: fpu avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16 sha_ni" for c in range(4)))
    put(root, "/proc/meminfo", "MemTotal:       32768000 kB")
    for c in range(4):  # AMD numbering: siblings are adjacent
        put(root, f"{sysfs.CPU}/cpu{c}/topology/physical_package_id", "0")
        put(root, f"{sysfs.CPU}/cpu{c}/topology/core_id", str(c // 2))
        put(root, sysfs.cpu_file(c, "scaling_driver"), "amd-pstate-epp")
        put(root, sysfs.cpu_file(c, "cpuinfo_min_freq"), "400000")
        put(root, sysfs.cpu_file(c, "cpuinfo_max_freq"), "5100000")
    for index, (level, kind, size) in enumerate(((1, "Data", "48K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "1024K"), (3, "Unified", "32M"))):
        base = f"{sysfs.CPU}/cpu0/cache/index{index}"
        put(root, f"{base}/level", str(level))
        put(root, f"{base}/type", kind)
        put(root, f"{base}/size", size)
    put(root, f"{sysfs.NODE}/node0/cpulist", "0-1")
    put(root, f"{sysfs.NODE}/node1/cpulist", "2-3")
    facts = probe.static_facts(str(root))
    assert (facts["physical_cores"], facts["logical_cores"], facts["smt"]) == (2, 4, True)
    assert facts["core_cpus"] == [[0, 1], [2, 3]]
    assert facts["numa_nodes"] == 2 and facts["numa_cpus"] == {"0": [0, 1], "1": [2, 3]}
    assert facts["isa_flags"] == "avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16"
    assert (facts["l1d_kb"], facts["l2_kb"], facts["l3_kb"]) == (48, 1024, 32768)
    assert (facts["freq_driver"], facts["freq_min_mhz"], facts["freq_max_mhz"]) == ("amd-pstate-epp", 400, 5100)
    assert facts["vendor"] == "AuthenticAMD" and facts["mem_total_gb"] == 31.25


def test_the_cli_prints_one_json_document(state_dir, facts):
    done = subprocess.run([sys.executable, "-m", "worker.machine.probe", "--json", "--quick",
                           "--state-dir", str(state_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fingerprint"] == facts["fingerprint"]


def test_the_noise_figure_is_the_coefficient_of_variation_of_identical_runs():
    from worker.machine.noise import coefficient_of_variation

    assert coefficient_of_variation([10.0, 10.0, 10.0]) == 0.0
    assert coefficient_of_variation([9.0, 10.0, 11.0]) == pytest.approx(0.1)  # stdev 1 (n-1), mean 10
    assert coefficient_of_variation([5.0]) is None


def test_the_probe_measures_the_machine_noise_and_the_store_keeps_it(facts, tmp_path):
    from orchestrator.queue.store import Store

    assert facts["noise_cv"] is not None and 0 <= facts["noise_cv"] < 5
    assert facts["noise"]["runs"] == len(facts["noise"]["medians_ms"]) >= 3
    assert all(m > 0 for m in facts["noise"]["medians_ms"])
    db = str(tmp_path / "r.db")
    machine_id = Store(db).register_machine(facts)
    import sqlite3

    with sqlite3.connect(db) as conn:
        assert (conn.execute("SELECT noise_cv FROM machines WHERE machine_id = ?", (machine_id,)).fetchone()
                == (facts["noise_cv"],))


@pytest.mark.slow
def test_a_cache_from_before_the_noise_figure_is_measured_again(tmp_path):
    first = probe.probe(tmp_path, quick=True)
    cache = tmp_path / "probe-limits.json"
    limits = json.loads(cache.read_text())
    for entry in limits.values():
        del entry["noise_cv"], entry["noise"]
    cache.write_text(json.dumps(limits))
    again = probe.probe(tmp_path, quick=True)
    assert again["noise_cv"] is not None and again["limits_measured_at"] > first["limits_measured_at"]


@pytest.mark.slow
def test_limits_measured_under_load_are_provisional_and_measured_again_later(tmp_path):
    """Two processes spinning on every CPU of the probe take far more than 5% of its window: the
    figures are used but flagged with why, and a probe RETRY_S later measures them again."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(2 * len(os.sched_getaffinity(0)))]
    try:
        loaded = probe.probe(tmp_path, quick=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert loaded["limits_disturbed"] and "other processes used" in loaded["limits_disturbed"]
    again = probe.probe(tmp_path, quick=True)  # within RETRY_S: the provisional figures, not a new measurement
    assert again["limits_measured_at"] == loaded["limits_measured_at"]
    cache = tmp_path / "probe-limits.json"
    limits = json.loads(cache.read_text())
    for entry in limits.values():
        entry["measured_at"] -= probe.RETRY_S + 1
    cache.write_text(json.dumps(limits))
    later = probe.probe(tmp_path, quick=True)
    assert later["limits_measured_at"] > loaded["limits_measured_at"]


@pytest.mark.slow
def test_a_cache_from_before_the_load_check_is_measured_again(tmp_path):
    """A cached figure never checked for load must not be reported as measured on a quiet machine."""
    first = probe.probe(tmp_path, quick=True)
    cache = tmp_path / "probe-limits.json"
    limits = json.loads(cache.read_text())
    for entry in limits.values():
        del entry["disturbed"]
    cache.write_text(json.dumps(limits))
    again = probe.probe(tmp_path, quick=True)
    assert again["limits_measured_at"] > first["limits_measured_at"] and "limits_disturbed" in again
