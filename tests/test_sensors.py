"""Run-time sensors against a fake sysfs tree (frequency, RAPL energy with wraparound, temperature)
and on this machine (whatever it lacks is None with a reason)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from worker.machine import sensors

from worker.knobs import sysfs
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
    assert out["notes"] == {"other_cpu_s": "the child's pid was never known"}  # no child watched here
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
    for metric in ("freq_mhz_avg", "energy_j", "temp_c_max", "steal_s", "other_cpu_s"):
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


def test_other_cpu_time_is_the_job_cpus_busy_time_less_the_childs(tmp_path):
    """other_cpu_s = /proc/stat user+nice+system of the job's CPUs minus the child's utime+stime
    (fields 14-15 of /proc/PID/stat, after a command name with spaces), over the window."""
    tick = sensors.CLK_TCK
    assert sensors.stat_ticks("cpu  9 9 9 9\ncpu0 10 1 5 400 0 0 0 7\ncpu1 3 0 2 100 0 0 0 1\ncpu2 50 0 0 0 0 0 0 0\n",
                              [0, 1]) == (21, 8)
    assert sensors.task_ticks("42 (python -m x) R 1 42 42 0 -1 4194304 10 0 0 0 120 30 0 0 20 0 3 0") == 150
    assert sensors.task_ticks(None) is None
    root = tmp_path / "root"
    put(root, "/proc/stat", "cpu0 100 0 100 0 0 0 0 0\ncpu1 5000 0 0 0 0 0 0 0\n")
    put(root, "/proc/77/stat", "77 (child) R 1 77 77 0 -1 0 0 0 0 0 10 10 0 0 20 0 1 0")
    sampler = sensors.RunSampler([0], sysfs_root=str(root), interval_s=0.01)
    sampler.start()
    sampler.watch(77)
    time.sleep(0.05)
    # The child ran 2 s and the CPU was busy 2.5 s: someone else took 0.5 s; cpu1 is not the job's.
    put(root, "/proc/stat", f"cpu0 {100 + 2 * tick} 0 {100 + tick // 2} 0 0 0 0 0\ncpu1 9000 0 0 0 0 0 0 0\n")
    put(root, "/proc/77/stat",
        f"77 (child) R 1 77 77 0 -1 0 0 0 0 0 {10 + tick + tick // 2} {10 + tick // 2} 0 0 20 0 1 0")
    out = sampler.stop()
    assert out["other_cpu_s"] == 0.5
    assert "minus the child's" in out["sources"]["other_cpu_s"]
    # The child's precise CPU time may outrun /proc/stat's ticks: never a negative figure.
    S = sensors.Sample
    assert sensors.over_window([S(0.0, None, None, None, None, 0), S(1.0, None, None, None, None, -3)],
                               (0.0, 1.0))["other_cpu_s"] == 0.0


@pytest.mark.probe
@pytest.mark.slow
def test_a_process_spinning_on_the_jobs_cpu_shows_in_other_cpu_s(tmp_path):
    """A real busy process pinned to CPU 0 while a real job (tests/busy_child.py) runs on CPU 0."""
    import os
    import subprocess
    import sys

    from common.variables import resolve
    from worker.loop import WorkerOptions, measure_once

    spin = "import os,time\nos.sched_setaffinity(0,{0})\nt=time.time()\nwhile time.time()-t<30: pass\n"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)  # pinned and spinning before the job starts
        config, why = resolve({}, 1)
        assert not why
        options = WorkerOptions(cpus=[0], child_module="tests.busy_child", spawn="exec",
                                state_dir=Path(os.environ["BENCH_STATE_DIR"]), output_dir=tmp_path / "out")
        result = measure_once(config, options)
    finally:
        spinner.kill()
        spinner.wait()
    assert result["status"] == "done", result["reason"]
    assert result["applied"]["affinity"] == [0]
    # Two busy processes share CPU 0 for ~1 s of wall time: the spinner gets a good share of it,
    # and the child's own share is not counted again (the two fit in one CPU's window).
    window = result["applied"]["timed_window"]
    window_s = window["end_unix_s"] - window["start_unix_s"]
    own = result["applied"]["window_cpu_s"]
    assert result["other_cpu_s"] > 0.1, result["other_cpu_s"]
    assert result["other_cpu_s"] + own <= window_s + 0.1, (result["other_cpu_s"], own, window_s)
    assert "other_cpu_s" in result["applied"]["sensor_sources"]
