"""System knobs: the settings the worker applies before the training child starts, and undoes after.

Every knob is one small class with one interface (pyperf's _system.py, plus what it lacks):

    name                      the catalogue variable it serves
    target(config)            what the job asks for; the word "default" means leave the machine alone
    available(target)         None, or why not here ("no cpufreq in sysfs", "needs root")
    read() -> State           the current values of what it governs ({sysfs path: text})
    apply(target) -> State    make it so; returns what it replaced
    restore(saved)            put `saved` back

`available` takes the target because availability depends on it (a frequency outside the machine's
limits, an ISA this CPU lacks, a library that is not installed).

Two families: sysfs knobs (frequency, governor, turbo) change the machine, write only when a value
changes, read back after writing, and are journaled to disk before the first write so that a killed
worker's changes are undone at the next start (restore_journal). Child knobs (CPUs, threads,
pinning, allocator, ISA cap, NUMA policy) change nothing in the parent: they fill the ChildSpec the
worker spawns the child with (affinity, environment, argv prefix); their State is empty. The parent's
os.environ is never edited.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from orchestrator.errors import BenchError
from worker import isa_check, sysfs

DEFAULT = "default"
State = dict  # {real sysfs path: text}; empty for knobs that only shape the child


@dataclass
class ChildSpec:
    cpus: list[int]  # the child's affinity set, in preference order (physical cores first)
    env: dict[str, str]  # variables to ADD to the child's whitelisted environment
    argv_prefix: list[str]  # e.g. ["/usr/bin/numactl", "--interleave=all"] or []
    applied: dict = field(default_factory=dict)  # what the parent set and read back


class Knob(Protocol):
    name: str

    def target(self, config: dict): ...
    def available(self, target) -> str | None: ...
    def read(self) -> State: ...
    def apply(self, target) -> State: ...
    def restore(self, saved: State) -> None: ...


@dataclass
class Job:
    """What every knob of one job sees."""

    config: dict
    facts: dict
    cpus: list[int]
    root: str
    spec: ChildSpec


def _needs_root(root: str, real_path: str) -> str | None:
    if sysfs.writable(root, real_path):
        return None
    return "needs root" if os.geteuid() != 0 else f"{real_path} is read-only"


# -- child knobs ----------------------------------------------------------------------------------

def choose_cpus(cores: int, facts: dict, cpu_pool: list[int]) -> list[int]:
    """`cores` CPUs of the pool: one per physical core first, then their SMT siblings, so cores=N
    means N real cores for as long as there are any."""
    pool = set(cpu_pool)
    core_cpus = facts.get("core_cpus") or [[cpu] for cpu in sorted(pool)]
    order = [core[i] for i in range(max(map(len, core_cpus), default=0))
             for core in core_cpus if i < len(core) and core[i] in pool]
    order += sorted(pool - set(order))  # CPUs the topology did not list (it should list all)
    return order[:cores]


class Cores:
    """The child's affinity set; the worker sets it on the child (readback reads sched_getaffinity)."""

    name = "cores"

    def __init__(self, job: Job, pool: list[int]):
        self.job, self.pool = job, pool

    def target(self, config):
        return int(config["cores"])

    def available(self, target):
        if target > len(self.pool):
            return f"cores={target} but this worker may use {len(self.pool)} CPUs ({_cpulist(self.pool)})"
        return None

    def read(self):
        return {}

    def apply(self, target):
        self.job.spec.cpus = list(self.job.cpus)
        self.job.spec.applied["cpus"] = list(self.job.cpus)
        return {}

    def restore(self, saved):
        pass


class Threads:
    """OpenMP/MKL pool sizes in the environment; torch's intra/inter-op pools are set by the child
    itself (readback.apply_in_child) because only the process can size them."""

    name = "omp_threads"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return int(config["omp_threads"]), int(config["intra_threads"]), int(config["inter_threads"])

    def available(self, target):
        return None

    def read(self):
        return {}

    def apply(self, target):
        omp, intra, inter = target
        self.job.spec.env.update(OMP_NUM_THREADS=str(omp), MKL_NUM_THREADS=str(omp))
        self.job.spec.applied.update(intra_threads=intra, inter_threads=inter)
        return {}

    def restore(self, saved):
        pass


