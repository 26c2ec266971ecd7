"""Writing files into a fake sysfs/procfs tree under tmp_path (the only fake the tests use: this
machine has no cpufreq, RAPL or thermal zones to change)."""

from pathlib import Path

from worker.knobs import sysfs


def put(root: Path, real_path: str, text: str) -> None:
    """Create `real_path` (e.g. /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor) under root."""
    f = Path(sysfs.path(str(root), real_path))
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text + "\n")
