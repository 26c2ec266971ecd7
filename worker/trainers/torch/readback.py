"""Inside the training child: apply the in-process settings and read back what is really in force.

The worker sets what must exist before the interpreter starts (affinity, environment, LD_PRELOAD);
this module, called by the torch child after importing torch, sets what only the process itself can
(torch thread pools, oneDNN switch) and reads every setting back so a run records what it ran under.
"""

from __future__ import annotations

import os

from worker.knobs import isa_check
from worker.trainers.harness import common_read_back


def apply_in_child(config: dict) -> None:
    """Set torch's thread pools and the oneDNN switch from the job's config."""
    import torch

    torch.set_num_threads(int(config["intra_threads"]))
    try:
        torch.set_num_interop_threads(int(config["inter_threads"]))
    except RuntimeError:
        pass  # already set (only possible once per process); read_back() records the real value
    torch.backends.mkldnn.enabled = bool(config["onednn"])


def read_back() -> dict:
    """The settings in force in this process, by the names runs.applied uses (harness.READBACK and torch's)."""
    import torch

    env = os.environ
    return common_read_back() | {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "omp_proc_bind": env.get("OMP_PROC_BIND"),
        "omp_places": env.get("OMP_PLACES"),
        "aten_cpu_capability": env.get("ATEN_CPU_CAPABILITY"),
        "onednn_max_cpu_isa": env.get("ONEDNN_MAX_CPU_ISA"),
        "mkl_enable_instructions": env.get("MKL_ENABLE_INSTRUCTIONS"),
        **isa_check.library_isas(),
    }