class PinThreads:
    """OpenMP threads bound to the affinity set, or free.

    torch's Linux wheels link GNU libgomp (the probe reports facts["torch"]["openmp"]), which reads
    the standard OMP_PROC_BIND/OMP_PLACES; Intel's libiomp5 reads them too, so no KMP_AFFINITY.
    Places are listed explicitly, one per CPU in the spec's preference order, so thread i sits on
    the i-th chosen CPU (physical cores first) whatever the machine's numbering of SMT siblings.
    "Free" is an explicit OMP_PROC_BIND=false so the read-back says so.
    """

    name = "pin_threads"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return bool(config["pin_threads"])

    def available(self, target):
        return None

    def read(self):
        return {}

    def apply(self, target):
        if target:
            places = ",".join(f"{{{cpu}}}" for cpu in self.job.cpus)
            self.job.spec.env.update(OMP_PROC_BIND="close", OMP_PLACES=places)
        else:
            self.job.spec.env["OMP_PROC_BIND"] = "false"
        return {}

    def restore(self, saved):
        pass


# Known system libraries only, per arch: a sweep file names a word, never a path.
# Debian/Ubuntu multiarch (libjemalloc2, libtcmalloc-minimal4, libgoogle-perftools4), then
# Fedora/RHEL (lib64) and Arch (lib).
ALLOCATOR_LIBS = {
    "jemalloc": ("/usr/lib/{triple}/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"),
    "tcmalloc": ("/usr/lib/{triple}/libtcmalloc_minimal.so.4", "/usr/lib/{triple}/libtcmalloc.so.4",
                 "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc.so.4",
                 "/usr/lib/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc.so.4"),
}
DEBIAN_PACKAGE = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
TRIPLES = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu",
           "s390x": "s390x-linux-gnu"}
# Intel's tuned settings for training (IPEX launcher and Intel's model-zoo scripts): huge decay times
# keep freed pages mapped, so each step does not pay page faults again. torch's own launcher
# (torch/backends/xeon/run_cpu.py in 2.13) uses the first three fields only.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"


def allocator_lib(kind: str) -> str | None:
    triple = TRIPLES.get(platform.machine(), f"{platform.machine()}-linux-gnu")
    for candidate in ALLOCATOR_LIBS[kind]:
        candidate = candidate.format(triple=triple)
        if os.path.exists(candidate):
            return candidate
    return None


class Allocator:
    """malloc replacement by LD_PRELOAD; the child's /proc/self/maps proves it (readback)."""

    name = "allocator"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return config["allocator"]

    def available(self, target):
        if target == DEFAULT or allocator_lib(target):
            return None
        return f"allocator={target}: no {target} library on the known paths (apt-get install {DEBIAN_PACKAGE[target]})"

    def read(self):
        return {}

    def apply(self, target):
        lib = allocator_lib(target) if target != DEFAULT else None
        if lib:
            self.job.spec.env["LD_PRELOAD"] = lib
            if target == "jemalloc":
                self.job.spec.env["MALLOC_CONF"] = JEMALLOC_CONF
        self.job.spec.applied["allocator_lib"] = lib
        return {}

    def restore(self, saved):
        pass


# isa value -> (CPU flags it needs, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA).
# ATen distinguishes only default/avx2/avx512 on x86 (an unknown word falls back to the best the
# CPU has, so every AVX-512 flavour maps to "avx512"); oneDNN distinguishes each step, so on one
# machine avx512, avx512_vnni, avx512_bf16 and amx differ only in oneDNN's kernels.
ISA_CAPS = {
    "baseline": (("sse4_1", "sse4_2"), "default", "SSE41"),  # MKL's lowest path is SSE4.2
    "avx2": (("avx2", "fma"), "avx2", "AVX2"),
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx512", "AVX512_CORE"),
    "avx512_vnni": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"), "avx512", "AVX512_CORE_VNNI"),
    "avx512_bf16": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"), "avx512",
                    "AVX512_CORE_BF16"),
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile", "amx_bf16", "amx_int8"), "avx512",
            "AVX512_CORE_AMX"),
}


