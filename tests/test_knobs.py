"""System knobs against a fake sysfs tree (the only way to test frequency control on a VM without
cpufreq) and against real child processes (affinity, allocator, ISA cap read back by the child)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from common.errors import BenchError
from common.variables import allocator_of, resolve
from orchestrator.stats.ran import _ran_value
from worker.knobs import settings as knobs, startspec, sysfs
from worker.machine import probe, sensors
from tests.conftest import ROOT, bench
from tests.fake_sysfs import put

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def get(root: Path, real_path: str) -> str | None:
    return sysfs.read(str(root), real_path)


def make_tree(root: Path, *, cpus: int = 4, turbo: str | None = "intel", cpufreq: bool = True) -> Path:
    """A 1-socket machine with cpus/2 physical cores and SMT siblings numbered after them (Intel's
    numbering), cpufreq limits 800..3500 MHz, and one of the three turbo switches."""
    cores = cpus // 2
    put(root, f"{sysfs.CPU}/online", f"0-{cpus - 1}")
    flags = "fpu sse4_1 sse4_2 avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni"
    put(root, "/proc/cpuinfo", "\n\n".join(
        f"processor\t: {c}\nvendor_id\t: GenuineIntel\nmodel name\t: Fake CPU\ncpu MHz\t\t: 2100.000\n"
        f"flags\t\t: {flags}" for c in range(cpus)))
    put(root, "/proc/meminfo", "MemTotal:       16384000 kB")
    put(root, "/proc/sys/kernel/random/boot_id", "fake-boot")
    for c in range(cpus):
        top = f"{sysfs.CPU}/cpu{c}/topology"
        put(root, f"{top}/physical_package_id", "0")
        put(root, f"{top}/core_id", str(c % cores))
        put(root, f"{top}/thread_siblings_list", f"{c % cores},{c % cores + cores}")
        if cpufreq:
            for name, value in (("scaling_driver", "intel_pstate" if turbo == "intel" else "amd-pstate"),
                                ("scaling_governor", "powersave"),
                                ("scaling_available_governors", "performance powersave"),
                                ("cpuinfo_min_freq", "800000"), ("cpuinfo_max_freq", "3500000"),
                                ("scaling_min_freq", "800000"), ("scaling_max_freq", "3500000"),
                                ("scaling_cur_freq", "2100000")):
                put(root, sysfs.cpu_file(c, name), value)
            if turbo == "per_cpu":
                put(root, sysfs.cpu_file(c, "boost"), "1")
    if turbo == "intel":
        put(root, f"{sysfs.CPU}/intel_pstate/no_turbo", "0")
    elif turbo == "global":
        put(root, f"{sysfs.CPU}/cpufreq/boost", "1")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text().strip() for p in root.rglob("*") if p.is_file()}


def job(**partial) -> dict:
    config, why = resolve(partial, 4)
    assert not why, why
    return config


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "root")


def test_apply_then_restore_returns_every_original_value_exactly(tree, tmp_path):
    facts = probe.static_facts(str(tree))
    before = snapshot(tree)
    journal = tmp_path / "journal.json"
    config = job(cores=2, freq_mhz=2000, governor="performance", turbo="off")
    assert knobs.unavailable(config, facts, [0, 1, 2, 3], sysfs_root=str(tree)) is None
    with knobs.applied(config, facts, [0, 1, 2, 3], journal_path=journal, sysfs_root=str(tree)) as spec:
        assert journal.exists()
        assert spec.cpus == [0, 1]  # two physical cores, not a core and its sibling
        assert get(tree, sysfs.cpu_file(0, "scaling_min_freq")) == "2000000"
        assert get(tree, sysfs.cpu_file(1, "scaling_max_freq")) == "2000000"
        assert get(tree, sysfs.cpu_file(2, "scaling_max_freq")) == "3500000"  # not a job CPU
        assert get(tree, f"{sysfs.CPU}/intel_pstate/no_turbo") == "1"
        assert spec.applied["freq_mhz"] == {"min_mhz": 2000, "max_mhz": 2000}
        assert spec.applied["governor"] == "performance"
        assert spec.applied["turbo"] == "off"
    assert snapshot(tree) == before
    assert not journal.exists()


def test_values_already_in_force_are_not_written(tree, tmp_path):
    for cpu in (0, 1):
        put(tree, sysfs.cpu_file(cpu, "scaling_governor"), "performance")
    facts = probe.static_facts(str(tree))
    mtimes = {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}
    sysfs.writes.clear()
    config = job(cores=2, governor="performance", turbo="on")
    with knobs.applied(config, facts, [0, 1, 2, 3], journal_path=tmp_path / "j.json", sysfs_root=str(tree)) as spec:
        assert spec.applied["sysfs_written"] == []
    assert list(sysfs.writes) == []
    assert {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()} == mtimes


def test_a_failure_mid_apply_restores_what_was_already_applied(tree, tmp_path):
    facts = probe.static_facts(str(tree))
    # cpu1's governor file becomes something the kernel would refuse: a write to it fails after
    # turbo and cpu0's governor were already changed.
    broken = Path(sysfs.path(str(tree), sysfs.cpu_file(1, "scaling_governor")))
    broken.unlink()
    broken.mkdir()
    before = snapshot(tree)
    journal = tmp_path / "j.json"
    config = job(cores=2, governor="performance", turbo="off")
    with pytest.raises(BenchError, match="scaling_governor"):
        with knobs.applied(config, facts, [0, 1, 2, 3], journal_path=journal, sysfs_root=str(tree)):
            pytest.fail("the body must not run when applying failed")
    assert snapshot(tree) == before
    assert get(tree, f"{sysfs.CPU}/intel_pstate/no_turbo") == "0"
    assert not journal.exists()


def test_an_exception_in_the_body_still_restores(tree, tmp_path):
    facts = probe.static_facts(str(tree))
    before = snapshot(tree)
    with pytest.raises(RuntimeError):
        with knobs.applied(job(cores=1, freq_mhz=1200), facts, [0, 1, 2, 3], journal_path=tmp_path / "j.json",
                           sysfs_root=str(tree)):
            raise RuntimeError("child crashed")
    assert snapshot(tree) == before


def test_a_killed_worker_leaves_a_journal_that_restore_journal_undoes(tree, tmp_path):
    facts = probe.static_facts(str(tree))
    before = snapshot(tree)
    journal = tmp_path / "journal.json"
    script = textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        from common.variables import resolve
        from worker.knobs import settings as knobs
        config, _ = resolve({{"cores": 2, "freq_mhz": 1600, "governor": "performance", "turbo": "off"}}, 4)
        facts = json.loads(sys.argv[1])
        with knobs.applied(config, facts, [0, 1, 2, 3], journal_path=Path({str(journal)!r}),
                           sysfs_root={str(tree)!r}):
            print("applied", flush=True)
            time.sleep(60)
    """)
    worker = subprocess.Popen([PY, "-c", script, json.dumps(facts)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "applied"
        assert get(tree, sysfs.cpu_file(1, "scaling_max_freq")) == "1600000"
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(10) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait()
    assert journal.exists() and snapshot(tree) != before
    lines = knobs.restore_journal(journal, sysfs_root=str(tree))
    assert any("scaling_max_freq: 1600000 -> 3500000" in line for line in lines)
    assert any("no_turbo: 1 -> 0" in line for line in lines)
    assert snapshot(tree) == before
    assert not journal.exists()
    assert knobs.restore_journal(journal, sysfs_root=str(tree)) == []


def test_frequency_outside_the_machine_limits_is_unavailable(tree):
    facts = probe.static_facts(str(tree))
    for mhz in (500, 3600):
        why = knobs.unavailable(job(cores=1, freq_mhz=mhz), facts, [0, 1, 2, 3], sysfs_root=str(tree))
        assert why and "outside this machine's limits 800..3500 MHz" in why
    assert knobs.unavailable(job(cores=1, freq_mhz=3500), facts, [0, 1, 2, 3], sysfs_root=str(tree)) is None


def test_raising_the_floor_above_the_ceiling_writes_the_ceiling_first(tree, tmp_path):
    for cpu in range(4):
        put(tree, sysfs.cpu_file(cpu, "scaling_max_freq"), "1000000")
    facts = probe.static_facts(str(tree))
    sysfs.writes.clear()
    with knobs.applied(job(cores=1, freq_mhz=3000), facts, [0, 1, 2, 3], journal_path=tmp_path / "j.json",
                       sysfs_root=str(tree)):
        assert list(sysfs.writes) == [sysfs.cpu_file(0, "scaling_max_freq"), sysfs.cpu_file(0, "scaling_min_freq")]
        sysfs.writes.clear()
    # restoring lowers the ceiling below the floor in force, so the floor goes first
    assert list(sysfs.writes) == [sysfs.cpu_file(0, "scaling_min_freq"), sysfs.cpu_file(0, "scaling_max_freq")]
    assert get(tree, sysfs.cpu_file(0, "scaling_max_freq")) == "1000000"


def test_a_governor_the_driver_does_not_offer_is_unavailable(tree):
    facts = probe.static_facts(str(tree))
    why = knobs.unavailable(job(cores=1, governor="schedutil"), facts, [0, 1, 2, 3], sysfs_root=str(tree))
    assert "governor=schedutil is not offered" in why and "performance powersave" in why


@pytest.mark.parametrize("switch, files, off", [
    ("intel", [f"{sysfs.CPU}/intel_pstate/no_turbo"], "1"),
    ("per_cpu", [sysfs.cpu_file(0, "boost"), sysfs.cpu_file(1, "boost")], "0"),
    ("global", [f"{sysfs.CPU}/cpufreq/boost"], "0"),
])
def test_turbo_off_uses_the_switch_the_driver_has(tmp_path, switch, files, off):
    tree = make_tree(tmp_path / "root", turbo=switch)
    facts = probe.static_facts(str(tree))
    before = snapshot(tree)
    with knobs.applied(job(cores=2, turbo="off"), facts, [0, 1, 2, 3], journal_path=tmp_path / "j.json",
                       sysfs_root=str(tree)) as spec:
        assert [get(tree, f) for f in files] == [off] * len(files)
        assert spec.applied["turbo"] == "off"
        if switch == "per_cpu":  # amd-pstate's per-policy boost: only the job's CPUs lose turbo
            assert get(tree, sysfs.cpu_file(2, "boost")) == "1"
    assert snapshot(tree) == before


def test_a_frequency_job_without_cpufreq_is_unavailable_with_a_reason(tmp_path):
    tree = make_tree(tmp_path / "root", cpufreq=False, turbo=None)
    facts = probe.static_facts(str(tree))
    for partial in ({"freq_mhz": 2000}, {"governor": "performance"}, {"turbo": "off"}):
        why = knobs.unavailable(job(cores=1, **partial), facts, [0, 1, 2, 3], sysfs_root=str(tree))
        assert why and "no cpufreq" in why


@pytest.mark.skipif(os.path.exists(sysfs.cpu_file(0, "scaling_max_freq")), reason="this machine has cpufreq")
def test_a_frequency_job_on_this_vm_is_unavailable_with_a_reason():
    facts = probe.static_facts()
    config, _ = resolve({"freq_mhz": 2000}, len(facts["cpus"]))
    why = knobs.unavailable(config, facts, facts["cpus"])
    assert why and "no cpufreq" in why


def test_without_root_sysfs_knobs_say_they_need_root():
    nobody = 65534
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        tree = make_tree(Path(tmp) / "root")
        script = textwrap.dedent(f"""
            import os
            from common.variables import resolve
            from worker.knobs import settings as knobs
            from worker.machine import probe
            os.setgid({nobody}); os.setuid({nobody})  # after the imports: the stdlib may be root-only
            facts = probe.static_facts({str(tree)!r})
            config, _ = resolve({{"cores": 1, "governor": "performance"}}, 4)
            print(knobs.unavailable(config, facts, [0, 1, 2, 3], sysfs_root={str(tree)!r}))
        """)
        if os.geteuid() != 0:
            pytest.skip("needs root to drop to nobody")
        done = subprocess.run([PY, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "governor: needs root"


def test_cpus_are_physical_cores_first_then_siblings():
    facts = {"core_cpus": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    assert knobs.choose_cpus(3, facts, list(range(8))) == [0, 1, 2]
    assert knobs.choose_cpus(6, facts, list(range(8))) == [0, 1, 2, 3, 4, 5]
    assert knobs.choose_cpus(3, facts, [1, 5, 2]) == [1, 2, 5]  # the pool narrows the choice


def test_more_cores_than_the_pool_is_unavailable(tree):
    facts = probe.static_facts(str(tree))
    why = knobs.unavailable(job(cores=3), facts, [0, 1], sysfs_root=str(tree))
    assert why.startswith("cores=3 but this worker may use 2 CPUs")


def test_an_isa_this_cpu_lacks_is_unavailable_naming_the_flag(tree):
    facts = probe.static_facts(str(tree))
    why = knobs.unavailable(job(isa="amx"), facts, [0, 1, 2, 3], sysfs_root=str(tree))
    assert why == "isa=amx: this CPU lacks amx_tile amx_bf16 amx_int8"


# -- real child processes -------------------------------------------------------------------------

READBACK = "from worker.trainers.torch import readback; import json; print(json.dumps(readback.read_back()))"


def run_child(spec: knobs.ChildSpec, code: str = READBACK) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **spec.env}
    done = subprocess.run(spec.argv_prefix + [PY, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, spec.cpus), timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def child_readback(tmp_path, **partial) -> tuple[knobs.ChildSpec, dict]:
    facts = probe.static_facts()
    cpus = sorted(os.sched_getaffinity(0))
    config, _ = resolve(partial, len(cpus))
    assert knobs.unavailable(config, facts, cpus) is None
    with knobs.applied(config, facts, cpus, journal_path=tmp_path / "j.json") as spec:
        return spec, json.loads(run_child(spec))


def test_one_core_gives_the_child_an_affinity_of_one_cpu(tmp_path):
    spec, back = child_readback(tmp_path, cores=1, pin_threads=True)
    assert back["affinity"] == spec.cpus and len(spec.cpus) == 1
    assert back["omp_num_threads"] == "1"
    assert (back["omp_proc_bind"], back["omp_places"]) == ("close", f"{{{spec.cpus[0]}}}")


@pytest.mark.parametrize("allocator", list(startspec.ALLOCATOR_LIBS))
def test_the_allocator_is_mapped_into_the_child(tmp_path, allocator):
    if knobs.allocator_lib(allocator) is None:
        pytest.skip(f"{allocator} is not installed (.ci/apt-packages.txt lists it)")
    spec, back = child_readback(tmp_path, allocator=allocator)
    assert os.path.basename(back["allocator_lib"]).startswith(f"lib{allocator}")
    assert back["allocator_lib"] == os.path.realpath(spec.applied["allocator_lib"])  # maps shows the file


@pytest.mark.probe  # its worker shares the session's probe instead of measuring its own
def test_a_worker_run_records_the_allocator_its_child_mapped(db):
    installed = [a for a in startspec.ALLOCATOR_LIBS if knobs.allocator_lib(a)]
    if not installed:
        pytest.skip("no allocator is installed (.ci/apt-packages.txt lists them)")
    bench("enqueue", "--db", db, "--set", "dataset=builtin", "--set", "steps=1",
          "--axis", f"allocator={','.join(installed)}", check=True)
    bench("work", "--db", db, env={"BENCH_CHILD_MODULE": "tests.stub_child"}, check=True)
    with sqlite3.connect(db) as conn:
        got = conn.execute("SELECT j.allocator, r.status, r.reason, r.applied FROM runs r "
                           "JOIN jobs j USING (job_id)").fetchall()
    assert sorted((a, status, reason) for a, status, reason, _ in got) == [(a, "done", None) for a in sorted(installed)]
    for asked, _, _, applied in got:
        applied = json.loads(applied)  # the child's own read-back of its mapped files, and what the report groups by
        assert applied["allocator_lib"] == os.path.realpath(knobs.allocator_lib(asked))  # maps shows the file
        assert allocator_of(applied["allocator_lib"]) == asked
        assert _ran_value("allocator", {}, applied) == asked


def test_isa_avx2_caps_the_child_at_avx2(tmp_path):
    if "avx2" not in probe.static_facts()["isa_flags"].split():
        pytest.skip("this CPU has no AVX2")
    spec, back = child_readback(tmp_path, isa="avx2")
    assert back["cpu_capability"] == "AVX2"
    assert back["onednn_max_cpu_isa"] == "AVX2"


def test_numa_interleave_runs_the_child_under_numactl(tmp_path):
    if startspec.numa_unavailable("interleave"):
        pytest.skip("numactl is missing or not allowed here")
    spec, back = child_readback(tmp_path, numa="interleave")
    policy = run_child(spec, "print(open('/proc/self/numa_maps').readline().split()[1])")
    assert spec.argv_prefix[1:] == ["--interleave=all"]
    assert policy.startswith("interleave")


MATMUL_WORK = textwrap.dedent("""
    import time, torch
    torch.manual_seed(0)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm the thread pool and MKL's buffers
    times = []
    for rep in range(5):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        times.append(time.perf_counter() - t0)
    print(min(times))  # the least disturbed rep: other processes only ever add time
""")


def idle_fraction(seconds: float = 0.5) -> float:
    """Share of all CPUs idle over a short window (/proc/stat), to tell a quiet machine."""
    def idle_total():
        fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)
    idle0, total0 = idle_total()
    time.sleep(seconds)
    idle1, total1 = idle_total()
    return (idle1 - idle0) / max(1, total1 - total0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.timing
def test_one_core_runs_a_fixed_matmul_workload_slower_than_two(tmp_path):
    # Compares two runs, never a time target. Two threads on two CPUs lose to one whenever something
    # else holds one of the CPUs (each OpenMP barrier waits for the descheduled thread), so the
    # comparison is only meaningful on a quiet machine.
    if idle_fraction() < 0.8:
        pytest.skip("the machine is busy: a 1-vs-2-core comparison would measure the other load")
    facts = probe.static_facts()
    cpus = sorted(os.sched_getaffinity(0))
    seconds = {}

    def compare() -> float:
        start = time.perf_counter()
        for cores in (1, 2):
            config, _ = resolve({"cores": cores, "pin_threads": True}, len(cpus))
            with knobs.applied(config, facts, cpus, journal_path=tmp_path / "j.json") as spec:
                seconds[cores] = float(run_child(spec, MATMUL_WORK))
        return time.perf_counter() - start

    # the rest of the machine's CPU-s meanwhile (the load that came after the quiet start): every CPU's busy time
    # and steal less this process's (OwnWindow) and its children's, the compared runs
    window, before = sensors.OwnWindow.start(cpus), os.times()
    wall = compare()
    other, steal, _ = window.load()
    after = os.times()
    others = (other or 0.0) + (steal or 0.0) - (after.children_user - before.children_user
                                                  + after.children_system - before.children_system)
    if seconds[1] <= seconds[2] and others > 0.2 * wall:
        pytest.skip(f"the machine got busy during the comparison ({others:.1f} CPU-s of others in {wall:.1f} s): "
                    f"{seconds}")
    assert seconds[1] > seconds[2], seconds


def test_a_setting_the_child_did_not_run_under_is_named(tmp_path):
    config, _ = resolve({"cores": 1, "isa": "avx2", "allocator": "jemalloc"}, 2)
    spec = knobs.ChildSpec(cpus=[0], env={"OMP_NUM_THREADS": "1"}, argv_prefix=[], applied={})
    honest = {"affinity": [0], "torch_threads": 1, "interop_threads": 1, "mkldnn": True, "omp_num_threads": "1",
              "omp_proc_bind": None, "omp_places": None, "cpu_capability": "AVX2",
              "allocator_lib": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert knobs.not_in_force(config, spec, honest) == []
    wrong = knobs.not_in_force(config, spec, {**honest, "affinity": [0, 1], "cpu_capability": "AVX512",
                                              "allocator_lib": None})
    assert len(wrong) == 3 and any(w.startswith("cpu_capability='AVX512'") for w in wrong)


def test_an_isa_cap_the_probe_knows_cannot_be_confirmed_is_skipped_before_setup_as_machine_says(tmp_path):
    """MKL names no ISA on this CPU (as on AMD): the probe read its banner, so a capped run is
    skipped at claim with the reason `bench.py machine` lists, before data, knobs or a child."""
    from worker.loop import Worker, WorkerOptions

    facts = dict(probe.static_facts(), arch="x86_64", isa_flags="sse4_2 avx2 fma",
                 library_isas={"mkl_isa": "Architecture processors", "onednn_isa": "Intel AVX2"})
    listed = knobs.machine_knobs(facts)["isa=avx2"]
    assert "MKL does not name the instruction set" in listed and "isa=avx2 cannot be confirmed" in listed

    config, why = resolve({"isa": "avx2", "cores": 1, "dataset": "builtin"}, 1)
    assert not why
    options = WorkerOptions(state_dir=tmp_path / "state", output_dir=tmp_path / "output", data_dir=tmp_path / "data",
                            spawn="exec")
    worker = Worker(None, options)
    worker.facts = facts
    outcome = worker.measure(config, run_id=7)
    assert (outcome.status, outcome.reason) == ("skipped", listed)
    assert not (tmp_path / "output").exists() and not (tmp_path / "data").exists()  # nothing was set up

    # where MKL names its ISA the cap goes on to the run (its read-back still checks it)
    facts["library_isas"] = {"mkl_isa": "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors",
                             "onednn_isa": "Intel AVX2"}
    assert knobs.machine_knobs(facts)["isa=avx2"] is None
    assert knobs.unavailable(config, facts, [0]) is None


def test_interconnect_is_skipped_with_the_reason_where_no_link_is_handed_over_or_the_job_has_one_node(monkeypatch):
    """The worker shapes only links it was handed (BENCH_INTERCONNECT_LINKS), and only between nodes;
    default touches nothing. The shaping itself: tests/test_slurm_nodes.py, on a namespace cluster."""
    from worker.knobs import interconnect

    monkeypatch.delenv("BENCH_INTERCONNECT_LINKS", raising=False)
    assert interconnect.unavailable({"nodes": 2, "interconnect": "1gbit"}) == (
        "interconnect=1gbit: no link between nodes handed to this worker (BENCH_INTERCONNECT_LINKS names each "
        "node's NETNS:DEVICE; docs/clusters.md)")
    assert interconnect.unavailable({"nodes": 1, "interconnect": "1gbit"}).startswith(
        "interconnect=1gbit: a job on one node has no link between nodes to shape")
    monkeypatch.setenv("BENCH_INTERCONNECT_LINKS", "cbnnotthere0:eth0")
    assert interconnect.unavailable({"nodes": 2, "interconnect": "default"}) is None
    assert "cannot read cbnnotthere0:eth0" in interconnect.unavailable({"nodes": 2, "interconnect": "1gbit"})
    assert [interconnect.rate_bits(r) for r in ("1gbit", "1Gbit", "100Mbit", "125Mbps")] == [1e9, 1e9, 1e8, 1e9]


def test_a_link_shaped_by_a_worker_killed_with_9_is_put_back_by_the_next_start(tmp_path, monkeypatch):
    """A real network namespace and veth (root only), a real process shaping it through
    interconnect.applied, a real SIGKILL: restore_left_behind (every worker's start, `bench.py restore`)
    deletes the tbf from the journal the dead worker left."""
    import random

    from worker.loop import restore_left_behind

    if os.geteuid() != 0 or subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode:
        pytest.skip("needs root and network namespaces")
    name = f"cbk{random.randrange(16**4):04x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "eth1", "up"]):
            subprocess.run(["nsenter", f"--net=/run/netns/{name}", *cmd], check=True)

        def root_qdisc() -> str:
            return subprocess.run(["nsenter", f"--net=/run/netns/{name}", "tc", "qdisc", "show", "dev", "eth0"],
                                  capture_output=True, text=True).stdout.strip()

        before = root_qdisc()
        state = tmp_path / "state"
        state.mkdir(exist_ok=True)
        shaper = subprocess.Popen([sys.executable, "-c", f"""
import os, pathlib, time
from worker.knobs import interconnect
with interconnect.applied({{"nodes": 2, "interconnect": "100mbit"}},
                          journal_path=pathlib.Path({str(state)!r}) / f"links-{{os.getpid()}}.json", record={{}}):
    print("shaped", flush=True)
    time.sleep(60)
"""], cwd=ROOT, env={**os.environ, "BENCH_INTERCONNECT_LINKS": f"{name}:eth0"}, stdout=subprocess.PIPE, text=True)
        assert shaper.stdout.readline().strip() == "shaped"
        assert " rate 100Mbit " in root_qdisc()
        os.kill(shaper.pid, signal.SIGKILL)
        shaper.wait()
        assert " rate 100Mbit " in root_qdisc() and list(state.glob("links-*.json"))  # left shaped, journaled
        lines = restore_left_behind(state, "/")
        assert root_qdisc() == before and not list(state.glob("links-*.json")), lines
        assert len(lines) == 1 and lines[0].startswith(f"{name}:eth0: qdisc tbf") and lines[0].endswith(f"-> {before}")
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
