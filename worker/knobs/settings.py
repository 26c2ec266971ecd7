"""What a job needs before its child starts, in one call for the worker: can it run here
(unavailable), apply it and give the child's start spec, restoring after (applied), and did the child
run under it (not_in_force). The parts live in their own modules:

    worker/knobs/system.py     the machine's settings on sysfs (turbo, governor, frequency): Knob protocol,
                         write-on-change, read back, journal, restore in reverse
    worker/knobs/startspec.py  the child's start spec, one plain function per trainer (CPU set,
                         environment, allocator, ISA caps, numactl), and its availability checks
    worker/knobs/verify.py     the trainer's read-back checked against the job, per framework
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.errors import BenchError
from worker.knobs import ccflags, interconnect, startspec, system
# the start spec's names, re-exported: the worker and the tests take them from here
from worker.knobs.startspec import ALLOCATOR_LIBS, ISA_CAPS, NUMA_OPTIONS, ChildSpec, allocator_lib, choose_cpus  # noqa: F401
from common.variables import AUTO, BLAS_AUTO, TORCH_GEMM_ROUTES
from worker.trainers.harness import NOT_OFFERED
from worker.trainers.torch import gemm_route
from worker.knobs.verify import not_in_force  # noqa: F401 (re-exported)


def _reasons(config: dict, facts: dict, cpu_pool: list[int], sysfs_root: str) -> list[str]:
    cpus = startspec.job_cpus(config, facts, cpu_pool)
    cores = startspec.cores_unavailable(int(config["cores"]), cpu_pool)
    links = interconnect.unavailable(config)
    return ([cores] if cores else []) + system.unavailable(config, cpus, sysfs_root=sysfs_root) + \
        ([links] if links else []) + startspec.unavailable(config, facts, cpu_pool)


def links_journal(journal_path: Path) -> Path:
    """The interconnect's journal beside the sysfs one (journal-PID.json -> links-PID.json)."""
    return journal_path.with_name("links-" + journal_path.name.removeprefix("journal-"))


def restore_journal(journal_path: Path, *, sysfs_root: str = "/") -> list[str]:
    """Restore what a killed worker left: its sysfs settings and its shaped links."""
    return system.restore_journal(journal_path, sysfs_root=sysfs_root) + \
        interconnect.restore_journal(links_journal(Path(journal_path)))


def unavailable(config: dict, facts: dict, cpu_pool: list[int], *, sysfs_root: str = "/") -> str | None:
    """None if every setting this job needs can be applied here, else the reason (the run becomes skipped)."""
    return "; ".join(_reasons(config, facts, cpu_pool, sysfs_root)) or None


def machine_knobs(facts: dict, *, sysfs_root: str = "/") -> dict[str, str | None]:
    """For `bench.py machine`: each knob (and each value that needs something of its own) -> None if
    it can be applied here, else why not."""
    cpus = facts.get("cpus") or sorted(os.sched_getaffinity(0))
    out = {"cores": None, **system.machine_availability(facts, cpus, sysfs_root=sysfs_root),
           "pin_threads": None, "omp_threads": None, "onednn": startspec.onednn_unavailable(True, facts)}
    for word in NUMA_OPTIONS:
        out[f"numa={word}"] = startspec.numa_unavailable(word)
    for word in ALLOCATOR_LIBS:
        out[f"allocator={word}"] = startspec.allocator_unavailable(word)
    for word in ISA_CAPS:
        out[f"isa={word}"] = startspec.isa_unavailable(word, facts)
    out["cc_flags=lto"] = ccflags.unavailable("lto")
    out["compiler=clang"] = ccflags.compiler_unavailable("clang")
    for word in ("mkl", "blis"):
        out[f"blas={word}"] = startspec.blas_unavailable(word)
    for word in TORCH_GEMM_ROUTES:  # torch's GEMM routes (worker/trainers/torch/gemm_route.py)
        out[f"blas={word} (torch)"] = gemm_route.unavailable(word, facts)
    fallback = gemm_route.auto_fallback({"framework": "torch", "blas": BLAS_AUTO["torch"]}, {"blas": AUTO}, facts)
    if fallback:
        out[f"blas={BLAS_AUTO['torch']} (torch)"] += ("; jobs that leave blas on auto run mkl here "
                                                      "(applied.blas_fallback)")

    from worker.trainers.torch.distributed import availability

    out["interconnect"] = interconnect.machine_availability()
    out.update(availability())  # ranks, nodes and torch.distributed's backends
    out.update(NOT_OFFERED)  # never available: what it is and why not
    return out


@contextmanager
def applied(config: dict, facts: dict, cpu_pool: list[int], *, journal_path: Path,
            sysfs_root: str = "/") -> Iterator[ChildSpec]:
    """A dead worker's leftovers restored first; then, if every setting can be applied, the system
    settings journaled and applied (worker/knobs/system.py) and the child's start spec built for the job's
    trainer (worker/knobs/startspec.py); yields the spec, whose `applied` holds what was set and read back.
    The system settings are restored in reverse on exit, also on an exception."""
    restore_journal(journal_path, sysfs_root=sysfs_root)
    reasons = _reasons(config, facts, cpu_pool, sysfs_root)
    if reasons:
        raise BenchError("cannot apply this job's settings here: " + "; ".join(reasons))
    cpus = startspec.job_cpus(config, facts, cpu_pool)
    spec = startspec.spec_for(config, facts, cpus)
    with system.applied(config, cpus, journal_path=journal_path, sysfs_root=sysfs_root, record=spec.applied), \
            interconnect.applied(config, journal_path=links_journal(Path(journal_path)), record=spec.applied):
        spec.applied.update(env=dict(spec.env), argv_prefix=list(spec.argv_prefix), cpus=list(spec.cpus),
                            numa=config["numa"], isa=config["isa"], allocator=config["allocator"])
        yield spec
