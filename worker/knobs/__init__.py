"""How each setting is applied to the machine or the child's start, read back and restored.

Each catalogue variable applied before the child runs (common/variables.py: applied "knob" or "env") is
declared here once, by what applies it:

    system.py        a Knob in SYSTEM_KNOBS: the machine's state on sysfs (freq_mhz, governor, turbo)
    interconnect.py  the Interconnect knob: the links between a job's nodes
    startspec.py     an entry of START: what shapes the child's start (cores, threads, allocator, ISA cap...)

What other parts must know of a variable is declared on its catalogue entry instead, since the report
(orchestrator/) and the trainers' children import only common/: ran_from (where a run records what
really ran: the report's RAN_FROM), per_rank (each data-parallel rank's read-back: PER_RANK_READBACK)
and compiled (the warm compile cache's key). The rest is derived, not listed: the GEMM peak's cache key
from SYSTEM_KNOBS, `bench.py machine`'s rows from each Knob's machine_target, the allocators' libraries
by the catalogue's words (variables.allocator_of: the child's read-back, verify.py, the report).
verify.py judges each read-back per framework (the same setting has other names there: intra_threads is
torch_threads on torch, blas_threads on numpy). tests/test_settings_declared.py checks that each
applied variable has one declaration, and that verify.py judges every declared ran_from.
"""
