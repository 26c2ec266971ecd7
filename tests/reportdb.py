"""Test databases for the report tests, built through the real Store: a machine registered, jobs
enqueued from configs made by variables.resolve/config_hash, claimed, and finished with synthetic
metrics that a function of the config decides."""

from __future__ import annotations

import os
from collections.abc import Callable

from orchestrator.queue.store import Store
from common.variables import config_hash, resolve
from tests.conftest import done_fields

CPUS = 8


def machine_facts(name: str, cpu: str = "Test CPU") -> dict:
    return {"fingerprint": f"fp-{name}", "hostname": name, "cpu_model": cpu, "vendor": "GenuineIntel",
            "sockets": 1, "physical_cores": CPUS, "logical_cores": CPUS, "numa_nodes": 1,
            "isa_flags": "avx2 avx512f", "l3_kb": 16384, "mem_total_gb": 24.0, "mem_bw_gbs_all": 20.5,
            "gemm_gflops_fp32_all": 150.0, "kernel": "6.1.0-test"}


def configs(base: dict, axes: dict[str, list], repeats: int = 3, *, grid: bool = False) -> list[dict]:
    """Full configs, one factor at a time around base (or the full grid), each repeated."""
    partials = [dict(base)]
    if grid:
        for name, values in axes.items():
            partials = [{**p, name: v} for p in partials for v in values]
    else:
        for name, values in axes.items():
            partials += [{**base, name: v} for v in values if v != base.get(name)]
    out = {}
    for p in partials:
        for rep in range(repeats):
            config, why = resolve({**p, "repeat": rep}, CPUS)
            assert not why, why
            out[config_hash(config)] = config  # the base spelled twice is one job
    return list(out.values())


def enqueue(store: Store, configs_: list[dict], sweep: str = "test-sweep") -> None:
    jobs = [{"config": c, "config_hash": config_hash(c), "run_order": i} for i, c in enumerate(configs_)]
    store.enqueue(name=sweep, source="tests", sweep_text=sweep, jobs=jobs)


def run_all(store: Store, machine_id: int, outcome: Callable[[dict], tuple[str, str | None, dict]],
            limit: int | None = None) -> int:
    """Claim and finish queued jobs of this machine; outcome(config) -> (status, reason, metrics)."""
    n = 0
    while limit is None or n < limit:
        claim = store.claim(machine_id, pid=os.getpid(), host="test-host", max_cores=CPUS)
        if claim is None:
            break
        status, reason, fields = outcome(claim.config)
        fields = done_fields(**fields) if status == "done" else fields
        store.finish(claim.run_id, pid=os.getpid(), status=status, reason=reason, fields=fields)
        n += 1
    return n


def metrics(step_ms: float, config: dict) -> dict:
    tokens = config["seq_len"] * config["batch_size"] * config["grad_accum"]
    return {"step_ms_median": step_ms, "step_ms_p10": step_ms * 0.95, "step_ms_p90": step_ms * 1.05,
            "tokens_per_s": tokens / (step_ms / 1000),
            "wall_s": 2.0 + step_ms * (config["steps"] + config["warmup_steps"]) / 1000,
            "params": 1000, "loss_first": 8.0, "loss_last": 7.0}