class Isa:
    """A cap on what ATen and oneDNN dispatch to (environment read once at the child's start);
    the child reads back torch.backends.cpu.get_cpu_capability()."""

    name = "isa"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return config["isa"]

    def available(self, target):
        if target == DEFAULT:
            return None
        arch = self.job.facts.get("arch") or platform.machine()
        if arch != "x86_64":
            return f"isa={target}: the ISA caps are defined for x86-64 only (this is {arch})"
        flags = set((self.job.facts.get("isa_flags") or "").split())
        missing = [f for f in ISA_CAPS[target][0] if f not in flags]
        return f"isa={target}: this CPU lacks {' '.join(missing)}" if missing else None

    def read(self):
        return {}

    def apply(self, target):
        if target != DEFAULT:
            _, aten, onednn = ISA_CAPS[target]
            self.job.spec.env.update(ATEN_CPU_CAPABILITY=aten, ONEDNN_MAX_CPU_ISA=onednn, **isa_check.extra_env(target))
        return {}

    def restore(self, saved):
        pass


class OneDnn:
    """oneDNN on/off is switched inside the child (readback.apply_in_child); here only: can it be on."""

    name = "onednn"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return bool(config["onednn"])

    def available(self, target):
        torch_facts = self.job.facts.get("torch") or {}
        if target and torch_facts.get("mkldnn_available") is False:
            return "onednn=on: this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
        return None

    def read(self):
        return {}

    def apply(self, target):
        return {}

    def restore(self, saved):
        pass


_numactl_ok: dict[str, str | None] = {}


def _numactl_works(numactl: str, option: str) -> str | None:
    """Containers often forbid set_mempolicy (seccomp): try the policy once per process."""
    if option not in _numactl_ok:
        try:
            done = subprocess.run([numactl, option, "true"], capture_output=True, text=True, timeout=10)
            _numactl_ok[option] = None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")
        except OSError as err:
            _numactl_ok[option] = str(err)
    return _numactl_ok[option]


NUMA_OPTIONS = {"local": "--localalloc", "interleave": "--interleave=all"}


class Numa:
    """Memory policy through numactl in front of the child's argv. The CPUs stay the ones the
    worker set (numactl without --physcpubind keeps the inherited affinity). There is no fallback:
    taskset binds CPUs but sets no memory policy, so without numactl the knob is unavailable."""

    name = "numa"

    def __init__(self, job: Job):
        self.job = job

    def target(self, config):
        return config["numa"]

    def available(self, target):
        if target == DEFAULT:
            return None
        numactl = shutil.which("numactl")
        if not numactl:
            return f"numa={target}: numactl is not installed (apt-get install numactl); taskset sets no memory policy"
        why = _numactl_works(numactl, NUMA_OPTIONS[target])
        return f"numa={target}: numactl {NUMA_OPTIONS[target]} is not allowed here: {why}" if why else None

    def read(self):
        return {}

    def apply(self, target):
        if target != DEFAULT:
            self.job.spec.argv_prefix = [shutil.which("numactl"), NUMA_OPTIONS[target]]
        self.job.spec.applied["numa_nodes"] = self.job.facts.get("numa_nodes")
        return {}

    def restore(self, saved):
        pass


# -- sysfs knobs ----------------------------------------------------------------------------------

NO_CPUFREQ = "no cpufreq in sysfs (VMs and containers usually hide it)"


class SysfsKnob:
    """Shared write-only-on-change, read-back and restore of sysfs files."""

    name = ""
    exact = True  # the kernel must read back exactly what was written

    def __init__(self, job: Job):
        self.job = job
        self.root = job.root

    def files(self) -> list[str]:
        raise NotImplementedError

    def read(self) -> State:
        return {f: sysfs.read(self.root, f) for f in self.files()}

    def _set(self, real_path: str, value: str) -> None:
        if sysfs.read(self.root, real_path) == value:
            return  # write only on change
        try:
            sysfs.write(self.root, real_path, value)
        except OSError as err:
            raise BenchError(f"{self.name}: cannot write {value} to {real_path}: {err.strerror or err}") from None
        now = sysfs.read(self.root, real_path)
        if self.exact and now != value:
            raise BenchError(f"{self.name}: wrote {value} to {real_path}, the kernel reads back {now}")
        self.job.spec.applied.setdefault("sysfs_written", []).append(real_path)

    def restore(self, saved: State) -> None:
        for real_path, value in reversed(list(saved.items())):
            if value is not None and sysfs.read(self.root, real_path) != value:
                sysfs.write(self.root, real_path, value)

    def _record(self) -> None:
        self.job.spec.applied.setdefault("sysfs", {}).update(self.read())

    def _cpufreq_missing(self) -> str | None:
        for cpu in self.job.cpus:
            if not sysfs.exists(self.root, sysfs.cpu_file(cpu, "scaling_governor")):
                return f"{self.name}: {NO_CPUFREQ} (no {sysfs.cpu_file(cpu, '')})"
        return None


