"""System settings on sysfs (turbo, governor, frequency): applied before the child starts, journaled,
restored after. pyperf's _system.py shape, plus what it lacks:

    name                      the catalogue variable it serves (the job's target is config[name])
    machine_target(facts)     the value `bench.py machine` asks it about
    available(target)         None, or why not here ("no cpufreq in sysfs", "needs root")
    read() -> State           the current values of what it governs ({sysfs path: text})
    apply(target) -> State    make it so; returns what it replaced
    restore(saved)            put `saved` back

Writes only when a value changes, reads back after writing, and journals the current values to disk
before the first write so that a killed worker's changes are undone at the next start
(restore_journal). applied() restores in reverse in an ExitStack, also on an exception. The word
"default" means leave the machine alone. What shapes only the child (CPUs, environment, numactl)
is worker/knobs/startspec.py's; nothing here edits the parent's os.environ.
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from common.errors import BenchError
from worker.knobs import sysfs

DEFAULT = "default"
State = dict  # {real sysfs path: text}


class Knob(Protocol):
    name: str

    @staticmethod
    def machine_target(facts: dict): ...
    def available(self, target) -> str | None: ...
    def read(self) -> State: ...
    def apply(self, target) -> State: ...
    def restore(self, saved: State) -> None: ...


@dataclass
class Job:
    """What a system knob of one job acts on: the job's CPUs under a sysfs root, and where it
    records what it wrote and read back (the run's `applied`)."""

    cpus: list[int]
    root: str = "/"
    applied: dict = field(default_factory=dict)


def _needs_root(root: str, real_path: str) -> str | None:
    if sysfs.writable(root, real_path):
        return None
    return "needs root" if os.geteuid() != 0 else f"{real_path} is read-only"


# -- the knobs -------------------------------------------------------------------------------------

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
        self.job.applied.setdefault("sysfs_written", []).append(real_path)

    def restore(self, saved: State) -> None:
        for real_path, value in reversed(list(saved.items())):
            if value is not None and sysfs.read(self.root, real_path) != value:
                sysfs.write(self.root, real_path, value)

    def _record(self) -> None:
        self.job.applied.setdefault("sysfs", {}).update(self.read())

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

    @staticmethod
    def machine_target(facts: dict):
        return "off"

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
            return ("turbo: no turbo switch in sysfs (no intel_pstate/no_turbo, cpufreq/boost or per-CPU boost); "
                    f"{NO_CPUFREQ}")
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

    @staticmethod
    def machine_target(facts: dict):
        return (facts.get("governors") or ["performance"])[0]

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

    @staticmethod
    def machine_target(facts: dict):
        return facts.get("freq_max_mhz") or 1000

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
        pairs = ([(hi_file, hi_khz), (lo_file, lo_khz)] if int(lo_khz) > ceiling
                 else [(lo_file, lo_khz), (hi_file, hi_khz)])
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


# The order they are applied in (restored in reverse). Why: turbo before governor and frequency: on
# intel_pstate toggling no_turbo changes the top of the range and clamps scaling_max_freq, so the
# limits are written after it settles; governor before frequency: on some drivers (intel_pstate) a
# governor change re-evaluates the policy's limits, so the min = max pair is written last and read
# back last. Restoring in reverse puts the user's frequency limits back before turbo comes back; a
# second pass in _restore_entries() re-writes whatever that interplay left different.
SYSTEM_KNOBS = (Turbo, Governor, Frequency)
BY_NAME = {cls.name: cls for cls in SYSTEM_KNOBS}


def unavailable(config: dict, cpus: list[int], *, sysfs_root: str = "/") -> list[str]:
    """Why each system setting this job asks for cannot be applied here (empty: all can)."""
    job = Job(cpus, sysfs_root)
    return [why for cls in SYSTEM_KNOBS if (why := cls(job).available(config[cls.name]))]


def machine_availability(facts: dict, cpus: list[int], *, sysfs_root: str = "/") -> dict[str, str | None]:
    """For `bench.py machine`: each system knob -> None if it can be applied here, else why not."""
    job = Job(cpus, sysfs_root)
    return {cls.name: cls(job).available(cls.machine_target(facts))
            for cls in sorted(SYSTEM_KNOBS, key=lambda cls: cls.name)}


@contextmanager
def applied(config: dict, cpus: list[int], *, journal_path: Path, sysfs_root: str = "/",
            record: dict | None = None) -> Iterator[dict]:
    """Journal the current values to disk before the first write, apply the job's system settings in
    order, read back; yield `record` (what was written and read back); restore in reverse on exit
    (also on an exception). The journal is removed after the restore. A dead worker's leftovers
    (the journal at journal_path) are restored first."""
    restore_journal(journal_path, sysfs_root=sysfs_root)
    record = {} if record is None else record
    job = Job(cpus, sysfs_root, record)
    knobs = [cls(job) for cls in SYSTEM_KNOBS]
    reasons = [why for knob in knobs if (why := knob.available(config[knob.name]))]
    if reasons:
        raise BenchError("cannot apply this job's settings here: " + "; ".join(reasons))
    entries = [{"knob": k.name, "saved": k.read()} for k in knobs if config[k.name] != DEFAULT]
    if entries:
        _write_journal(journal_path, entries, sysfs_root)
    with ExitStack() as stack:
        if entries:
            # Restore from the full pre-state, not from what apply() returns: a knob that fails
            # half-way has written some files and returned nothing, and restore writes only what differs.
            stack.callback(_finish, journal_path, entries, sysfs_root)
        for knob in knobs:
            knob.apply(config[knob.name])
        for knob in knobs:
            record[knob.name] = knob.describe()
        record.setdefault("sysfs_written", [])
        record.setdefault("sysfs", {})
        yield record


# -- the journal ----------------------------------------------------------------------------------

def _write_journal(journal_path: Path, entries: list[dict], sysfs_root: str) -> None:
    journal_path = Path(journal_path)
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
    job = Job([], sysfs_root)
    lines, failures = [], []
    for attempt in range(2):
        for entry in reversed(entries):
            knob = BY_NAME[entry["knob"]](job)
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


def _finish(journal_path: Path, entries: list[dict], sysfs_root: str) -> None:
    _restore_entries(entries, sysfs_root)
    Path(journal_path).unlink(missing_ok=True)


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
