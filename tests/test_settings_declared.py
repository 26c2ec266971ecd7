"""Each setting applied to the machine or the child's start is declared once (worker/knobs/__init__.py
says where), and what is derived from the declarations equals the lists the code kept by hand before."""

from __future__ import annotations

import os

import pytest

from common import variables
from common.variables import CATALOGUE, ENV, KNOB, PER_RANK_READBACK, allocator_of, resolve
from orchestrator.stats.ran import RAN_FROM
from worker.knobs import interconnect, startspec, system
from worker.knobs.verify import not_in_force
from worker.machine.gemm_peak import CLOCK_KNOBS

# The hand-kept lists as they stood before they were derived.
OLD_RAN_FROM = {
    "dataset": ("column", "dataset_used"),
    "omp_threads": ("applied", "omp_num_threads"),
    "intra_threads": ("applied", "torch_threads"),
    "inter_threads": ("applied", "interop_threads"),
    "onednn": ("applied", "mkldnn"),
    "allocator": ("applied", "allocator_lib"),
    "blas": ("applied", "blas"),
}
OLD_CLOCK_KNOBS = ("freq_mhz", "governor", "turbo")
OLD_SKIP_KEYS = {"cores", "freq_mhz", "governor", "turbo", "pin_threads", "numa", "allocator", "omp_threads",
                 "intra_threads", "inter_threads", "steps", "warmup_steps", "seed", "repeat", "task",
                 "optimizer", "grad_accum", "lr", "lr_schedule"}
OLD_PER_RANK_READBACK = ("affinity", "main_thread_affinity", "torch_threads", "interop_threads", "omp_num_threads",
                         "omp_places")
OLD_ALLOCATOR_LIBS = {
    "jemalloc": ("/usr/lib/{triple}/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"),
    "tcmalloc": ("/usr/lib/{triple}/libtcmalloc_minimal.so.4", "/usr/lib/{triple}/libtcmalloc.so.4",
                 "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc.so.4",
                 "/usr/lib/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc.so.4"),
}
OLD_DEBIAN_PACKAGE = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}


def declarations() -> dict[str, list[str]]:
    """Each variable some part of worker/knobs applies -> where that is declared (one item per declaration)."""
    found: dict[str, list[str]] = {}
    for name, where in [*((knob.name, "system.SYSTEM_KNOBS") for knob in system.SYSTEM_KNOBS),
                        (interconnect.Interconnect.name, "interconnect.Interconnect"),
                        *((name, "startspec.START") for name in startspec.START)]:
        found.setdefault(name, []).append(where)
    return found


def test_every_variable_applied_to_the_machine_or_the_child_is_declared_once():
    applied = {v.name for v in CATALOGUE if v.applied in (KNOB, ENV)}
    found = declarations()
    assert {name: where for name, where in found.items() if len(where) != 1} == {}
    assert sorted(found) == sorted(applied)


def test_the_report_reads_what_ran_from_the_same_places_in_the_same_order():
    assert list(RAN_FROM.items()) == list(OLD_RAN_FROM.items())


def test_the_gemm_peak_is_keyed_by_the_same_clock_knobs():
    assert CLOCK_KNOBS == OLD_CLOCK_KNOBS


def test_the_warm_compile_cache_leaves_out_the_same_variables():
    assert variables.NOT_COMPILED == OLD_SKIP_KEYS


def test_each_rank_reads_back_the_same_keys():
    # the same keys; each rank's record lists them in the catalogue's order now (nothing reads it by position)
    assert sorted(PER_RANK_READBACK) == sorted(OLD_PER_RANK_READBACK)
    assert len(set(PER_RANK_READBACK)) == len(PER_RANK_READBACK)


def test_bench_machine_lists_the_system_knobs_in_the_same_order():
    assert list(system.machine_availability({}, [0], sysfs_root="/nonexistent")) == ["freq_mhz", "governor", "turbo"]


def test_every_allocator_of_the_catalogue_has_one_known_library():
    assert list(startspec.ALLOCATOR_LIBS) == list(variables.ALLOCATORS)


@pytest.mark.parametrize("kind", sorted(OLD_ALLOCATOR_LIBS))
def test_the_allocator_libraries_are_looked_for_where_they_were(kind):
    triple = startspec.TRIPLES.get(os.uname().machine, f"{os.uname().machine}-linux-gnu")
    assert startspec.allocator_paths(kind) == [p.format(triple=triple) for p in OLD_ALLOCATOR_LIBS[kind]]
    assert startspec.ALLOCATOR_LIBS[kind].package == OLD_DEBIAN_PACKAGE[kind]


@pytest.mark.parametrize("path", ["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib64/libtcmalloc.so.4",
                                  "/usr/lib/libtcmalloc_minimal.so.4.5.10", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                                  "[heap]", ""])
def test_a_mapped_library_names_the_allocator_it_did_before(path):
    base = os.path.basename(path)
    before = next((a for a in ("jemalloc", "tcmalloc") if base.startswith(f"lib{a}")), None)
    assert allocator_of(path) == before


# A wrong read-back of each declared applied key, as a torch child could report it.
WRONG = {"omp_num_threads": "7", "torch_threads": 7, "interop_threads": 7, "mkldnn": False, "blas": "openblas",
         "allocator_lib": "/usr/lib/x86_64-linux-gnu/libc.so.6"}


@pytest.mark.parametrize("name", [v.name for v in CATALOGUE if v.ran_from and v.ran_from[0] == "applied"])
def test_the_read_back_check_judges_every_declared_read_back(name):
    key = variables.BY_NAME[name].ran_from[1]
    config, _ = resolve({"cores": 1, "allocator": "jemalloc"}, 2)
    spec = startspec.spec_for(config, {}, [0])
    assert not_in_force(config, spec, {}) == []
    wrong = not_in_force(config, spec, {key: WRONG[key]})
    assert [w.split("=")[0] for w in wrong] == [key]


@pytest.mark.parametrize("kind", list(startspec.ALLOCATOR_LIBS))
def test_an_allocator_whose_library_is_missing_is_skipped_naming_its_package(monkeypatch, tmp_path, kind):
    monkeypatch.setattr(startspec, "LIB_DIRS", (str(tmp_path),))
    config, _ = resolve({"cores": 1, "allocator": kind}, 2)
    package = startspec.ALLOCATOR_LIBS[kind].package
    assert startspec.unavailable(config, {}, [0, 1]) == [
        f"allocator={kind}: no {kind} library on the known paths (apt-get install {package})"]
