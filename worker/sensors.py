"""Run-time sensors: average frequency of the job's CPUs, package energy and the hottest CPU
temperature while a child runs, sampled by one background thread that reads a few sysfs files.

A metric the machine does not expose is None with the reason in `notes`, never a made-up number.
Energy is RAPL's package counter: it includes every core of the package, not only the job's.
"""

from __future__ import annotations

import threading

from worker import sysfs

POWERCAP = "/sys/class/powercap"
HWMON = "/sys/class/hwmon"
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

    # -- what to read, resolved once so each sample is a few reads
    def _resolve(self) -> None:
        self._freq_files = [sysfs.cpu_file(c, "scaling_cur_freq") for c in self.cpus
                            if sysfs.read_int(self.root, sysfs.cpu_file(c, "scaling_cur_freq")) is not None]
        if self._freq_files:
            self.sources["freq_mhz_avg"] = "scaling_cur_freq"
        elif self._cpuinfo_mhz() is not None:
            self.sources["freq_mhz_avg"] = "/proc/cpuinfo cpu MHz (in a VM: the nominal clock)"
        else:
            self.notes["freq_mhz_avg"] = "no scaling_cur_freq and no 'cpu MHz' in /proc/cpuinfo"
        self._rapl, why = _rapl_domains(self.root)
        if why:
            self.notes["energy_j"] = why
        else:
            self.sources["energy_j"] = "RAPL package counters"
        self._temps, why = _temp_files(self.root)
        if why:
            self.notes["temp_c_max"] = why

    def _cpuinfo_mhz(self) -> float | None:
        mhz, processor = [], None
        for line in (sysfs.read(self.root, "/proc/cpuinfo") or "").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "processor":
                processor = int(value)
            elif key == "cpu MHz" and processor in self.cpus:
                mhz.append(float(value))
        return sum(mhz) / len(mhz) if mhz else None

    def _sample(self) -> None:
        if self._freq_files:
            khz = [v for f in self._freq_files if (v := sysfs.read_int(self.root, f)) is not None]
            if khz:
                self._freqs.append(sum(khz) / len(khz) / 1000)
        elif "freq_mhz_avg" in self.sources:
            mhz = self._cpuinfo_mhz()
            if mhz is not None:
                self._freqs.append(mhz)
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
        for f in self._temps:
            milli = sysfs.read_int(self.root, f)
            if milli is not None:
                c = milli / 1000
                self._temp_max = c if self._temp_max is None else max(self._temp_max, c)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._resolve()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="run-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        out = {
            "freq_mhz_avg": round(sum(self._freqs) / len(self._freqs), 1) if self._freqs else None,
            "energy_j": round(self._energy_j, 3) if self._rapl and self._last_uj else None,
            "temp_c_max": self._temp_max,
        }
        notes = {k: self.notes.get(k, "no sample could be read during the run") for k, v in out.items() if v is None}
        return {**out, "notes": notes, "sources": dict(self.sources)}
