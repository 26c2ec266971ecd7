"""The NumPy trainer's GEMM library (`blas`): OpenBLAS (NumPy's own), Intel MKL or BLIS, each called
for every matrix product of the model (model.py calls `matmul` here, never `@`), its thread count set
and read back, its name and version recorded per run.

    openblas  np.matmul: NumPy's bundled OpenBLAS (scipy-openblas), its pool set through threadpoolctl
    mkl       cblas_sgemm of libmkl_rt from PyPI's `mkl` wheel (ctypes, row-major), threads by
              MKL_Set_Num_Threads, read back by threadpoolctl (which sees the loaded libmkl_rt)
    blis      bli_sgemm_ex of Debian's threaded BLIS where installed (libblis4-openmp, else
              libblis4-pthread: BLIS 0.9.0, its threads set by bli_thread_set_num_threads), else of
              the BLIS inside PyPI's `blis` wheel (cython-blis: BLIS 0.7.0, exported from
              blis/cy*.so), which is built without threading and so runs one thread only

A library that is missing, or cannot run the job's thread count, raises Unavailable: the run is
skipped with the reason, never run on another library. Which BLIS ran, its version and threading
(OpenMP, pthreads or none) are recorded per run (info()).

BLIS 0.7.0 picks its kernels by CPUID and knows no CPU newer than Zen 2 / Skylake-X: on a Zen 3 or
later it falls back to its `generic` reference kernels (measured 17 GFLOP/s against 61 with the
zen2 kernels on this VM's EPYC, one thread). When its choice is generic and the CPU has AVX2 and
FMA, the trainer passes the context of the AVX2/FMA kernel set BLIS ships for the vendor (zen2 on
AMD, haswell on Intel) to every call, and records both the CPUID choice and the one used.

Every product here is float32 with the shapes of np.matmul (2-D, or stacked with broadcast leading
dimensions); a stacked product is one GEMM call per matrix, as np.matmul does itself.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

F32 = np.float32
CHOICES = ("openblas", "mkl", "blis")


class Unavailable(Exception):
    """This library cannot run the job as asked here (the run is skipped with this reason)."""


class Library:
    """One GEMM library: matmul(a, b, out=None) and its threads, name, version and kernel set."""

    name = ""

    def set_threads(self, n: int) -> None:
        raise NotImplementedError

    def info(self) -> dict:
        """What runs: {"blas", "blas_version", "blas_threads", "blas_architecture", "blas_threading", ...}."""
        raise NotImplementedError

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError


def _threadpool_entry(internal_api: str) -> dict:
    from threadpoolctl import threadpool_info

    return next((e for e in threadpool_info() if e.get("internal_api") == internal_api), {})


class OpenBLAS(Library):
    name = "openblas"

    def __init__(self):
        self._limits = None

    def set_threads(self, n: int) -> None:
        from threadpoolctl import threadpool_limits

        self._limits = threadpool_limits(limits=n, user_api="blas")  # kept: in force while alive

    def info(self) -> dict:
        e = _threadpool_entry("openblas")
        return {"blas": "openblas" if e else None, "blas_version": e.get("version"),
                "blas_threads": e.get("num_threads"),
                "blas_architecture": e.get("architecture"), "blas_threading": e.get("threading_layer"),
                "blas_lib": e.get("filepath")}

    matmul = staticmethod(np.matmul)


class _Strided(Library):
    """A C GEMM called on each 2-D product, with np.matmul's broadcasting of stacked operands."""

    def gemm2(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def matmul(self, a, b, out=None):
        if a.dtype != F32 or b.dtype != F32:
            raise TypeError(f"{self.name} matmul: float32 only (got {a.dtype}, {b.dtype})")
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not chain")
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if out is None:
            out = np.empty(batch + (m, n), F32)
        elif out.shape != batch + (m, n) or out.dtype != F32:
            raise ValueError(f"matmul: out {out.shape} {out.dtype} for a product of {batch + (m, n)}")
        if not batch:
            self.gemm2(a, b, out)
            return out
        a = np.broadcast_to(a, batch + (m, k))
        b = np.broadcast_to(b, batch + (k, n))
        for index in np.ndindex(*batch):
            self.gemm2(a[index], b[index], out[index])
        return out


# -- Intel MKL ----------------------------------------------------------------------------------

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _row_major(x: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(array, transpose flag, leading dimension) for cblas: a row-major matrix or the transpose of one;
    anything else (a broadcast or strided view) is copied first."""
    rows, cols = x.shape
    s0, s1 = x.strides
    if s1 == 4 and s0 >= 4 * max(cols, 1) and s0 % 4 == 0:
        return x, NO_TRANS, s0 // 4
    if s0 == 4 and s1 >= 4 * max(rows, 1) and s1 % 4 == 0:
        return x, TRANS, s1 // 4
    x = np.ascontiguousarray(x)
    return x, NO_TRANS, max(cols, 1)


class MKL(_Strided):
    name = "mkl"
    SONAMES = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so")

    def __init__(self):
        lib_dir = os.path.join(sys.prefix, "lib")  # where PyPI's mkl wheel puts its libraries
        self.path = next((os.path.join(lib_dir, s) for s in self.SONAMES if os.path.exists(os.path.join(lib_dir, s))),
                         None)
        if self.path is None:
            raise Unavailable(f"blas=mkl: no libmkl_rt in {lib_dir} (pip install the mkl of requirements.txt)")
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise Unavailable(f"blas=mkl: {self.path} does not load ({e})") from None
        c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.lib.cblas_sgemm.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_float, ptr, c_int, ptr, c_int,
                                         c_float, ptr, c_int]
        self.lib.cblas_sgemm.restype = None
        self.lib.MKL_Set_Num_Threads.argtypes = [c_int]
        self.lib.MKL_Get_Max_Threads.restype = c_int

    def set_threads(self, n: int) -> None:
        self.lib.MKL_Set_Num_Threads(n)

    def version(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.MKL_Get_Version_String(buf, len(buf))
        return buf.value.decode(errors="replace")

    def info(self) -> dict:
        e = _threadpool_entry("mkl")  # threadpoolctl reads mkl_get_max_threads of the loaded libmkl_rt
        return {"blas": "mkl" if e else None, "blas_version": self.version(), "blas_threads": e.get("num_threads"),
                "blas_architecture": None, "blas_threading": e.get("threading_layer"), "blas_lib": self.path}

    def gemm2(self, a, b, out):
        m, k = a.shape
        n = b.shape[1]
        target = out if out.strides[1] == 4 and out.strides[0] >= 4 * max(n, 1) else np.empty((m, n), F32)
        a, ta, lda = _row_major(a)
        b, tb, ldb = _row_major(b)
        self.lib.cblas_sgemm(ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
                             target.ctypes.data, target.strides[0] // 4)
        if target is not out:
            out[...] = target


# -- BLIS ---------------------------------------------------------------------------------------

# Kernel sets of BLIS 0.7.0 (its arch_t ids) that run on any x86 CPU with AVX2 and FMA.
BLIS_AVX2_SETS = {"AuthenticAMD": "zen2", "GenuineIntel": "haswell"}
# Debian's BLIS builds with threading, preferred in this order: OpenMP keeps a pool of threads, the
# pthreads build starts its threads for every call.
DEBIAN_BLIS = (("/usr/lib/{triple}/blis-openmp/libblis.so.4", "libblis4-openmp"),
               ("/usr/lib/{triple}/blis-pthread/libblis.so.4", "libblis4-pthread"))


def debian_blis() -> tuple[str, str] | None:
    """(path, Debian package) of the first threaded BLIS installed, or None."""
    import platform

    triple = f"{platform.machine()}-linux-gnu"
    return next(((path.format(triple=triple), package) for path, package in DEBIAN_BLIS
                 if os.path.exists(path.format(triple=triple))), None)


class BLIS(_Strided):
    name = "blis"

    def __init__(self):
        found = debian_blis()
        if found:
            self.lib = ctypes.CDLL(found[0])
            self.package_version = f"Debian {found[1]} {_deb_version(found[1]) or ''}".strip()
        else:
            try:
                import blis
                import blis.cy
            except ImportError:
                raise Unavailable("blas=blis: neither Debian's threaded BLIS (apt-get install libblis4-openmp) "
                                  "nor PyPI's blis (pip install the blis of requirements.txt) is installed") from None
            self.package_version = f"PyPI blis {getattr(blis, '__version__', None) or _dist_version('blis')}"
            self.lib = ctypes.CDLL(blis.cy.__file__)  # cython-blis exports BLIS's own C API
        lib = self.lib
        lib.bli_init()
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        lib.bli_arch_string.restype = ctypes.c_char_p
        lib.bli_arch_query_id.restype = ctypes.c_int
        lib.bli_thread_get_num_threads.restype = ctypes.c_long
        i64, ptr = ctypes.c_long, ctypes.c_void_p
        lib.bli_sgemm_ex.argtypes = [ctypes.c_int, ctypes.c_int, i64, i64, i64, ptr, ptr, i64, i64, ptr, i64, i64,
                                     ptr, ptr, i64, i64, ptr, ptr]
        lib.bli_sgemm_ex.restype = None
        self.threading = bool(lib.bli_info_get_enable_threading())
        self.cpuid_arch = lib.bli_arch_string(lib.bli_arch_query_id()).decode()
        self.arch = self.cpuid_arch
        self.cntx = None  # NULL: BLIS's own choice
        if self.cpuid_arch == "generic":
            vendor, flags = _cpu_vendor_flags()
            wanted = BLIS_AVX2_SETS.get(vendor) if {"avx2", "fma"} <= flags else None
            ids = {lib.bli_arch_string(i).decode(): i for i in range(32) if lib.bli_arch_string(i)}
            if wanted in ids and hasattr(lib, "bli_gks_lookup_nat_cntx"):  # BLIS 0.7's; 0.9 has no such call
                lib.bli_gks_lookup_nat_cntx.restype = ctypes.c_void_p
                lib.bli_gks_lookup_nat_cntx.argtypes = [ctypes.c_int]
                self.cntx = lib.bli_gks_lookup_nat_cntx(ids[wanted])
                self.arch = wanted
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def set_threads(self, n: int) -> None:
        if n != 1 and not self.threading:
            raise Unavailable(f"blas=blis: this BLIS ({self.package_version}, BLIS "
                              f"{self.lib.bli_info_get_version_str().decode()}) is built without threading; "
                              f"intra_threads={n} cannot run on it "
                              "(apt-get install libblis4-openmp for a threaded one)")
        self.lib.bli_thread_set_num_threads(n)

    def info(self) -> dict:
        arch = self.arch if self.arch == self.cpuid_arch else f"{self.arch} (BLIS's CPUID choice: {self.cpuid_arch})"
        threads = int(self.lib.bli_thread_get_num_threads()) if self.threading else 1
        return {"blas": "blis", "blas_version": f"BLIS {self.lib.bli_info_get_version_str().decode()} "
                                                f"({self.package_version})",
                "blas_threads": threads, "blas_architecture": arch, "blas_threading": self.threading_word(),
                "blas_lib": self.lib._name}

    def threading_word(self) -> str:
        if not self.threading:
            return "none (built single-threaded)"
        return "OpenMP" if self.lib.bli_info_get_enable_openmp() else "pthreads"

    def gemm2(self, a, b, out):
        m, k = a.shape
        n = b.shape[1]
        self.lib.bli_sgemm_ex(0, 0, m, n, k, ctypes.byref(self._one),  # BLIS_NO_TRANSPOSE: strides say it all
                              a.ctypes.data, a.strides[0] // 4, a.strides[1] // 4,
                              b.ctypes.data, b.strides[0] // 4, b.strides[1] // 4, ctypes.byref(self._zero),
                              out.ctypes.data, out.strides[0] // 4, out.strides[1] // 4, self.cntx, None)


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _deb_version(package: str) -> str | None:
    """The installed version of a Debian package, from dpkg's status file (no subprocess)."""
    try:
        with open("/var/lib/dpkg/status") as f:
            block = next((b for b in f.read().split("\n\n") if f"Package: {package}\n" in b), "")
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in block.splitlines() if line.startswith("Version:")), None)


def _cpu_vendor_flags() -> tuple[str | None, set[str]]:
    vendor, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id") and vendor is None:
                    vendor = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return vendor, flags


LIBRARIES = {"openblas": OpenBLAS, "mkl": MKL, "blis": BLIS}

# The library model.py's products run on; OpenBLAS until use() picks one (tests build models directly).
active: Library = OpenBLAS()


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b (np.matmul's shapes) on the active library."""
    return active.matmul(a, b, out)


def use(name: str, threads: int) -> Library:
    """Make `name` the active library with `threads` threads; raises Unavailable where it cannot be."""
    global active
    if name not in LIBRARIES:
        raise Unavailable(f"blas={name}: not a library of the NumPy trainer ({', '.join(CHOICES)})")
    library = LIBRARIES[name]()
    library.set_threads(threads)
    active = library
    return library
