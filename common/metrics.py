"""The metrics of a run: the columns of `runs` that hold measurements, which of them the trainer
measures and which the worker adds, and when a timed window counts as disturbed.

One list: schema.sql's metric columns, the store, v_results, `once --json` and the trainers all derive
from METRICS (tests/test_harness.py fails when schema.sql drifts). `disturbance()` is the one rule
that the worker's sensors (a run, a GEMM-peak measurement) and the report's statistics share.
"""

from __future__ import annotations

# The metric columns of `runs`, in schema.sql's order. schema.sql, the store, v_results, `once --json`
# and the trainers all derive from this list (tests/test_harness.py fails when schema.sql drifts).
METRICS = (
    "setup_s", "first_step_s", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_mean",
    "step_ms_std", "train_s", "wall_s", "tokens_per_s", "samples_per_s", "loss_first", "loss_last",
    "peak_rss_mb", "cpu_user_s", "cpu_sys_s", "ctx_switches", "freq_mhz_avg", "energy_j",
    "temp_c_max", "params", "trainable_params", "flops_per_step", "gflops", "mfu", "steal_s",
    "other_cpu_s", "world_size", "global_batch", "allreduce_ms", "allreduce_share",
    "val_loss", "eval_s", "train_tokens", "reached", "tokens_to_target", "steps_to_target", "time_to_target_s",
)
# Measured by the worker around the child (its wall clock, the sensors), merged before the store's check.
WORKER_METRICS = ("wall_s", "freq_mhz_avg", "energy_j", "temp_c_max", "steal_s", "other_cpu_s")
# What a trainer reports: every one of these, None where it cannot measure.
TRAINER_METRICS = tuple(m for m in METRICS if m not in WORKER_METRICS)


# A run (or a GEMM-peak measurement) is *disturbed* when other processes (other_cpu_s) or the hypervisor
# (steal_s) took more than this share of its CPUs' time over its timed window (window seconds x CPUs).
# Why 5%: a compute-bound step loses about the share of CPU time taken from it, and 5% is the size of
# the smaller effects the report resolves and above a quiet machine's run-to-run noise (1-3%); a GEMM
# peak lowered by 5% inflates every MFU taken against it by as much.
DISTURBED_SHARE = 0.05
# /proc/stat counts in USER_HZ ticks (10 ms): two ticks per CPU (the window's two edges) is resolution,
# not disturbance, so a very short window needs at least this much per CPU before it is flagged.
DISTURBED_FLOOR_S = 0.02


def disturbance(other_cpu_s: float | None, steal_s: float | None, cpus: int, window_s: float,
                during: str = "") -> str | None:
    """Why `cpus` CPUs over `window_s` seconds were disturbed (other processes' CPU time or steal above
    DISTURBED_SHARE of it), or None. `during` names the window in the message."""
    limit = max(DISTURBED_SHARE * window_s, DISTURBED_FLOOR_S) * cpus
    why = [f"{what} {float(v):.2f} s" for v, what in ((other_cpu_s, "other processes used"),
                                                      (steal_s, "the hypervisor stole"))
           if v is not None and float(v) > limit]
    if not why:
        return None
    return (f"{' and '.join(why)} of {cpus} CPU(s) x {window_s:.2f} s{during} "
            f"(more than {DISTURBED_SHARE:.0%}: {limit:.2f} CPU-s)")


def peak_text(peak: dict) -> str:
    """'fp32 480 (jax; numpy 255, torch 218), bf16 936 (torch; jax 454)': a GEMM peak as a run records
    it (applied.peak_gflops: worker/machine/gemm_peak.py), each precision's figure, the library that gave it
    and the others' figures. The worker's basis and the report's machines table both say it so."""
    parts = []
    for p in ("fp32", "bf16"):
        fastest = (peak.get("library") or {}).get(p) or "?"
        others = ", ".join(f"{lib} {g:,.0f}" for lib, g in sorted((peak.get("by_library") or {}).get(p, {}).items())
                           if lib != fastest)
        parts.append(f"{p} {peak[p]:,.0f} ({fastest}" + (f"; {others})" if others else ")"))
    return ", ".join(parts)