class Turbo(SysfsKnob):
    """Turbo/boost. intel_pstate has one inverted switch (no_turbo: 1 = off); amd-pstate and
    acpi-cpufreq on recent kernels have per-policy `boost` (touch only the job's CPUs); older
    acpi-cpufreq only the global cpufreq/boost."""

    name = "turbo"
    INTEL = f"{sysfs.CPU}/intel_pstate/no_turbo"
    GLOBAL = f"{sysfs.CPU}/cpufreq/boost"

    def target(self, config):
        return config["turbo"]

    def _mode(self) -> str | None:
        if sysfs.exists(self.root, self.INTEL):
            return "intel"
        if self.job.cpus and all(sysfs.exists(self.root, sysfs.cpu_file(c, "boost")) for c in self.job.cpus):
            return "per_cpu"
        if sysfs.exists(self.root, self.GLOBAL):
            return "global"
        return None

    def files(self):
        mode = self._mode()
        if mode == "intel":
            return [self.INTEL]
        if mode == "per_cpu":
            return [sysfs.cpu_file(c, "boost") for c in self.job.cpus]
        return [self.GLOBAL] if mode == "global" else []

    def available(self, target):
        if target == DEFAULT:
            return None
        if self._mode() is None:
            return f"turbo: no turbo switch in sysfs (no intel_pstate/no_turbo, cpufreq/boost or per-CPU boost); {NO_CPUFREQ}"
        for f in self.files():
            why = _needs_root(self.root, f)
            if why:
                return f"turbo: {why}"
        return None

    def _value(self, target) -> str:
        on = target == "on"
        return ("0" if on else "1") if self._mode() == "intel" else ("1" if on else "0")

    def apply(self, target):
        saved = self.read()
        if target != DEFAULT:
            for f in self.files():
                self._set(f, self._value(target))
        self._record()
        return saved

    def describe(self):
        state = self.read()
        if not state:
            return None
        if self._mode() == "intel":
            return {"0": "on", "1": "off"}.get(next(iter(state.values())))
        values = {v for v in state.values()}
        return {"1": "on", "0": "off"}.get(values.pop()) if len(values) == 1 else "mixed"


class Governor(SysfsKnob):
    name = "governor"

    def target(self, config):
        return config["governor"]

    def files(self):
        return [sysfs.cpu_file(c, "scaling_governor") for c in self.job.cpus
                if sysfs.exists(self.root, sysfs.cpu_file(c, "scaling_governor"))]

    def available(self, target):
        if target == DEFAULT:
            return None
        missing = self._cpufreq_missing()
        if missing:
            return missing
        for cpu in self.job.cpus:
            offered = (sysfs.read(self.root, sysfs.cpu_file(cpu, "scaling_available_governors")) or "").split()
            if target not in offered:
                return f"governor={target} is not offered on cpu{cpu} (available: {' '.join(offered) or 'none'})"
            why = _needs_root(self.root, sysfs.cpu_file(cpu, "scaling_governor"))
            if why:
                return f"governor: {why}"
        return None

    def apply(self, target):
        saved = self.read()
        if target != DEFAULT:
            for f in self.files():
                self._set(f, target)
        self._record()
        return saved

    def describe(self):
        values = set(self.read().values())
        return values.pop() if len(values) == 1 else (sorted(values) or None)


