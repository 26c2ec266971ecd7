"""The one way to reach /sys and /proc: every path is taken relative to a root, so tests can point
the knobs, the probe and the sensors at a fake tree under tmp_path.

Paths are written as they appear on a real machine ("/sys/devices/system/cpu/online"); `path()`
re-roots them. Reads return None for a missing or unreadable file instead of raising, because "this
machine does not have it" is an ordinary answer here; writes raise OSError, which the knobs turn
into a BenchError naming the file.
"""

from __future__ import annotations

import os
from collections import deque

CPU = "/sys/devices/system/cpu"
NODE = "/sys/devices/system/node"

# The last writes through this module, in order; tests read it to prove unchanged values are not
# written and pairs are written in the order the kernel accepts. Bounded: a worker runs for days.
writes: deque[str] = deque(maxlen=256)


def path(root: str, real_path: str) -> str:
    """`real_path` (absolute, as on a real machine) under `root` ("/" for the real machine)."""
    if root in ("", "/"):
        return real_path
    return os.path.join(root, real_path.lstrip("/"))


def read(root: str, real_path: str) -> str | None:
    """The stripped text of a file, or None if it is missing or unreadable."""
    try:
        with open(path(root, real_path)) as f:
            return f.read().strip()
    except OSError:
        return None


def read_int(root: str, real_path: str) -> int | None:
    text = read(root, real_path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def exists(root: str, real_path: str) -> bool:
    return os.path.exists(path(root, real_path))


def writable(root: str, real_path: str) -> bool:
    return os.access(path(root, real_path), os.W_OK)


def write(root: str, real_path: str, value: str) -> None:
    """Write one value (sysfs takes one write per open). Raises OSError as the kernel answers."""
    writes.append(real_path)
    with open(path(root, real_path), "w") as f:
        f.write(value)


def listdir(root: str, real_path: str) -> list[str]:
    try:
        return sorted(os.listdir(path(root, real_path)))
    except OSError:
        return []


def parse_cpulist(text: str | None) -> list[int]:
    """Kernel cpulist syntax ("0-3,8,10-11") -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in (text or "").replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return sorted(set(cpus))


def cpu_file(cpu: int, name: str) -> str:
    """A per-CPU cpufreq file, e.g. cpu_file(3, "scaling_max_freq")."""
    return f"{CPU}/cpu{cpu}/cpufreq/{name}"
