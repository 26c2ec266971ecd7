"""What each `cc_flags` and `compiler` value means for compiled kernels, without importing a framework:
the worker's availability checks (lto; a compiler without its OpenMP headers), the effective flags and
the compiler a kernel's compile command must show, and how those are read off a command line. The
torch child applies a value to inductor and reads the commands back (worker/trainers/torch/ccflags.py);
worker/knobs/verify.py compares.

Only inductor's C++ kernels take such flags. Inductor's own choice on Linux x86 (`default`) is
-O3 -march=native plus its fast-math subset (no unsafe math, -ffp-contract=off); the ladder:

    O2               -O2, no -march (the compiler's generic target)
    O3               -O3, no -march
    native           -O3 -march=native
    native_fastmath  -O3 -march=native -ffast-math (unsafe math and -ffp-contract=fast as well)

Without -march the kernels keep their vector ISA: inductor adds its picked ISA's -m flags (-mavx512f,
-mavx2...) to every vectorised kernel either way, so O2/O3 change the optimiser and the scheduling
target, not the instruction set the vector code is written for.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess

DEFAULT = "default"

# `compiler` -> the C++ driver inductor is given (torch._inductor.config.cpp.cxx); gcc is inductor's own
# choice on Linux. Clang needs LLVM's OpenMP headers (Debian: libomp-dev) for inductor's kernels.
COMPILERS = {"gcc": "g++", "clang": "clang++"}

# value -> (optimisation level, -march value or "" for none, -ffast-math)
LADDER = {
    "O2": ("O2", "", False),
    "O3": ("O3", "", False),
    "native": ("O3", "native", False),
    "native_fastmath": ("O3", "native", True),
}

LTO_REASON = ("cc_flags=lto: link-time optimisation needs the framework built from source with -flto "
              "(torch here is a prebuilt wheel), and inductor's kernels are separate .so files loaded "
              "at run time, so no link step sees them together with libtorch")

# Inductor compiles glue (the Python-binding / wrapper module around the kernels) at -O1 for compile
# speed; those commands are not kernels and are left out of the read-back.
GLUE_LEVELS = ("-O0", "-O1")


def unavailable(value: str) -> str | None:
    """Why this machine cannot run the value (the run is skipped), or None."""
    return LTO_REASON if value == "lto" else None


@functools.lru_cache(maxsize=None)
def compiler_unavailable(value: str) -> str | None:
    """Why inductor cannot compile its kernels with this `compiler` here (the run is skipped), or None:
    the driver must be on PATH and find omp.h with -fopenmp (every inductor kernel includes it)."""
    driver = COMPILERS[value]
    path = shutil.which(driver)
    if path is None:
        return (f"compiler={value}: no {driver} on PATH "
                f"(Debian: apt install {'g++' if value == 'gcc' else 'clang libomp-dev'})")
    try:
        probe = subprocess.run([path, "-fopenmp", "-E", "-x", "c++", "-", "-o", os.devnull],
                               input="#include <omp.h>\n", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"compiler={value}: {driver} could not be run ({e})"
    if probe.returncode != 0:
        return (f"compiler={value}: {driver} finds no omp.h with -fopenmp, which every inductor kernel includes "
                f"({'apt install libomp-dev' if value == 'clang' else 'install libgomp'})")
    return None


def compiler_of(command_line: str) -> str | None:
    """The compiler driver a compile command runs (its first word's file name: g++, clang++)."""
    words = shlex.split(command_line)
    return os.path.basename(words[0]) if words else None


def expected(value: str) -> str | None:
    """The effective flags every kernel command must show for this value; None for default (not judged)."""
    if value not in LADDER:
        return None
    level, march, fastmath = LADDER[value]
    return " ".join([f"-{level}"] + ([f"-march={march}"] if march else []) + (["-ffast-math"] if fastmath else []))


def effective(command_line: str) -> str | None:
    """The flags that decide code generation on one compile command, as expected() spells them: the
    last -O level and -march (the compiler takes the last), and -ffast-math if given; None for a
    command that is glue (-O0/-O1) or no C++ compile at all."""
    level = march = None
    fastmath = False
    for arg in shlex.split(command_line):
        if arg.startswith("-O") and len(arg) <= 6:
            level = arg
        elif arg.startswith("-march="):
            march = arg
        elif arg == "-ffast-math":
            fastmath = True
    if level is None or level in GLUE_LEVELS:
        return None
    return " ".join([level] + ([march] if march else []) + (["-ffast-math"] if fastmath else []))
