"""Run-time sensors: average frequency of the job's CPUs, package energy and the hottest CPU
temperature while a child runs, sampled by one background thread that reads a few sysfs files.

A metric the machine does not expose is None with the reason in `notes`, never a made-up number.
Energy is RAPL's package counter: it includes every core of the package, not only the job's.
`other_cpu_s` is the CPU time processes other than the child used on the job's CPUs: /proc/stat's
busy time (user+nice+system) of those CPUs minus the child's own utime+stime (/proc/PID/stat, every
thread of it), so a disturbed run can be seen (orchestrator/effects.disturbed flags it).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from common.metrics import DISTURBED_FLOOR_S, DISTURBED_SHARE, disturbance  # noqa: F401 (the worker's names)
from worker.knobs import sysfs

POWERCAP = "/sys/class/powercap"
HWMON = "/sys/class/hwmon"
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc/stat ticks per second
THERMAL = "/sys/class/thermal"
CPU_HWMON = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "soc_thermal")
CPU_ZONES = ("x86_pkg_temp", "cpu-thermal", "cpu_thermal", "soc_thermal", "cpu")


def _rapl_domains(root: str) -> tuple[list[tuple[str, int | None]], str | None]:
    """Top-level package domains (intel-rapl:N; AMD Zen exposes the same driver name) with their
    wrap range. Sub-zones (intel-rapl:N:M) are inside the package counter; psys overlaps it."""
    domains, why = [], None
    for name in sysfs.listdir(root, POWERCAP):
        if not name.startswith("intel-rapl:") or name.count(":") != 1:
            continue
        base = f"{POWERCAP}/{name}"
        if sysfs.read(root, f"{base}/name") == "psys":
            continue
        if sysfs.read_int(root, f"{base}/energy_uj") is None:
            why = "RAPL energy_uj is not readable (root only since Linux 5.10)"
            continue
        domains.append((f"{base}/energy_uj", sysfs.read_int(root, f"{base}/max_energy_range_uj")))
    if not domains and why is None:
        why = "no RAPL powercap domains in sysfs (VMs do not expose them)"
    return domains, why if not domains else None


def _temp_files(root: str) -> tuple[list[str], str | None]:
    cpu, other = [], []
    for hw in sysfs.listdir(root, HWMON):
        base = f"{HWMON}/{hw}"
        inputs = [f"{base}/{f}" for f in sysfs.listdir(root, base) if f.startswith("temp") and f.endswith("_input")]
        (cpu if sysfs.read(root, f"{base}/name") in CPU_HWMON else other).extend(inputs)
    for zone in sysfs.listdir(root, THERMAL):
        if zone.startswith("thermal_zone"):
            f = f"{THERMAL}/{zone}/temp"
            (cpu if sysfs.read(root, f"{THERMAL}/{zone}/type") in CPU_ZONES else other).append(f)
    files = [f for f in (cpu or other) if sysfs.read_int(root, f) is not None]
    return files, None if files else "no readable temperature sensor in /sys/class/thermal or hwmon"


class RunSampler:
    def __init__(self, cpus: list[int], *, sysfs_root: str = "/", interval_s: float = 0.2):
        self.cpus, self.root, self.interval_s = list(cpus), sysfs_root, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._freqs: list[float] = []
        self._temp_max: float | None = None
        self._energy_j = 0.0
        self._last_uj: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        self.sources: dict[str, str] = {}
        self.samples: list[Sample] = []
        self.pid: int | None = None  # the child, once spawned (watch())

    # -- what to read, resolved once so each sample is a few reads
    def _resolve(self) -> None:
        self._freq_files = [sysfs.cpu_file(c, "scaling_cur_freq") for c in self.cpus
                            if sysfs.read_int(self.root, sysfs.cpu_file(c, "scaling_cur_freq")) is not None]
        if self._freq_files:
            self.sources["freq_mhz_avg"] = "scaling_cur_freq"
        else:  # /proc/cpuinfo's 'cpu MHz' without cpufreq (and in a VM) is the nominal clock: not a measurement
            self.notes["freq_mhz_avg"] = ("no cpufreq (scaling_cur_freq); /proc/cpuinfo 'cpu MHz' here is the "
                                          "nominal clock, not a measurement")
        busy, steal = self._stat_ticks()
        if steal is not None:
            self.sources["steal_s"] = "/proc/stat steal of the job's CPUs"
        else:
            self.notes["steal_s"] = "no per-CPU steal column in /proc/stat"
        if busy is not None:
            self.sources["other_cpu_s"] = ("/proc/stat user+nice+system of the job's CPUs minus the child's "
                                           "utime+stime (/proc/PID/stat, all its threads), clamped at 0")
        else:
            self.notes["other_cpu_s"] = "no per-CPU lines in /proc/stat"
        self._rapl, why = _rapl_domains(self.root)
        if why:
            self.notes["energy_j"] = why
        else:
            self.sources["energy_j"] = "RAPL package counters"
        self._temps, why = _temp_files(self.root)
        if why:
            self.notes["temp_c_max"] = why

    def watch(self, pid: int) -> None:
        """The child's pid: its own CPU time is taken out of the job's CPUs' busy time."""
        self.pid = pid

    def _stat_ticks(self) -> tuple[int | None, int | None]:
        """(busy, steal) of the job's CPUs so far, in USER_HZ ticks: busy = user+nice+system (fields
        1-3 of the cpuN lines; guest time is inside user), steal = the 8th field."""
        return stat_ticks(sysfs.read(self.root, "/proc/stat") or "", self.cpus)

    def _child_ticks(self) -> int | None:
        """The child's utime+stime so far (every thread, live or exited), in USER_HZ ticks, with the
        processes it started (a data-parallel child's ranks: /proc/PID/task/PID/children, the ones its
        main thread started, recursively; their time once they ended and were waited for is in cutime)."""
        if self.pid is None:
            return None
        own = task_ticks(sysfs.read(self.root, f"/proc/{self.pid}/stat"))
        if own is None:
            return None
        seen, todo, total = {self.pid}, [self.pid], 0
        while todo:
            pid = todo.pop()
            stat = sysfs.read(self.root, f"/proc/{pid}/stat")
            total += (task_ticks(stat) or 0) + (waited_ticks(stat) or 0)
            for child in (sysfs.read(self.root, f"/proc/{pid}/task/{pid}/children") or "").split():
                if child.isdigit() and int(child) not in seen:
                    seen.add(int(child))
                    todo.append(int(child))
        return total

    def _sample(self) -> None:
        now = time.time()
        freq = None
        if self._freq_files:
            khz = [v for f in self._freq_files if (v := sysfs.read_int(self.root, f)) is not None]
            if khz:
                freq = sum(khz) / len(khz) / 1000
                self._freqs.append(freq)
        for f, wrap in self._rapl:
            uj = sysfs.read_int(self.root, f)
            if uj is None:
                continue
            last = self._last_uj.get(f)
            if last is not None:
                delta = uj - last
                if delta < 0 and wrap:  # the counter wrapped at max_energy_range_uj
                    delta += wrap
                self._energy_j += max(delta, 0) / 1e6
            self._last_uj[f] = uj
        temp = None
        for f in self._temps:
            milli = sysfs.read_int(self.root, f)
            if milli is not None:
                c = milli / 1000
                temp = c if temp is None else max(temp, c)
                self._temp_max = c if self._temp_max is None else max(self._temp_max, c)
        busy, steal = self._stat_ticks()
        child = self._child_ticks()  # read right after /proc/stat: the two describe one moment
        other = busy - child if busy is not None and child is not None else None
        energy = self._energy_j if self._rapl and self._last_uj else None
        self.samples.append(Sample(now, freq, energy, temp, steal if "steal_s" in self.sources else None, other))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._resolve()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="run-sampler", daemon=True)
        self._thread.start()

    def stop(self, window: tuple[float, float] | None = None) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._sample()
        return self.summary(window)

    def summary(self, window: tuple[float, float] | None = None) -> dict:
        """The sensor metrics over `window` (wall-clock start/end of the child's timed steps), or
        over the child's whole life when the child reported none; `sources` says which."""
        out = over_window(self.samples, window)
        if out["other_cpu_s"] is None and "other_cpu_s" in self.sources and "other_cpu_s" not in self.notes:
            self.notes["other_cpu_s"] = ("the child's /proc/PID/stat could not be read during the window"
                                         if self.pid is not None else "the child's pid was never known")
        notes = {k: self.notes.get(k, "no sample could be read during the run") for k, v in out.items() if v is None}
        span = "the timed window" if window else "the child's whole life (no timed window reported)"
        sources = {k: f"{v}, over {span}" for k, v in self.sources.items()}
        return {**out, "notes": notes, "sources": sources}


