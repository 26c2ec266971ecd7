"""Run-time sensors against a fake sysfs tree (frequency, RAPL energy with wraparound, temperature)
and on this machine (whatever it lacks is None with a reason)."""

from __future__ import annotations

import time
from pathlib import Path

from worker import sensors, sysfs
from tests.fake_sysfs import put


def test_frequency_energy_and_temperature_are_read_from_sysfs(tmp_path):
    root = tmp_path / "root"
    put(root, sysfs.cpu_file(0, "scaling_cur_freq"), "2000000")
    put(root, sysfs.cpu_file(1, "scaling_cur_freq"), "3000000")
    put(root, sysfs.cpu_file(2, "scaling_cur_freq"), "800000")  # not a job CPU
    rapl = "/sys/class/powercap/intel-rapl:0"
    put(root, f"{rapl}/name", "package-0")
    put(root, f"{rapl}/max_energy_range_uj", "1000000000")
    put(root, f"{rapl}/energy_uj", "999000000")
    put(root, "/sys/class/powercap/intel-rapl:0:0/energy_uj", "5")  # a sub-zone: inside the package
    put(root, "/sys/class/thermal/thermal_zone0/type", "x86_pkg_temp")
    put(root, "/sys/class/thermal/thermal_zone0/temp", "61500")
    put(root, "/sys/class/thermal/thermal_zone1/type", "acpitz")
    put(root, "/sys/class/thermal/thermal_zone1/temp", "90000")  # the board, not the CPU
    put(root, "/proc/stat", "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 1 1 1 1 1 1 100 0 0\ncpu1 1 1 1 1 1 1 1 50 0 0\n"
                            "cpu2 1 1 1 1 1 1 1 7000 0 0\n")
    sampler = sensors.RunSampler([0, 1], sysfs_root=str(root), interval_s=0.01)
    sampler.start()
    time.sleep(0.05)
    put(root, f"{rapl}/energy_uj", "2500000")  # wrapped: 1 J to the top, then 2.5 J
    put(root, "/proc/stat", f"cpu0 1 1 1 1 1 1 1 {100 + sensors.CLK_TCK} 0 0\ncpu1 1 1 1 1 1 1 1 50 0 0\n"
                            "cpu2 1 1 1 1 1 1 1 9000 0 0\n")  # 1 s stolen from cpu0; cpu2 is not the job's
    out = sampler.stop()
    assert out["freq_mhz_avg"] == 2500.0
    assert out["energy_j"] == 3.5
    assert out["temp_c_max"] == 61.5
    assert out["steal_s"] == 1.0
    assert out["notes"] == {}
    assert "whole life" in out["sources"]["steal_s"]


def test_a_machine_without_sensors_gives_none_with_reasons(tmp_path):
    root = tmp_path / "root"
    put(root, "/proc/cpuinfo", "processor\t: 0\ncpu MHz\t\t: 2400.000\n\nprocessor\t: 1\ncpu MHz\t\t: 2600.000")
    sampler = sensors.RunSampler([0, 1], sysfs_root=str(root))
    sampler.start()
    out = sampler.stop()
    assert out["freq_mhz_avg"] is None  # cpuinfo's nominal MHz is no measurement
    assert "nominal" in out["notes"]["freq_mhz_avg"]
    assert out["steal_s"] is None and "steal" in out["notes"]["steal_s"]
    assert out["energy_j"] is None and "RAPL" in out["notes"]["energy_j"]
    assert out["temp_c_max"] is None and "temperature" in out["notes"]["temp_c_max"]


def test_on_this_machine_every_missing_metric_has_a_reason():
    sampler = sensors.RunSampler([0])
    sampler.start()
    time.sleep(0.3)
    out = sampler.stop()
    for metric in ("freq_mhz_avg", "energy_j", "temp_c_max", "steal_s"):
        assert (out[metric] is None) == (metric in out["notes"]), out


def test_sensors_average_over_the_timed_window_only():
    """Setup before the window (hot, fast clock, big steal) must not reach the window's figures;
    counters are interpolated at the window's edges."""
    S = sensors.Sample
    tick = sensors.CLK_TCK
    samples = [S(0.0, 3900.0, 0.0, 95.0, 0), S(1.0, 3900.0, 100.0, 95.0, 10 * tick),  # setup
               S(2.0, 2000.0, 110.0, 60.0, 10 * tick), S(3.0, 2200.0, 130.0, 62.0, 10 * tick + tick // 2),
               S(4.0, 2100.0, 150.0, 61.0, 11 * tick)]
    out = sensors.over_window(samples, (2.0, 4.0))
    assert out["freq_mhz_avg"] == 2100.0
    assert out["temp_c_max"] == 62.0
    assert out["energy_j"] == 40.0
    assert out["steal_s"] == 1.0
    mid = sensors.over_window(samples, (2.5, 3.5))  # between samples: interpolated counters
    assert mid["energy_j"] == 20.0
    assert sensors.over_window(samples, None)["energy_j"] == 150.0  # no window: the whole life