class Frequency(SysfsKnob):
    """scaling_min_freq = scaling_max_freq = freq_mhz on the job's CPUs, validated against the
    machine's cpuinfo_min/max_freq (a value outside them is unavailable, never silently clamped).
    The pair is written in the order the kernel accepts: min may never exceed max, so when raising
    the floor above the current ceiling the ceiling goes first."""

    name = "freq_mhz"
    exact = False  # checked below with a tolerance: some drivers round to their P-state steps

    def target(self, config):
        return config["freq_mhz"]

    def files(self):
        return [sysfs.cpu_file(c, n) for c in self.job.cpus for n in ("scaling_min_freq", "scaling_max_freq")
                if sysfs.exists(self.root, sysfs.cpu_file(c, n))]

    def limits_mhz(self, cpu: int) -> tuple[int | None, int | None]:
        lo = sysfs.read_int(self.root, sysfs.cpu_file(cpu, "cpuinfo_min_freq"))
        hi = sysfs.read_int(self.root, sysfs.cpu_file(cpu, "cpuinfo_max_freq"))
        return (lo // 1000 if lo else None), (hi // 1000 if hi else None)

    def available(self, target):
        if target == DEFAULT:
            return None
        for cpu in self.job.cpus:
            if not sysfs.exists(self.root, sysfs.cpu_file(cpu, "scaling_max_freq")):
                return f"freq_mhz: {NO_CPUFREQ} (no {sysfs.cpu_file(cpu, 'scaling_max_freq')})"
            lo, hi = self.limits_mhz(cpu)
            if lo is None or hi is None:
                return f"freq_mhz: cpu{cpu} does not report cpuinfo_min_freq/cpuinfo_max_freq"
            if not lo <= int(target) <= hi:
                return f"freq_mhz={target} is outside this machine's limits {lo}..{hi} MHz (cpu{cpu})"
            for name in ("scaling_min_freq", "scaling_max_freq"):
                why = _needs_root(self.root, sysfs.cpu_file(cpu, name))
                if why:
                    return f"freq_mhz: {why}"
        return None

    def _set_pair(self, cpu: int, lo_khz: str, hi_khz: str) -> None:
        lo_file, hi_file = sysfs.cpu_file(cpu, "scaling_min_freq"), sysfs.cpu_file(cpu, "scaling_max_freq")
        ceiling = sysfs.read_int(self.root, hi_file) or 0
        pairs = [(hi_file, hi_khz), (lo_file, lo_khz)] if int(lo_khz) > ceiling else [(lo_file, lo_khz), (hi_file, hi_khz)]
        for f, v in pairs:
            self._set(f, v)

    def apply(self, target):
        saved = self.read()
        if target != DEFAULT:
            khz = str(int(target) * 1000)
            for cpu in self.job.cpus:
                self._set_pair(cpu, khz, khz)
                for name in ("scaling_min_freq", "scaling_max_freq"):
                    now = sysfs.read_int(self.root, sysfs.cpu_file(cpu, name)) or 0
                    if abs(now - int(khz)) > int(khz) // 100:  # more than 1% off: not the job's setting
                        raise BenchError(f"freq_mhz: wrote {khz} kHz to cpu{cpu} {name}, the kernel set {now} kHz")
        self._record()
        return saved

    def restore(self, saved):
        by_cpu: dict[int, dict[str, str]] = {}
        for real_path, value in saved.items():
            cpu = int(re.search(r"/cpu(\d+)/", real_path).group(1))
            by_cpu.setdefault(cpu, {})[real_path.rsplit("/", 1)[-1]] = value
        for cpu, values in by_cpu.items():
            lo_file, hi_file = sysfs.cpu_file(cpu, "scaling_min_freq"), sysfs.cpu_file(cpu, "scaling_max_freq")
            lo = values.get("scaling_min_freq") or sysfs.read(self.root, lo_file)
            hi = values.get("scaling_max_freq") or sysfs.read(self.root, hi_file)
            ceiling = sysfs.read_int(self.root, hi_file) or 0
            order = [(hi_file, hi), (lo_file, lo)] if int(lo) > ceiling else [(lo_file, lo), (hi_file, hi)]
            for f, v in order:
                if sysfs.read(self.root, f) != v:
                    sysfs.write(self.root, f, v)

    def describe(self):
        state = self.read()
        pairs = {(state.get(sysfs.cpu_file(c, "scaling_min_freq")), state.get(sysfs.cpu_file(c, "scaling_max_freq")))
                 for c in self.job.cpus}
        if not state or len(pairs) != 1:
            return None if not state else {str(c): [state.get(sysfs.cpu_file(c, n)) for n in
                                                    ("scaling_min_freq", "scaling_max_freq")] for c in self.job.cpus}
        lo, hi = pairs.pop()
        return {"min_mhz": int(lo) // 1000 if lo else None, "max_mhz": int(hi) // 1000 if hi else None}


# -- the ordered list -----------------------------------------------------------------------------

def knobs_for(job: Job, pool: list[int]) -> list:
    """The knobs in the order they are applied (restored in reverse). Why this order:
    - cores first: it fixes the CPUs every later knob acts on;
    - turbo before governor and frequency: on intel_pstate toggling no_turbo changes the top of the
      range and clamps scaling_max_freq, so the limits are written after it settles;
    - governor before frequency: on some drivers (intel_pstate) a governor change re-evaluates the
      policy's limits, so the min = max pair is written last and read back last;
    - the child knobs last: they only fill the ChildSpec and cannot fail half-way.
    Restoring in reverse puts the user's frequency limits back before turbo comes back; a second
    pass in applied() re-writes whatever that interplay left different."""
    return [Cores(job, pool), Turbo(job), Governor(job), Frequency(job),
            Numa(job), Allocator(job), Isa(job), Threads(job), PinThreads(job), OneDnn(job)]


SYSFS_KNOBS = {cls.name: cls for cls in (Turbo, Governor, Frequency)}


def _job(config: dict, facts: dict, cpu_pool: list[int], sysfs_root: str) -> tuple[Job, list]:
    cores = int(config.get("cores") or len(cpu_pool))
    cpus = choose_cpus(cores, facts, cpu_pool)
    job = Job(config, facts, cpus, sysfs_root, ChildSpec(cpus=cpus, env={}, argv_prefix=[], applied={}))
    return job, knobs_for(job, cpu_pool)


def unavailable(config: dict, facts: dict, cpu_pool: list[int], *, sysfs_root: str = "/") -> str | None:
    """None if every knob this job needs can be applied here, else the reason (the run becomes skipped)."""
    job, knobs = _job(config, facts, cpu_pool, sysfs_root)
    reasons = [why for knob in knobs if (why := knob.available(knob.target(config)))]
    return "; ".join(reasons) or None


def machine_knobs(facts: dict, *, sysfs_root: str = "/") -> dict[str, str | None]:
    """For `bench.py machine`: each knob (and each value that needs something of its own) -> None if
    it can be applied here, else why not."""
    cpus = facts.get("cpus") or sorted(os.sched_getaffinity(0))
    job = Job({}, facts, cpus, sysfs_root, ChildSpec(cpus=cpus, env={}, argv_prefix=[]))
    governors = facts.get("governors") or ["performance"]
    probes = {
        "cores": (Cores(job, cpus), len(cpus)),
        "freq_mhz": (Frequency(job), facts.get("freq_max_mhz") or 1000),
        "governor": (Governor(job), governors[0]),
        "turbo": (Turbo(job), "off"),
        "pin_threads": (PinThreads(job), True),
        "omp_threads": (Threads(job), (1, 1, 1)),
        "onednn": (OneDnn(job), True),
    }
    out = {name: knob.available(value) for name, (knob, value) in probes.items()}
    for word in NUMA_OPTIONS:
        out[f"numa={word}"] = Numa(job).available(word)
    for word in ALLOCATOR_LIBS:
        out[f"allocator={word}"] = Allocator(job).available(word)
    for word in ISA_CAPS:
        out[f"isa={word}"] = Isa(job).available(word)
    return out


# -- apply, journal, restore ----------------------------------------------------------------------

def _write_journal(journal_path: Path, entries: list[dict], sysfs_root: str) -> None:
    journal_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = journal_path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "time": time.time(), "sysfs_root": sysfs_root, "entries": entries}, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before the first sysfs write, or a crash could lose it
    tmp.replace(journal_path)


def _restore_entries(entries: list[dict], sysfs_root: str) -> list[str]:
    """Restore in reverse, then once more for anything the interplay of knobs left different
    (turbo coming back can move the frequency ceiling). Raises BenchError if a value will not stick."""
    job = Job({}, {}, [], sysfs_root, ChildSpec([], {}, []))
    lines, failures = [], []
    for attempt in range(2):
        for entry in reversed(entries):
            knob = SYSFS_KNOBS[entry["knob"]](job)
            saved = {k: v for k, v in entry["saved"].items() if v is not None}
            before = {k: sysfs.read(sysfs_root, k) for k in saved}
            try:
                knob.restore(saved)
            except OSError as err:
                failures.append(f"{entry['knob']}: {err}")
            for k, v in saved.items():
                if before[k] != v and sysfs.read(sysfs_root, k) == v:
                    lines.append(f"{k}: {before[k]} -> {v}")
        left = [f"{k} is {sysfs.read(sysfs_root, k)}, was {v}" for e in entries for k, v in e["saved"].items()
                if v is not None and sysfs.read(sysfs_root, k) != v]
        if not left:
            return lines
    raise BenchError("could not restore system settings: " + "; ".join(failures + left))


@contextmanager
def applied(config: dict, facts: dict, cpu_pool: list[int], *, journal_path: Path,
            sysfs_root: str = "/") -> Iterator[ChildSpec]:
    """Journal the current values to disk before the first write, apply the knobs in order, read back,
    yield the ChildSpec; restore in reverse on exit (also on exception). Journal removed after restore."""
    journal_path = Path(journal_path)
    restore_journal(journal_path, sysfs_root=sysfs_root)  # a dead worker's leftovers come back first
    job, knobs = _job(config, facts, cpu_pool, sysfs_root)
    targets = [knob.target(config) for knob in knobs]
    reasons = [why for knob, t in zip(knobs, targets) if (why := knob.available(t))]
    if reasons:
        raise BenchError("cannot apply this job's settings here: " + "; ".join(reasons))
    entries = [{"knob": k.name, "saved": k.read()} for k, t in zip(knobs, targets)
               if isinstance(k, SysfsKnob) and t != DEFAULT]
    if entries:
        _write_journal(journal_path, entries, sysfs_root)
    with ExitStack() as stack:
        if entries:
            # Restore from the full pre-state, not from what apply() returns: a knob that fails
            # half-way has written some files and returned nothing, and restore writes only what differs.
            stack.callback(_finish, journal_path, entries, sysfs_root)
        for knob, target in zip(knobs, targets):
            knob.apply(target)
        spec = job.spec
        for knob in knobs:
            if isinstance(knob, SysfsKnob):
                spec.applied[knob.name] = knob.describe()
        spec.applied.update(env=dict(spec.env), argv_prefix=list(spec.argv_prefix), cpus=list(spec.cpus),
                            numa=config["numa"], isa=config["isa"], allocator=config["allocator"])
        spec.applied.setdefault("sysfs_written", [])
        spec.applied.setdefault("sysfs", {})
        yield spec


def _finish(journal_path: Path, entries: list[dict], sysfs_root: str) -> None:
    _restore_entries(entries, sysfs_root)
    journal_path.unlink(missing_ok=True)


def restore_journal(journal_path: Path, *, sysfs_root: str = "/") -> list[str]:
    """Restore what a killed worker left (journal on disk); return human lines of what was restored;
    no journal -> []."""
    journal_path = Path(journal_path)
    try:
        journal = json.loads(journal_path.read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        # Written atomically, so a torn file means someone else wrote it: keep it for a human.
        raise BenchError(f"{journal_path}: unreadable journal; check and delete it by hand") from None
    lines = _restore_entries(journal["entries"], sysfs_root)
    journal_path.unlink(missing_ok=True)
    return lines


def _cpulist(cpus: list[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


# -- the child's read-back, checked -----------------------------------------------------------------

def not_in_force(config: dict, spec: ChildSpec, child: dict) -> list[str]:
    """The job's settings the child did NOT run under, from what it read back (worker/readback.py).
    A run with any is recorded failed: its numbers would belong to other settings."""
    expected = {
        "affinity": sorted(spec.cpus),
        "torch_threads": config["intra_threads"],
        "interop_threads": config["inter_threads"],
        "mkldnn": bool(config["onednn"]),
        "omp_num_threads": spec.env.get("OMP_NUM_THREADS"),
        "omp_proc_bind": spec.env.get("OMP_PROC_BIND"),
        "omp_places": spec.env.get("OMP_PLACES"),
    }
    if config["isa"] != DEFAULT:
        expected["cpu_capability"] = ISA_CAPS[config["isa"]][1].upper()
    wrong = [f"{key}={child.get(key)!r} (asked {want!r})" for key, want in expected.items()
             if key in child and child[key] != want]
    wrong += isa_check.disobeyed(config["isa"], child)
    lib = child.get("allocator_lib")
    if config["allocator"] != DEFAULT and "allocator_lib" in child and (
            lib is None or not os.path.basename(lib).startswith(f"lib{config['allocator']}")):
        wrong.append(f"allocator_lib={lib!r} (asked {config['allocator']})")
    return wrong