@dataclass
class Sample:
    t: float  # time.time()
    freq_mhz: float | None
    energy_j: float | None  # cumulative since the first sample
    temp_c: float | None
    steal_ticks: int | None  # cumulative, /proc/stat
    other_ticks: int | None = None  # cumulative: busy ticks of the job's CPUs minus the child's (an offset cancels)


def stat_ticks(stat: str, cpus: list[int]) -> tuple[int | None, int | None]:
    """(busy, steal) ticks of `cpus` in /proc/stat text; None for what no cpuN line of them has."""
    wanted = set(cpus)
    busy = steal = 0
    seen_busy = seen_steal = 0
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0].startswith("cpu") and fields[0][3:].isdigit() and int(fields[0][3:]) in wanted:
            if len(fields) > 3:
                busy += int(fields[1]) + int(fields[2]) + int(fields[3])
                seen_busy += 1
            if len(fields) > 8:
                steal += int(fields[8])
                seen_steal += 1
    return (busy if seen_busy else None), (steal if seen_steal else None)


@dataclass
class OwnWindow:
    """What else ran on `cpus` while this process measured something: start() before, load() after.
    Other processes' CPU time is the set's busy ticks minus this process's own CPU time (every
    thread); steal is the hypervisor's. Each is None where /proc/stat has no line for the set."""

    cpus: list[int]
    ticks: tuple[int | None, int | None]
    own: os.times_result
    t0: float

    @classmethod
    def start(cls, cpus: list[int]) -> "OwnWindow":
        with open("/proc/stat") as f:
            return cls(cpus, stat_ticks(f.read(), cpus), os.times(), time.perf_counter())

    def load(self) -> tuple[float | None, float | None, float]:
        """(other processes' CPU seconds, steal seconds, window seconds) since start()."""
        with open("/proc/stat") as f:
            busy, steal = stat_ticks(f.read(), self.cpus)
        own, window_s = os.times(), time.perf_counter() - self.t0
        own_s = (own.user - self.own.user) + (own.system - self.own.system)
        other = None if busy is None or self.ticks[0] is None else max((busy - self.ticks[0]) / CLK_TCK - own_s, 0.0)
        stolen = None if steal is None or self.ticks[1] is None else (steal - self.ticks[1]) / CLK_TCK
        return other, stolen, window_s


