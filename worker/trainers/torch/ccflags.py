"""Inside the torch child: apply `cc_flags` and `compiler` to inductor's C++ kernels and read back the
flags and the compiler each kernel command really ran (the values' meaning: worker/knobs/ccflags.py).

`compiler` sets torch._inductor.config.cpp.cxx (gcc: g++, inductor's own; clang: clang++). Inductor
adapts its flags to the compiler it finds (cpp_builder checks for clang: OpenMP through LLVM's
libomp instead of GCC's libgomp), so a clang run differs in compiler, code generator and OpenMP
runtime of the kernels; torch's own ATen kernels are the same prebuilt ones.

Applied in this process before torch.compile. -march and the fast-math switches are inductor's own
settings (torch._inductor.config.cpp.march, enable_unsafe_math_opt_flag,
enable_floating_point_contract_flag); the optimisation level is not a setting in torch 2.13
(cpp_builder._get_optimization_cflags writes -O3), so that function is wrapped to swap the level of
kernel builds (not the -O1 glue) and add -ffast-math. Inductor keys each compiled .so on its full
command line, so a kernel built under other flags is never reused.

Read-back: every C++ command line inductor builds in this process (CppBuilder.get_command_line; the
parent builds it even when a compile worker runs it or the .so is already on disk), reduced to its
effective flags (worker.knobs.ccflags.effective). A warm cache shows the same lines: an FX graph cache hit
reloads its kernels through the same keyed path, so a graph first compiled at -O3 gets its kernel
rebuilt at -O2 in an O2 run (seen: one new .so, and none on the next O2 run).
"""

from __future__ import annotations

from worker.knobs.ccflags import COMPILERS, DEFAULT, LADDER, compiler_of, effective

_seen: set[str] = set()  # effective flags of the kernel command lines built in this process
_compilers: set[str] = set()  # the compiler drivers of those kernel command lines


def record_compiles() -> None:
    """Start collecting the C++ command lines inductor builds (once per process)."""
    from torch._inductor import cpp_builder

    builder = cpp_builder.CppBuilder
    if getattr(builder.get_command_line, "_cpubench", False):
        return
    original = builder.get_command_line

    def get_command_line(self) -> str:
        line = original(self)
        flags = effective(line)
        if flags is not None:
            _seen.add(flags)
            _compilers.add(compiler_of(line))
        return line

    get_command_line._cpubench = True
    builder.get_command_line = get_command_line


def apply(value: str) -> dict:
    """Set inductor up for the value; return the settings now in force (read back from inductor)."""
    from torch._inductor import config, cpp_builder

    record_compiles()
    if value in LADDER:
        level, march, fastmath = LADDER[value]
        config.cpp.march = march  # "" = no -march flag at all
        if fastmath:
            config.cpp.enable_unsafe_math_opt_flag = True
            config.cpp.enable_floating_point_contract_flag = "fast"
        original = cpp_builder._get_optimization_cflags

        def optimization_cflags(cpp_compiler: str, min_optimize: bool = False):
            cflags, ldflags = original(cpp_compiler, min_optimize)
            if not min_optimize:  # kernels; the glue keeps inductor's -O1
                cflags = [level if flag == "O3" else flag for flag in cflags] + (["ffast-math"] if fastmath else [])
            return cflags, ldflags

        cpp_builder._get_optimization_cflags = optimization_cflags
    elif value != DEFAULT:
        raise ValueError(f"cc_flags={value} cannot be applied to inductor")
    return {"cpp.march": config.cpp.march, "cpp.enable_unsafe_math_opt_flag": config.cpp.enable_unsafe_math_opt_flag,
            "cpp.enable_floating_point_contract_flag": config.cpp.enable_floating_point_contract_flag}


def read_back() -> list[str]:
    """The distinct effective flags of the kernel compile commands inductor built in this process."""
    return sorted(_seen)


def apply_compiler(value: str) -> dict:
    """Give inductor the `compiler` value's C++ driver (torch._inductor.config.cpp.cxx); return what
    inductor now resolves as its compiler and that compiler's version line."""
    import subprocess

    from torch._inductor import config, cpp_builder

    record_compiles()
    config.cpp.cxx = (None, COMPILERS[value])
    resolved = cpp_builder.get_cpp_compiler()
    try:
        version = subprocess.run([resolved, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return {"cpp.cxx": resolved, "cxx_version": version.splitlines()[0] if version else None}


def compilers_read_back() -> list[str]:
    """The distinct compiler drivers of the kernel compile commands inductor built in this process."""
    return sorted(_compilers)