def task_ticks(stat: str | None) -> int | None:
    """utime+stime of a /proc/PID/stat line (fields 14 and 15; the command name may hold spaces)."""
    if not stat or ")" not in stat:
        return None
    rest = stat.rsplit(")", 1)[1].split()  # rest[0] is field 3 (state)
    return int(rest[11]) + int(rest[12]) if len(rest) > 12 else None


def waited_ticks(stat: str | None) -> int | None:
    """cutime+cstime of a /proc/PID/stat line (fields 16 and 17): its ended, waited-for children."""
    if not stat or ")" not in stat:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return int(rest[13]) + int(rest[14]) if len(rest) > 14 else None


def _at(samples: list[Sample], attr: str, t: float) -> float | None:
    """A cumulative counter at time t, linearly interpolated between the samples around it (clamped)."""
    pts = [(s.t, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
    if not pts:
        return None
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return pts[-1][1]


def over_window(samples: list[Sample], window: tuple[float, float] | None) -> dict:
    """Frequency (mean) and temperature (max) of the samples inside the window (the two around it when
    none falls inside); energy, steal and other processes' CPU time as counter differences
    interpolated at the window's edges (clamped at 0: a counter never runs backwards, and the child's
    precise CPU time can outrun /proc/stat's ticks by one)."""
    if not samples:
        return {"freq_mhz_avg": None, "energy_j": None, "temp_c_max": None, "steal_s": None, "other_cpu_s": None}
    lo, hi = window if window else (samples[0].t, samples[-1].t)
    inside = [s for s in samples if lo <= s.t <= hi]
    before = [s for s in samples if s.t < lo][-1:]
    after = [s for s in samples if s.t > hi][:1]
    near = inside or before + after  # a window shorter than the sampling interval: the samples around it
    freqs = [s.freq_mhz for s in near if s.freq_mhz is not None]
    temps = [s.temp_c for s in near if s.temp_c is not None]

    def delta(attr):
        a, b = _at(samples, attr, lo), _at(samples, attr, hi)
        return None if a is None or b is None else max(b - a, 0.0)

    energy, steal, other = delta("energy_j"), delta("steal_ticks"), delta("other_ticks")
    return {
        "freq_mhz_avg": round(sum(freqs) / len(freqs), 1) if freqs else None,
        "energy_j": round(energy, 3) if energy is not None else None,
        "temp_c_max": max(temps) if temps else None,
        "steal_s": round(steal / CLK_TCK, 3) if steal is not None else None,
        "other_cpu_s": round(other / CLK_TCK, 3) if other is not None else None,
    }
